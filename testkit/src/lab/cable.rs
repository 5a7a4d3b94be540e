//! The cable between a host's `eth0` and its switch port: two threads, one
//! per direction, that copy Ethernet frames between two TAP descriptors and
//! apply the host's [`Rules`] on the way.
//!
//! Why userspace: the kernel here has no `sch_netem` (nor `prio` or `u32`
//! actions), so delay and loss cannot be a qdisc. A frame read from one TAP
//! is written to the other, dropped, or held in a delay queue that the same
//! thread serves: it polls with a timeout that ends at the next frame due,
//! and at most [`POLL`] so it notices the stop flag.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest a cable thread waits before it looks at the stop flag.
const POLL: Duration = Duration::from_millis(20);
/// Frames read in a row before the thread polls again and serves its queue.
const BATCH: usize = 64;
/// Each frame on a TAP descriptor starts with a `struct virtio_net_hdr`
/// (its segmentation and checksum offload state), passed on unread.
pub const OFFLOAD_HEADER: usize = 10;
/// The largest read: a header and a segmentation-offload frame of up to
/// 64 KiB plus its Ethernet header.
const FRAME_MAX: usize = 1 << 17;

const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];

/// Delay and loss of the frames towards one peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub delay: Duration,
    /// Probability in `0.0..=1.0` that a frame is dropped.
    pub loss: f64,
}

/// What one direction of a cable does to IPv4 frames, keyed by the peer's
/// address (the destination going out, the source coming in). A dropped
/// peer wins over a shaped one.
#[derive(Debug, Default)]
pub struct DirectionRules {
    pub dropped: HashSet<Ipv4Addr>,
    pub shaped: HashMap<Ipv4Addr, Shape>,
}

/// The faults of one host's cable.
#[derive(Debug, Default)]
pub struct Rules {
    /// The cable is pulled: every frame is dropped, ARP included.
    pub isolated: bool,
    /// Host to switch, matched on the IPv4 destination.
    pub outbound: DirectionRules,
    /// Switch to host, matched on the IPv4 source.
    pub inbound: DirectionRules,
}

pub type SharedRules = Arc<Mutex<Rules>>;

pub fn lock(rules: &SharedRules) -> std::sync::MutexGuard<'_, Rules> {
    rules.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    Outbound,
    Inbound,
}

enum Verdict {
    Pass,
    Drop,
    Delay(Ipv4Addr, Duration),
}

/// The two threads of one cable; they end when the shared stop flag is set,
/// and [`Cable::join`] waits for them. The TAP descriptors are theirs, so
/// the devices go when both threads have ended.
pub struct Cable {
    threads: Vec<JoinHandle<()>>,
}

impl Cable {
    /// Starts copying between `host` (the host's `eth0`) and `port` (its
    /// port on the switch), both non-blocking TAP descriptors.
    pub fn start(
        name: &str,
        host: OwnedFd,
        port: OwnedFd,
        rules: SharedRules,
        stop: Arc<AtomicBool>,
    ) -> io::Result<Self> {
        let host = Arc::new(host);
        let port = Arc::new(port);
        let mut cable = Self {
            threads: Vec::new(),
        };
        for (direction, from, to) in [
            (Direction::Outbound, host.clone(), port.clone()),
            (Direction::Inbound, port, host),
        ] {
            let (rules, flag) = (rules.clone(), stop.clone());
            let thread = std::thread::Builder::new()
                .name(format!("lab-cable-{name}"))
                .spawn(move || carry(&from, &to, direction, &rules, &flag));
            match thread {
                Ok(thread) => cable.threads.push(thread),
                Err(err) => {
                    // The threads already started end with the stop flag.
                    stop.store(true, Ordering::Relaxed);
                    cable.join();
                    return Err(err);
                }
            }
        }
        Ok(cable)
    }

    /// Waits for both threads (the stop flag must be set).
    pub fn join(&mut self) {
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Frames held back by a delay, sent in order of the time they are due.
/// Per peer a frame is never due before the one queued ahead of it, so a
/// changed delay does not reorder a connection.
#[derive(Default)]
struct DelayQueue {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    frames: HashMap<u64, Vec<u8>>,
    last_due: HashMap<Ipv4Addr, Instant>,
    next_seq: u64,
}

impl DelayQueue {
    fn push(&mut self, peer: Ipv4Addr, due: Instant, frame: &[u8]) {
        let due = match self.last_due.get(&peer) {
            Some(&last) if last > due => last,
            _ => due,
        };
        self.last_due.insert(peer, due);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Reverse((due, seq)));
        self.frames.insert(seq, frame.to_vec());
    }

    /// Whether a frame to `peer` sent now would overtake one still queued.
    fn holds(&self, peer: Ipv4Addr, now: Instant) -> bool {
        self.last_due.get(&peer).is_some_and(|&due| due > now)
    }

    fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((due, _))| *due)
    }

    fn send_due(&mut self, now: Instant, to: &OwnedFd) {
        while let Some(&Reverse((due, seq))) = self.heap.peek() {
            if due > now {
                break;
            }
            self.heap.pop();
            if let Some(frame) = self.frames.remove(&seq) {
                write_frame(to, &frame);
            }
        }
        if self.heap.is_empty() {
            self.last_due.clear();
        }
    }
}

fn carry(
    from: &OwnedFd,
    to: &OwnedFd,
    direction: Direction,
    rules: &SharedRules,
    stop: &AtomicBool,
) {
    let mut frame = vec![0u8; FRAME_MAX];
    let mut queue = DelayQueue::default();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        queue.send_due(now, to);
        let wait = queue
            .next_due()
            .map_or(POLL, |due| due.saturating_duration_since(now).min(POLL));
        match wait_readable(from, wait) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) => {
                std::thread::sleep(POLL);
                continue;
            }
        }
        for _ in 0..BATCH {
            // SAFETY: reads at most `frame.len()` bytes into our buffer.
            let read =
                unsafe { libc::read(from.as_raw_fd(), frame.as_mut_ptr().cast(), frame.len()) };
            let Ok(len) = usize::try_from(read) else {
                // EAGAIN: drained. Anything else: poll again.
                break;
            };
            let frame = &frame[..len];
            let now = Instant::now();
            match verdict(frame, direction, rules) {
                Verdict::Drop => {}
                Verdict::Pass => write_frame(to, frame),
                Verdict::Delay(peer, delay) => {
                    if delay.is_zero() && !queue.holds(peer, now) {
                        write_frame(to, frame);
                    } else {
                        queue.push(peer, now + delay, frame);
                    }
                }
            }
        }
    }
}

fn verdict(frame: &[u8], direction: Direction, rules: &SharedRules) -> Verdict {
    let rules = lock(rules);
    if rules.isolated {
        return Verdict::Drop;
    }
    let Some((source, destination)) = ipv4_addresses(frame) else {
        return Verdict::Pass;
    };
    let (table, peer) = match direction {
        Direction::Outbound => (&rules.outbound, destination),
        Direction::Inbound => (&rules.inbound, source),
    };
    if table.dropped.contains(&peer) {
        return Verdict::Drop;
    }
    match table.shaped.get(&peer) {
        None => Verdict::Pass,
        Some(shape) if shape.loss > 0.0 && rand::random::<f64>() < shape.loss => Verdict::Drop,
        Some(shape) => Verdict::Delay(peer, shape.delay),
    }
}

/// Source and destination of an untagged Ethernet frame carrying IPv4.
fn ipv4_addresses(frame: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let frame = frame.get(OFFLOAD_HEADER..)?;
    if frame.get(12..14)? != ETHERTYPE_IPV4 {
        return None;
    }
    let header = frame.get(14..34)?;
    let source: [u8; 4] = header[12..16].try_into().ok()?;
    let destination: [u8; 4] = header[16..20].try_into().ok()?;
    Some((source.into(), destination.into()))
}

/// Hands a frame to the kernel; a frame it refuses is lost, as on a wire.
fn write_frame(to: &OwnedFd, frame: &[u8]) {
    // SAFETY: writes `frame.len()` bytes from a live slice.
    let _ = unsafe { libc::write(to.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
}

fn wait_readable(fd: &OwnedFd, wait: Duration) -> io::Result<bool> {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_nsec: wait.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one pollfd and a timespec, both live for the call.
    let ready = unsafe { libc::ppoll(&mut poll, 1, &timeout, std::ptr::null()) };
    match ready {
        0 => Ok(false),
        n if n > 0 => Ok(poll.revents & libc::POLLIN != 0),
        _ => {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETHERTYPE: std::ops::Range<usize> = OFFLOAD_HEADER + 12..OFFLOAD_HEADER + 14;

    fn ipv4_frame(source: [u8; 4], destination: [u8; 4]) -> Vec<u8> {
        let mut frame = vec![0u8; OFFLOAD_HEADER + 60];
        let ethernet = &mut frame[OFFLOAD_HEADER..];
        ethernet[12..14].copy_from_slice(&ETHERTYPE_IPV4);
        ethernet[14] = 0x45;
        ethernet[26..30].copy_from_slice(&source);
        ethernet[30..34].copy_from_slice(&destination);
        frame
    }

    #[test]
    fn addresses_of_ipv4_frames_only() {
        let frame = ipv4_frame([198, 18, 251, 10], [198, 18, 251, 11]);
        assert_eq!(
            ipv4_addresses(&frame),
            Some((
                Ipv4Addr::new(198, 18, 251, 10),
                Ipv4Addr::new(198, 18, 251, 11)
            ))
        );
        let mut arp = frame.clone();
        arp[ETHERTYPE].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(ipv4_addresses(&arp), None);
        assert_eq!(ipv4_addresses(&frame[..OFFLOAD_HEADER + 20]), None);
    }

    #[test]
    fn drop_wins_and_direction_picks_the_peer() {
        let a = Ipv4Addr::new(198, 18, 251, 10);
        let b = Ipv4Addr::new(198, 18, 251, 11);
        let rules: SharedRules = Arc::default();
        let out = ipv4_frame(a.octets(), b.octets());
        let back = ipv4_frame(b.octets(), a.octets());
        lock(&rules).outbound.shaped.insert(
            b,
            Shape {
                delay: Duration::from_millis(5),
                loss: 0.0,
            },
        );
        assert!(matches!(
            verdict(&out, Direction::Outbound, &rules),
            Verdict::Delay(peer, _) if peer == b
        ));
        assert!(matches!(
            verdict(&back, Direction::Inbound, &rules),
            Verdict::Pass
        ));
        lock(&rules).outbound.dropped.insert(b);
        assert!(matches!(
            verdict(&out, Direction::Outbound, &rules),
            Verdict::Drop
        ));
        lock(&rules).isolated = true;
        let mut arp = back.clone();
        arp[ETHERTYPE].copy_from_slice(&[0x08, 0x06]);
        assert!(matches!(
            verdict(&arp, Direction::Inbound, &rules),
            Verdict::Drop
        ));
    }

    #[test]
    fn delay_queue_keeps_order_per_peer() {
        let peer = Ipv4Addr::new(198, 18, 251, 11);
        let now = Instant::now();
        let mut queue = DelayQueue::default();
        queue.push(peer, now + Duration::from_millis(50), b"first");
        // A shorter delay later must not overtake.
        queue.push(peer, now + Duration::from_millis(1), b"second");
        assert!(queue.holds(peer, now));
        assert_eq!(queue.next_due(), Some(now + Duration::from_millis(50)));
        let order: Vec<_> = std::iter::from_fn(|| queue.heap.pop())
            .map(|Reverse((_, seq))| queue.frames.remove(&seq).unwrap())
            .collect();
        assert_eq!(order, vec![b"first".to_vec(), b"second".to_vec()]);
    }
}
