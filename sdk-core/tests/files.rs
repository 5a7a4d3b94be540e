//! File transfer (`Client::upload`, `download`, the stream forms,
//! `read_file`/`write_file`) against real processes: the gateway binary
//! (one replica, or `LocalCluster`'s three behind the edge), real
//! supervisors, and the sandbox's SFTP server run as an exec of the
//! sandbox. Every wait is bounded; processes are stopped by PID (the
//! harness's).

mod common;

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use bytes::Bytes;
use common::*;
use openshell_sdk::testing::{LocalCluster, LocalClusterOptions};
use openshell_sdk::{CallOptions, Client, Error, ExecRequest, TransferOptions};
use openshell_testkit::bin;

/// Writes `len` pseudo-random bytes (xorshift64*, a block at a time).
fn random_file(path: &Path, len: u64, seed: u64) {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            word.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        out.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    out.flush().unwrap();
}

/// SHA-256 of a local file, by `openssl dgst` (fast in a debug build, and
/// with the CPU's SHA instructions).
fn sha256_local(path: &Path) -> String {
    let out = Command::new("openssl")
        .args(["dgst", "-sha256", "-r"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    first_word(&String::from_utf8_lossy(&out.stdout))
}

fn first_word(text: &str) -> String {
    text.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Starts writing `len` bytes of AES-CTR keystream (random to any test,
/// fixed by `seed`) to `path`, in a process of its own: `openssl enc`
/// is far faster than any generator in a debug build.
fn start_random_file(path: &Path, len: u64, seed: u8) -> std::process::Child {
    let key = format!("{seed:02x}").repeat(16);
    let script = format!(
        "openssl enc -aes-128-ctr -K {key} -iv 00000000000000000000000000000000 -in /dev/zero 2>/dev/null | head -c {len} > '{}'",
        path.display()
    );
    Command::new("sh").args(["-c", &script]).spawn().unwrap()
}

fn wait_ok(mut child: std::process::Child) {
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// Runs `script` with `sh -c` in the sandbox; its stdout (asserted exit 0).
async fn sh(client: &Client, sandbox: &str, script: &str) -> String {
    let out = within(
        120,
        "exec",
        client.exec(
            ExecRequest::new(sandbox, ["sh", "-c", script]),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(out.exit_code, 0, "{script}: {:?}", out.stderr_text());
    out.stdout_text()
}

/// Temp files of uploads left anywhere under the sandbox's working
/// directory.
async fn leftovers(client: &Client, sandbox: &str) -> String {
    sh(client, sandbox, "find . -name '*.openshell-part-*'").await
}

fn local_leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                stack.push(path.clone());
            }
            if path.to_string_lossy().contains(".openshell-part-") {
                found.push(path);
            }
        }
    }
    found
}

/// Peak resident memory of this process so far (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn assert_code(err: &Error, code: &str, path: &str) {
    assert_eq!(err.code(), code, "{err}");
    assert!(err.message().contains(path), "no {path} in {err}");
    assert!(err.message().len() < 600, "{err}");
    assert!(!err.message().contains(TOKEN), "{err}");
}

fn cluster_options() -> LocalClusterOptions {
    LocalClusterOptions::new().gateway_bin(bin("openshell-gateway"))
}

/// A single-replica gateway with one ready sandbox.
async fn one_sandbox(name: &str) -> (openshell_testkit::Gateway, Client) {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, name).await;
    (gw, client)
}

/// 2 GiB of random bytes up and back through the edge of a 3-replica
/// cluster: equal both ways, and the client's memory stays flat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_2_gib_file_round_trips_through_the_edge_with_flat_memory() {
    const SIZE: u64 = 2 << 30;
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("big.bin");
    // Generated while the cluster starts.
    let generating = start_random_file(&source, SIZE, 7);
    let cluster = LocalCluster::start(cluster_options()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let sandbox = "files-big";
    create_ready(&client, sandbox).await;
    let cluster_ready = started.elapsed();
    wait_ok(generating);
    let generated = started.elapsed();
    let want = sha256_local(&source);
    let rss_before = peak_rss();

    let t = Instant::now();
    let calls = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&calls);
    let options = TransferOptions::new().progress(move |p| {
        assert!(p.bytes_done <= p.bytes_total);
        seen.fetch_add(1, Ordering::Relaxed);
    });
    let up = within(
        300,
        "upload",
        client.upload(sandbox, &source, "big.bin", &options),
    )
    .await
    .unwrap();
    let upload_time = t.elapsed();
    assert_eq!((up.files, up.bytes), (1, SIZE));
    let progress_calls = calls.load(Ordering::Relaxed);
    // Throttled to ~10 a second, and not silent.
    assert!(progress_calls >= 2, "{progress_calls}");
    assert!(
        progress_calls <= upload_time.as_millis() as u64 / 100 + 3,
        "{progress_calls} progress calls in {upload_time:?}"
    );
    let remote_sum = first_word(&sh(&client, sandbox, "openssl dgst -sha256 -r big.bin").await);
    assert_eq!(remote_sum, want);

    let back = dir.path().join("back.bin");
    let t = Instant::now();
    let down = within(
        300,
        "download",
        client.download(sandbox, "big.bin", &back, &TransferOptions::new()),
    )
    .await
    .unwrap();
    let download_time = t.elapsed();
    assert_eq!((down.files, down.bytes), (1, SIZE));
    assert_eq!(sha256_local(&back), want);
    let growth = peak_rss().saturating_sub(rss_before);
    let mib = |d: Duration| SIZE as f64 / (1 << 20) as f64 / d.as_secs_f64();
    println!(
        "2 GiB: cluster ready at {cluster_ready:?}, file generated at {generated:?}, upload {upload_time:?} ({:.0} MiB/s), download {download_time:?} ({:.0} MiB/s); peak RSS {} MiB (+{} MiB); total {:?}",
        mib(upload_time),
        mib(download_time),
        peak_rss() >> 20,
        growth >> 20,
        started.elapsed()
    );
    assert!(growth < 300 << 20, "peak RSS grew by {} MiB", growth >> 20);
    assert!(local_leftovers(dir.path()).is_empty());
    assert_eq!(leftovers(&client, sandbox).await, "");
    drop(dir);
    cluster.stop().await.unwrap();
}

fn set_mtime(path: &Path, secs: u64) {
    let time = UNIX_EPOCH + Duration::from_secs(secs);
    let file = std::fs::File::options()
        .write(!path.is_dir())
        .read(path.is_dir())
        .open(path)
        .unwrap();
    file.set_times(
        std::fs::FileTimes::new()
            .set_accessed(time)
            .set_modified(time),
    )
    .unwrap();
}

fn mtime(path: &Path) -> i64 {
    std::fs::symlink_metadata(path).unwrap().mtime()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// A tree with nested directories, modes, mtimes, an inside and two
/// outside symlinks and ignore files, up and back.
#[tokio::test]
async fn a_directory_tree_round_trips_with_modes_times_links_and_ignores() {
    let (_gw, client) = one_sandbox("files-tree").await;
    let sandbox = "files-tree";
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("proj");
    std::fs::create_dir_all(tree.join("src/deep/deeper")).unwrap();
    std::fs::create_dir_all(tree.join("build")).unwrap();
    std::fs::write(tree.join("README"), b"read me\n").unwrap();
    std::fs::write(tree.join("src/main.rs"), b"fn main() {}\n").unwrap();
    std::fs::write(tree.join("src/deep/deeper/data"), vec![9u8; 700_000]).unwrap();
    std::fs::write(tree.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::write(tree.join("debug.log"), b"noise").unwrap();
    std::fs::write(tree.join("src/keep.log"), b"kept").unwrap();
    std::fs::write(tree.join("src/other.log"), b"dropped").unwrap();
    std::fs::write(tree.join("build/out.o"), b"obj").unwrap();
    std::fs::write(tree.join(".ignore-me"), b"*.log\nbuild/\n").unwrap();
    std::fs::write(tree.join("src/.ignore-me"), b"!keep.log\n").unwrap();
    std::fs::set_permissions(tree.join("run.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(tree.join("src/main.rs"), PermissionsExt::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink("../README", tree.join("src/readme-link")).unwrap();
    std::os::unix::fs::symlink("../../outside", tree.join("src/escape")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", tree.join("abs-link")).unwrap();
    set_mtime(&tree.join("README"), 1_000_000_000);
    set_mtime(&tree.join("src/deep/deeper/data"), 1_200_000_000);
    std::fs::set_permissions(tree.join("src/deep"), PermissionsExt::from_mode(0o750)).unwrap();
    set_mtime(&tree.join("src/deep"), 1_100_000_000);

    let options = TransferOptions::new().ignore_file(".ignore-me");
    let up = within(
        60,
        "upload tree",
        client.upload(sandbox, &tree, ".", &options),
    )
    .await
    .unwrap();
    assert_eq!(up.skipped_symlinks, 2, "{up:?}");
    assert_eq!(up.symlinks, 1, "{up:?}");
    // debug.log, build/, src/other.log
    assert_eq!(up.ignored, 3, "{up:?}");
    // README, run.sh, src/main.rs, src/keep.log, the data file, two ignore files.
    assert_eq!(up.files, 7, "{up:?}");
    let listing = sh(
        &client,
        sandbox,
        "cd proj && find . | sort && stat -c '%n %a %Y' README run.sh src/main.rs src/deep src/deep/deeper/data && readlink src/readme-link",
    )
    .await;
    for present in ["./src/keep.log", "./src/readme-link", "./.ignore-me"] {
        assert!(listing.contains(present), "{listing}");
    }
    for absent in ["debug.log", "build", "other.log", "escape", "abs-link"] {
        assert!(!listing.contains(absent), "{absent} in {listing}");
    }
    assert!(listing.contains("README 644 1000000000"), "{listing}");
    assert!(listing.contains("run.sh 755 "), "{listing}");
    assert!(listing.contains("src/main.rs 640 "), "{listing}");
    assert!(listing.contains("src/deep 750 1100000000"), "{listing}");
    assert!(
        listing.contains("src/deep/deeper/data 644 1200000000"),
        "{listing}"
    );
    assert!(listing.trim_end().ends_with("../README"), "{listing}");

    // And back, with the same ignore rules read from the sandbox's files.
    sh(
        &client,
        sandbox,
        "echo x > proj/src/late.log && ln -s /etc proj/etc-link",
    )
    .await;
    let back = dir.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let down = within(
        60,
        "download tree",
        client.download(sandbox, "proj", &back, &options),
    )
    .await
    .unwrap();
    let got = back.join("proj");
    assert_eq!(down.files, 7, "{down:?}");
    assert_eq!(down.ignored, 1, "{down:?}"); // src/late.log
    assert_eq!(down.skipped_symlinks, 1, "{down:?}"); // etc-link
    assert_eq!(std::fs::read(got.join("README")).unwrap(), b"read me\n");
    assert_eq!(
        std::fs::read(got.join("src/deep/deeper/data")).unwrap(),
        vec![9u8; 700_000]
    );
    assert_eq!(mtime(&got.join("README")), 1_000_000_000);
    assert_eq!(mtime(&got.join("src/deep")), 1_100_000_000);
    assert_eq!(mode(&got.join("src/deep")), 0o750);
    assert_eq!(mode(&got.join("run.sh")), 0o755);
    assert_eq!(mode(&got.join("src/main.rs")), 0o640);
    assert_eq!(
        std::fs::read_link(got.join("src/readme-link")).unwrap(),
        Path::new("../README")
    );
    assert!(!got.join("src/late.log").exists());
    assert!(std::fs::symlink_metadata(got.join("etc-link")).is_err());
    assert!(local_leftovers(dir.path()).is_empty());
    assert_eq!(leftovers(&client, sandbox).await, "");
}

/// The stream forms and the small-file calls.
#[tokio::test]
async fn streams_and_small_files() {
    let (_gw, client) = one_sandbox("files-streams").await;
    let sandbox = "files-streams";
    let options = TransferOptions::new();
    let mut sink = client
        .upload_stream(sandbox, "streamed.bin", &options)
        .await
        .unwrap();
    let mut want = Vec::new();
    for i in 0..100u32 {
        let piece: Vec<u8> = (0..(i * 997 % 70_000)).map(|b| (b ^ i) as u8).collect();
        want.extend_from_slice(&piece);
        sink.write(Bytes::from(piece)).await.unwrap();
    }
    // Not there before finish.
    assert!(
        sh(&client, sandbox, "ls")
            .await
            .lines()
            .all(|l| l != "streamed.bin")
    );
    let summary = sink.finish().await.unwrap();
    assert_eq!(summary.bytes, want.len() as u64);
    let mut source = client
        .download_stream(sandbox, "streamed.bin", &options)
        .await
        .unwrap();
    assert_eq!(source.size(), want.len() as u64);
    let mut got = Vec::new();
    while let Some(chunk) = source.next_chunk().await.unwrap() {
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, want);

    // A dropped sink leaves nothing; an aborted one neither.
    let mut sink = client
        .upload_stream(sandbox, "dropped.bin", &options)
        .await
        .unwrap();
    sink.write(Bytes::from(vec![1u8; 3 << 20])).await.unwrap();
    drop(sink);
    let mut sink = client
        .upload_stream(sandbox, "aborted.bin", &options)
        .await
        .unwrap();
    sink.write(Bytes::from(vec![1u8; 1 << 20])).await.unwrap();
    sink.abort().await;
    within(10, "temp files removed", async {
        while !leftovers(&client, sandbox).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let ls = sh(&client, sandbox, "ls -a").await;
    assert!(
        !ls.contains("dropped.bin") && !ls.contains("aborted.bin"),
        "{ls}"
    );

    client
        .write_file(sandbox, "sub-less.txt", b"hello", CallOptions::new())
        .await
        .unwrap();
    // Replaced atomically.
    client
        .write_file(sandbox, "sub-less.txt", b"hello again", CallOptions::new())
        .await
        .unwrap();
    let text = client
        .read_file(sandbox, "sub-less.txt", CallOptions::new())
        .await
        .unwrap();
    assert_eq!(text, b"hello again");
    assert_eq!(
        sh(&client, sandbox, "stat -c %a sub-less.txt").await.trim(),
        "644"
    );
    // Over the cap: refused before reading.
    sh(&client, sandbox, "truncate -s 65M huge.bin").await;
    let err = client
        .read_file(sandbox, "huge.bin", CallOptions::new())
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "huge.bin");
    assert!(err.message().contains("64 MiB"), "{err}");
}

#[tokio::test]
async fn missing_files_are_not_found() {
    let (_gw, client) = one_sandbox("files-missing").await;
    let sandbox = "files-missing";
    let dir = tempfile::tempdir().unwrap();
    let options = TransferOptions::new();
    let err = client
        .upload(sandbox, &dir.path().join("nope.txt"), ".", &options)
        .await
        .unwrap_err();
    assert_code(&err, "not_found", "nope.txt");
    let err = client
        .download(sandbox, "absent.txt", dir.path(), &options)
        .await
        .unwrap_err();
    assert_code(&err, "not_found", "absent.txt");
    let err = client
        .read_file(sandbox, "absent.txt", CallOptions::new())
        .await
        .unwrap_err();
    assert_code(&err, "not_found", "absent.txt");
    // A directory that does not exist to upload into.
    std::fs::write(dir.path().join("f.txt"), b"x").unwrap();
    let err = client
        .upload(
            sandbox,
            &dir.path().join("f.txt"),
            "no/such/dir/f.txt",
            &options,
        )
        .await
        .unwrap_err();
    assert_code(&err, "not_found", "no/such/dir");
    // An unknown sandbox.
    let err = client
        .upload(
            sandbox.replace("missing", "ghost").as_str(),
            &dir.path().join("f.txt"),
            ".",
            &options,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    assert!(local_leftovers(dir.path()).is_empty());
    assert_eq!(leftovers(&client, sandbox).await, "");
}

#[tokio::test]
async fn a_directory_where_a_file_is_expected_is_a_failed_precondition() {
    let (_gw, client) = one_sandbox("files-kind").await;
    let sandbox = "files-kind";
    let dir = tempfile::tempdir().unwrap();
    let options = TransferOptions::new();
    sh(&client, sandbox, "mkdir -p d/f.txt e && echo x > plain").await;
    std::fs::write(dir.path().join("f.txt"), b"x").unwrap();
    // d/f.txt is a directory: a file cannot take its place.
    let err = client
        .upload(sandbox, &dir.path().join("f.txt"), "d/", &options)
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "d/f.txt");
    assert!(err.message().contains("is a directory"), "{err}");
    let err = client
        .upload_stream(sandbox, "e", &options)
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "/e");
    let err = client
        .read_file(sandbox, "e", CallOptions::new())
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "/e");
    // The reverse: a local tree onto a remote file, a remote tree onto a
    // local file.
    std::fs::create_dir(dir.path().join("tree")).unwrap();
    let err = client
        .upload(sandbox, &dir.path().join("tree"), "plain", &options)
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "plain");
    let err = client
        .download(sandbox, "d", &dir.path().join("f.txt"), &options)
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "f.txt");
    // A file uploaded "inside" a path that is a file.
    let err = client
        .upload(sandbox, &dir.path().join("f.txt"), "plain/f.txt", &options)
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "plain");
    assert_eq!(std::fs::read(dir.path().join("f.txt")).unwrap(), b"x");
    assert!(local_leftovers(dir.path()).is_empty());
    assert_eq!(leftovers(&client, sandbox).await, "");
    assert_eq!(sh(&client, sandbox, "cat plain").await, "x\n");
}

#[tokio::test]
async fn paths_outside_the_working_directory_are_invalid_arguments() {
    let (_gw, client) = one_sandbox("files-outside").await;
    let sandbox = "files-outside";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), b"x").unwrap();
    let options = TransferOptions::new();
    for remote in [
        "/etc/openshell-files-test",
        "../escaped.txt",
        "a/../../escaped.txt",
        "/",
    ] {
        let err = client
            .upload(sandbox, &dir.path().join("f.txt"), remote, &options)
            .await
            .unwrap_err();
        assert_code(&err, "invalid_argument", remote);
        let err = client
            .download(sandbox, remote, &dir.path().join("g.txt"), &options)
            .await
            .unwrap_err();
        assert_code(&err, "invalid_argument", remote);
    }
    let err = client
        .write_file(sandbox, "/tmp/x", b"x", CallOptions::new())
        .await
        .unwrap_err();
    assert_code(&err, "invalid_argument", "/tmp/x");
    // Nothing was written: not outside, not next to the working directory.
    let check = sh(
        &client,
        sandbox,
        "ls /etc/openshell-files-test ../escaped.txt /tmp/x 2>/dev/null; true",
    )
    .await;
    assert_eq!(check, "");
    // An absolute path inside is fine.
    let root = sh(&client, sandbox, "pwd").await.trim().to_owned();
    client
        .upload(
            sandbox,
            &dir.path().join("f.txt"),
            &format!("{root}/inside.txt"),
            &options,
        )
        .await
        .unwrap();
    assert_eq!(sh(&client, sandbox, "cat inside.txt").await, "x");
}

/// What a sandbox could try against the user's machine through a
/// download, and names file transfer cannot carry: a chain of links that
/// leaves the tree though each looks inside, a name that is not UTF-8 (on
/// either side), a local link standing where a directory of the tree goes.
#[tokio::test]
async fn hostile_links_and_names_are_refused_or_skipped() {
    let (_gw, client) = one_sandbox("files-hostile").await;
    let sandbox = "files-hostile";
    let dir = tempfile::tempdir().unwrap();
    let options = TransferOptions::new();

    // `s -> .` stays; `e -> s/..` would be the parent of the tree.
    sh(
        &client,
        sandbox,
        "mkdir -p chain && cd chain && ln -s . s && ln -s s/.. e && echo x > f",
    )
    .await;
    let down = client
        .download(sandbox, "chain", dir.path(), &options)
        .await
        .unwrap();
    assert_eq!((down.symlinks, down.skipped_symlinks), (1, 1), "{down:?}");
    assert!(std::fs::symlink_metadata(dir.path().join("chain/e")).is_err());
    assert_eq!(
        std::fs::read_link(dir.path().join("chain/s")).unwrap(),
        Path::new(".")
    );

    // A remote name that is not UTF-8: refused, naming the directory,
    // before anything of the tree is written.
    sh(
        &client,
        sandbox,
        "mkdir -p odd && printf x > \"odd/$(printf 'a\\377b')\"",
    )
    .await;
    let err = client
        .download(sandbox, "odd", &dir.path().join("odd-copy"), &options)
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "odd");
    assert!(err.message().contains("UTF-8"), "{err}");
    assert!(!dir.path().join("odd-copy").exists());

    // A local name that is not UTF-8: refused before anything is written.
    let local = dir.path().join("up");
    std::fs::create_dir(&local).unwrap();
    let bad = std::ffi::OsStr::from_bytes(b"a\xffb");
    std::fs::write(local.join(bad), b"x").unwrap();
    let err = client
        .upload(sandbox, &local, ".", &options)
        .await
        .unwrap_err();
    assert_code(&err, "invalid_argument", "up");
    assert_eq!(sh(&client, sandbox, "ls -d up 2>/dev/null; true").await, "");

    // A local link where the tree has a directory is not followed.
    let dest = dir.path().join("dest");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(dest.join("chain")).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    sh(
        &client,
        sandbox,
        "mkdir -p chain/sub && echo y > chain/sub/g",
    )
    .await;
    std::os::unix::fs::symlink(&elsewhere, dest.join("chain/sub")).unwrap();
    let err = client
        .download(sandbox, "chain", &dest, &options)
        .await
        .unwrap_err();
    assert_code(&err, "failed_precondition", "sub");
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    assert!(local_leftovers(dir.path()).is_empty());
}

#[tokio::test]
async fn permission_denied_is_reported_and_leaves_nothing() {
    let (_gw, client) = one_sandbox("files-denied").await;
    let sandbox = "files-denied";
    let uid = sh(&client, sandbox, "id -u").await;
    assert_ne!(
        uid.trim(),
        "0",
        "execs run as root here: DAC would not deny"
    );
    sh(
        &client,
        sandbox,
        "mkdir ro && echo secret > ro/locked && chmod 000 ro/locked && chmod 555 ro",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), b"x").unwrap();
    let options = TransferOptions::new();
    let err = client
        .upload(sandbox, &dir.path().join("f.txt"), "ro/", &options)
        .await
        .unwrap_err();
    assert_code(&err, "permission_denied", "ro/f.txt");
    let err = client
        .download(sandbox, "ro/locked", &dir.path().join("locked"), &options)
        .await
        .unwrap_err();
    assert_code(&err, "permission_denied", "ro/locked");
    assert!(!dir.path().join("locked").exists());
    assert!(local_leftovers(dir.path()).is_empty());
    assert_eq!(sh(&client, sandbox, "ls -a ro").await, ".\n..\nlocked\n");
}

/// The host PID of a process in the sandbox's mount namespace (its PID 1
/// or any other), found by the namespace's inode.
async fn pid_in_mount_ns_of(client: &Client, sandbox: &str) -> i32 {
    let ns = sh(client, sandbox, "readlink /proc/self/ns/mnt").await;
    let ns = ns.trim();
    let own = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    assert_ne!(
        own.to_string_lossy(),
        ns,
        "the sandbox shares our mount namespace"
    );
    for entry in std::fs::read_dir("/proc").unwrap() {
        let entry = entry.unwrap();
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
            .is_ok_and(|l| l.to_string_lossy() == ns)
        {
            return pid;
        }
    }
    panic!("no process in mount namespace {ns}");
}

#[tokio::test]
async fn no_space_left_is_resource_exhausted_and_leaves_nothing() {
    let (_gw, client) = one_sandbox("files-full").await;
    let sandbox = "files-full";
    sh(&client, sandbox, "mkdir small").await;
    let root = sh(&client, sandbox, "pwd").await.trim().to_owned();
    let pid = pid_in_mount_ns_of(&client, sandbox).await;
    let mounted = Command::new("nsenter")
        .args([
            "-t",
            &pid.to_string(),
            "-m",
            "mount",
            "-t",
            "tmpfs",
            "-o",
            "size=256k,mode=1777",
            "tmpfs",
        ])
        .arg(format!("{root}/small"))
        .status()
        .unwrap();
    assert!(mounted.success());
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.bin");
    random_file(&big, 2 << 20, 3);
    let options = TransferOptions::new();
    let err = within(
        60,
        "upload",
        client.upload(sandbox, &big, "small/", &options),
    )
    .await
    .unwrap_err();
    assert_code(&err, "resource_exhausted", "small/big.bin");
    assert!(err.message().contains("no space left"), "{err}");
    let err = client
        .write_file(
            sandbox,
            "small/w.bin",
            &vec![0u8; 1 << 20],
            CallOptions::new(),
        )
        .await
        .unwrap_err();
    assert_code(&err, "resource_exhausted", "small/w.bin");
    assert_eq!(sh(&client, sandbox, "ls -a small").await, ".\n..\n");
    // Space is there again once the temp files are gone: a small file fits.
    client
        .write_file(sandbox, "small/ok.txt", b"fits", CallOptions::new())
        .await
        .unwrap();
    assert_eq!(leftovers(&client, sandbox).await, "");
}

/// The owner replica is SIGKILLed (by PID, through the harness) in the
/// middle of a large upload: the upload fails cleanly (or completes, once),
/// nothing half-written is left, and the next upload succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_killed_mid_upload_leaves_nothing_half_written() {
    const SIZE: u64 = 768 << 20;
    let cluster = LocalCluster::start(cluster_options()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let sandbox = "files-failover";
    create_ready(&client, sandbox).await;
    let owner = cluster.owner_of(sandbox).await.unwrap().expect("an owner");
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("large.bin");
    wait_ok(start_random_file(&source, SIZE, 11));
    let want = sha256_local(&source);
    let done = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&done);
    let options =
        TransferOptions::new().progress(move |p| seen.store(p.bytes_done, Ordering::Relaxed));
    let upload = {
        let client = client.clone();
        let source = source.clone();
        tokio::spawn(async move { client.upload(sandbox, &source, "large.bin", &options).await })
    };
    within(120, "upload under way", async {
        while done.load(Ordering::Relaxed) < 64 << 20 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    cluster.kill_replica(&owner).await.unwrap();
    let result = within(180, "upload end", upload).await.unwrap();
    // The supervisor reconnects to another replica.
    within(60, "owner moved", async {
        loop {
            if let Ok(Some(now)) = cluster.owner_of(sandbox).await
                && now != owner
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    match &result {
        Ok(summary) => {
            assert_eq!(summary.bytes, SIZE);
            let sum = sh(&client, sandbox, "openssl dgst -sha256 -r large.bin").await;
            assert_eq!(first_word(&sum), want);
        }
        Err(err) => {
            println!("upload failed as the owner died: {err}");
            // The sandbox's server removes the temp file once its stream
            // is gone (bounded: its exit grace).
            within(30, "temp file removed", async {
                while !sh(&client, sandbox, "ls -a")
                    .await
                    .lines()
                    .all(|l| !l.contains("large.bin"))
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
            .await;
        }
    }
    assert_eq!(leftovers(&client, sandbox).await, "");
    // And the next upload goes through.
    let again = within(
        180,
        "second upload",
        client.upload(sandbox, &source, "large.bin", &TransferOptions::new()),
    )
    .await
    .unwrap();
    assert_eq!(again.bytes, SIZE);
    let sum = sh(&client, sandbox, "openssl dgst -sha256 -r large.bin").await;
    assert_eq!(first_word(&sum), want);
    assert_eq!(leftovers(&client, sandbox).await, "");
    cluster.stop().await.unwrap();
}
