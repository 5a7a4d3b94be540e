//! Connections to one replica: HTTP/2 connections opened on demand, the
//! streams counted on each, and when a connect last failed.

use crate::routes::Target;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;

/// One configured replica: its address, a small pool of HTTP/2 connections
/// (opened on demand, dropped when they close) and when a connect last failed.
pub(crate) struct Replica {
    pub(crate) id: String,
    pub(crate) target: Target,
    pub(crate) pool: tokio::sync::Mutex<Vec<Upstream>>,
    pub(crate) failed_at: Mutex<Option<Instant>>,
}

/// One HTTP/2 connection to a replica, the streams open on it, and the
/// replica's concurrent-stream limit (SETTINGS_MAX_CONCURRENT_STREAMS).
pub(crate) struct Upstream {
    pub(crate) sender: SendRequest<Incoming>,
    pub(crate) streams: Arc<AtomicUsize>,
    pub(crate) limit: Arc<AtomicUsize>,
}

impl Upstream {
    pub(crate) fn load(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    pub(crate) fn has_room(&self) -> bool {
        self.load() < self.limit.load(Ordering::Relaxed)
    }

    pub(crate) fn checkout(&self) -> (SendRequest<Incoming>, StreamSlot) {
        self.streams.fetch_add(1, Ordering::Relaxed);
        (
            self.sender.clone(),
            StreamSlot {
                streams: self.streams.clone(),
            },
        )
    }
}

/// Counts one stream on an upstream connection until dropped (with the
/// response body, or when the request fails).
pub(crate) struct StreamSlot {
    pub(crate) streams: Arc<AtomicUsize>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An upstream response body that keeps its stream counted while it lives.
pub(crate) struct CountedBody {
    pub(crate) inner: Incoming,
    pub(crate) _slot: StreamSlot,
}

impl http_body::Body for CountedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Replica {
    pub(crate) fn new(id: String, target: Target) -> Self {
        Self {
            id,
            target,
            pool: tokio::sync::Mutex::new(Vec::new()),
            failed_at: Mutex::new(None),
        }
    }

    pub(crate) fn recently_failed(&self, window: Duration) -> bool {
        self.failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < window)
    }

    pub(crate) fn set_failed(&self, failed: bool) {
        *self
            .failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = failed.then(Instant::now);
    }
}

/// The live route map: every configured replica, by position and by id.
pub(crate) struct Routes {
    pub(crate) list: Vec<Arc<Replica>>,
    pub(crate) by_id: HashMap<String, Arc<Replica>>,
}

impl Routes {
    pub(crate) fn describe(&self) -> String {
        if self.list.is_empty() {
            return "(no replicas)".into();
        }
        self.list
            .iter()
            .map(|r| format!("{}=http://{}", r.id, r.target.authority))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
