//! Command-line flags that are only safe in some settings, judged from the
//! parsed arguments and where each value came from (clap's value source):
//! every hidden `serve` flag is a test or benchmark knob (`--driver none`
//! writes sandbox tokens to disk, the delay flags slow the replica down):
//! given on the command line it needs `--allow-test-flags`, so a production
//! command line cannot pick one up by accident.

use anyhow::bail;
use clap::ArgMatches;
use clap::parser::ValueSource;

/// Checks the `serve` arguments: an error for test flags without
/// `--allow-test-flags`.
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
    Ok(())
}

fn flag_name(arg: &clap::Arg) -> String {
    match arg.get_long() {
        Some(long) => format!("--{long}"),
        None => arg.get_id().to_string(),
    }
}
