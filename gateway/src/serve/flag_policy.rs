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
    let mut test_flags: Vec<String> = command
        .get_arguments()
        .filter(|arg| arg.is_hide_set() && from_command_line(arg.get_id().as_str()))
        .map(flag_name)
        .collect();
    // `--driver` is an operator's flag; only its `none` is a test knob.
    if from_command_line("driver")
        && matches.get_one::<crate::sandboxes::driver::DriverKind>("driver")
            == Some(&crate::sandboxes::driver::DriverKind::None)
    {
        test_flags.push("--driver none".to_owned());
    }
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
    matches
        .try_get_one::<crate::secret::Secret>(id)
        .ok()
        .flatten()
        .is_some_and(|url| has_password(url.expose()))
}

fn has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or("", |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{check_serve, has_password};
    use crate::Cli;

    fn check(args: &[&str], allow: bool) -> anyhow::Result<()> {
        let mut cli = Cli::command();
        let matches = cli
            .try_get_matches_from_mut(["openshell-gateway", "serve"].iter().chain(args))
            .unwrap();
        check_serve(
            cli.find_subcommand("serve").unwrap(),
            matches.subcommand_matches("serve").unwrap(),
            allow,
        )
    }

    #[test]
    fn hidden_flags_are_test_flags() {
        let err = check(&["--driver", "none", "--member-ttl-ms", "9"], false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--member-ttl-ms, --driver none are for tests and benchmarks only: \
             pass --allow-test-flags as well to use them"
        );
        assert!(check(&["--driver", "none"], true).is_ok());
        // The operator's drivers need no test flag.
        assert!(check(&["--driver", "hosts"], false).is_ok());
        assert!(check(&["--driver", "process"], false).is_ok());
        assert!(check(&["--dev", "--token", "t"], false).is_ok());
    }

    #[test]
    fn passwords_in_urls() {
        assert!(has_password("postgres://gw:pw@db/openshell"));
        assert!(has_password("postgres://gw:p@ss@db"));
        assert!(!has_password("postgres://gw@db/openshell"));
        assert!(!has_password("postgres://db/x?user=a:b@c"));
        assert!(!has_password("sqlite:///tmp/gateway.db"));
    }
}
