//! `openshell-bench isolation`: what `--isolation namespaces` costs an exec.
//! Two gateways, one isolated and one not, each with one sandbox; `true`
//! execs through the SDK in rounds of one batch per gateway, the two in a
//! random order per round. Prints both and their ratio.

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox};
use openshell_testkit::{Gateway, GatewayOptions};

use crate::measure::{exec_round_trips, interleaved, ms, p50_p99, percentile, sorted};

const ROUNDS: usize = 30;
const BATCH: usize = 10;
const WARMUP: usize = 20;

pub async fn run() {
    let mut clients = Vec::new();
    let mut gateways = Vec::new();
    for mode in ["namespaces", "none"] {
        let gw = Gateway::start(GatewayOptions {
            extra_args: vec!["--isolation".into(), mode.into()],
            ..GatewayOptions::dev()
        });
        let client = Client::connect(ClientConfig::builder(gw.url.clone()).build().unwrap())
            .await
            .unwrap();
        client
            .sandboxes()
            .create(CreateSandbox::new().name("bench"), CallOptions::new())
            .await
            .unwrap();
        client
            .sandboxes()
            .wait_ready("bench", CallOptions::new())
            .await
            .unwrap();
        exec_round_trips(&client, "bench", WARMUP).await;
        clients.push(client);
        gateways.push(gw);
    }
    let mut samples = [Vec::new(), Vec::new()];
    for arm in interleaved(2, ROUNDS) {
        samples[arm].extend(exec_round_trips(&clients[arm], "bench", BATCH).await);
    }
    let [isolated, plain] = samples.map(sorted);
    println!(
        "isolation benchmark ({} `true` execs each, {ROUNDS} rounds of a batch of {BATCH} per gateway, random order per round)",
        ROUNDS * BATCH
    );
    println!("  --isolation namespaces: {}", p50_p99(&isolated));
    println!("  --isolation none:       {}", p50_p99(&plain));
    println!(
        "  ratio namespaces / none (p50): {:.2} (difference {:.3} ms)",
        percentile(&isolated, 0.5).as_secs_f64() / percentile(&plain, 0.5).as_secs_f64(),
        ms(percentile(&isolated, 0.5)) - ms(percentile(&plain, 0.5))
    );
}
