//! `unroute_owner_then_exec`: the unrouted retry, with the owner replica made
//! unreachable by the harness (`replica_control`).
//!
//! The harness fronts the cluster with an edge whose routes it controls and
//! answers one line per request on `OPENSHELL_CONFORMANCE_CONTROL`
//! (`unroute REPLICA`, `restore`; README: "Replica control"). The runner only
//! asks: it learns the owner, has its route pointed at a dead port, execs,
//! and has the routes restored whatever the exec did.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::ops::exec::counters;
use crate::report::{StepError, StepResult};
use crate::runner::Runner;

/// The harness answers once its edge reloaded the routes (within 10 s).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

impl Runner {
    pub async fn unroute_owner_then_exec(&mut self, step: &Value) -> StepResult {
        let control = self
            .control
            .clone()
            .ok_or_else(|| anyhow!("no OPENSHELL_CONFORMANCE_CONTROL: no replica control"))?;
        let owner = self.owner_of(step).await?;
        ask(&control, &format!("unroute {owner}")).await?;
        let before = self.client.routing_stats();
        let outcome = self.exec(step).await;
        let after = self.client.routing_stats();
        ask(&control, "restore").await?;
        let mut result = outcome?;
        result["unrouted_replica"] = json!(owner);
        result["routing_before"] = counters(&before);
        result["routing_after"] = counters(&after);
        Ok(result)
    }

    /// The replica that owns the step's sandbox, as GetSandbox reports it.
    async fn owner_of(&mut self, step: &Value) -> Result<String, StepError> {
        let name = self.target(step);
        let ask_owner = json!({
            "method": "GetSandbox",
            "request": {"name": name},
            "metadata": [["x-openshell-want-owner", "1"]],
        });
        let answer = self.raw_unary(&ask_owner).await?;
        let owner = answer["metadata"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|pair| pair[0] == "x-openshell-owner")
            .and_then(|pair| pair[1].as_str())
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("GetSandbox {name} named no owner replica"))?;
        Ok(owner)
    }
}

/// One request line to the harness's control port; its answer must be `ok`.
async fn ask(control: &str, request: &str) -> anyhow::Result<()> {
    let exchange = async {
        let mut stream = TcpStream::connect(control)
            .await
            .with_context(|| format!("connecting to the harness's control port {control}"))?;
        stream.write_all(format!("{request}\n").as_bytes()).await?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(CONTROL_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("the harness did not answer {request:?} in 30 s"))??;
    if answer.trim() != "ok" {
        bail!("the harness refused {request:?}: {}", answer.trim());
    }
    Ok(())
}
