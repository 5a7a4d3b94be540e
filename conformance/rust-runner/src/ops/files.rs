//! File transfer ops: `write_file`, `read_file`, `file_round_trip`.

use openshell_sdk::TransferOptions;
use serde_json::{Map, Value, json};

use crate::report::{StepResult, text};
use crate::runner::{Runner, opts};

impl Runner {
    pub async fn write_file(&mut self, step: &Value) -> StepResult {
        let name = self.target(step);
        let path = self.subst_str(step["path"].as_str().unwrap_or_default());
        let content = self.subst_str(step["content"].as_str().unwrap_or_default());
        let summary = self
            .client
            .write_file(&name, &path, content.as_bytes(), opts())
            .await?;
        Ok(json!({"bytes": summary.bytes}))
    }

    pub async fn read_file(&mut self, step: &Value) -> StepResult {
        let name = self.target(step);
        let path = self.subst_str(step["path"].as_str().unwrap_or_default());
        let data = self.client.read_file(&name, &path, opts()).await?;
        let mut out = Map::new();
        text(&mut out, "content", &data);
        Ok(Value::Object(out))
    }

    /// Random bytes to a local file, uploaded by path, downloaded by path
    /// to another, compared.
    pub async fn file_round_trip(&mut self, step: &Value) -> StepResult {
        let name = self.target(step);
        let remote = self.subst_str(step["remote"].as_str().unwrap_or_default());
        let size = step["size"].as_u64().unwrap_or(0) as usize;
        let dir = tempfile::tempdir().map_err(anyhow::Error::from)?;
        let sent = dir.path().join("sent.bin");
        let back = dir.path().join("back.bin");
        let bytes: Vec<u8> = (0..size).map(|_| rand::random::<u8>()).collect();
        std::fs::write(&sent, &bytes).map_err(anyhow::Error::from)?;
        let options = TransferOptions::new();
        let summary = self.client.upload(&name, &sent, &remote, &options).await?;
        self.client
            .download(&name, &remote, &back, &options)
            .await?;
        let got = std::fs::read(&back).map_err(anyhow::Error::from)?;
        Ok(json!({"bytes": summary.bytes, "same": got == bytes}))
    }
}
