//! `openshell sandbox upload|download` against a real 3-replica cluster
//! behind the edge: a file and a tree both ways, `--ignore-file`, `--json`,
//! no progress bar when stderr is not a terminal, and a missing path as one
//! clear error line.

mod common;

use common::*;

#[test]
fn upload_and_download_files_and_trees() {
    let c = Cluster::start();
    c.create_ready("cli-files");
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(tree.join("sub/b.bin"), vec![7u8; 3 << 20]).unwrap();
    std::fs::write(tree.join("sub/skip.tmp"), b"no").unwrap();
    std::fs::write(tree.join(".ignore"), b"*.tmp\n").unwrap();

    // A tree, with an ignore file: the summary on stdout, nothing on
    // stderr (not a terminal: no bar).
    let out = c
        .cli()
        .args(["sandbox", "upload", "cli-files"])
        .args([tree.to_str().unwrap()])
        .args([".", "--ignore-file", ".ignore"])
        .run(60);
    out.success();
    assert!(
        out.stdout
            .starts_with("uploaded 3 files (3.0 MiB), 2 directories; ignored 1"),
        "{}",
        out.stdout
    );
    assert_eq!(out.stderr, "");
    let listing = c
        .cli()
        .args([
            "exec",
            "cli-files",
            "--",
            "sh",
            "-c",
            "find tree | sort; cat tree/a.txt",
        ])
        .run(30);
    assert_eq!(
        listing.success().stdout,
        "tree\ntree/.ignore\ntree/a.txt\ntree/sub\ntree/sub/b.bin\nalpha\n"
    );

    // One file, default remote (the working directory), --json.
    let single = dir.path().join("single.txt");
    std::fs::write(&single, b"one\n").unwrap();
    let out = c
        .cli()
        .args(["sandbox", "upload", "cli-files"])
        .args([single.to_str().unwrap()])
        .args(["--json"])
        .run(30);
    let summary = out.success().json();
    assert_eq!(summary["files"], 1);
    assert_eq!(summary["bytes"], 4);

    // Back: the tree into a local directory, a file to a new name.
    let back = dir.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let out = c
        .cli()
        .args(["sandbox", "download", "cli-files", "tree"])
        .args([back.to_str().unwrap()])
        .args(["--quiet"])
        .run(60);
    out.success();
    assert_eq!(out.stdout, "");
    assert_eq!(std::fs::read(back.join("tree/a.txt")).unwrap(), b"alpha\n");
    assert_eq!(
        std::fs::read(back.join("tree/sub/b.bin")).unwrap(),
        vec![7u8; 3 << 20]
    );
    let copy = dir.path().join("copy.txt");
    c.cli()
        .args(["sandbox", "download", "cli-files", "single.txt"])
        .args([copy.to_str().unwrap()])
        .run(30)
        .success();
    assert_eq!(std::fs::read(&copy).unwrap(), b"one\n");

    // Bad input: one line, the path named.
    let out = c
        .cli()
        .args(["sandbox", "download", "cli-files", "missing.txt"])
        .args([copy.to_str().unwrap()])
        .run(30);
    out.one_line_error(1, "not_found");
    assert!(out.stderr.contains("missing.txt"), "{}", out.stderr);
    let out = c
        .cli()
        .args(["sandbox", "upload", "cli-files"])
        .args([single.to_str().unwrap()])
        .args(["/etc/passwd"])
        .run(30);
    out.one_line_error(1, "invalid_argument");
    assert!(out.stderr.contains("/etc/passwd"), "{}", out.stderr);
}
