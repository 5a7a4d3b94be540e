//! Progress reports of a transfer, throttled for the caller's callback.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// Shortest time between two progress reports (the last one always comes).
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// Where a transfer stands, as handed to [`TransferOptions::progress`](super::TransferOptions::progress).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// File bytes moved so far.
    pub bytes_done: u64,
    /// File bytes the transfer moves in all (known up front).
    pub bytes_total: u64,
    /// Files completed (renamed into place).
    pub files_done: u64,
    /// Files the transfer moves in all.
    pub files_total: u64,
    /// The file being moved (its destination path), or the last one.
    pub current: String,
}

/// The progress callback: called on the transfer's task, so it should
/// return quickly.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Counts what a transfer did and reports it at most every
/// [`PROGRESS_INTERVAL`].
pub(super) struct Reporter {
    callback: Option<ProgressFn>,
    pub state: Progress,
    last: Option<Instant>,
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("state", &self.state)
            .finish()
    }
}

impl Reporter {
    pub fn new(callback: Option<ProgressFn>, bytes_total: u64, files_total: u64) -> Self {
        Self {
            callback,
            state: Progress {
                bytes_total,
                files_total,
                ..Progress::default()
            },
            last: None,
        }
    }

    pub fn current(&mut self, path: &str) {
        path.clone_into(&mut self.state.current);
        self.tick();
    }

    pub fn bytes(&mut self, n: u64) {
        self.state.bytes_done += n;
        self.tick();
    }

    pub fn file_done(&mut self) {
        self.state.files_done += 1;
        self.tick();
    }

    fn tick(&mut self) {
        let Some(callback) = &self.callback else {
            return;
        };
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < PROGRESS_INTERVAL)
        {
            return;
        }
        self.last = Some(now);
        callback(&self.state);
    }

    /// The final report, whenever the last one was.
    pub fn finish(&mut self) {
        if let Some(callback) = &self.callback {
            callback(&self.state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn reports_are_throttled_and_the_last_always_comes() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let callback: ProgressFn =
            Arc::new(move |p: &Progress| sink.lock().unwrap().push(p.clone()));
        let mut reporter = Reporter::new(Some(callback), 100, 1);
        for _ in 0..10 {
            reporter.bytes(10);
        }
        tokio::time::sleep(PROGRESS_INTERVAL + Duration::from_millis(10)).await;
        reporter.file_done();
        reporter.finish();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0].bytes_done, 10);
        assert_eq!((seen[2].bytes_done, seen[2].files_done), (100, 1));
    }
}
