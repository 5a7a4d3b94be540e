//! Command-line flags that are only safe in some settings, judged from the
//! parsed arguments and where each value came from (clap's value source):
//!
//! - every hidden `serve` flag is a test or benchmark knob (`--driver none`
//!   writes sandbox tokens to disk, the delay flags slow the replica down):
//!   given on the command line it needs `--allow-test-flags`, so a
//!   production command line cannot pick one up by accident;
//! - a secret given as an argument (`--token`, `--peer-token`, a
//!   `--database-url` with a password) is readable by every local user in
//!   `/proc/<pid>/cmdline`: it works, with a warning that names the flag and
//!   a safer source, never the value.

use anyhow::bail;
use clap::ArgMatches;
use clap::parser::ValueSource;

/// Secret-bearing `serve` flags (clap ids) and where to put the secret instead.
const SECRET_FLAGS: [(&str, &str); 3] = [
    ("tokens", "--tokens-file or OPENSHELL_GATEWAY_TOKENS"),
    ("peer_token", "OPENSHELL_PEER_TOKEN"),
    ("database_url", "OPENSHELL_DATABASE_URL"),
];

/// Checks the `serve` arguments: an error for test flags without
/// `--allow-test-flags`, a warning for each secret on the command line.
pub fn check_serve(
    command: &clap::Command,
    matches: &ArgMatches,
    allow_test_flags: bool,
) -> anyhow::Result<()> {
    let from_command_line = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let test_flags: Vec<String> = command
        .get_arguments()
        .filter(|arg| arg.is_hide_set() && from_command_line(arg.get_id().as_str()))
        .map(flag_name)
        .collect();
    if !test_flags.is_empty() && !allow_test_flags {
        bail!(
            "{} {} for tests and benchmarks only: pass --allow-test-flags as well to use {}",
            test_flags.join(", "),
            if test_flags.len() == 1 { "is" } else { "are" },
            if test_flags.len() == 1 { "it" } else { "them" },
        );
    }
    for (id, instead) in SECRET_FLAGS {
        if !from_command_line(id) {
            continue;
        }
        if id == "database_url" && !url_has_password(matches, id) {
            continue;
        }
        let flag = command
            .get_arguments()
            .find(|arg| arg.get_id() == id)
            .map(flag_name)
            .unwrap_or_else(|| id.to_owned());
        tracing::warn!(
            "{flag} was given on the command line, which every local user can read \
             (ps, /proc/<pid>/cmdline); use {instead} instead"
        );
    }
    Ok(())
}

fn flag_name(arg: &clap::Arg) -> String {
    match arg.get_long() {
        Some(long) => format!("--{long}"),
        None => arg.get_id().to_string(),
    }
}

/// `scheme://user:password@host/...`: userinfo with a password.
fn url_has_password(matches: &ArgMatches, id: &str) -> bool {
    let Ok(Some(url)) = matches.try_get_one::<crate::secret::Secret>(id) else {
        return false;
    };
    let rest = url.expose().split_once("://").map_or("", |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}
