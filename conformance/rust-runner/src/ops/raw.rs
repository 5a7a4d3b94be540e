//! Raw calls: request messages built from the scenario's proto JSON with
//! prost-reflect over the contract's descriptor set; answers reported as
//! proto JSON with the proto's own field names.

use anyhow::{Context, anyhow};
use bytes::Bytes;
use openshell_sdk::Metadata;
use prost::Message;
use prost_reflect::{DynamicMessage, MethodDescriptor, SerializeOptions};
use serde_json::{Value, json};

use crate::report::StepResult;
use crate::runner::{Runner, opts};

impl Runner {
    pub async fn raw_unary(&mut self, step: &Value) -> StepResult {
        let method = step["method"].as_str().unwrap_or_default();
        let request = self.message(method, &step["request"])?;
        let mut metadata = Metadata::new();
        for pair in step["metadata"].as_array().into_iter().flatten() {
            metadata.append(
                pair[0].as_str().unwrap_or_default(),
                pair[1].as_str().unwrap_or_default(),
            );
        }
        let answer = self
            .client
            .raw_unary(&path(method), request, metadata, opts())
            .await?;
        let pairs: Vec<(String, String)> = answer
            .metadata
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let response = DynamicMessage::decode(self.method(method)?.output(), answer.bytes)
            .map_err(|e| anyhow!("decoding the answer: {e}"))?;
        let options = SerializeOptions::new().use_proto_field_name(true);
        let response = response
            .serialize_with_options(serde_json::value::Serializer, &options)
            .context("the answer as JSON")?;
        Ok(json!({"metadata": pairs, "response": response}))
    }

    /// Sends the step's messages, half-closes, and reads to the end.
    pub async fn raw_stream(&mut self, step: &Value) -> StepResult {
        let method = step["method"].as_str().unwrap_or_default();
        let mut stream = self
            .client
            .raw_stream(&path(method), Metadata::new(), opts())
            .await?;
        for message in step["messages"].as_array().into_iter().flatten() {
            stream.send(self.message(method, message)?).await?;
        }
        stream.close_send();
        let mut received = 0;
        while stream.recv().await?.is_some() {
            received += 1;
        }
        Ok(json!({"received": received}))
    }

    fn method(&self, name: &str) -> anyhow::Result<MethodDescriptor> {
        self.pool
            .get_service_by_name(openshell_sdk::proto::SERVICE)
            .and_then(|s| s.methods().find(|m| m.name() == name))
            .ok_or_else(|| anyhow!("no method {name}"))
    }

    /// Encodes a request message of `method` from proto JSON.
    fn message(&mut self, method: &str, body: &Value) -> anyhow::Result<Bytes> {
        let descriptor = self.method(method)?.input();
        let body = self.subst(body);
        let message = DynamicMessage::deserialize(descriptor, body)
            .with_context(|| format!("building a {method} request from JSON"))?;
        Ok(Bytes::from(message.encode_to_vec()))
    }
}

fn path(method: &str) -> String {
    format!("/{}/{method}", openshell_sdk::proto::SERVICE)
}
