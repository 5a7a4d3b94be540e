//! The raw boundary for the JVM: any method of the proto by path, with an
//! encoded request and string metadata in, the encoded response and the
//! response metadata out. Both calls go through the core's raw layer
//! (`Client::raw_unary`, `Client::raw_stream`), so owner routing, replica
//! hints, the single unrouted retry and the token refresh apply exactly as
//! for the other SDKs. The typed stubs (`sdk-jvm/.../raw/RawStubs.kt`,
//! written by sdkgen) encode and decode protobuf-java messages over this.
//!
//! Metadata crosses as a list of pairs (a key may repeat, as on the wire).
//! A stream is a [`RawCall`]: `send`, `close_send`, `next` (`None` at the
//! end), `response_metadata`, `trailers` and `cancel`. Its call starts with
//! its first message (routing needs it), or the first `next` or
//! `close_send`.

use std::sync::Arc;

use bytes::Bytes;
use openshell_sdk::{CancellationToken, Metadata, RawReceiver, RawSender};
use tokio::sync::Mutex;

use crate::client::OpenShellClient;
use crate::errors::OpenShellError;

/// One metadata pair (keys are lowercase ASCII; `-bin` keys are not
/// supported).
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct MetadataEntry {
    pub key: String,
    pub value: String,
}

/// The answer to a raw unary call.
#[derive(Debug, Clone, uniffi::Record)]
pub struct RawAnswer {
    /// The encoded response message.
    pub bytes: Vec<u8>,
    /// Response headers, then trailers (for example `x-openshell-served-by`,
    /// or `x-openshell-owner` after a `GetSandbox` with
    /// `x-openshell-want-owner: 1`).
    pub metadata: Vec<MetadataEntry>,
    /// The replica that answered (`x-openshell-served-by`), if it said.
    pub served_by: Option<String>,
}

fn entries(metadata: &Metadata) -> Vec<MetadataEntry> {
    metadata
        .iter()
        .map(|(key, value)| MetadataEntry {
            key: key.to_owned(),
            value: value.to_owned(),
        })
        .collect()
}

fn metadata_of(entries: Vec<MetadataEntry>) -> Metadata {
    Metadata::from(
        entries
            .into_iter()
            .map(|e| (e.key, e.value))
            .collect::<Vec<_>>(),
    )
}

#[uniffi::export(async_runtime = "tokio")]
impl OpenShellClient {
    /// Calls a unary method by path (`/openshell.v1.OpenShell/GetSandbox`).
    /// An `authorization` pair in `metadata` replaces the client's token for
    /// this call. `invalid_config` for a malformed path or a streaming method.
    pub async fn raw_unary(
        &self,
        path: String,
        request: Vec<u8>,
        metadata: Vec<MetadataEntry>,
        timeout_ms: Option<u64>,
    ) -> Result<RawAnswer, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let call =
            self.client
                .raw_unary(&path, Bytes::from(request), metadata_of(metadata), options);
        let answer = self.run(call).await?;
        Ok(RawAnswer {
            served_by: answer.served_by().map(str::to_owned),
            metadata: entries(&answer.metadata),
            bytes: answer.bytes.to_vec(),
        })
    }

    /// Opens a stream on any method by path. `timeout_ms` bounds the whole
    /// stream (`None`: no deadline).
    pub async fn raw_stream(
        &self,
        path: String,
        metadata: Vec<MetadataEntry>,
        timeout_ms: Option<u64>,
    ) -> Result<Arc<RawCall>, OpenShellError> {
        let (options, token) = self.options(timeout_ms);
        let stream = self
            .run(
                self.client
                    .raw_stream(&path, metadata_of(metadata), options),
            )
            .await?;
        let (sender, receiver) = stream.split();
        Ok(Arc::new(RawCall {
            sender,
            receiver: Mutex::new(receiver),
            cancel: token,
        }))
    }
}

/// A raw stream: encoded messages both ways.
#[derive(uniffi::Object)]
pub struct RawCall {
    sender: RawSender,
    receiver: Mutex<RawReceiver>,
    cancel: CancellationToken,
}

impl RawCall {
    async fn guarded<T>(
        &self,
        fut: impl Future<Output = Result<T, openshell_sdk::Error>>,
    ) -> Result<T, OpenShellError> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(openshell_sdk::Error::Cancelled.into()),
            out = fut => Ok(out?),
        }
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl RawCall {
    /// Sends one encoded request message (waits while the queue is full).
    pub async fn send(&self, message: Vec<u8>) -> Result<(), OpenShellError> {
        self.guarded(self.sender.send(Bytes::from(message))).await
    }

    /// Half-closes the call: no more requests. Idempotent.
    pub fn close_send(&self) {
        self.sender.close();
    }

    /// The next encoded response message; `None` once the server ended the
    /// stream with OK. After an error, every later call fails the same way.
    pub async fn next(&self) -> Result<Option<Vec<u8>>, OpenShellError> {
        let next = async {
            let mut receiver = self.receiver.lock().await;
            receiver.recv().await.map(|m| m.map(|b| b.to_vec()))
        };
        self.guarded(next).await
    }

    /// The response headers (waits for them).
    pub async fn response_metadata(&self) -> Result<Vec<MetadataEntry>, OpenShellError> {
        let headers = async {
            let mut receiver = self.receiver.lock().await;
            receiver.response_metadata().await
        };
        Ok(entries(&self.guarded(headers).await?))
    }

    /// The trailers, once the stream ended with OK (`None` before, or while
    /// a `next` is in flight).
    pub fn trailers(&self) -> Option<Vec<MetadataEntry>> {
        let receiver = self.receiver.try_lock().ok()?;
        receiver.trailers().map(entries)
    }

    /// Cancels the call (the stream is reset). Idempotent.
    pub fn cancel(&self) {
        self.cancel.cancel();
        self.sender.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_pairs_keep_order_and_repeats() {
        let pairs = vec![
            MetadataEntry {
                key: "a".into(),
                value: "1".into(),
            },
            MetadataEntry {
                key: "a".into(),
                value: "2".into(),
            },
        ];
        let metadata = metadata_of(pairs.clone());
        assert_eq!(entries(&metadata), pairs);
    }
}
