//! Unit tests of host mode that need no gateway. What a host does with a
//! gateway (assignments starting and stopping sandboxes, their processes
//! killed, sessions moving) is tested against the real gateway in
//! `supervisor/tests/host.rs` and `gateway/tests/hosts_e2e.rs`.

use std::path::Path;

use super::runtime::sandbox_dir;

#[test]
fn only_plain_names_become_sandbox_directories() {
    let root = Path::new("/srv/host");
    assert_eq!(
        sandbox_dir(root, "sb-1_a.b").as_deref(),
        Some(Path::new("/srv/host/sb-1_a.b"))
    );
    let long = "x".repeat(129);
    for bad in [
        "",
        ".",
        "..",
        "../escape",
        "a/b",
        "/abs",
        "sp ace",
        "é",
        long.as_str(),
    ] {
        assert_eq!(sandbox_dir(root, bad), None, "{bad:?}");
    }
    assert!(sandbox_dir(root, &"x".repeat(128)).is_some());
}
