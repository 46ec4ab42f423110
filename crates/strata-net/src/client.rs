//! `RemoteStore`: a [`Store`] whose bytes live on one or several memory nodes.
//!
//! Pages are striped over the nodes in fixed units (`stripe_bytes`, 64 KiB by default):
//! stripe `k` lives on node `k % nodes`. Each node lends one region for its share.
//!
//! One I/O thread owns the UCX worker and every endpoint (UCX workers are single-threaded).
//! Callers cut their requests into per-node pieces, queue them, wake the thread and wait on a
//! completion; the thread keeps up to `max_in_flight` pieces per node outstanding, so batches
//! (`read_batch`/`write_batch`) and concurrent callers overlap their round trips.
//!
//! Two access paths, chosen per store ([`AccessPath`]):
//! - `Messages`: request/response active messages; the node copies between its memory and
//!   the wire and checks every range. Works everywhere.
//! - `OneSided`: UCX `get`/`put` on the region's remote key, then `flush` for writes. On
//!   InfiniBand/RoCE the NIC does the work with no node CPU; over TCP UCX emulates it in
//!   software (see the benchmark numbers in the crate docs for which is faster here).
//!
//! Failure: every piece carries a deadline (`timeout`). A piece that misses it, or an endpoint
//! error reported by UCX (peer closed, connection reset), marks the node lost: its endpoint is
//! closed with force (which cancels every operation still touching callers' buffers), waiting
//! callers get [`StoreError::Unavailable`], and later requests to that node fail at once. A
//! read never returns zeros in place of lost data.
//!
//! Files: `options` (what a store is opened with, its errors and counters), `pieces` (a
//! request cut into per-node pieces and its completion), `io_loop` (the I/O thread) and
//! `io_loop/setup` (handshake, connection, region borrowing and goodbye); this file holds the
//! `Store` face that callers see.

mod io_loop;
mod options;
mod pieces;

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_core::store::{ReadRequest, Store, StoreError, check_range};
use strata_core::units::format_size;
use strata_ucx::WorkerWaker;

use crate::handshake::{self, HandshakeError, NodeCapacity};
use crate::protocol::Status;
use io_loop::{CloseQueueOnExit, IoLoop};
use pieces::{Completion, Piece};

pub use options::{AccessPath, MAX_TIMEOUT, NetworkCounters, RemoteOpenError, RemoteStoreOptions};

struct Shared {
    /// Pieces for the I/O thread; `None` once that thread has ended.
    queue: Mutex<Option<VecDeque<Piece>>>,
    stop: AtomicBool,
    waker: Mutex<Option<WorkerWaker>>,
}

/// A store on memory nodes. See the module docs.
#[derive(Debug)]
pub struct RemoteStore {
    size: u64,
    stripe: u64,
    node_names: Vec<String>,
    shared: Arc<Shared>,
    counters: Arc<NetworkCounters>,
    thread: Option<JoinHandle<()>>,
    access: AccessPath,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl RemoteStore {
    /// Connects to every node, authenticates, and borrows this store's share on each.
    pub fn connect(size: u64, options: RemoteStoreOptions) -> Result<Self, RemoteOpenError> {
        // Every deadline is `now + timeout`: refuse what would overflow or never expire.
        check_nodes(&options.nodes, options.timeout)?;
        if options.stripe_bytes == 0 {
            return Err(RemoteOpenError::BadStripe(options.stripe_bytes));
        }
        let addresses = options
            .nodes
            .iter()
            .map(|node| resolve(node))
            .collect::<Result<Vec<_>, _>>()?;
        let per_node = bytes_per_node(size, options.stripe_bytes, addresses.len());
        let shared = Arc::new(Shared {
            queue: Mutex::new(Some(VecDeque::new())),
            stop: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        let counters = Arc::new(NetworkCounters::default());
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let shared = Arc::clone(&shared);
            let counters = Arc::clone(&counters);
            let options = options.clone();
            std::thread::Builder::new()
                .name("strata-remote-io".into())
                .spawn(move || {
                    // However the thread ends (even by panic), later submissions fail at
                    // once instead of waiting for a thread that is gone.
                    let _closed = CloseQueueOnExit(&shared);
                    match IoLoop::connect(&options, &addresses, per_node, counters) {
                        Ok(mut io) => {
                            *shared.waker.lock().unwrap_or_else(|e| e.into_inner()) =
                                Some(io.worker.waker());
                            let _ = ready_tx.send(Ok(()));
                            io.run(&shared);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                })
                .map_err(|e| RemoteOpenError::Thread(e.to_string()))?
        };
        ready_rx
            .recv()
            .map_err(|_| RemoteOpenError::Thread("no start-up report".into()))??;
        tracing::debug!(nodes = ?options.nodes, size = %format_size(size), "remote store open");
        Ok(Self {
            size,
            stripe: options.stripe_bytes,
            node_names: options.nodes,
            shared,
            counters,
            thread: Some(thread),
            access: options.access,
        })
    }

    /// Network byte counters.
    pub fn counters(&self) -> &NetworkCounters {
        &self.counters
    }

    /// The access path in use.
    pub fn access(&self) -> AccessPath {
        self.access
    }

    /// Cuts `[offset, offset + length)` into per-node pieces.
    fn pieces(
        &self,
        offset: u64,
        buffer: usize,
        length: usize,
        write: bool,
        completion: &Arc<Completion>,
        out: &mut Vec<Piece>,
    ) {
        let nodes = self.node_names.len();
        for piece in stripe_pieces(offset, length, self.stripe, nodes) {
            out.push(Piece {
                node: piece.node,
                write,
                remote_offset: piece.at,
                buffer: buffer + piece.start,
                length: piece.length,
                completion: Arc::clone(completion),
                finished: false,
            });
        }
    }

    fn piece_count(&self, offset: u64, length: usize) -> usize {
        if length == 0 {
            return 0;
        }
        let first = offset / self.stripe;
        let last = (offset + length as u64 - 1) / self.stripe;
        usize::try_from(last - first + 1).expect("piece count fits")
    }

    /// Queues the pieces and waits for all of them.
    fn submit_and_wait(
        &self,
        pieces: Vec<Piece>,
        completion: &Completion,
    ) -> Result<(), StoreError> {
        if pieces.is_empty() {
            return Ok(());
        }
        match &mut *self.shared.queue.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(queue) => queue.extend(pieces),
            None => drop(pieces), // the I/O thread is gone: the pieces fail as they drop
        }
        if let Some(waker) = &*self.shared.waker.lock().unwrap_or_else(|e| e.into_inner()) {
            waker.wake();
        }
        completion.wait()
    }
}

impl Store for RemoteStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let mut request = [ReadRequest { offset, buf }];
        self.read_batch(&mut request)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.write_batch(&[(offset, buf)])
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Writes complete only once the node holds the bytes; nothing is buffered here.
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "remote:{} ({})",
            self.node_names.join(","),
            format_size(self.size)
        )
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        let mut total = 0;
        for r in requests.iter() {
            check_range(self, r.offset, r.buf.len())?;
            total += self.piece_count(r.offset, r.buf.len());
        }
        let completion = Completion::new(total);
        let mut pieces = Vec::with_capacity(total);
        for r in requests.iter_mut() {
            let (ptr, len) = (r.buf.as_mut_ptr() as usize, r.buf.len());
            self.pieces(r.offset, ptr, len, false, &completion, &mut pieces);
        }
        self.submit_and_wait(pieces, &completion)
    }

    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let mut total = 0;
        for (offset, buf) in requests {
            check_range(self, *offset, buf.len())?;
            total += self.piece_count(*offset, buf.len());
        }
        let completion = Completion::new(total);
        let mut pieces = Vec::with_capacity(total);
        for (offset, buf) in requests {
            self.pieces(
                *offset,
                buf.as_ptr() as usize,
                buf.len(),
                true,
                &completion,
                &mut pieces,
            );
        }
        self.submit_and_wait(pieces, &completion)
    }
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(waker) = &*self.shared.waker.lock().unwrap_or_else(|e| e.into_inner()) {
            waker.wake();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One node's part of a request over a striped store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StripePiece {
    /// The node holding it.
    pub node: usize,
    /// Its offset in what that node lends.
    pub at: u64,
    /// Where it starts in the request.
    pub start: usize,
    /// Its length (at most one stripe).
    pub length: usize,
}

/// The pieces of `[offset, offset + length)` over `nodes` nodes in stripes of `stripe`
/// bytes: stripe `k` lives on node `k % nodes`, at `(k / nodes) * stripe` there.
pub(crate) fn stripe_pieces(
    offset: u64,
    length: usize,
    stripe: u64,
    nodes: usize,
) -> impl Iterator<Item = StripePiece> {
    let nodes = nodes.max(1) as u64;
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= length {
            return None;
        }
        let position = offset + done as u64;
        let index = position / stripe;
        let within = position % stripe;
        let take = usize::try_from((stripe - within).min((length - done) as u64))
            .expect("a piece is at most one stripe");
        let piece = StripePiece {
            node: usize::try_from(index % nodes).expect("node index fits"),
            at: (index / nodes) * stripe + within,
            start: done,
            length: take,
        };
        done += take;
        Some(piece)
    })
}

/// The error of every request to memory node `node` once it is lost, and why.
pub(crate) fn lost_error(node: &str, reason: &str) -> StoreError {
    StoreError::Unavailable {
        store: format!("remote:{node}"),
        reason: format!(
            "memory node {node} is lost: {reason}; the pages it held are gone: restart the node and the job (or raise STRATA_REMOTE_TIMEOUT if the node is only slow)"
        ),
    }
}

/// Bytes each of `nodes` lends for a store of `size` bytes in stripes of `stripe` bytes:
/// stripe `k` lives on node `k % nodes`, so every node lends as many stripes as the first.
pub fn bytes_per_node(size: u64, stripe: u64, nodes: usize) -> u64 {
    let stripes = size.div_ceil(stripe.max(1)).max(1);
    stripes
        .div_ceil(nodes.max(1) as u64)
        .saturating_mul(stripe.max(1))
}

/// The socket address `node` (`HOST:PORT`) names.
pub(crate) fn resolve(node: &str) -> Result<SocketAddr, RemoteOpenError> {
    node.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| RemoteOpenError::BadAddress(node.to_string()))
}

/// Checks what every conversation with nodes' front doors needs: nodes, and a timeout that
/// neither is zero nor overflows a deadline.
pub(crate) fn check_nodes(nodes: &[String], timeout: Duration) -> Result<(), RemoteOpenError> {
    if nodes.is_empty() {
        return Err(RemoteOpenError::NoNodes);
    }
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(RemoteOpenError::BadTimeout(timeout));
    }
    Ok(())
}

/// Connects to `node`'s front door at `address` and runs `talk` (one handshake) on the
/// connection, all within `timeout`; returns what `talk` returned and the connection.
pub(crate) fn through_door<T>(
    node: &str,
    address: SocketAddr,
    timeout: Duration,
    talk: impl FnOnce(&mut TcpStream, Instant) -> Result<T, HandshakeError>,
) -> Result<(T, TcpStream), RemoteOpenError> {
    let connection = |reason: String| RemoteOpenError::Connection {
        node: node.to_string(),
        reason,
    };
    let deadline = Instant::now() + timeout;
    let mut stream =
        TcpStream::connect_timeout(&address, timeout).map_err(|e| connection(e.to_string()))?;
    let outcome = talk(&mut stream, deadline).map_err(|e| match e {
        HandshakeError::Denied => RemoteOpenError::Refused {
            node: node.to_string(),
            reason: Status::Denied.explain(),
        },
        HandshakeError::Deadline => RemoteOpenError::Timeout {
            node: node.to_string(),
            timeout,
        },
        other => connection(other.to_string()),
    })?;
    Ok((outcome, stream))
}

/// Reads each node's greeting ([`crate::handshake::greeting_only`]) within `timeout`: the
/// nodes answer, speak this handshake version and take clients now.
pub fn probe_nodes(nodes: &[String], timeout: Duration) -> Result<(), RemoteOpenError> {
    check_nodes(nodes, timeout)?;
    for node in nodes {
        through_door(node, resolve(node)?, timeout, handshake::greeting_only)?;
    }
    Ok(())
}

/// Asks each node how much it can lend ([`crate::handshake::query_capacity`]), in the order
/// given, within `timeout` per node. Proves the token: a wrong one is refused here.
pub fn query_capacities(
    nodes: &[String],
    token: &str,
    timeout: Duration,
) -> Result<Vec<NodeCapacity>, RemoteOpenError> {
    check_nodes(nodes, timeout)?;
    nodes
        .iter()
        .map(|node| {
            through_door(node, resolve(node)?, timeout, |stream, deadline| {
                handshake::query_capacity(stream, token.as_bytes(), deadline)
            })
            .map(|(capacity, _)| capacity)
        })
        .collect()
}

#[cfg(test)]
mod stripe_tests {
    use super::*;
    use rand::Rng;

    /// Pieces tile the request in order, never cross a stripe, and land where stripe `k`
    /// lives: node `k % nodes`, offset `(k / nodes) * stripe` there.
    #[test]
    fn stripe_pieces_tile_the_request_and_land_on_their_nodes() {
        let mut rng = rand::rng();
        for _ in 0..2000 {
            let stripe = 1u64 << rng.random_range(0..17);
            let nodes = rng.random_range(1..=5);
            let offset = rng.random_range(0..1u64 << 30);
            let length = rng.random_range(0..300_000usize);
            let mut next = 0usize;
            for p in stripe_pieces(offset, length, stripe, nodes) {
                assert_eq!(p.start, next);
                assert!(p.length > 0 && p.length as u64 <= stripe);
                let position = offset + p.start as u64;
                let k = position / stripe;
                assert_eq!(p.node as u64, k % nodes as u64);
                assert_eq!(p.at, (k / nodes as u64) * stripe + position % stripe);
                assert_eq!(
                    (position + p.length as u64 - 1) / stripe,
                    k,
                    "crosses a stripe"
                );
                next += p.length;
            }
            assert_eq!(next, length);
        }
    }
}
