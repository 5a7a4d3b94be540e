//! Build permits (one FIFO pool for every push session of the replica) and
//! the backoff of failed builds.

use super::*;

/// permits in the order they asked.
pub struct Permits {
    pub(super) semaphore: Semaphore,
    pub(super) size: usize,
}

impl Permits {
    /// 2 x the store pool, at least 4.
    pub fn sized_for_pool(pool: u32) -> Self {
        Self::new((2 * pool as usize).max(4))
    }

    pub fn new(size: usize) -> Self {
        Self {
            semaphore: Semaphore::new(size),
            size,
        }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Waits for a permit in line, counted in `builds_waiting`.
    pub async fn acquire(&self, metrics: &ConfigMetrics) -> SemaphorePermit<'_> {
        metrics.builds_waiting.inc();
        let _waiting = scopeguard(|| {
            metrics.builds_waiting.dec();
        });
        let started = Instant::now();
        let permit = self
            .semaphore
            .acquire()
            .await
            .expect("the permit pool is never closed");
        metrics.build_wait.observe(started.elapsed().as_secs_f64());
        permit
    }
}

/// Runs `f` when dropped (also when the waiting future is cancelled).
pub(super) fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

// ---------------------------------------------------------------- backoff

/// Build failure backoff: 1, 2, 4, 8, 16, then 30 s; reset by a success.
#[derive(Debug, Default)]
pub struct BuildBackoff {
    pub(super) failures: u32,
}

impl BuildBackoff {
    pub fn next_delay(&mut self) -> Duration {
        let delay = match self.failures {
            n @ 0..=4 => Duration::from_secs(1 << n),
            _ => Duration::from_secs(30),
        };
        self.failures = self.failures.saturating_add(1);
        delay
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

// ---------------------------------------------------------------- slots
