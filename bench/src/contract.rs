//! The contract every per-language program of `openshell-bench languages`
//! follows (Rust here, `sdk-python/bench/languages.py`,
//! `sdk-typescript/bench/languages.ts`, `sdk-go/bench`, `sdk-jvm/bench`).
//!
//! Inputs, from the environment:
//! - `OPENSHELL_ENDPOINT`: the gateway; `OPENSHELL_TOKEN` (optional);
//! - `OPENSHELL_BENCH_SANDBOX`: a READY sandbox;
//! - `OPENSHELL_BENCH_IPERF_PORT`: an `iperf3 -s` on 127.0.0.1:PORT inside
//!   the sandbox's network (its own loopback under isolation), a forward
//!   target;
//! - `OPENSHELL_BENCH_ROUNDS` (default 5), `OPENSHELL_BENCH_FORWARD_SECONDS`
//!   (default 3).
//!
//! Output: a human table, then as the last stdout line `BENCH_JSON ` and
//! `{"language":..,"rows":[{"client":..,"unary_p50_us":..,"unary_p99_us":..,
//! "concurrent_per_s":..,"forward_gbit_s":..|null,"exec_stdout_mib_s":..|null}]}`,
//! medians over the program's rounds.

use serde_json::{Value, json};

pub const JSON_PREFIX: &str = "BENCH_JSON ";

/// The inputs of a per-language program.
pub struct Inputs {
    pub endpoint: String,
    pub token: Option<String>,
    pub sandbox: String,
    pub iperf_port: u16,
    pub rounds: usize,
    pub forward_seconds: u64,
}

fn required(name: &str) -> String {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => value,
        _ => {
            eprintln!("{name} is not set");
            std::process::exit(2);
        }
    }
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => value.parse().unwrap_or_else(|_| {
            eprintln!("{name} is not a number");
            std::process::exit(2);
        }),
        _ => default,
    }
}

impl Inputs {
    pub fn from_env() -> Self {
        Self {
            endpoint: required("OPENSHELL_ENDPOINT"),
            token: std::env::var("OPENSHELL_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
            sandbox: required("OPENSHELL_BENCH_SANDBOX"),
            iperf_port: number("OPENSHELL_BENCH_IPERF_PORT", 0),
            rounds: number("OPENSHELL_BENCH_ROUNDS", 5usize).max(1),
            forward_seconds: number("OPENSHELL_BENCH_FORWARD_SECONDS", 3u64).max(1),
        }
    }
}

/// One client's figures (medians over rounds).
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub client: String,
    pub unary_p50_us: f64,
    pub unary_p99_us: f64,
    pub concurrent_per_s: f64,
    pub forward_gbit_s: Option<f64>,
    pub exec_stdout_mib_s: Option<f64>,
}

impl Row {
    pub fn to_json(&self) -> Value {
        json!({
            "client": self.client,
            "unary_p50_us": self.unary_p50_us,
            "unary_p99_us": self.unary_p99_us,
            "concurrent_per_s": self.concurrent_per_s,
            "forward_gbit_s": self.forward_gbit_s,
            "exec_stdout_mib_s": self.exec_stdout_mib_s,
        })
    }

    /// A row of a program's JSON line; `None` when a required figure is
    /// missing or not a number.
    pub fn from_json(value: &Value) -> Option<Self> {
        let optional = |key: &str| match &value[key] {
            Value::Null => Some(None),
            v => v.as_f64().map(Some),
        };
        Some(Self {
            client: value["client"].as_str()?.to_owned(),
            unary_p50_us: value["unary_p50_us"].as_f64()?,
            unary_p99_us: value["unary_p99_us"].as_f64()?,
            concurrent_per_s: value["concurrent_per_s"].as_f64()?,
            forward_gbit_s: optional("forward_gbit_s")?,
            exec_stdout_mib_s: optional("exec_stdout_mib_s")?,
        })
    }
}

/// The program's result line.
pub fn json_line(language: &str, rows: &[Row]) -> String {
    let rows: Vec<Value> = rows.iter().map(Row::to_json).collect();
    format!(
        "{JSON_PREFIX}{}",
        json!({ "language": language, "rows": rows })
    )
}

/// Parses a program's stdout: the language and rows of its last
/// `BENCH_JSON` line.
pub fn parse_output(stdout: &str) -> Result<(String, Vec<Row>), String> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(JSON_PREFIX))
        .ok_or("no BENCH_JSON line on stdout")?;
    let value: Value =
        serde_json::from_str(line).map_err(|e| format!("the BENCH_JSON line is not JSON: {e}"))?;
    let language = value["language"]
        .as_str()
        .ok_or("BENCH_JSON has no language")?
        .to_owned();
    let rows = value["rows"]
        .as_array()
        .ok_or("BENCH_JSON has no rows")?
        .iter()
        .map(|row| Row::from_json(row).ok_or_else(|| format!("a row misses a figure: {row}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((language, rows))
}

/// Median of the values (`None` for none).
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_survives_the_json_line() {
        let rows = [
            Row {
                client: "sdk".into(),
                unary_p50_us: 250.5,
                unary_p99_us: 400.0,
                concurrent_per_s: 12000.0,
                forward_gbit_s: Some(4.5),
                exec_stdout_mib_s: None,
            },
            Row {
                client: "tonic".into(),
                ..Row::default()
            },
        ];
        let out = format!("a table\n{}\n", json_line("rust", &rows));
        let (language, parsed) = parse_output(&out).unwrap();
        assert_eq!(language, "rust");
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].client, "sdk");
        assert_eq!(parsed[0].forward_gbit_s, Some(4.5));
        assert_eq!(parsed[0].exec_stdout_mib_s, None);
        assert_eq!(parsed[1].unary_p50_us, 0.0);
    }

    #[test]
    fn missing_figures_and_lines_are_errors() {
        assert!(parse_output("no json here").is_err());
        assert!(
            parse_output("BENCH_JSON {\"language\":\"x\",\"rows\":[{\"client\":\"a\"}]}").is_err()
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
