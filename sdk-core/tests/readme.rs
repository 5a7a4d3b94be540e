//! The README's quick start is `examples/quickstart.rs`, which the examples
//! run against a cluster: the two must not drift apart.

#[test]
fn the_readme_quick_start_is_the_quickstart_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/quickstart.rs")).unwrap();
    let start = readme
        .find("```rust\n")
        .expect("a rust block in the README")
        + "```rust\n".len();
    let end = start + readme[start..].find("```").expect("the end of the block");
    let code: String = example
        .lines()
        .skip_while(|l| l.starts_with("//!") || l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        readme[start..end],
        code,
        "README.md quick start != examples/quickstart.rs"
    );
}
