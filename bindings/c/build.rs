//! Generates the C header with cbindgen into `OUT_DIR` and checks the two
//! checked-in copies against it: `include/openshell.h` and
//! `sdk-go/internal/native/openshell.h` (cgo cannot reach outside the Go
//! module).
//!
//! A build never writes into the source tree by default: a checked-in
//! header that differs from the generated one fails the build (so `cargo
//! build`, clippy and `make test` all catch a stale or hand-edited header).
//! `OPENSHELL_WRITE_HEADER=1` (set by `make generate`) writes both copies
//! instead.

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=OPENSHELL_WRITE_HEADER");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("bindings/c/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    std::fs::write(out_dir.join("openshell.h"), &generated).unwrap();

    let write = std::env::var("OPENSHELL_WRITE_HEADER").is_ok_and(|v| v == "1");
    let targets = [
        crate_dir.join("include/openshell.h"),
        crate_dir.join("../../sdk-go/internal/native/openshell.h"),
    ];
    let mut stale = Vec::new();
    for target in targets {
        println!("cargo:rerun-if-changed={}", target.display());
        let current = std::fs::read(&target).unwrap_or_default();
        if current == generated {
            continue;
        }
        if write {
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(&target, &generated).unwrap();
        } else {
            stale.push(target.display().to_string());
        }
    }
    if !stale.is_empty() {
        // A message, not a panic: no backtrace around it.
        eprintln!(
            "error: the C header differs from what cbindgen generates for bindings/c \
             (stale or edited by hand): {}\n\
             regenerate it with `make generate` \
             (or `OPENSHELL_WRITE_HEADER=1 cargo build -p openshell-c`) and commit it",
            stale.join(", ")
        );
        std::process::exit(1);
    }
}
