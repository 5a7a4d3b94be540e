//! The tokio runtime every call of the extension runs on, and the bridge that
//! turns Rust futures into asyncio awaitables.
//!
//! # A runtime that survives fork
//!
//! Tokio's worker threads do not survive `fork()`: a runtime kept in a global
//! that can never be replaced (as pyo3-async-runtimes' is) would hang every
//! call in a forked child (multiprocessing's fork start method, gunicorn,
//! Celery). This module keeps its runtime behind an atomic pointer together
//! with the PID that built it:
//!
//! - the first use in a process builds the runtime (multi-threaded, worker
//!   threads named `openshell-sdk`);
//! - a use in a process whose PID differs from the builder's (a forked
//!   child) builds a fresh runtime and swaps it in. The parent's runtime is
//!   deliberately leaked in the child: its threads do not exist there, and
//!   dropping it would wait for them.
//!
//! No lock is taken on this path (a lock held by another thread at the
//! moment of `fork()` would stay locked in the child forever).
//!
//! The workspace builds tokio without its `parking_lot` feature on purpose:
//! parking_lot keeps global wait queues that point into the stacks of the
//! threads parked at the fork, and glibc gives those stacks to the child's
//! new threads, so a child's runtime crashed or lost wake-ups
//! (`tests/test_fork.py` forks six children in a row to catch it).
//!
//! # Interpreter exit
//!
//! Tokio threads outlive Python's finalization unless stopped: a future that
//! completes while the interpreter is being torn down would take the GIL and
//! crash the process. `openshell_sdk` registers [`shutdown`] with `atexit`:
//! it takes the runtime out of the slot, drops every task (cancelling their
//! calls) and waits briefly for blocking threads, with the GIL released so
//! they can finish. Any later use gets a runtime that never runs anything.
//!
//! The slot is only read by threads that hold the GIL (every export) or by
//! tokio's own threads, which use their current runtime instead; so
//! `shutdown`, which holds the GIL, never frees a slot in use.
//!
//! How results reach Python (asyncio futures, or a blocked sync caller) is
//! the business of the `waker` module, which sits above this one.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

struct Slot {
    pid: u32,
    runtime: tokio::runtime::Runtime,
}

static SLOT: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
static BUILDS: AtomicU64 = AtomicU64::new(0);
/// Set by [`shutdown`]: the process is exiting, nothing may run any more.
static SHUT_DOWN: AtomicBool = AtomicBool::new(false);

fn build(pid: u32) -> Box<Slot> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("openshell-sdk")
        .build()
        .expect("building the tokio runtime");
    BUILDS.fetch_add(1, Ordering::Relaxed);
    Box::new(Slot { pid, runtime })
}

/// The runtime of this process, built on first use and rebuilt after a fork.
pub fn handle() -> tokio::runtime::Handle {
    if let Ok(current) = tokio::runtime::Handle::try_current() {
        // A tokio thread of this process: its runtime is the live one (the
        // threads of a parent's runtime do not exist in a forked child).
        return current;
    }
    if SHUT_DOWN.load(Ordering::Acquire) {
        return inert();
    }
    let pid = std::process::id();
    loop {
        let current = SLOT.load(Ordering::Acquire);
        // SAFETY: a published slot is never freed (see the module docs), so
        // the pointer stays valid for the life of the process.
        if let Some(slot) = unsafe { current.as_ref() }
            && slot.pid == pid
        {
            return slot.runtime.handle().clone();
        }
        let fresh = Box::into_raw(build(pid));
        match SLOT.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // The old slot (if any) belongs to the parent process: leaked.
            Ok(_) => continue,
            Err(_) => {
                // Another thread published first; ours was never shared.
                // SAFETY: `fresh` came from Box::into_raw above and nobody
                // else saw it.
                let ours = unsafe { Box::from_raw(fresh) };
                ours.runtime.shutdown_background();
            }
        }
    }
}

/// A runtime that is never driven: what is spawned on it after [`shutdown`]
/// never runs.
fn inert() -> tokio::runtime::Handle {
    static INERT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    INERT
        .get_or_init(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("building the inert runtime")
        })
        .handle()
        .clone()
}

/// Stops the runtime of this process (see the module docs). Must be called
/// with the GIL held; releases it while waiting.
pub fn shutdown(py: pyo3::Python<'_>) {
    SHUT_DOWN.store(true, Ordering::Release);
    let current = SLOT.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if current.is_null() {
        return;
    }
    // SAFETY: the pointer came from Box::into_raw in `handle`; see the module
    // docs for why no other thread can be using it now.
    let slot = unsafe { Box::from_raw(current) };
    if slot.pid != std::process::id() {
        // A parent's runtime: its threads are not here; leak it.
        std::mem::forget(slot);
        return;
    }
    py.detach(move || {
        slot.runtime
            .shutdown_timeout(std::time::Duration::from_secs(2))
    });
}

/// Facts about the runtime, for tests and diagnostics.
pub fn info() -> (u32, u64) {
    let _ = handle();
    (std::process::id(), BUILDS.load(Ordering::Relaxed))
}

/// Whether [`shutdown`] ran: the process is exiting and no call can run.
pub fn is_shut_down() -> bool {
    SHUT_DOWN.load(Ordering::Acquire)
}
