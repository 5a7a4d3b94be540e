//! Connections to one replica: HTTP/2 connections opened on demand, the
//! streams counted on each, the connect in flight, and when a connect last
//! failed.
//!
//! No lock here is held across an await: a replica that never answers a
//! connect (a dropped SYN, a full backlog) must not queue every call to it
//! behind one dial. One dial runs at a time per replica, in its own task;
//! every call that needs a new connection meanwhile waits for that dial's
//! outcome (bounded by the connect timeout) instead of starting its own.

use crate::routes::Target;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use tokio::sync::watch;

/// The outcome of a dial in flight: `None` until it ends, then `Ok` (the
/// new connection is in the pool) or the reason it failed.
pub(crate) type DialOutcome = watch::Receiver<Option<Result<(), String>>>;

/// One configured replica: its address, a small pool of HTTP/2 connections
/// (opened on demand, dropped when they close), the dial in flight and when
/// a connect last failed.
pub(crate) struct Replica {
    pub(crate) id: String,
    pub(crate) target: Target,
    pool: Mutex<Vec<Upstream>>,
    pub(crate) dialing: Mutex<Option<DialOutcome>>,
    pub(crate) failed_at: Mutex<Option<Instant>>,
    /// When a connect last timed out (the replica answers nothing: a cut
    /// link, a dropped SYN), cleared by a connect that succeeds.
    timed_out_at: Mutex<Option<Instant>>,
    /// The TLS failure last logged at warn level (not repeated per dial).
    tls_failure: Mutex<Option<String>>,
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
            pool: Mutex::new(Vec::new()),
            dialing: Mutex::new(None),
            failed_at: Mutex::new(None),
            timed_out_at: Mutex::new(None),
            tls_failure: Mutex::new(None),
        }
    }

    /// The connection pool, closed connections dropped. Never held across
    /// an await.
    pub(crate) fn pool(&self) -> MutexGuard<'_, Vec<Upstream>> {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.retain(|u| !u.sender.is_closed());
        pool
    }

    /// A dial is in flight and no open connection can take a stream now:
    /// a call sent here would wait for that dial.
    pub(crate) fn connecting(&self) -> bool {
        self.dialing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
            && !self.pool().iter().any(Upstream::has_room)
    }

    pub(crate) fn recently_failed(&self, window: Duration) -> bool {
        self.failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < window)
    }

    /// Records the latest TLS failure (`None`: a dial succeeded); true when
    /// it differs from the one before, i.e. the log should say it.
    pub(crate) fn tls_failure_logged(&self, reason: Option<&str>) -> bool {
        let mut last = self
            .tls_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.as_deref() == reason {
            return false;
        }
        *last = reason.map(str::to_owned);
        true
    }

    /// A connect timed out within `window` and no connection is open: a
    /// hinted call would only wait out another connect timeout.
    pub(crate) fn unreachable(&self, window: Duration) -> bool {
        self.timed_out_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < window)
            && self.pool().is_empty()
    }

    /// Records how the last connect ended: `None` success, else whether it
    /// timed out.
    pub(crate) fn set_dial_outcome(&self, failure: Option<bool>) {
        self.set_failed(failure.is_some());
        *self
            .timed_out_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (failure == Some(true)).then(Instant::now);
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
            .map(|r| format!("{}={}://{}", r.id, r.target.scheme(), r.target.authority))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
