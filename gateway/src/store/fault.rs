//! A store fault injected for tests: a delay before every call, or a
//! store that answers nothing (see [`StoreFault`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A store fault injected for tests (`serve --store-fault-file`, set by
/// `up`'s `slow-store`/`cut-store` orders): every call waits `delay` first,
/// and while `down` it waits for its deadline and fails as a frozen server
/// would ([`StoreError::TimedOut`]). Off unless set.
#[derive(Debug, Default)]
pub struct StoreFault {
    delay_ms: AtomicU64,
    down: AtomicBool,
}

impl StoreFault {
    pub fn set(&self, delay: Duration, down: bool) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::SeqCst))
    }

    pub fn down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// What a call meets before it reaches the database.
    pub(super) async fn meet(&self) {
        let delay = self.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if self.down() {
            std::future::pending::<()>().await;
        }
    }
}
