//! `openshell-bench typescript`: `@openshell/sdk` against `@grpc/grpc-js`.
//! This starts one gateway (dev mode) with one sandbox, then runs the Node
//! program `sdk-typescript/dist/bench/languages.js` (compiled by `make
//! typescript`), the TypeScript program of `openshell-bench languages`
//! (`contract`) run alone: the SDK against a grpc-js client loaded from the
//! same proto (unary, 100 concurrent callers, forward with its own iperf3,
//! which it starts inside the sandbox, through `client.forward` and the
//! grpc-js pump of
//! `sdk-typescript/bench/grpcjs.ts`, exec stdout), and prints the figures. The SDK runs
//! on the release addon (`libopenshell_sdk_node.so` next to the release
//! binaries, which `make bench` builds), copied to a temporary `.node` file
//! and named in `OPENSHELL_SDK_NATIVE`.

use std::path::Path;
use std::process::Command;

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox};
use openshell_testkit::{Gateway, GatewayOptions, bin_dir};

pub async fn run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("sdk-typescript/dist/bench/languages.js");
    assert!(
        script.exists(),
        "{} is missing: run `make typescript` first",
        script.display()
    );
    let addon = bin_dir().join("libopenshell_sdk_node.so");
    assert!(
        addon.exists(),
        "{} is missing: `cargo build --release -p openshell-sdk-node` (make bench does)",
        addon.display()
    );
    let scratch = tempfile::tempdir().unwrap();
    let native = scratch.path().join("openshell-sdk.node");
    std::fs::copy(&addon, &native).unwrap();

    let gw = Gateway::start(GatewayOptions::dev());
    let config = ClientConfig::builder(gw.url.clone()).build().unwrap();
    let client = Client::connect(config).await.unwrap();
    let sandboxes = client.sandboxes();
    sandboxes
        .create(CreateSandbox::new().name("bench-ts"), CallOptions::new())
        .await
        .unwrap();
    sandboxes
        .wait_ready("bench-ts", CallOptions::new())
        .await
        .unwrap();

    let status = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(&script)
            .env("OPENSHELL_SDK_NATIVE", &native)
            .env("OPENSHELL_ENDPOINT", &gw.url)
            .env("OPENSHELL_BENCH_SANDBOX", "bench-ts")
            .env("OPENSHELL_BENCH_PROTO", root.join("proto"))
            .status()
            .expect("running node")
    })
    .await
    .unwrap();
    assert!(
        status.success(),
        "the TypeScript benchmark failed: {status}"
    );
}
