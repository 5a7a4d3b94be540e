//! Reconnect backoff of the session loop.

use std::time::Duration;

/// Reconnect backoff: each delay doubles the previous one up to `max`;
/// reset once a session was accepted.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial.min(max),
        }
    }

    /// The session reconnect policy: 1 s doubling to 30 s.
    pub fn reconnect() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// Delay to wait now; the following one doubles.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = delay.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to the initial delay (after a session was accepted).
    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(delays: &[Duration]) -> Vec<u64> {
        delays.iter().map(Duration::as_secs).collect()
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut backoff = Backoff::reconnect();
        let delays: Vec<_> = (0..8).map(|_| backoff.next_delay()).collect();
        assert_eq!(secs(&delays), [1, 2, 4, 8, 16, 30, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
        assert_eq!(backoff.next_delay(), Duration::from_secs(2));
        let mut capped = Backoff::new(Duration::from_secs(10), Duration::from_secs(3));
        assert_eq!(capped.next_delay(), Duration::from_secs(3));
        assert_eq!(capped.next_delay(), Duration::from_secs(3));
    }
}
