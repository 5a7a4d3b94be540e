//! `openshell-bench files`: file transfer through the SDK
//! (`Client::upload` / `Client::download`: SFTP over one `ForwardTcp`
//! stream, 16 requests of 256 KiB in flight) against `scp` through
//! `openshell ssh-proxy` (OpenSSH's scp, SFTP mode, over the sandbox's
//! embedded SSH server: the same stream kind plus SSH's encryption).
//!
//! One dev gateway, one sandbox (`--isolation` as the gateway's default),
//! one file of `OPENSHELL_BENCH_FILE_MIB` MiB (default 1024) of
//! AES-CTR keystream. Rounds (`OPENSHELL_BENCH_ROUNDS`, default 3) of one
//! run per arm, the arms in a random order per round; medians of MB/s
//! (10^6 bytes per second) and the ratios SDK / scp (goal: at least 1.0).
//! Every copy is checked by size.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, TransferOptions};
use openshell_testkit::{Gateway, GatewayOptions, bin};

use crate::measure::interleaved;

const ARMS: [&str; 4] = ["sdk upload", "scp upload", "sdk download", "scp download"];
const GOAL: f64 = 1.0;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn run(command: &mut Command) {
    let out = command.output().expect("start a command");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openshell ssh-config` for the sandbox, with a known_hosts of its own.
fn ssh_config(gw: &Gateway, dir: &Path) -> PathBuf {
    let out = Command::new(bin("openshell"))
        .args(["ssh-config", "bench"])
        .env("OPENSHELL_ENDPOINT", &gw.url)
        .env("XDG_CONFIG_HOME", dir)
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("ssh_config");
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

pub async fn run_bench() {
    let mib = env_number("OPENSHELL_BENCH_FILE_MIB", 1024);
    let rounds = env_number("OPENSHELL_BENCH_ROUNDS", 3) as usize;
    let size = mib << 20;
    let gw = Gateway::start(GatewayOptions::dev());
    let client = Client::connect(ClientConfig::builder(gw.url.clone()).build().unwrap())
        .await
        .unwrap();
    let sandboxes = client.sandboxes();
    sandboxes
        .create(CreateSandbox::new().name("bench"), CallOptions::new())
        .await
        .unwrap();
    sandboxes
        .wait_ready("bench", CallOptions::new())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source.bin");
    run(Command::new("sh").args([
        "-c",
        &format!(
            "openssl enc -aes-128-ctr -K 0f0e0d0c0b0a09080706050403020100 -iv 00000000000000000000000000000000 -in /dev/zero 2>/dev/null | head -c {size} > '{}'",
            source.display()
        ),
    ]));
    let config = ssh_config(&gw, dir.path());
    // The ProxyCommand runs `openshell` by the name ssh-config wrote.
    let path = format!(
        "{}:{}",
        bin("openshell").parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let scp = |from: &str, to: &str| {
        run(Command::new("scp")
            .args(["-q", "-F"])
            .arg(&config)
            .args([from, to])
            .env("OPENSHELL_ENDPOINT", &gw.url)
            .env("XDG_CONFIG_HOME", dir.path())
            .env("PATH", &path));
    };
    let back = dir.path().join("back.bin");
    let options = TransferOptions::new();
    // Warm-up: the remote file exists for the first download.
    client
        .upload("bench", &source, "data.bin", &options)
        .await
        .unwrap();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); ARMS.len()];
    for arm in interleaved(ARMS.len(), rounds) {
        let _ = std::fs::remove_file(&back);
        let started = Instant::now();
        match arm {
            0 => {
                client
                    .upload("bench", &source, "data.bin", &options)
                    .await
                    .unwrap();
            }
            1 => scp(&source.to_string_lossy(), "bench:data.bin"),
            2 => {
                client
                    .download("bench", "data.bin", &back, &options)
                    .await
                    .unwrap();
            }
            _ => scp("bench:data.bin", &back.to_string_lossy()),
        }
        let took = started.elapsed().max(Duration::from_micros(1));
        if arm >= 2 {
            assert_eq!(
                std::fs::metadata(&back).unwrap().len(),
                size,
                "{}",
                ARMS[arm]
            );
        } else {
            let remote = client
                .exec(
                    openshell_sdk::ExecRequest::new("bench", ["stat", "-c", "%s", "data.bin"]),
                    CallOptions::new(),
                )
                .await
                .unwrap();
            assert_eq!(
                remote.stdout_text().trim(),
                size.to_string(),
                "{}",
                ARMS[arm]
            );
        }
        rates[arm].push(size as f64 / 1e6 / took.as_secs_f64());
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    println!("files: {mib} MiB, {rounds} rounds, medians (MB/s = 10^6 bytes/s)");
    for (arm, rate) in ARMS.iter().zip(&medians) {
        println!("  {arm:<13} {rate:>8.1} MB/s");
    }
    for (what, sdk, scp) in [
        ("upload", medians[0], medians[1]),
        ("download", medians[2], medians[3]),
    ] {
        let ratio = sdk / scp;
        let verdict = if ratio >= GOAL { "ok" } else { "BELOW GOAL" };
        println!("  {what:<9} SDK / scp = {ratio:.2}x (goal >= {GOAL:.1}x) {verdict}");
    }
}
