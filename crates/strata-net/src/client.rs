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

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_core::store::{ReadRequest, Store, StoreError, check_range};
use strata_core::units::format_size;
use strata_ucx::{
    AmAction, Context, ContextOptions, Endpoint, HeldAmData, RemoteKey, Request, UcxError, Worker,
    WorkerWaker,
};

use crate::handshake::{self, HandshakeError, Session, Welcome};
use crate::protocol::{AM_REPLY, AM_REQUEST, Op, ReplyHeader, RequestHeader, Status};

/// How reads and writes reach a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessPath {
    /// Request/response active messages.
    Messages,
    /// One-sided UCX get/put.
    OneSided,
}

impl std::str::FromStr for AccessPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "messages" | "am" => Ok(AccessPath::Messages),
            "one-sided" | "rma" => Ok(AccessPath::OneSided),
            _ => Err(format!(
                "access path {s:?} not understood; write messages or one-sided"
            )),
        }
    }
}

/// Longest request timeout a [`RemoteStore`] accepts (one day).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// How to open a [`RemoteStore`].
#[derive(Debug, Clone)]
pub struct RemoteStoreOptions {
    /// `HOST:PORT` of each memory node, in stripe order.
    pub nodes: Vec<String>,
    /// The nodes' token.
    pub token: String,
    /// How long a request may stay unanswered before its node counts as lost.
    pub timeout: Duration,
    /// Striping unit in bytes (use the page size, or the codec's slot size).
    pub stripe_bytes: u64,
    /// Access path.
    pub access: AccessPath,
    /// Pieces in flight per node.
    pub max_in_flight: usize,
    /// UCX transports (`None`: UCX's choice).
    pub transports: Option<String>,
    /// Emulate a link of this many bytes per second in each direction (for benchmarks of
    /// compression when the network is the bottleneck); `None`: no limit.
    pub link_bytes_per_sec: Option<u64>,
}

impl RemoteStoreOptions {
    /// Options with defaults: messages, 64 KiB stripes, 32 pieces in flight per node.
    pub fn new(nodes: Vec<String>, token: impl Into<String>, timeout: Duration) -> Self {
        Self {
            nodes,
            token: token.into(),
            timeout,
            stripe_bytes: 64 << 10,
            access: AccessPath::Messages,
            max_in_flight: 32,
            transports: None,
            link_bytes_per_sec: None,
        }
    }
}

/// Why a [`RemoteStore`] could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RemoteOpenError {
    /// A node address does not resolve.
    #[error("memory node address {0:?} does not resolve; write HOST:PORT, e.g. 127.0.0.1:7400")]
    BadAddress(String),
    /// No node was given.
    #[error("no memory node given; pass at least one HOST:PORT")]
    NoNodes,
    /// A timeout of zero or longer than a day.
    #[error(
        "request timeout {0:?} must be between 1 ns and one day; STRATA_REMOTE_TIMEOUT is in seconds"
    )]
    BadTimeout(Duration),
    /// A bad stripe size.
    #[error("stripe size {0} must be larger than zero; use the page size, such as 64KiB")]
    BadStripe(u64),
    /// UCX failed.
    #[error("UCX error while connecting to {node}: {source}")]
    Ucx {
        /// The node.
        node: String,
        /// The error.
        #[source]
        source: UcxError,
    },
    /// The node refused.
    #[error("memory node {node} refused: {reason}")]
    Refused {
        /// The node.
        node: String,
        /// Why.
        reason: &'static str,
    },
    /// The node did not answer in time.
    #[error(
        "memory node {node} did not answer within {timeout:?}; check that `strata serve` runs there and the address is right"
    )]
    Timeout {
        /// The node.
        node: String,
        /// The limit.
        timeout: Duration,
    },
    /// The node's connection failed.
    #[error(
        "connection to memory node {node} failed: {reason}; check that `strata serve` runs there"
    )]
    Connection {
        /// The node.
        node: String,
        /// The error.
        reason: String,
    },
    /// The I/O thread could not start.
    #[error("the remote I/O thread failed to start: {0}")]
    Thread(String),
}

/// Bytes moved over the network by a [`RemoteStore`] (payload, without headers).
#[derive(Debug, Default)]
pub struct NetworkCounters {
    /// Bytes fetched from nodes.
    pub bytes_received: AtomicU64,
    /// Bytes sent to nodes.
    pub bytes_sent: AtomicU64,
    /// Pieces issued.
    pub operations: AtomicU64,
}

/// Completion of one caller's request (all its pieces).
struct Completion {
    state: Mutex<(usize, Option<StoreError>)>,
    done: Condvar,
}

impl Completion {
    fn new(pieces: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new((pieces, None)),
            done: Condvar::new(),
        })
    }
    fn finish(&self, outcome: Result<(), StoreError>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if let Err(e) = outcome {
            state.1.get_or_insert(e);
        }
        if state.0 == 0 {
            self.done.notify_all();
        }
    }
    fn wait(&self) -> Result<(), StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while state.0 > 0 {
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        match state.1.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// One piece: a contiguous range on one node.
struct Piece {
    node: usize,
    write: bool,
    remote_offset: u64,
    /// Caller's buffer (read: written by the I/O thread; write: read by it). The caller
    /// blocks in `Completion::wait` until the piece finishes, keeping the buffer alive.
    buffer: usize,
    length: usize,
    completion: Arc<Completion>,
    finished: bool,
}

impl Piece {
    fn finish(mut self, outcome: Result<(), StoreError>) {
        self.finished = true;
        self.completion.finish(outcome);
    }
}

impl Drop for Piece {
    /// A piece dropped unfinished (the I/O thread stopped or panicked) fails its request, so
    /// no caller waits forever. By then no progress call can touch the caller's buffer.
    fn drop(&mut self) {
        if !self.finished {
            self.completion.finish(Err(StoreError::Unavailable {
                store: "remote".into(),
                reason: "the remote I/O thread stopped; reopen the store".into(),
            }));
        }
    }
}

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
        if options.nodes.is_empty() {
            return Err(RemoteOpenError::NoNodes);
        }
        if options.stripe_bytes == 0 {
            return Err(RemoteOpenError::BadStripe(options.stripe_bytes));
        }
        // Every deadline is `now + timeout`: refuse what would overflow or never expire.
        if options.timeout.is_zero() || options.timeout > MAX_TIMEOUT {
            return Err(RemoteOpenError::BadTimeout(options.timeout));
        }
        let mut addresses = Vec::new();
        for node in &options.nodes {
            let address = node
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| RemoteOpenError::BadAddress(node.clone()))?;
            addresses.push(address);
        }
        let stripes = size.div_ceil(options.stripe_bytes).max(1);
        let per_node = stripes.div_ceil(addresses.len() as u64) * options.stripe_bytes;
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
        let nodes = self.node_names.len() as u64;
        let mut done = 0usize;
        while done < length {
            let position = offset + done as u64;
            let stripe = position / self.stripe;
            let within = position % self.stripe;
            let take = usize::try_from((self.stripe - within).min((length - done) as u64))
                .expect("a piece is at most one stripe");
            out.push(Piece {
                node: usize::try_from(stripe % nodes).expect("node index fits"),
                write,
                remote_offset: (stripe / nodes) * self.stripe + within,
                buffer: buffer + done,
                length: take,
                completion: Arc::clone(completion),
                finished: false,
            });
            done += take;
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

// ---------------------------------------------------------------------------------------------
// The I/O thread

/// Closes the submission queue when the I/O thread ends (normally or by panic); queued
/// pieces fail as they drop.
struct CloseQueueOnExit<'a>(&'a Shared);

impl Drop for CloseQueueOnExit<'_> {
    fn drop(&mut self) {
        let left = self
            .0
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(left);
    }
}

struct Reply {
    header: Option<ReplyHeader>,
    data: ReplyData,
}

enum ReplyData {
    None,
    Held(HeldAmData),
    Copied(Vec<u8>),
}

struct Node {
    name: String,
    /// The capability the node's handshake issued; every request carries it.
    session: Session,
    /// The front-door connection, held open while the store lives: its closing tells the
    /// node this client is gone, even if it dies idle.
    door: Option<TcpStream>,
    endpoint: Option<Endpoint>,
    remote_key: Option<RemoteKey>,
    region: u64,
    base: u64,
    size: u64,
    lost: Option<String>,
    in_flight: usize,
    waiting: VecDeque<Piece>,
    /// One-sided writes: puts were issued since the last flush.
    unflushed: bool,
    /// One-sided writes: flushes issued so far; a put waits for flush number `epoch`.
    flush_epoch: u64,
    /// One-sided writes: the highest flush number that completed.
    flushed_epoch: u64,
    /// One-sided writes: flushes in flight, with their numbers. One flush per round covers
    /// every put issued in that round, instead of one flush per page.
    flushes: Vec<(u64, Request)>,
}

/// A piece on the wire and what it still waits for.
struct InFlight {
    piece: Piece,
    deadline: Instant,
    /// The send / get / put / flush / rendezvous-receive requests still pending.
    requests: Vec<Request>,
    /// Messages path: still waiting for the node's reply.
    awaiting_reply: bool,
    /// One-sided writes: the flush that makes this put remotely complete.
    flush_epoch: Option<u64>,
    failed: Option<StoreError>,
}

/// Paces pieces to an emulated link rate (one direction).
struct Pacer {
    bytes_per_sec: u64,
    next_free: Instant,
}

impl Pacer {
    /// When a transfer of `bytes` may start; reserves the link if now.
    fn admit(&mut self, bytes: usize, now: Instant) -> Option<Instant> {
        if now < self.next_free {
            return Some(self.next_free);
        }
        let seconds = bytes as f64 / self.bytes_per_sec as f64;
        self.next_free = now + Duration::from_secs_f64(seconds);
        None
    }
}

struct IoLoop {
    worker: Worker,
    nodes: Vec<Node>,
    replies: Rc<RefCell<VecDeque<Reply>>>,
    in_flight: HashMap<u64, InFlight>,
    next_id: u64,
    timeout: Duration,
    access: AccessPath,
    max_in_flight: usize,
    counters: Arc<NetworkCounters>,
    pace_send: Option<Pacer>,
    pace_receive: Option<Pacer>,
    /// Control requests (hello, alloc, free) during set-up and tear-down: id -> reply.
    control: HashMap<u64, Option<Reply>>,
}

impl IoLoop {
    fn connect(
        options: &RemoteStoreOptions,
        addresses: &[SocketAddr],
        per_node: u64,
        counters: Arc<NetworkCounters>,
    ) -> Result<Self, RemoteOpenError> {
        let ucx = |node: &str| {
            let node = node.to_string();
            move |source| RemoteOpenError::Ucx { node, source }
        };
        let first = options.nodes[0].as_str();
        let context = Context::new(&ContextOptions {
            transports: options.transports.clone(),
            rma: options.access == AccessPath::OneSided,
        })
        .map_err(ucx(first))?;
        let worker = Worker::new(&context).map_err(ucx(first))?;
        let replies: Rc<RefCell<VecDeque<Reply>>> = Rc::default();
        let sink = Rc::clone(&replies);
        worker
            .set_am_handler(AM_REPLY, move |message| {
                let data = match message.length() {
                    0 => ReplyData::None,
                    _ => match message.hold() {
                        Some(held) => ReplyData::Held(held),
                        None => ReplyData::Copied(message.data().unwrap_or_default().to_vec()),
                    },
                };
                sink.borrow_mut().push_back(Reply {
                    header: ReplyHeader::decode(message.header()),
                    data,
                });
                AmAction::Done
            })
            .map_err(ucx(first))?;
        let pacer = |rate: Option<u64>| {
            rate.map(|bytes_per_sec| Pacer {
                bytes_per_sec,
                next_free: Instant::now(),
            })
        };
        let mut io = Self {
            worker,
            nodes: Vec::new(),
            replies,
            in_flight: HashMap::new(),
            next_id: 1,
            timeout: options.timeout,
            access: options.access,
            max_in_flight: options.max_in_flight.max(1),
            counters,
            pace_send: pacer(options.link_bytes_per_sec),
            pace_receive: pacer(options.link_bytes_per_sec),
            control: HashMap::new(),
        };
        let own_address = io.worker.address().map_err(ucx(first))?;
        for (name, address) in options.nodes.iter().zip(addresses) {
            let (welcome, door) = front_door(
                name,
                *address,
                &options.token,
                &own_address,
                options.timeout,
            )?;
            let endpoint = io
                .worker
                .connect_worker(&welcome.node_address)
                .map_err(ucx(name))?;
            io.nodes.push(Node {
                name: name.clone(),
                session: welcome.session,
                door: Some(door),
                endpoint: Some(endpoint),
                remote_key: None,
                region: 0,
                base: 0,
                size: 0,
                lost: None,
                in_flight: 0,
                waiting: VecDeque::new(),
                unflushed: false,
                flush_epoch: 0,
                flushed_epoch: 0,
                flushes: Vec::new(),
            });
        }
        for index in 0..io.nodes.len() {
            let name = io.nodes[index].name.clone();
            let alloc = RequestHeader {
                op: Op::Alloc,
                session: io.nodes[index].session,
                id: 0,
                region: 0,
                offset: 0,
                length: per_node,
            };
            let reply = io.control_call(index, alloc, &[])?;
            let header = expect_ok(&name, &reply)?;
            let key = match &reply.data {
                ReplyData::Held(held) => held.bytes().map(<[u8]>::to_vec).unwrap_or_default(),
                ReplyData::Copied(bytes) => bytes.clone(),
                ReplyData::None => Vec::new(),
            };
            if let ReplyData::Held(held) = reply.data {
                held.release(&io.worker);
            }
            let node = &mut io.nodes[index];
            node.region = header.region;
            node.base = header.base;
            node.size = header.size;
            if io.access == AccessPath::OneSided {
                if key.is_empty() {
                    return Err(RemoteOpenError::Refused {
                        node: name,
                        reason: "the node does not offer one-sided access (it needs `strata serve --one-sided` on InfiniBand/RoCE transports); use the messages access path",
                    });
                }
                let endpoint = node.endpoint.as_ref().expect("connected above");
                node.remote_key = Some(endpoint.unpack_remote_key(&key).map_err(ucx(&name))?);
            }
            tracing::debug!(node = %name, region = header.region, size = %format_size(header.size), "region borrowed");
        }
        Ok(io)
    }

    /// Sends a control request to node `index` and waits (bounded) for its reply.
    fn control_call(
        &mut self,
        index: usize,
        mut header: RequestHeader,
        data: &[u8],
    ) -> Result<Reply, RemoteOpenError> {
        let name = self.nodes[index].name.clone();
        header.id = self.next_id;
        self.next_id += 1;
        self.control.insert(header.id, None);
        let endpoint =
            self.nodes[index]
                .endpoint
                .as_ref()
                .ok_or_else(|| RemoteOpenError::Connection {
                    node: name.clone(),
                    reason: "not connected".into(),
                })?;
        // SAFETY: `data` outlives this call: every return path below either sees the send
        // complete or closes the endpoint with force and drains it, which cancels the send.
        let mut request = unsafe {
            endpoint.am_send(
                AM_REQUEST,
                &header.encode(),
                data.as_ptr(),
                data.len(),
                true,
            )
        }
        .map_err(|source| RemoteOpenError::Ucx {
            node: name.clone(),
            source,
        })?;
        let deadline = Instant::now() + self.timeout;
        let mut sent = false;
        loop {
            while self.worker.progress() > 0 {}
            if !sent && let Some(outcome) = request.poll() {
                sent = true;
                if let Err(e) = outcome {
                    if let Some(endpoint) = self.nodes[index].endpoint.take() {
                        self.close_and_drain(endpoint);
                    }
                    return Err(RemoteOpenError::Connection {
                        node: name,
                        reason: e.to_string(),
                    });
                }
            }
            self.route_replies();
            if let Some((_, error)) = self
                .worker
                .take_endpoint_errors()
                .into_iter()
                .find(|(id, _)| Some(*id) == self.nodes[index].endpoint.as_ref().map(Endpoint::id))
            {
                if let Some(endpoint) = self.nodes[index].endpoint.take() {
                    self.close_and_drain(endpoint);
                }
                return Err(RemoteOpenError::Connection {
                    node: name,
                    reason: error.to_string(),
                });
            }
            if sent && let Some(reply) = self.control.get_mut(&header.id).and_then(Option::take) {
                self.control.remove(&header.id);
                return Ok(reply);
            }
            let now = Instant::now();
            if now >= deadline {
                // Cancel the send so UCX stops reading `data` before we return.
                if let Some(endpoint) = self.nodes[index].endpoint.take() {
                    self.close_and_drain(endpoint);
                }
                drop(request);
                return Err(RemoteOpenError::Timeout {
                    node: name,
                    timeout: self.timeout,
                });
            }
            let _ = self
                .worker
                .wait((deadline - now).min(Duration::from_millis(20)));
        }
    }

    /// Closes an endpoint with force and progresses until UCX confirms (bounded), so no
    /// operation on it still touches a caller's buffer.
    fn close_and_drain(&mut self, endpoint: Endpoint) {
        match endpoint.close(true) {
            Ok(mut request) => {
                let deadline = Instant::now() + Duration::from_secs(2);
                while request.poll().is_none() && Instant::now() < deadline {
                    self.worker.progress();
                }
            }
            Err(e) => tracing::debug!(error = %e, "closing a failed endpoint"),
        }
        // Progress once more so cancelled operations report completion.
        while self.worker.progress() > 0 {}
    }

    /// Hands replies to the control table or to in-flight pieces.
    fn route_replies(&mut self) {
        loop {
            let next = self.replies.borrow_mut().pop_front();
            let Some(reply) = next else { break };
            let Some(header) = reply.header else {
                tracing::warn!("malformed reply from a memory node dropped");
                self.release(reply.data);
                continue;
            };
            if let Some(slot) = self.control.get_mut(&header.id) {
                *slot = Some(reply);
                continue;
            }
            self.deliver(header, reply.data);
        }
    }

    fn release(&self, data: ReplyData) {
        if let ReplyData::Held(held) = data {
            held.release(&self.worker);
        }
    }

    /// Applies a reply to its in-flight piece.
    fn deliver(&mut self, header: ReplyHeader, data: ReplyData) {
        let Some(flight) = self.in_flight.get_mut(&header.id) else {
            // The piece already failed (its node was declared lost): drop the late reply.
            self.release(data);
            return;
        };
        flight.awaiting_reply = false;
        let node_name = self.nodes[flight.piece.node].name.clone();
        if header.status != Status::Ok {
            flight.failed = Some(StoreError::Unavailable {
                store: format!("remote:{node_name}"),
                reason: header.status.explain().to_string(),
            });
            self.release(data);
            return;
        }
        if flight.piece.write {
            self.release(data);
            return;
        }
        let length = flight.piece.length;
        let buffer = flight.piece.buffer as *mut u8;
        let wrong_length = |got: usize| StoreError::Corrupt {
            store: format!("remote:{node_name}"),
            offset: flight.piece.remote_offset,
            detail: format!("asked for {length} bytes, the node sent {got}"),
        };
        match data {
            ReplyData::Held(held) if held.is_rendezvous() => {
                if held.length() != length {
                    flight.failed = Some(wrong_length(held.length()));
                    held.release(&self.worker);
                    return;
                }
                // SAFETY: the caller's buffer has `length` writable bytes and stays alive
                // until this piece finishes, which waits for this request.
                match unsafe { held.receive_into(&self.worker, buffer) } {
                    Ok(request) => flight.requests.push(request),
                    Err(e) => {
                        flight.failed = Some(StoreError::Unavailable {
                            store: format!("remote:{node_name}"),
                            reason: e.to_string(),
                        });
                    }
                }
            }
            other => {
                let bytes: &[u8] = match &other {
                    ReplyData::Held(held) => held.bytes().unwrap_or_default(),
                    ReplyData::Copied(bytes) => bytes,
                    ReplyData::None => &[],
                };
                if bytes.len() == length {
                    // SAFETY: the caller's buffer has `length` writable bytes, is alive until
                    // the piece finishes, and cannot overlap UCX's receive buffer.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer, length) };
                } else {
                    flight.failed = Some(wrong_length(bytes.len()));
                }
                if let ReplyData::Held(held) = other {
                    held.release(&self.worker);
                }
            }
        }
    }

    fn run(&mut self, shared: &Shared) {
        loop {
            while self.worker.progress() > 0 {}
            self.route_replies();
            for (id, error) in self.worker.take_endpoint_errors() {
                if let Some(index) = self
                    .nodes
                    .iter()
                    .position(|n| n.endpoint.as_ref().map(Endpoint::id) == Some(id))
                {
                    self.lose_node(index, format!("the connection failed ({error})"));
                }
            }
            let queued: Vec<Piece> = shared
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .map(|q| q.drain(..).collect())
                .unwrap_or_default();
            for piece in queued {
                let node = piece.node;
                self.nodes[node].waiting.push_back(piece);
            }
            let next_pace = self.issue();
            self.flush_puts();
            self.poll_flushes();
            self.retire();
            let next_deadline = self.expire();
            if shared.stop.load(Ordering::SeqCst)
                && self.in_flight.is_empty()
                && self.nodes.iter().all(|n| n.waiting.is_empty())
            {
                break;
            }
            let now = Instant::now();
            let mut wake_at = now + Duration::from_millis(50);
            for t in [next_pace, next_deadline].into_iter().flatten() {
                wake_at = wake_at.min(t);
            }
            if wake_at > now && self.replies.borrow().is_empty() {
                let _ = self.worker.wait(wake_at - now);
            }
        }
        self.goodbye();
    }

    /// Issues waiting pieces up to the in-flight limit; returns when paced pieces may go.
    fn issue(&mut self) -> Option<Instant> {
        let mut next_pace = None;
        for index in 0..self.nodes.len() {
            while self.nodes[index].in_flight < self.max_in_flight {
                let Some(piece) = self.nodes[index].waiting.pop_front() else {
                    break;
                };
                if let Some(reason) = &self.nodes[index].lost {
                    let error = lost_error(&self.nodes[index].name, reason);
                    piece.finish(Err(error));
                    continue;
                }
                let now = Instant::now();
                let pacer = if piece.write {
                    self.pace_send.as_mut()
                } else {
                    self.pace_receive.as_mut()
                };
                if let Some(at) = pacer.and_then(|p| p.admit(piece.length, now)) {
                    self.nodes[index].waiting.push_front(piece);
                    next_pace = Some(next_pace.map_or(at, |n: Instant| n.min(at)));
                    break;
                }
                self.start(index, piece);
            }
        }
        next_pace
    }

    fn start(&mut self, index: usize, piece: Piece) {
        let id = self.next_id;
        self.next_id += 1;
        let node = &mut self.nodes[index];
        let store = format!("remote:{}", node.name);
        let endpoint = node
            .endpoint
            .as_ref()
            .expect("a node not lost has an endpoint");
        // Client-side bounds check: the node checks too on the messages path, and the NIC's
        // registration bounds on the one-sided path.
        if piece.remote_offset + piece.length as u64 > node.size {
            let error = StoreError::OutOfRange {
                store,
                offset: piece.remote_offset,
                len: piece.length as u64,
                size: node.size,
            };
            piece.finish(Err(error));
            return;
        }
        let mut requests = Vec::with_capacity(2);
        let mut awaiting_reply = false;
        // SAFETY: (all three paths) piece.buffer has piece.length bytes, readable (write) or
        // writable (read), alive until the piece finishes; a piece finishes only after every
        // request in `requests` completed or its endpoint was closed with force.
        let issued = unsafe {
            match (self.access, piece.write) {
                (AccessPath::Messages, write) => {
                    awaiting_reply = true;
                    let header = RequestHeader {
                        op: if write { Op::Write } else { Op::Read },
                        session: node.session,
                        id,
                        region: node.region,
                        offset: piece.remote_offset,
                        length: piece.length as u64,
                    };
                    let (data, length) = if write {
                        (piece.buffer as *const u8, piece.length)
                    } else {
                        (std::ptr::null(), 0)
                    };
                    endpoint.am_send(AM_REQUEST, &header.encode(), data, length, true)
                }
                (AccessPath::OneSided, false) => endpoint.get(
                    piece.buffer as *mut u8,
                    piece.length,
                    node.base + piece.remote_offset,
                    node.remote_key
                        .as_ref()
                        .expect("one-sided nodes hold a key"),
                ),
                (AccessPath::OneSided, true) => endpoint.put(
                    piece.buffer as *const u8,
                    piece.length,
                    node.base + piece.remote_offset,
                    node.remote_key
                        .as_ref()
                        .expect("one-sided nodes hold a key"),
                ),
            }
        };
        match issued {
            Ok(request) => requests.push(request),
            Err(e) => {
                // Operations already issued for this piece are cancelled when the node is
                // declared lost below.
                let reason = format!("sending a request failed ({e})");
                self.in_flight.insert(
                    id,
                    InFlight {
                        piece,
                        deadline: Instant::now(),
                        requests,
                        awaiting_reply: false,
                        flush_epoch: None,
                        failed: None,
                    },
                );
                self.nodes[index].in_flight += 1;
                self.lose_node(index, reason);
                return;
            }
        }
        if piece.write {
            self.counters
                .bytes_sent
                .fetch_add(piece.length as u64, Ordering::Relaxed);
        } else {
            self.counters
                .bytes_received
                .fetch_add(piece.length as u64, Ordering::Relaxed);
        }
        self.counters.operations.fetch_add(1, Ordering::Relaxed);
        node.in_flight += 1;
        let flush_epoch = (self.access == AccessPath::OneSided && piece.write).then(|| {
            node.unflushed = true;
            node.flush_epoch + 1
        });
        self.in_flight.insert(
            id,
            InFlight {
                piece,
                deadline: Instant::now() + self.timeout,
                requests,
                awaiting_reply,
                flush_epoch,
                failed: None,
            },
        );
    }

    /// Issues one flush per node that got puts this round (one-sided writes complete at the
    /// node only once a later flush completes).
    fn flush_puts(&mut self) {
        for index in 0..self.nodes.len() {
            let node = &mut self.nodes[index];
            if !node.unflushed || node.lost.is_some() {
                continue;
            }
            let Some(endpoint) = node.endpoint.as_ref() else {
                continue;
            };
            node.unflushed = false;
            node.flush_epoch += 1;
            match endpoint.flush() {
                Ok(request) => {
                    let epoch = node.flush_epoch;
                    node.flushes.push((epoch, request));
                }
                Err(e) => self.lose_node(index, format!("flushing writes failed ({e})")),
            }
        }
    }

    /// Notes completed flushes; a failed flush loses its node.
    fn poll_flushes(&mut self) {
        let mut failed = Vec::new();
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let mut error = None;
            let mut done = node.flushed_epoch;
            node.flushes
                .retain_mut(|(epoch, request)| match request.poll() {
                    None => true,
                    Some(Ok(())) => {
                        done = done.max(*epoch);
                        false
                    }
                    Some(Err(e)) => {
                        error.get_or_insert(e);
                        false
                    }
                });
            node.flushed_epoch = done;
            if let Some(e) = error {
                failed.push((index, format!("flushing writes failed ({e})")));
            }
        }
        for (index, reason) in failed {
            self.lose_node(index, reason);
        }
    }

    /// Finishes pieces whose requests and reply are all in.
    fn retire(&mut self) {
        let mut done = Vec::new();
        for (id, flight) in &mut self.in_flight {
            let mut transport_error = None;
            flight.requests.retain_mut(|r| match r.poll() {
                None => true,
                Some(Ok(())) => false,
                Some(Err(e)) => {
                    transport_error.get_or_insert(e);
                    false
                }
            });
            if let Some(e) = transport_error {
                let store = format!("remote:{}", self.nodes[flight.piece.node].name);
                flight
                    .failed
                    .get_or_insert_with(|| StoreError::Unavailable {
                        store,
                        reason: format!("a transfer failed ({e}); the memory node may be gone"),
                    });
            }
            let flushed = flight
                .flush_epoch
                .is_none_or(|epoch| epoch <= self.nodes[flight.piece.node].flushed_epoch);
            if flight.requests.is_empty()
                && ((!flight.awaiting_reply && flushed) || flight.failed.is_some())
            {
                done.push(*id);
            }
        }
        for id in done {
            let flight = self.in_flight.remove(&id).expect("listed above");
            // A failed piece may still have a reply coming; a late reply finds no entry and
            // is dropped (deliver), so nothing writes to the buffer after this point...
            // unless a rendezvous receive is pending, which `requests.is_empty()` excludes.
            self.nodes[flight.piece.node].in_flight -= 1;
            let outcome = match flight.failed {
                Some(e) => Err(e),
                None => Ok(()),
            };
            flight.piece.finish(outcome);
        }
    }

    /// Declares nodes with overdue pieces lost; returns the next deadline.
    fn expire(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let overdue: Vec<usize> = self
            .in_flight
            .values()
            .filter(|f| f.deadline <= now)
            .map(|f| f.piece.node)
            .collect();
        for index in overdue {
            if self.nodes[index].lost.is_none() {
                let reason = format!("no answer within {:?}", self.timeout);
                self.lose_node(index, reason);
            }
        }
        self.in_flight.values().map(|f| f.deadline).min()
    }

    /// Marks a node lost: cancels everything on its endpoint, then fails its pieces.
    fn lose_node(&mut self, index: usize, reason: String) {
        if self.nodes[index].lost.is_some() {
            return;
        }
        tracing::error!(node = %self.nodes[index].name, %reason, "memory node lost");
        self.nodes[index].remote_key = None;
        if let Some(endpoint) = self.nodes[index].endpoint.take() {
            self.close_and_drain(endpoint);
        }
        self.nodes[index].door = None;
        self.nodes[index].flushes.clear();
        self.nodes[index].unflushed = false;
        self.nodes[index].lost = Some(reason.clone());
        let ids: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.piece.node == index)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let flight = self.in_flight.remove(&id).expect("listed above");
            // The force close completed every operation on the endpoint; dropping the
            // requests frees them.
            drop(flight.requests);
            flight
                .piece
                .finish(Err(lost_error(&self.nodes[index].name, &reason)));
        }
        self.nodes[index].in_flight = 0;
        for piece in std::mem::take(&mut self.nodes[index].waiting) {
            piece.finish(Err(lost_error(&self.nodes[index].name, &reason)));
        }
    }

    /// Gives the regions back and closes the connections (best effort, bounded).
    fn goodbye(&mut self) {
        for index in 0..self.nodes.len() {
            if self.nodes[index].lost.is_some() || self.nodes[index].endpoint.is_none() {
                continue;
            }
            self.nodes[index].remote_key = None;
            let free = RequestHeader {
                op: Op::Free,
                session: self.nodes[index].session,
                id: 0,
                region: self.nodes[index].region,
                offset: 0,
                length: 0,
            };
            let saved = self.timeout;
            self.timeout = saved.min(Duration::from_secs(1));
            match self.control_call(index, free, &[]) {
                Ok(reply) => self.release(reply.data),
                Err(e) => tracing::debug!(error = %e, "freeing a region at shutdown"),
            }
            self.timeout = saved;
            if let Some(endpoint) = self.nodes[index].endpoint.take() {
                match endpoint.close(false) {
                    Ok(mut request) => {
                        let deadline = Instant::now() + Duration::from_secs(1);
                        while request.poll().is_none() && Instant::now() < deadline {
                            self.worker.progress();
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "closing a connection at shutdown"),
                }
            }
        }
        let leftovers: Vec<Reply> = self.replies.borrow_mut().drain(..).collect();
        for reply in leftovers {
            self.release(reply.data);
        }
    }
}

/// Passes a node's front door (TCP handshake) and returns its session and worker address,
/// with the connection, which must stay open as long as the session is used.
fn front_door(
    node: &str,
    address: SocketAddr,
    token: &str,
    own_address: &[u8],
    timeout: Duration,
) -> Result<(Welcome, TcpStream), RemoteOpenError> {
    let connection = |reason: String| RemoteOpenError::Connection {
        node: node.to_string(),
        reason,
    };
    let deadline = Instant::now() + timeout;
    let mut stream =
        TcpStream::connect_timeout(&address, timeout).map_err(|e| connection(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let welcome = handshake::client_side(&mut stream, token.as_bytes(), own_address, deadline)
        .map_err(|e| match e {
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
    Ok((welcome, stream))
}

fn lost_error(node: &str, reason: &str) -> StoreError {
    StoreError::Unavailable {
        store: format!("remote:{node}"),
        reason: format!(
            "memory node {node} is lost: {reason}; the pages it held are gone: restart the node and the job (or raise STRATA_REMOTE_TIMEOUT if the node is only slow)"
        ),
    }
}

fn expect_ok(node: &str, reply: &Reply) -> Result<ReplyHeader, RemoteOpenError> {
    let header = reply.header.ok_or_else(|| RemoteOpenError::Connection {
        node: node.to_string(),
        reason: "malformed reply".into(),
    })?;
    if header.status == Status::Ok {
        Ok(header)
    } else {
        Err(RemoteOpenError::Refused {
            node: node.to_string(),
            reason: header.status.explain(),
        })
    }
}
