//! The node's front door: the TCP listener, caps on handshakes in total and per peer, a
//! doubling delay for peers after failures, one bounded handshake thread per connection, and,
//! once a client is in, its TCP connection watched as its lifeline.

use std::collections::HashMap;
use std::io::Read as _;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use strata_ucx::WorkerWaker;

use super::lent_file::LentFile;
use super::{NodeCounters, ServeOptions};
use crate::handshake::{self, FileGrant, HandshakeError, NodeCapacity, Refusal, Session, Visit};

/// A client that passed the handshake, handed to the node loop, which answers with its
/// session (or why it cannot take it).
pub(super) struct Admission {
    pub(super) client_address: Vec<u8>,
    /// The client runs on this host (its connection's two ends share an address), so the
    /// node may reach it over shared memory; the door watches its connection either way.
    pub(super) on_host: bool,
    pub(super) answer: mpsc::Sender<Result<Session, Refusal>>,
}

/// What the door tells the node loop.
pub(super) enum DoorEvent {
    /// A client passed the handshake.
    Admit(Admission),
    /// An admitted client's front-door connection closed: it is gone.
    Left(Session),
}

/// Per-peer bookkeeping of the door.
#[derive(Default)]
struct Peer {
    handshakes: usize,
    failures: u32,
    blocked_until: Option<Instant>,
}

/// Handshakes under way in total and the per-peer records.
#[derive(Default)]
pub(super) struct Peers {
    handshakes: usize,
    by_address: HashMap<IpAddr, Peer>,
}

/// Most per-peer records kept; beyond it, records of peers with nothing under way are dropped.
const MAX_PEER_RECORDS: usize = 4096;

/// First throttle delay after a failed handshake; each further failure doubles it.
const FIRST_THROTTLE: Duration = Duration::from_millis(250);

/// How a handshake ended, for throttling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judgement {
    /// Authenticated: the peer's failure count starts over.
    Passed,
    /// Turned away, stalled or reset: bounded by caps and the deadline, not counted.
    Neutral,
    /// A wrong proof or garbage: the peer waits a doubling delay.
    Failed,
}

/// Longest a door blocked in `accept` takes to notice a stop request.
const STOP_CHECK: Duration = Duration::from_millis(50);

/// Whether a blocking call only ran out of time (or was interrupted): try again.
fn waited_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

/// Makes `accept` on `listener` give up with `WouldBlock` after `timeout` (Linux honours a
/// listening socket's receive timeout in `accept`).
fn accept_timeout(listener: &TcpListener, timeout: Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let tv = libc::timeval {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
    };
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::timeval>())
        .map_err(|_| std::io::Error::other("timeval size does not fit socklen_t"))?;
    // SAFETY: the descriptor is the listener's, open for the call; the option value points
    // to a live `timeval` of `len` bytes, which the kernel only reads.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast::<libc::c_void>(),
            len,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The TCP front door: accepts, throttles, and runs one bounded handshake thread per
/// connection.
pub(super) struct Door {
    pub(super) listener: TcpListener,
    pub(super) options: ServeOptions,
    pub(super) worker_address: Vec<u8>,
    pub(super) admit: mpsc::Sender<DoorEvent>,
    pub(super) waker: WorkerWaker,
    pub(super) counters: Arc<NodeCounters>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) peers: Arc<Mutex<Peers>>,
}

impl Door {
    pub(super) fn run(self) {
        // A blocking accept that gives up every STOP_CHECK: a connection is taken the
        // moment it arrives (polling a non-blocking listener every 20 ms made every client
        // wait 10 ms on average, and `strata run` connects twice per program), and a stop
        // is still noticed. Where the timeout cannot be set, poll as before.
        let poll = match accept_timeout(&self.listener, STOP_CHECK) {
            Ok(()) => None,
            Err(e) => {
                tracing::debug!(error = %e, "no accept timeout; polling the listener");
                if let Err(e) = self.listener.set_nonblocking(true) {
                    tracing::error!(error = %e, "the front door cannot poll its listener");
                    return;
                }
                Some(Duration::from_millis(20))
            }
        };
        let door = Arc::new(self);
        while !door.stop.load(Ordering::SeqCst) {
            match door.listener.accept() {
                Ok((stream, peer)) => door.clone().enter(stream, peer.ip()),
                Err(e) if waited_out(&e) => {
                    // The timeout (or the poll interval) bounds how late a stop is noticed;
                    // accept storms take no sleep.
                    if let Some(interval) = poll {
                        std::thread::sleep(interval);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// Admits a connection to a handshake thread, or turns it away (caps, throttling).
    fn enter(self: Arc<Self>, mut stream: TcpStream, peer: IpAddr) {
        let deadline = Instant::now() + self.options.handshake_timeout;
        let _ = stream.set_nodelay(true);
        if stream.set_nonblocking(false).is_err() {
            return;
        }
        let admitted = {
            let mut peers = self
                .peers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let total = peers.handshakes;
            if peers.by_address.len() >= MAX_PEER_RECORDS {
                let now = Instant::now();
                peers
                    .by_address
                    .retain(|_, p| p.handshakes > 0 || p.blocked_until.is_some_and(|t| t > now));
            }
            let record = peers.by_address.entry(peer).or_default();
            let throttled = record.blocked_until.is_some_and(|t| t > Instant::now());
            let ok = !throttled
                && total < self.options.max_clients
                && record.handshakes < self.options.max_per_peer;
            if ok {
                record.handshakes += 1;
                peers.handshakes += 1;
            }
            ok
        };
        if !admitted {
            self.counters
                .handshakes_failed
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "connection turned away (cap reached or peer throttled)");
            handshake::turn_away(&mut stream, Instant::now() + Duration::from_millis(100));
            return;
        }
        let door = Arc::clone(&self);
        let spawned = std::thread::Builder::new()
            .name("strata-handshake".into())
            .spawn(move || door.handshake(stream, peer, deadline));
        if spawned.is_err() {
            self.finish(peer, Judgement::Neutral);
        }
    }

    fn handshake(&self, mut stream: TcpStream, peer: IpAddr, deadline: Instant) {
        let mut session = None;
        let mut loan = None;
        let on_host = handshake::on_this_host(&stream);
        let outcome = handshake::node_side_lending(
            &mut stream,
            self.options.token.as_bytes(),
            &self.worker_address,
            deadline,
            |admitted| {
                let (answer, reply) = mpsc::channel();
                self.admit
                    .send(DoorEvent::Admit(Admission {
                        client_address: admitted.client_address,
                        on_host,
                        answer,
                    }))
                    .map_err(|_| Refusal::NoAnswer)?;
                self.waker.wake();
                let left = deadline.saturating_duration_since(Instant::now());
                let answered = reply.recv_timeout(left).unwrap_or(Err(Refusal::NoAnswer));
                session = answered.ok();
                answered
            },
            || self.capacity(),
            |bytes| {
                let (lent, grant) = self.lend_file(bytes, on_host)?;
                loan = Some(lent);
                Ok(grant)
            },
        );
        match &outcome {
            Ok(Visit::Session) => tracing::info!(%peer, "client authenticated"),
            Ok(Visit::File) => tracing::info!(%peer, "memory lent as a file"),
            // `strata run` asks before each paging process sizes its arena: not worth a
            // line each time.
            Ok(Visit::Capacity) => tracing::debug!(%peer, "free capacity asked"),
            // A peer that closes during the handshake is usually a reachability check
            // (a client reading the greeting only): not worth a warning each time.
            Err(e @ HandshakeError::Closed) => {
                self.counters
                    .handshakes_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, error = %e, "peer left during the handshake");
            }
            // The error's text speaks to the client ("this host"): name the reason here.
            Err(HandshakeError::Refused(refusal)) => {
                self.counters
                    .handshakes_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, ?refusal, "authenticated client given no session");
            }
            Err(e) => {
                self.counters
                    .handshakes_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, error = %e, "handshake failed");
            }
        }
        // A wrong proof or garbage counts towards throttling; a full node, a stall (the
        // handshake deadline and the caps bound those) or a reset connection does not.
        let judgement = match outcome {
            Ok(_) => Judgement::Passed,
            Err(HandshakeError::Denied | HandshakeError::Protocol(_)) => Judgement::Failed,
            Err(_) => Judgement::Neutral,
        };
        self.finish(peer, judgement);
        if let Some(loan) = loan {
            // The loan lasts while the client holds its connection.
            if outcome.is_ok() {
                self.watch(&mut stream);
            }
            drop(loan);
            tracing::info!(%peer, "file loan ended");
        }
        if let Some(session) = session {
            if outcome.is_ok() {
                self.watch(&mut stream);
            }
            let _ = self.admit.send(DoorEvent::Left(session));
            self.waker.wake();
        }
    }

    /// Lends `bytes` as a file to a client (`on_host`: its connection shows it on this
    /// host), or says it will not; the reason goes to the log, since the client then asks
    /// for a session over messages, where a lack of room is told with numbers.
    fn lend_file(&self, bytes: u64, on_host: bool) -> Result<(LentFile, FileGrant), Refusal> {
        let refuse = |why: &str| {
            tracing::info!(why, "no file lent; the client may ask over messages");
            Refusal::NoFile
        };
        if !on_host {
            return Err(refuse("the client is not on this host"));
        }
        if !self.options.lend_files {
            return Err(refuse("lending files is turned off"));
        }
        if self.options.overcommit {
            return Err(refuse("an overcommitting node lends no files"));
        }
        let taken = self.counters.clients.load(Ordering::Relaxed)
            + self.counters.file_loans.load(Ordering::Relaxed);
        if bytes == 0 || taken >= self.options.max_clients as u64 {
            return Err(refuse("no bytes asked, or all clients taken"));
        }
        self.counters
            .reserve(self.options.capacity, bytes)
            .map_err(|_| refuse("too little capacity free"))?;
        LentFile::create(bytes, Arc::clone(&self.counters)).map_err(|e| refuse(&e))
    }

    /// What the node can still lend: its capacity less what the node loop and the lent
    /// files hold (both take and give back through the same counter).
    fn capacity(&self) -> NodeCapacity {
        let lent = self.counters.lent_bytes.load(Ordering::Relaxed);
        NodeCapacity {
            free: self.options.capacity.saturating_sub(lent),
            capacity: self.options.capacity,
        }
    }

    /// Holds an admitted client's TCP connection until it closes (or sends anything, which
    /// a client never does) or the node stops: a client that dies at any point, even idle,
    /// loses its session and regions at once, without waiting for UCX to notice.
    fn watch(&self, stream: &mut TcpStream) {
        if stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .is_err()
        {
            return;
        }
        let mut byte = [0u8; 1];
        while !self.stop.load(Ordering::SeqCst) {
            match stream.read(&mut byte) {
                Err(e) if waited_out(&e) => {}
                _ => return,
            }
        }
    }

    /// Ends a handshake's accounting; a failure blocks the peer for a doubling delay
    /// (250 ms, 500 ms, ... up to 30 s), a success clears its record.
    fn finish(&self, peer: IpAddr, judgement: Judgement) {
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        peers.handshakes = peers.handshakes.saturating_sub(1);
        if let Some(record) = peers.by_address.get_mut(&peer) {
            record.handshakes = record.handshakes.saturating_sub(1);
            if judgement == Judgement::Passed {
                record.failures = 0;
            } else if judgement == Judgement::Failed {
                record.failures = record.failures.saturating_add(1);
                let delay = FIRST_THROTTLE
                    .saturating_mul(1 << record.failures.min(9).saturating_sub(1))
                    .min(Duration::from_secs(30));
                record.blocked_until = Some(Instant::now() + delay);
            }
        }
    }
}
