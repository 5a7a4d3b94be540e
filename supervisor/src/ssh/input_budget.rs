//! One budget per supervisor process for SSH channel input that no
//! program has read yet (`--ssh-input-budget`, [`DEFAULT_BUDGET`]).
//!
//! Why a budget and not per-channel windows: russh delivers every
//! channel's data from one connection loop and opens the client's window
//! again as data arrives, not as it is consumed, so SSH flow control never
//! holds a client back. What holds it back is the supervisor not reading
//! the connection: [`GatedStream`] stops handing russh bytes while the
//! connection is over its share, and the relay's pipe, the HTTP/2 stream
//! and the gateway then push back on the client (delayed, never dropped).
//!
//! What is counted: a channel's stdin bytes (and [`FRAME_CHARGE`] per
//! data, EOF or window-change message), from the moment russh hands them
//! to the handler (in the connection loop, before it reads the next
//! packet) until the program's stdin took them, or they were dropped
//! because the program is gone.
//!
//! Fairness: each connection may hold [`CONNECTION_RESERVE`] whatever
//! the others hold; beyond it, it draws on the one shared budget. A
//! connection is stopped only while it holds more than its reserve *and*
//! the shared budget is used up, and resumes as soon as either is no longer
//! true: when its own programs read, or when any connection's programs
//! read (every stopped connection is woken at once and reads on; none waits
//! behind another). So one connection's unread input never stops another
//! connection whose programs read what they are sent. Inside one
//! connection, a stop holds every channel's input (the SSH stream is one
//! byte stream), never its output.
//!
//! What memory this bounds: the budget, plus per connection its reserve,
//! one SSH packet (russh reads whole packets before their data is counted:
//! 32 KiB from OpenSSH, at most 256 KiB), and the relay's pipe (`PIPE_BUFFER`
//! in `ssh`); the HTTP/2 receive window of the supervisor's connection to the
//! gateway (16 MiB for all its streams) is the transport's, as for any relay.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Default of `--ssh-input-budget`: 64 MiB.
pub const DEFAULT_BUDGET: usize = 64 << 20;
/// Unread input each connection may hold beyond the shared budget.
pub const CONNECTION_RESERVE: usize = 64 << 10;
/// What each queued message costs besides its bytes, so that many tiny
/// messages (or window changes) are bounded too.
pub const FRAME_CHARGE: usize = 128;

/// The budget's flag, in both modes (a host's budget is shared by all its
/// sandboxes).
#[derive(Debug, Clone, clap::Args)]
pub struct BudgetArgs {
    /// Bytes of SSH channel input this process holds for programs that have
    /// not read it yet, all connections (and, in host mode, all sandboxes)
    /// together. Past it, connections sending more are not read until
    /// programs read (the client waits; nothing is dropped); each
    /// connection may still hold 64 KiB of its own.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_BUDGET as u64,
          value_parser = clap::value_parser!(u64).range(65536..=(1 << 40)))]
    pub ssh_input_budget: u64,
}

impl BudgetArgs {
    /// Makes the flag's value the process's budget.
    pub fn install(&self) {
        install(usize::try_from(self.ssh_input_budget).unwrap_or(usize::MAX));
    }
}

static BUDGET: OnceLock<Arc<InputBudget>> = OnceLock::new();

/// Sets the process's budget (once, at start; later calls change nothing).
pub fn install(limit: usize) {
    let _ = BUDGET.set(InputBudget::new(limit));
}

/// The process's budget ([`DEFAULT_BUDGET`] when none was installed).
pub fn budget() -> Arc<InputBudget> {
    BUDGET
        .get_or_init(|| InputBudget::new(DEFAULT_BUDGET))
        .clone()
}

/// What a data message of `len` bytes costs.
pub fn data_cost(len: usize) -> usize {
    FRAME_CHARGE + len
}

pub struct InputBudget {
    limit: usize,
    reserve: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// What connections hold beyond their reserves, together.
    shared: usize,
    next_id: u64,
    connections: HashMap<u64, Held>,
}

#[derive(Default)]
struct Held {
    /// May be below zero for a moment: a channel can take a message (and
    /// give its cost back) before the handler has charged it.
    bytes: i64,
    /// The connection's reader, while it is stopped.
    waker: Option<Waker>,
}

impl State {
    fn beyond(bytes: i64, reserve: usize) -> usize {
        usize::try_from(bytes).unwrap_or(0).saturating_sub(reserve)
    }

    fn wake_all(&mut self) {
        for held in self.connections.values_mut() {
            if let Some(waker) = held.waker.take() {
                waker.wake();
            }
        }
    }
}

impl InputBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Self::with_reserve(limit, CONNECTION_RESERVE)
    }

    fn with_reserve(limit: usize, reserve: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            reserve,
            state: Mutex::default(),
        })
    }

    /// An account for one SSH connection.
    pub fn connection(self: &Arc<Self>) -> Arc<ConnectionInput> {
        let mut state = self.state.lock().expect("budget lock");
        let id = state.next_id;
        state.next_id += 1;
        state.connections.insert(id, Held::default());
        Arc::new(ConnectionInput {
            budget: self.clone(),
            id,
        })
    }

    /// Bytes held by all connections now (reserves included).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        let state = self.state.lock().expect("budget lock");
        state
            .connections
            .values()
            .map(|h| usize::try_from(h.bytes).unwrap_or(0))
            .sum()
    }

    /// Adds `delta` to connection `id`'s holding; a release wakes whoever
    /// may read again.
    fn adjust(&self, id: u64, delta: i64) {
        let mut state = self.state.lock().expect("budget lock");
        let reserve = self.reserve;
        let Some(held) = state.connections.get_mut(&id) else {
            return;
        };
        let before = State::beyond(held.bytes, reserve);
        held.bytes += delta;
        let after = State::beyond(held.bytes, reserve);
        let own_room = usize::try_from(held.bytes).unwrap_or(0) < reserve;
        let own_waker = if delta < 0 && own_room {
            held.waker.take()
        } else {
            None
        };
        state.shared = state.shared - before + after;
        if delta < 0 && state.shared < self.limit {
            state.wake_all();
        }
        drop(state);
        if let Some(waker) = own_waker {
            waker.wake();
        }
    }

    /// Whether connection `id` may read now; if not, `waker` is woken when
    /// it may.
    fn may_read(&self, id: u64, waker: &Waker) -> bool {
        let mut state = self.state.lock().expect("budget lock");
        let open = state.shared < self.limit;
        let Some(held) = state.connections.get_mut(&id) else {
            return true;
        };
        if open || usize::try_from(held.bytes).unwrap_or(0) < self.reserve {
            return true;
        }
        held.waker = Some(waker.clone());
        false
    }

    fn remove(&self, id: u64) {
        let mut state = self.state.lock().expect("budget lock");
        if let Some(held) = state.connections.remove(&id) {
            state.shared -= State::beyond(held.bytes, self.reserve);
            if state.shared < self.limit {
                state.wake_all();
            }
        }
    }
}

/// One SSH connection's account; gone with the connection.
pub struct ConnectionInput {
    budget: Arc<InputBudget>,
    id: u64,
}

impl Drop for ConnectionInput {
    fn drop(&mut self) {
        self.budget.remove(self.id);
    }
}

/// One channel's share of its connection's account: what the handler
/// charged and the channel has not given back yet. Closing it gives the
/// rest back and ignores later charges (russh may still deliver data to a
/// channel whose task has ended).
pub struct ChannelInput {
    connection: Arc<ConnectionInput>,
    state: Mutex<(i64, bool)>,
}

impl ChannelInput {
    pub fn new(connection: Arc<ConnectionInput>) -> Arc<Self> {
        Arc::new(Self {
            connection,
            state: Mutex::new((0, false)),
        })
    }

    fn apply(&self, delta: i64) {
        let mut state = self.state.lock().expect("channel input lock");
        if state.1 {
            return;
        }
        state.0 += delta;
        self.connection.budget.adjust(self.connection.id, delta);
    }

    /// Counts `cost` bytes the client sent to this channel.
    pub fn charge(&self, cost: usize) {
        self.apply(i64::try_from(cost).unwrap_or(i64::MAX));
    }

    /// Gives back `cost` bytes: read by the program, or dropped.
    pub fn release(&self, cost: usize) {
        self.apply(-i64::try_from(cost).unwrap_or(i64::MAX));
    }

    pub fn is_closed(&self) -> bool {
        self.state.lock().expect("channel input lock").1
    }

    /// The channel is over: everything it holds is given back.
    pub fn close(&self) {
        let mut state = self.state.lock().expect("channel input lock");
        if !state.1 {
            state.1 = true;
            let balance = std::mem::take(&mut state.0);
            self.connection.budget.adjust(self.connection.id, -balance);
        }
    }
}

/// The SSH server's side of the relay pipe: bytes are read only while the
/// connection may read ([`InputBudget`]); writes pass. Once `ended` (the
/// relay is gone) it reads as EOF at once, so a stopped connection still
/// ends and its programs are killed.
pub struct GatedStream<S> {
    inner: S,
    input: Arc<ConnectionInput>,
    ended: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<S> GatedStream<S> {
    pub fn new(inner: S, input: Arc<ConnectionInput>, ended: CancellationToken) -> Self {
        Self {
            inner,
            input,
            ended: Box::pin(ended.cancelled_owned()),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GatedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.ended.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        if !this.input.budget.may_read(this.input.id, cx.waker()) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GatedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn a_connection_over_its_reserve_stops_only_when_the_budget_is_used_up() {
        let budget = InputBudget::with_reserve(1000, 100);
        let (a, b) = (budget.connection(), budget.connection());
        let (wa, wb) = (ChannelInput::new(a.clone()), ChannelInput::new(b.clone()));
        let (woken, w) = waker();
        wa.charge(600);
        assert!(budget.may_read(a.id, &w), "500 of 1000 shared used");
        wa.charge(600);
        assert!(!budget.may_read(a.id, &w), "1100 shared used");
        // Another connection under its reserve still reads.
        wb.charge(50);
        assert!(budget.may_read(b.id, &w));
        // One over its reserve does not.
        wb.charge(100);
        assert!(!budget.may_read(b.id, &w));
        // A reads some: both are woken, and may read again.
        wa.release(300);
        assert!(woken.0.load(Ordering::SeqCst) >= 1);
        assert!(budget.may_read(a.id, &w) && budget.may_read(b.id, &w));
        assert_eq!(budget.held(), 1200 - 300 + 150);
    }

    #[test]
    fn its_own_reads_wake_a_stopped_connection_whatever_others_hold() {
        let budget = InputBudget::with_reserve(1000, 100);
        let (hog, small) = (budget.connection(), budget.connection());
        let hog_input = ChannelInput::new(hog.clone());
        hog_input.charge(5000);
        let small_input = ChannelInput::new(small.clone());
        small_input.charge(150);
        let (woken, w) = waker();
        assert!(!budget.may_read(small.id, &w));
        small_input.release(100);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(budget.may_read(small.id, &w));
        assert!(!budget.may_read(hog.id, &w));
    }

    #[test]
    fn closing_gives_everything_back_and_ignores_later_charges() {
        let budget = InputBudget::with_reserve(1000, 0);
        let conn = budget.connection();
        let input = ChannelInput::new(conn.clone());
        // Released before charged (the channel took it first), then charged.
        input.release(10);
        input.charge(10);
        input.charge(700);
        assert_eq!(budget.held(), 700);
        input.close();
        input.charge(500);
        assert_eq!(budget.held(), 0);
        let other = ChannelInput::new(conn.clone());
        other.charge(2000);
        drop((input, other, conn));
        assert_eq!(budget.held(), 0, "a gone connection holds nothing");
        assert_eq!(budget.state.lock().unwrap().shared, 0);
    }
}
