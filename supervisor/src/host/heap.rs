//! Gives freed heap pages back to the kernel while a host is quiet.
//!
//! A host's heap grows in bursts (sandboxes starting, relays running) and
//! glibc returns only the top of the heap on `free`: the pages of a relay
//! that ended below the top stay resident though nothing uses them. Every
//! [`CHECK_EVERY`] the host looks at how much of its heap is free
//! (`mallinfo2`, a walk of the allocator's bins) and, once at least
//! [`RELEASE_AT`] more is free than after the last release, asks glibc to
//! release every whole free page (`malloc_trim(0)`). A host that is idle or
//! steady does nothing but the check. Check and trim run on the runtime
//! thread, so they keep no blocking thread alive; both walk the free chunks
//! of one arena (`M_ARENA_MAX` is 1) of a heap of a few MiB.

use std::time::Duration;

/// How often the free part of the heap is looked at.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);
/// Newly freed bytes worth a release.
pub const RELEASE_AT: usize = 64 * 1024;

/// Bytes free in the heap's chunks (not yet returned to the kernel).
fn free_bytes() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's own statistics.
    unsafe { libc::mallinfo2() }.fordblks
}

/// Whether `free` bytes now, against `released` after the last release,
/// call for another.
fn due(free: usize, released: usize) -> bool {
    released
        .checked_add(RELEASE_AT)
        .is_some_and(|at| free >= at)
}

/// Runs for the host's life.
pub async fn release_loop() {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut released = 0usize;
    loop {
        tick.tick().await;
        let free = free_bytes();
        if due(free, released) {
            // SAFETY: malloc_trim takes a plain size and only changes the
            // allocator's own state.
            unsafe {
                libc::malloc_trim(0);
            }
            released = free_bytes();
        } else {
            // Free chunks were reused: a later burst counts from here.
            released = released.min(free);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_waits_for_enough_newly_freed_memory() {
        assert!(!due(0, 0));
        assert!(!due(RELEASE_AT - 1, 0));
        assert!(due(RELEASE_AT, 0));
        assert!(!due(RELEASE_AT + 10, 20));
        assert!(due(usize::MAX, usize::MAX - RELEASE_AT));
        assert!(!due(usize::MAX, usize::MAX));
    }
}
