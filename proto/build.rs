//! Compiles `proto/openshell/*.proto` with protox (no system `protoc`) and
//! generates prost messages plus tonic client and server stubs.
//! The file descriptor set is kept too: sdk-core's method table and the
//! generator read the `owner_routed` option from it.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "openshell/openshell.proto",
        "openshell/datamodel.proto",
        "openshell/options.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("openshell_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
