//! Compiles `proto/openshell/*.proto` with protox (no system `protoc`) and
//! generates prost messages plus tonic client and server stubs, and the
//! encoded descriptor set (`FILE_DESCRIPTOR_SET`).
//!
//! The method table (`src/methods.rs`) is not made here: `sdkgen` generates
//! it, with every other language's surface, and it is checked in
//! (`make generate`; `make check-generated` fails when it is stale).

use std::path::PathBuf;

const FILES: [&str; 6] = [
    "openshell/openshell.proto",
    "openshell/supervisor_host.proto",
    "openshell/sandbox.proto",
    "openshell/peer.proto",
    "openshell/datamodel.proto",
    "openshell/options.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for file in FILES {
        println!("cargo:rerun-if-changed={file}");
    }
    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(FILES)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The encoded set keeps custom options (prost-types would drop them).
    std::fs::write(
        out.join("openshell_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        // Ordered maps in configuration messages: their encoding is
        // deterministic, so snapshots can be hashed and compared.
        .btree_map(".openshell.sandbox.v1")
        // Data-plane payloads as `bytes::Bytes`: decoding slices the
        // received buffer instead of copying it, and a relay hands the same
        // buffer on. Exec output stays `Vec<u8>` for the C binding's sake.
        .bytes(".openshell.v1.TcpForwardFrame.data")
        .bytes(".openshell.v1.RelayFrame.data")
        .bytes(".openshell.v1.ExecSandboxInput.stdin")
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
