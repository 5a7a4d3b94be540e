//! A real local cluster for your own tests: three replicas behind an edge,
//! a sandbox, an exec, then a replica killed and the next exec still
//! answering. Needs the gateway executable (`OPENSHELL_GATEWAY_BIN`, or
//! `openshell-gateway` on `PATH`).
//!
//! ```sh
//! cargo build --bins
//! OPENSHELL_GATEWAY_BIN=target/debug/openshell-gateway \
//!     cargo run -p openshell-sdk --example local_cluster
//! ```
//!
//! With `OPENSHELL_EXAMPLE_HOLD=1` it keeps the cluster until it is killed
//! (the SDK's tests kill it with SIGKILL and check that nothing is left).

use openshell_sdk::testing::{LocalCluster, LocalClusterOptions};
use openshell_sdk::{CallOptions, CreateSandbox, ExecRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = LocalCluster::start(LocalClusterOptions::new().replicas(3)).await?;
    println!(
        "cluster at {} (data {})",
        cluster.endpoint(),
        cluster.data_dir().display()
    );
    let client = cluster.client().await?;
    let sandboxes = client.sandboxes();
    let sandbox = sandboxes
        .create(CreateSandbox::new(), CallOptions::new())
        .await?;
    sandboxes
        .wait_ready(&sandbox.name, CallOptions::new())
        .await?;
    let hello = ExecRequest::new(&sandbox.name, ["echo", "hello"]);
    print!(
        "{}",
        client.exec(hello, CallOptions::new()).await?.stdout_text()
    );

    if std::env::var_os("OPENSHELL_EXAMPLE_HOLD").is_some() {
        println!("holding");
        std::future::pending::<()>().await;
    }
    // The owner dies; the next exec is routed to the replica the sandbox's
    // supervisor reconnects to.
    let owner = cluster
        .owner_of(&sandbox.name)
        .await?
        .expect("three replicas");
    cluster.kill_replica(&owner).await?;
    let again = ExecRequest::new(&sandbox.name, ["echo", "still here"]);
    print!(
        "{}",
        client.exec(again, CallOptions::new()).await?.stdout_text()
    );
    println!("owner now {:?}", cluster.owner_of(&sandbox.name).await?);
    cluster.stop().await?;
    Ok(())
}
