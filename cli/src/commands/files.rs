//! `openshell sandbox upload|download`: files and trees in and out of a
//! sandbox, through the core's file transfer (the sandbox's SFTP server,
//! owner-routed like any forward). A progress bar goes to stderr when it is
//! a terminal (not with `--quiet`); the summary goes to stdout.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Instant;

use openshell_sdk::{Progress, TransferOptions, TransferSummary};
use serde_json::json;

use crate::args::{DownloadArgs, TransferArgs, UploadArgs};
use crate::failure::Failure;
use crate::output::print_json;
use crate::settings::Settings;

/// Width of the bar itself, in cells.
const BAR: usize = 24;

fn options(args: &TransferArgs) -> TransferOptions {
    let mut options = TransferOptions::new();
    if let Some(name) = &args.ignore_file {
        options = options.ignore_file(name);
    }
    if !args.quiet && std::io::stderr().is_terminal() {
        let started = Instant::now();
        let drawn = Mutex::new(());
        options = options.progress(move |p: &Progress| {
            let _line = drawn.lock();
            eprint!("\r\x1b[2K{}", bar_line(p, started.elapsed().as_secs_f64()));
            let _ = std::io::stderr().flush();
        });
    }
    options
}

/// Bytes as people read them (binary units).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// One line of progress: bar, percent, bytes, rate, files, current path.
fn bar_line(p: &Progress, seconds: f64) -> String {
    let fraction = if p.bytes_total == 0 {
        if p.files_total == 0 {
            1.0
        } else {
            p.files_done as f64 / p.files_total as f64
        }
    } else {
        (p.bytes_done as f64 / p.bytes_total as f64).min(1.0)
    };
    let filled = (fraction * BAR as f64).round() as usize;
    let rate = if seconds > 0.0 {
        (p.bytes_done as f64 / seconds) as u64
    } else {
        0
    };
    let mut current = p.current.clone();
    if current.chars().count() > 40 {
        let tail: String = current.chars().rev().take(39).collect();
        current = format!("…{}", tail.chars().rev().collect::<String>());
    }
    format!(
        "[{}{}] {:>3}% {}/{} {}/s {}/{} files {current}",
        "#".repeat(filled),
        ".".repeat(BAR - filled),
        (fraction * 100.0) as u32,
        human(p.bytes_done),
        human(p.bytes_total),
        human(rate),
        p.files_done,
        p.files_total,
    )
}

fn finish_bar(args: &TransferArgs) {
    if !args.quiet && std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K");
        let _ = std::io::stderr().flush();
    }
}

fn report(verb: &str, summary: &TransferSummary, args: &TransferArgs, seconds: f64) {
    if args.json {
        print_json(&json!({
            "files": summary.files,
            "directories": summary.directories,
            "symlinks": summary.symlinks,
            "skipped_symlinks": summary.skipped_symlinks,
            "ignored": summary.ignored,
            "skipped_other": summary.skipped_other,
            "bytes": summary.bytes,
            "seconds": seconds,
        }));
        return;
    }
    if args.quiet {
        return;
    }
    let mut line = format!(
        "{verb} {} file{} ({})",
        summary.files,
        if summary.files == 1 { "" } else { "s" },
        human(summary.bytes)
    );
    if summary.directories > 0 {
        line.push_str(&format!(", {} directories", summary.directories));
    }
    if summary.symlinks > 0 {
        line.push_str(&format!(", {} symlinks", summary.symlinks));
    }
    if summary.skipped_symlinks > 0 {
        line.push_str(&format!(
            "; skipped {} symlinks pointing outside the tree",
            summary.skipped_symlinks
        ));
    }
    if summary.ignored > 0 {
        line.push_str(&format!("; ignored {}", summary.ignored));
    }
    if summary.skipped_other > 0 {
        line.push_str(&format!(
            "; skipped {} special files",
            summary.skipped_other
        ));
    }
    println!("{line} in {seconds:.1} s");
}

pub async fn upload(args: UploadArgs, settings: &Settings) -> Result<(), Failure> {
    let client = settings.connect().await?;
    let started = Instant::now();
    let result = client
        .upload(
            &args.name,
            &args.local,
            &args.remote,
            &options(&args.transfer),
        )
        .await;
    finish_bar(&args.transfer);
    let summary = result?;
    report(
        "uploaded",
        &summary,
        &args.transfer,
        started.elapsed().as_secs_f64(),
    );
    Ok(())
}

pub async fn download(args: DownloadArgs, settings: &Settings) -> Result<(), Failure> {
    let client = settings.connect().await?;
    let started = Instant::now();
    let result = client
        .download(
            &args.name,
            &args.remote,
            &args.local,
            &options(&args.transfer),
        )
        .await;
    finish_bar(&args.transfer);
    let summary = result?;
    report(
        "downloaded",
        &summary,
        &args.transfer,
        started.elapsed().as_secs_f64(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_the_bytes() {
        let p = Progress {
            bytes_done: 512,
            bytes_total: 1024,
            files_done: 0,
            files_total: 1,
            current: "/w/a.bin".into(),
        };
        let line = bar_line(&p, 1.0);
        assert!(
            line.starts_with("[############............]  50% 512 B/1.0 KiB"),
            "{line}"
        );
        assert!(line.ends_with("0/1 files /w/a.bin"), "{line}");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
