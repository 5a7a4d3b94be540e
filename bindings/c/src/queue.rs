//! The completion queue: async exports that report into a queue the caller
//! drains, instead of calling into the caller's language on a runtime
//! thread.
//!
//! # Why
//!
//! A completion callback runs on a tokio worker. For a language whose
//! runtime must first adopt that foreign thread before running its code (Go:
//! a cgo callback from a C thread takes an M and a P), every completion pays
//! that entry, and the waiting caller is woken from a thread its scheduler
//! does not own. With the queue, a runtime thread only appends the outcome
//! and, when the consumer sleeps, writes one byte to a socket; the consumer
//! waits for that byte with its own event loop (Go's netpoller), takes every
//! queued completion with one call, and wakes its waiters itself. No thread
//! of the caller is held while a call is in flight, and completions that
//! arrive together cost one wake-up.
//!
//! # Use
//!
//! Pass [`openshell_queue_complete`] as the `callback` of any async export;
//! `user_data` is returned with the completion. Then:
//!
//! 1. [`openshell_queue_fd`] once: the read end of the doorbell (non-blocking,
//!    close-on-exec, owned by the library: never close it);
//! 2. in a loop, [`openshell_queue_take`]: it frees the previous batch and
//!    returns the next one, or null when nothing is queued, and then arms the
//!    doorbell: wait until the fd is readable, read what is there, take again.
//!
//! There is one queue per process and it is meant for one consumer. The
//! callback copies the completion (its views are borrowed), so the queue's
//! items own their bytes until their batch is freed.

use std::ffi::c_void;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, OnceLock};

use crate::complete::OsCompletion;
use crate::types::{ErrorParts, OS_ERROR, OsBytes};

/// One completion taken from the queue: the `user_data` its export was
/// given and the completion, whose views stay valid until the batch that
/// holds it is freed.
#[repr(C)]
pub struct OsQueued {
    pub user_data: usize,
    pub completion: OsCompletion,
}

/// Completions taken together; freed by the next [`openshell_queue_take`]
/// or by [`openshell_queue_batch_free`].
pub struct OsQueueBatch {
    views: Vec<OsQueued>,
    // The bytes the views point into (heap buffers: they do not move when
    // the vector does).
    _owned: Vec<Owned>,
}

/// An owned copy of a completion.
struct Owned {
    user_data: usize,
    status: i32,
    value: Vec<u8>,
    handle: usize,
    served_by: Vec<u8>,
    metadata: Vec<u8>,
    error: Option<ErrorParts>,
}

impl Owned {
    unsafe fn copy(user_data: usize, c: &OsCompletion) -> Self {
        let text = |b: OsBytes| String::from_utf8_lossy(&unsafe { b.to_vec() }).into_owned();
        Self {
            user_data,
            status: c.status,
            value: unsafe { c.value.to_vec() },
            handle: c.handle as usize,
            served_by: unsafe { c.served_by.to_vec() },
            metadata: unsafe { c.metadata.to_vec() },
            error: (c.status == OS_ERROR).then(|| ErrorParts {
                code: text(c.error.code),
                message: text(c.error.message),
                served_by: text(c.error.served_by),
                grpc_status: c.error.grpc_status,
                retryable: c.error.retryable,
                logs: text(c.error.logs),
            }),
        }
    }

    fn view(&self) -> OsQueued {
        OsQueued {
            user_data: self.user_data,
            completion: OsCompletion {
                status: self.status,
                value: OsBytes::of(&self.value),
                handle: self.handle as *mut c_void,
                served_by: OsBytes::of(&self.served_by),
                metadata: OsBytes::of(&self.metadata),
                error: match &self.error {
                    Some(parts) => parts.view(),
                    None => ErrorParts::none(),
                },
            },
        }
    }
}

struct Pending {
    items: Vec<Owned>,
    /// The consumer found the queue empty and waits for the doorbell.
    armed: bool,
}

struct Queue {
    pending: Mutex<Pending>,
    /// Written by runtime threads: one byte per arming.
    bell: UnixStream,
    /// Read by the consumer (its fd is handed out; kept open for ever).
    door: UnixStream,
}

fn queue() -> Option<&'static Queue> {
    static QUEUE: OnceLock<Option<Queue>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (bell, door) = UnixStream::pair().ok()?;
            bell.set_nonblocking(true).ok()?;
            door.set_nonblocking(true).ok()?;
            Some(Queue {
                pending: Mutex::new(Pending {
                    items: Vec::new(),
                    armed: false,
                }),
                bell,
                door,
            })
        })
        .as_ref()
}

impl Queue {
    fn push(&self, item: Owned) {
        let ring = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.items.push(item);
            std::mem::replace(&mut pending.armed, false)
        };
        if ring {
            // At most one byte is ever unread (one per arming), so the
            // socket cannot be full; an error leaves nothing to do.
            let _ = (&self.bell).write(&[1]);
        }
    }

    /// Every queued item, or none (and the doorbell armed).
    fn take(&self) -> Vec<Owned> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.items.is_empty() {
            pending.armed = true;
        }
        std::mem::take(&mut pending.items)
    }
}

/// The callback that queues: pass it as the `callback` of an async export.
/// It copies the completion into the queue with `user_data` and, when the
/// consumer waits, rings the doorbell. Never blocks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_queue_complete(
    user_data: usize,
    completion: *const OsCompletion,
) {
    let Some(c) = (unsafe { completion.as_ref() }) else {
        return;
    };
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let item = unsafe { Owned::copy(user_data, c) };
        if let Some(q) = queue() {
            q.push(item);
        }
    }));
}

/// The read end of the queue's doorbell (non-blocking; owned by the
/// library, never close it), creating the queue on first use; -1 when the
/// socket pair could not be made (then do not use the queue).
#[unsafe(no_mangle)]
pub extern "C" fn openshell_queue_fd() -> i32 {
    std::panic::catch_unwind(|| queue().map_or(-1, |q| q.door.as_raw_fd())).unwrap_or(-1)
}

/// Frees `previous` (a batch from an earlier take, or null) and takes every
/// queued completion: returns their batch with `*items` and `*len` set, or
/// null with `*len` 0 when the queue is empty. A null return arms the
/// doorbell: the next completion writes one byte to [`openshell_queue_fd`];
/// read it once the fd is readable, then take again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_queue_take(
    previous: *mut OsQueueBatch,
    items: *mut *const OsQueued,
    len: *mut usize,
) -> *mut OsQueueBatch {
    unsafe { openshell_queue_batch_free(previous) };
    if items.is_null() || len.is_null() {
        return std::ptr::null_mut();
    }
    unsafe {
        *items = std::ptr::null();
        *len = 0;
    }
    let taken = std::panic::catch_unwind(|| {
        let owned = queue().map(Queue::take).unwrap_or_default();
        if owned.is_empty() {
            return None;
        }
        let views = owned.iter().map(Owned::view).collect();
        Some(Box::new(OsQueueBatch {
            views,
            _owned: owned,
        }))
    });
    match taken {
        Ok(Some(batch)) => {
            unsafe {
                *items = batch.views.as_ptr();
                *len = batch.views.len();
            }
            Box::into_raw(batch)
        }
        _ => std::ptr::null_mut(),
    }
}

/// Frees a batch (null is ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_queue_batch_free(batch: *mut OsQueueBatch) {
    if !batch.is_null() {
        let _ =
            std::panic::catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(batch) })));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::time::Duration;

    use super::*;
    use crate::complete::{Outcome, start};

    fn take() -> Vec<(usize, i32, Vec<u8>, String)> {
        let mut items = std::ptr::null();
        let mut len = 0;
        let batch = unsafe { openshell_queue_take(std::ptr::null_mut(), &mut items, &mut len) };
        if batch.is_null() {
            return Vec::new();
        }
        let out = unsafe { std::slice::from_raw_parts(items, len) }
            .iter()
            .map(|q| {
                let c = &q.completion;
                let code = String::from_utf8_lossy(&unsafe { c.error.code.to_vec() }).into_owned();
                (q.user_data, c.status, unsafe { c.value.to_vec() }, code)
            })
            .collect();
        unsafe { openshell_queue_batch_free(batch) };
        out
    }

    /// Waits (bounded) for the doorbell, the way a consumer's event loop would.
    fn wait_for_bell() {
        let fd = openshell_queue_fd();
        assert!(fd >= 0);
        let door = &queue().unwrap().door;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut byte = [0u8; 8];
        loop {
            match (&*door).read(&mut byte) {
                Ok(n) if n > 0 => return,
                _ => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the doorbell never rang"
                    );
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    /// Takes until `n` completions came, waiting for the doorbell whenever
    /// a take finds the queue empty (as a consumer does).
    fn collect(n: usize) -> Vec<(usize, i32, Vec<u8>, String)> {
        let mut got = Vec::new();
        while got.len() < n {
            let batch = take();
            if batch.is_empty() {
                wait_for_bell();
            }
            got.extend(batch);
        }
        got
    }

    #[test]
    fn completions_queue_with_their_user_data_and_an_empty_take_arms_the_bell() {
        let status = start(Some(openshell_queue_complete), 41, || async {
            Ok(Outcome::Value(b"answer".to_vec()))
        });
        assert_eq!(status, crate::types::OS_OK);
        // An error completes through the queue as well.
        let status = start(Some(openshell_queue_complete), 42, || async {
            Err(openshell_sdk::Error::Cancelled)
        });
        assert_eq!(status, crate::types::OS_OK);
        let mut got = collect(2);
        got.sort_by_key(|g| g.0);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0],
            (41, crate::types::OS_OK, b"answer".to_vec(), String::new())
        );
        assert_eq!(got[1].0, 42);
        assert_eq!(got[1].1, OS_ERROR);
        assert_eq!(got[1].3, "cancelled");
        // Nothing more: an empty take, and a later completion rings again.
        assert!(take().is_empty());
        let status = start(Some(openshell_queue_complete), 43, || async {
            Ok(Outcome::End)
        });
        assert_eq!(status, crate::types::OS_OK);
        let got = collect(1);
        assert_eq!(got[0].0, 43);
        assert_eq!(got[0].1, crate::types::OS_END);
    }
}
