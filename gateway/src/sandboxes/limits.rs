//! Sandbox resource limits: read from `spec.template.resources`
//! (Kubernetes style, `{"limits": {"cpu": "500m", "memory": "256Mi",
//! "pids": 128}}`), completed with the gateway's defaults, and stored back
//! there as the limits the sandbox runs with. The supervisor (or shared
//! host) enforces them with a control group per sandbox.
//!
//! What this host cannot enforce (no writable cgroup controller for it) is
//! `--resource-limits` policy, as `--isolation` is: `auto` runs the
//! sandbox without that limit, says so in a `LimitsNotEnforced` condition
//! and counts it in `openshell_sandbox_limits_unenforced_total`;
//! `required` refuses the sandbox with FAILED_PRECONDITION.

use std::collections::BTreeMap;
use std::process::Stdio;

use openshell_proto::SandboxTemplate;
use prost_types::value::Kind;
use prost_types::{Struct, Value};
use tonic::Status;

use crate::validate;

/// The condition of a sandbox whose limits are not all enforced.
pub const LIMITS_NOT_ENFORCED: &str = "LimitsNotEnforced";

/// Smallest memory limit: below it not even the sandbox's init and a shell
/// fit.
const MIN_MEMORY: u64 = 16 << 20;
/// Smallest CPU limit in millicores (the kernel's smallest quota is 1 ms
/// per 100 ms period).
const MIN_CPU_MILLIS: u64 = 10;
const MAX_CPU_MILLIS: u64 = 1024 * 1000;
/// Smallest process limit: the init, PID 1, an exec's helper and its
/// program, with room for a shell pipeline.
const MIN_PIDS: u64 = 16;
const MAX_PIDS: u64 = 4 << 20;

/// One sandbox's limits; `None`: unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub pids: Option<u64>,
}

/// A limit kind, as the template and the supervisor's cgroup controllers
/// name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Memory,
    Cpu,
    Pids,
}

impl Resource {
    pub const ALL: [Resource; 3] = [Resource::Memory, Resource::Cpu, Resource::Pids];

    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Cpu => "cpu",
            Resource::Pids => "pids",
        }
    }
}

impl Limits {
    fn get(&self, resource: Resource) -> Option<u64> {
        match resource {
            Resource::Memory => self.memory,
            Resource::Cpu => self.cpu_millis,
            Resource::Pids => self.pids,
        }
    }

    fn clear(&mut self, resource: Resource) {
        match resource {
            Resource::Memory => self.memory = None,
            Resource::Cpu => self.cpu_millis = None,
            Resource::Pids => self.pids = None,
        }
    }

    /// The supervisor's flags for these limits.
    pub fn supervisor_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (flag, value) in [
            ("--memory-limit", self.memory),
            ("--cpu-limit", self.cpu_millis),
            ("--pids-limit", self.pids),
        ] {
            if let Some(value) = value {
                args.push(flag.to_owned());
                args.push(value.to_string());
            }
        }
        args
    }

    /// The limits a stored template says the sandbox runs with (written by
    /// [`LimitPolicy::resolve`]; anything unreadable counts as no limit).
    pub fn of_template(template: Option<&SandboxTemplate>) -> Self {
        template
            .and_then(|t| t.resources.as_ref())
            .and_then(|resources| parse(resources).ok())
            .map(|(limits, _)| limits)
            .unwrap_or_default()
    }
}

/// `--resource-limits`: what happens to a limit the host cannot enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LimitsMode {
    /// Run without it, with a `LimitsNotEnforced` condition and a metric.
    Auto,
    /// Refuse the sandbox (FAILED_PRECONDITION).
    Required,
}

/// The gateway's defaults and what its hosts can enforce.
#[derive(Debug, Clone)]
pub struct LimitPolicy {
    pub defaults: Limits,
    pub mode: LimitsMode,
    /// The resources the supervisor can limit here; `None`: not known here
    /// (shared hosts enforce what they can).
    pub available: Option<Vec<Resource>>,
}

/// A sandbox's resolved limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Enforced.
    pub limits: Limits,
    /// Asked for (or defaulted) but not enforceable here (`auto`).
    pub unenforced: Vec<Resource>,
}

impl LimitPolicy {
    /// No defaults, nothing known.
    #[cfg(test)]
    pub fn unlimited() -> Self {
        Self {
            defaults: Limits::default(),
            mode: LimitsMode::Auto,
            available: None,
        }
    }

    /// Validates the template's resources, completes them with the
    /// defaults and writes the result back into the template.
    pub fn resolve(&self, template: &mut Option<SandboxTemplate>) -> Result<Resolved, Status> {
        let given = template.as_ref().and_then(|t| t.resources.as_ref());
        let (mut limits, requests) = match given {
            Some(resources) => parse(resources)?,
            None => (Limits::default(), None),
        };
        limits.memory = limits.memory.or(self.defaults.memory);
        limits.cpu_millis = limits.cpu_millis.or(self.defaults.cpu_millis);
        limits.pids = limits.pids.or(self.defaults.pids);
        let mut unenforced = Vec::new();
        if let Some(available) = &self.available {
            for resource in Resource::ALL {
                if limits.get(resource).is_some() && !available.contains(&resource) {
                    unenforced.push(resource);
                }
            }
        }
        let explicit = |resource: Resource| {
            given
                .and_then(|r| r.fields.get("limits"))
                .and_then(|v| as_struct(v))
                .is_some_and(|l| l.fields.contains_key(resource.name()))
        };
        if self.mode == LimitsMode::Required
            && let Some(resource) = unenforced.first()
        {
            let whose = if explicit(*resource) {
                "spec.template.resources"
            } else {
                "the gateway's defaults"
            };
            return Err(Status::failed_precondition(format!(
                "{whose} set a {} limit, and this gateway's hosts cannot enforce {} \
                 limits (no writable cgroup controller); --resource-limits required refuses it",
                resource.name(),
                resource.name()
            )));
        }
        for resource in &unenforced {
            limits.clear(*resource);
        }
        let has_limits = limits != Limits::default();
        if has_limits || requests.is_some() {
            let template = template.get_or_insert_with(SandboxTemplate::default);
            template.resources = Some(render(&limits, requests));
        } else if let Some(template) = template.as_mut() {
            template.resources = None;
        }
        Ok(Resolved { limits, unenforced })
    }
}

/// Asks the supervisor binary which controllers it can use here.
pub fn check_available(supervisor_bin: &std::path::Path) -> Result<Vec<Resource>, String> {
    let output = std::process::Command::new(supervisor_bin)
        .arg("__limits-check")
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run {}: {err}", supervisor_bin.display()))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(Resource::ALL
        .into_iter()
        .filter(|r| text.split_whitespace().any(|name| name == r.name()))
        .collect())
}

fn invalid(field: &str, why: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("spec.template.resources.{field}: {why}"))
}

fn as_struct(value: &Value) -> Option<&Struct> {
    match &value.kind {
        Some(Kind::StructValue(s)) => Some(s),
        _ => None,
    }
}

/// The limits in `resources`, and its `requests` (kept, not enforced).
fn parse(resources: &Struct) -> Result<(Limits, Option<Struct>), Status> {
    let mut limits = Limits::default();
    let mut requests = None;
    for (key, value) in &resources.fields {
        match key.as_str() {
            "limits" => {
                let table = as_struct(value).ok_or_else(|| invalid("limits", "not an object"))?;
                for (name, value) in &table.fields {
                    let field = format!("limits.{name}");
                    match name.as_str() {
                        "memory" => limits.memory = Some(memory(&field, value)?),
                        "cpu" => limits.cpu_millis = Some(cpu(&field, value)?),
                        "pids" => limits.pids = Some(pids(&field, value)?),
                        _ => {
                            return Err(Status::invalid_argument(format!(
                                "spec.template.resources.limits: {} is not a limit this gateway \
                                 enforces (memory, cpu, pids)",
                                validate::quote(name)
                            )));
                        }
                    }
                }
            }
            "requests" => {
                let table = as_struct(value).ok_or_else(|| invalid("requests", "not an object"))?;
                // Checked as limits would be, so a typo is not kept silently.
                for (name, value) in &table.fields {
                    let field = format!("requests.{name}");
                    match name.as_str() {
                        "memory" => drop(memory(&field, value)?),
                        "cpu" => drop(cpu(&field, value)?),
                        "pids" => drop(pids(&field, value)?),
                        _ => {
                            return Err(Status::invalid_argument(format!(
                                "spec.template.resources.requests: {} is not a resource this \
                                 gateway knows (memory, cpu, pids)",
                                validate::quote(name)
                            )));
                        }
                    }
                }
                requests = Some(table.clone());
            }
            _ => {
                return Err(Status::invalid_argument(format!(
                    "spec.template.resources: {} is not a field (limits, requests)",
                    validate::quote(key)
                )));
            }
        }
    }
    Ok((limits, requests))
}

/// A quantity as text: a string, or a number written the way JSON would.
fn quantity_text(field: &str, value: &Value) -> Result<String, Status> {
    match &value.kind {
        Some(Kind::StringValue(text)) => Ok(text.trim().to_owned()),
        Some(Kind::NumberValue(n)) if n.is_finite() && *n >= 0.0 => Ok(format!("{n}")),
        _ => Err(invalid(
            field,
            "not a quantity (a string such as \"512Mi\" or a number)",
        )),
    }
}

/// `digits[.digits]` as (whole, thousandths-or-finer fraction as a ratio).
fn decimal(text: &str) -> Option<(u64, u64, u64)> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if fraction.len() > 9 {
        return None;
    }
    let whole = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let scale = 10u64.pow(fraction.len() as u32);
    let fraction = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    Some((whole, fraction, scale))
}

/// Bytes: `512Mi`, `1.5Gi`, `100M`, `1048576`.
pub fn parse_memory(text: &str) -> Result<u64, String> {
    const UNITS: [(&str, u64); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let (number, unit) = UNITS
        .iter()
        .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|n| (n, *unit)))
        .unwrap_or((text, 1));
    let bad = || {
        format!(
            "{} is not a memory quantity (such as 512Mi or 2Gi)",
            validate::quote(text)
        )
    };
    let (whole, fraction, scale) = decimal(number).ok_or_else(bad)?;
    let bytes = u128::from(whole) * u128::from(unit)
        + u128::from(fraction) * u128::from(unit) / u128::from(scale);
    let bytes = u64::try_from(bytes).map_err(|_| bad())?;
    if bytes < MIN_MEMORY {
        return Err(format!(
            "{} is below the smallest memory limit, 16Mi",
            validate::quote(text)
        ));
    }
    Ok(bytes)
}

/// Millicores: `500m`, `2`, `0.5`.
pub fn parse_cpu(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "{} is not a CPU quantity (such as 500m or 2)",
            validate::quote(text)
        )
    };
    let millis = match text.strip_suffix('m') {
        Some(number) if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) => {
            number.parse::<u64>().map_err(|_| bad())?
        }
        Some(_) => return Err(bad()),
        None => {
            let (whole, fraction, scale) = decimal(text).ok_or_else(bad)?;
            whole
                .checked_mul(1000)
                .and_then(|w| w.checked_add(fraction * 1000 / scale))
                .ok_or_else(bad)?
        }
    };
    if !(MIN_CPU_MILLIS..=MAX_CPU_MILLIS).contains(&millis) {
        return Err(format!(
            "{} is outside the CPU limits this gateway sets (10m to 1024)",
            validate::quote(text)
        ));
    }
    Ok(millis)
}

/// A process count.
pub fn parse_pids(text: &str) -> Result<u64, String> {
    let count: u64 = text
        .parse()
        .map_err(|_| format!("{} is not a process count", validate::quote(text)))?;
    if !(MIN_PIDS..=MAX_PIDS).contains(&count) {
        return Err(format!(
            "{} is outside the process limits this gateway sets (16 to 4194304)",
            validate::quote(text)
        ));
    }
    Ok(count)
}

fn memory(field: &str, value: &Value) -> Result<u64, Status> {
    parse_memory(&quantity_text(field, value)?).map_err(|why| invalid(field, why))
}

fn cpu(field: &str, value: &Value) -> Result<u64, Status> {
    parse_cpu(&quantity_text(field, value)?).map_err(|why| invalid(field, why))
}

fn pids(field: &str, value: &Value) -> Result<u64, Status> {
    parse_pids(&quantity_text(field, value)?).map_err(|why| invalid(field, why))
}

/// Memory in the largest binary unit that divides it.
fn render_memory(bytes: u64) -> String {
    for (suffix, shift) in [("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn string(text: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(text)),
    }
}

fn render(limits: &Limits, requests: Option<Struct>) -> Struct {
    let mut table = BTreeMap::new();
    if let Some(bytes) = limits.memory {
        table.insert("memory".to_owned(), string(render_memory(bytes)));
    }
    if let Some(millis) = limits.cpu_millis {
        table.insert("cpu".to_owned(), string(format!("{millis}m")));
    }
    if let Some(count) = limits.pids {
        table.insert(
            "pids".to_owned(),
            Value {
                kind: Some(Kind::NumberValue(count as f64)),
            },
        );
    }
    let mut fields = BTreeMap::new();
    if !table.is_empty() {
        fields.insert(
            "limits".to_owned(),
            Value {
                kind: Some(Kind::StructValue(Struct { fields: table })),
            },
        );
    }
    if let Some(requests) = requests {
        fields.insert(
            "requests".to_owned(),
            Value {
                kind: Some(Kind::StructValue(requests)),
            },
        );
    }
    Struct { fields }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits_struct(pairs: &[(&str, Value)]) -> Option<SandboxTemplate> {
        let table = Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        };
        Some(SandboxTemplate {
            resources: Some(Struct {
                fields: [(
                    "limits".to_owned(),
                    Value {
                        kind: Some(Kind::StructValue(table)),
                    },
                )]
                .into(),
            }),
            ..Default::default()
        })
    }

    fn number(n: f64) -> Value {
        Value {
            kind: Some(Kind::NumberValue(n)),
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_memory("512Mi"), Ok(512 << 20));
        assert_eq!(parse_memory("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_memory("100M"), Ok(100_000_000));
        assert_eq!(parse_memory("16777216"), Ok(16 << 20));
        assert!(parse_memory("1Mi").unwrap_err().contains("smallest"));
        for bad in ["", "Mi", "12Xi", "-5Mi", "1e9", "99999999999Ei", "1.2.3Mi"] {
            assert!(parse_memory(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_cpu("500m"), Ok(500));
        assert_eq!(parse_cpu("2"), Ok(2000));
        assert_eq!(parse_cpu("0.25"), Ok(250));
        for bad in ["", "m", "0", "5m", "abc", "1.5m", "2000"] {
            assert!(parse_cpu(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_pids("64"), Ok(64));
        for bad in ["3", "x", "-1", "99999999"] {
            assert!(parse_pids(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults_fill_in_and_the_result_is_stored() {
        let policy = LimitPolicy {
            defaults: Limits {
                memory: Some(1 << 30),
                cpu_millis: None,
                pids: Some(1024),
            },
            mode: LimitsMode::Auto,
            available: Some(Resource::ALL.to_vec()),
        };
        let mut template =
            limits_struct(&[("memory", string("256Mi".into())), ("cpu", number(0.5))]);
        let resolved = policy.resolve(&mut template).unwrap();
        let want = Limits {
            memory: Some(256 << 20),
            cpu_millis: Some(500),
            pids: Some(1024),
        };
        assert_eq!(resolved.limits, want);
        assert!(resolved.unenforced.is_empty());
        assert_eq!(Limits::of_template(template.as_ref()), want);
        // Stored in canonical form.
        let mut again = template.clone();
        assert_eq!(policy.resolve(&mut again).unwrap().limits, want);
        assert_eq!(again, template);
    }

    #[test]
    fn unenforceable_limits_follow_the_mode() {
        let mut policy = LimitPolicy {
            defaults: Limits::default(),
            mode: LimitsMode::Auto,
            available: Some(vec![Resource::Pids]),
        };
        let mut template =
            limits_struct(&[("memory", string("64Mi".into())), ("pids", number(32.0))]);
        let resolved = policy.resolve(&mut template).unwrap();
        assert_eq!(resolved.unenforced, vec![Resource::Memory]);
        assert_eq!(resolved.limits.memory, None);
        assert_eq!(resolved.limits.pids, Some(32));
        policy.mode = LimitsMode::Required;
        let mut template = limits_struct(&[("memory", string("64Mi".into()))]);
        let err = policy.resolve(&mut template).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.message().contains("memory"), "{}", err.message());
    }

    #[test]
    fn bad_resources_are_refused_by_name() {
        let policy = LimitPolicy::unlimited();
        for (template, needle) in [
            (limits_struct(&[("gpu", number(1.0))]), "\"gpu\""),
            (
                limits_struct(&[("memory", string("lots".into()))]),
                "limits.memory",
            ),
            (limits_struct(&[("cpu", number(-1.0))]), "limits.cpu"),
            (
                limits_struct(&[("pids", string("2".into()))]),
                "limits.pids",
            ),
        ] {
            let mut template = template;
            let err = policy.resolve(&mut template).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains(needle), "{}", err.message());
        }
        let mut odd = Some(SandboxTemplate {
            resources: Some(Struct {
                fields: [("limitz".to_owned(), number(1.0))].into(),
            }),
            ..Default::default()
        });
        let err = policy.resolve(&mut odd).unwrap_err();
        assert!(err.message().contains("\"limitz\""), "{}", err.message());
    }
}
