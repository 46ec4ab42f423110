//! The memory node (`strata serve`): lends regions of its memory to authenticated clients.
//!
//! One thread drives one UCX worker. Clients connect, authenticate with the node's token, and
//! ask for regions; reads and writes arrive as active messages and are bounds-checked here
//! against the region the client owns. Regions are also registered with UCX so clients can use
//! one-sided `get`/`put` where the transport does it in hardware; there the NIC enforces the
//! registration's bounds, and the client library checks its own ranges first.
//! A client's regions are freed when it asks, or when its connection fails or closes.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use strata_core::units::format_size;
use strata_ucx::{
    AmAction, Context, ContextOptions, Endpoint, EndpointId, HeldAmData, MemoryHandle, Request,
    UcxError, Worker, WorkerWaker,
};

use crate::protocol::{
    AM_REPLY, AM_REQUEST, Op, PROTOCOL_VERSION, ReplyHeader, RequestHeader, Status,
};

/// How to run a memory node.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Most bytes lent to all clients together.
    pub capacity: u64,
    /// The secret clients must present.
    pub token: String,
    /// UCX transports (`None`: UCX's choice).
    pub transports: Option<String>,
}

/// Why a memory node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// UCX failed while starting.
    #[error("cannot start the memory node on {listen}: {source}")]
    Ucx {
        /// The address asked for.
        listen: SocketAddr,
        /// The UCX error.
        #[source]
        source: UcxError,
    },
    /// An empty token would let anyone in.
    #[error("the memory node needs a non-empty token; pass --token or set STRATA_REMOTE_TOKEN")]
    EmptyToken,
    /// Zero capacity lends nothing.
    #[error("capacity must be larger than zero; pass for example --capacity 4GiB")]
    ZeroCapacity,
    /// The server thread died while starting.
    #[error("the memory node thread stopped while starting: {0}")]
    Thread(String),
}

/// Live counters of a memory node.
#[derive(Debug, Default)]
pub struct NodeCounters {
    /// Bytes lent now.
    pub lent_bytes: AtomicU64,
    /// Clients connected now.
    pub clients: AtomicU64,
    /// Bytes read by clients through messages.
    pub bytes_read: AtomicU64,
    /// Bytes written by clients through messages.
    pub bytes_written: AtomicU64,
    /// Requests refused (bad token, out of bounds, unknown region, no capacity).
    pub refused: AtomicU64,
}

/// A running memory node. Dropping it shuts it down.
#[derive(Debug)]
pub struct MemoryNode {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: WorkerWaker,
    counters: Arc<NodeCounters>,
    thread: Option<JoinHandle<()>>,
}

impl MemoryNode {
    /// Starts a node on its own thread and returns once it listens.
    pub fn start(options: ServeOptions) -> Result<Self, ServeError> {
        if options.token.is_empty() {
            return Err(ServeError::EmptyToken);
        }
        if options.capacity == 0 {
            return Err(ServeError::ZeroCapacity);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(NodeCounters::default());
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            let counters = Arc::clone(&counters);
            std::thread::Builder::new()
                .name("strata-serve".into())
                .spawn(move || {
                    let listen = options.listen;
                    match NodeLoop::new(options, counters) {
                        Ok(mut node) => {
                            let _ = ready_tx.send(Ok((node.address, node.worker.waker())));
                            node.run(&stop);
                        }
                        Err(source) => {
                            let _ = ready_tx.send(Err(ServeError::Ucx { listen, source }));
                        }
                    }
                })
                .map_err(|e| ServeError::Thread(e.to_string()))?
        };
        let (address, waker) = ready_rx
            .recv()
            .map_err(|_| ServeError::Thread("no start-up report".into()))??;
        Ok(Self {
            address,
            stop,
            waker,
            counters,
            thread: Some(thread),
        })
    }

    /// The address clients connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Live counters.
    pub fn counters(&self) -> &NodeCounters {
        &self.counters
    }

    /// Asks the node to stop (it closes every connection and frees every region).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Stops the node and waits for its thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.request_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MemoryNode {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Anonymous memory lent as one region, registered with UCX.
struct RegionMemory {
    base: *mut u8,
    length: usize,
    registration: Option<MemoryHandle>,
}

impl RegionMemory {
    fn allocate(context: &Arc<Context>, length: usize) -> Result<Self, String> {
        // SAFETY: a fresh private anonymous mapping touches no existing memory; NORESERVE
        // lets the node lend memory it commits only as clients write.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let mut memory = Self {
            base: base.cast::<u8>(),
            length,
            registration: None,
        };
        // SAFETY: the mapping stays until Drop, which drops the registration first.
        let registration = unsafe { context.map_memory(memory.base, length) };
        memory.registration = Some(registration.map_err(|e| e.to_string())?);
        Ok(memory)
    }
}

impl Drop for RegionMemory {
    fn drop(&mut self) {
        self.registration = None;
        // SAFETY: base/length is the mapping made in `allocate`, unmapped once; no request
        // references it any more (pending operations hold an Arc to this struct).
        unsafe { libc::munmap(self.base.cast::<libc::c_void>(), self.length) };
    }
}

struct Region {
    owner: EndpointId,
    memory: Rc<RegionMemory>,
    remote_key: Vec<u8>,
}

struct Client {
    endpoint: Endpoint,
    authenticated: bool,
    regions: Vec<u64>,
}

/// A request as received, its data held or copied out of the AM callback.
struct Incoming {
    reply_to: Option<EndpointId>,
    header: Option<RequestHeader>,
    data: Payload,
}

enum Payload {
    None,
    Held(HeldAmData),
    Copied(Vec<u8>),
}

/// An operation the node waits on, with what it must keep alive until it completes.
struct Pending {
    request: Request,
    _keep: Keep,
    /// A reply to send once the operation completes (rendezvous writes).
    then_reply: Option<(EndpointId, ReplyHeader)>,
}

/// What a pending send or receive needs alive until it completes (only held, never read).
struct Keep {
    _memory: Option<Rc<RegionMemory>>,
    _bytes: Option<Vec<u8>>,
}

impl Keep {
    const NOTHING: Keep = Keep {
        _memory: None,
        _bytes: None,
    };
    fn memory(memory: Rc<RegionMemory>) -> Self {
        Keep {
            _memory: Some(memory),
            _bytes: None,
        }
    }
    fn bytes(bytes: Vec<u8>) -> Self {
        Keep {
            _memory: None,
            _bytes: Some(bytes),
        }
    }
}

struct NodeLoop {
    worker: Worker,
    listener: Option<strata_ucx::Listener>,
    address: SocketAddr,
    options: ServeOptions,
    counters: Arc<NodeCounters>,
    inbox: Rc<RefCell<VecDeque<Incoming>>>,
    clients: HashMap<EndpointId, Client>,
    regions: HashMap<u64, Region>,
    next_region: u64,
    lent: u64,
    pending: Vec<Pending>,
}

impl NodeLoop {
    fn new(options: ServeOptions, counters: Arc<NodeCounters>) -> Result<Self, UcxError> {
        let context = Context::new(&ContextOptions {
            transports: options.transports.clone(),
            rma: true,
        })?;
        let worker = Worker::new(&context)?;
        let inbox: Rc<RefCell<VecDeque<Incoming>>> = Rc::default();
        let sink = Rc::clone(&inbox);
        worker.set_am_handler(AM_REQUEST, move |message| {
            let data = match message.length() {
                0 => Payload::None,
                _ => match message.hold() {
                    Some(held) => Payload::Held(held),
                    None => Payload::Copied(message.data().unwrap_or_default().to_vec()),
                },
            };
            sink.borrow_mut().push_back(Incoming {
                reply_to: message.reply_endpoint(),
                header: RequestHeader::decode(message.header()),
                data,
            });
            AmAction::Done
        })?;
        let listener = worker.listen(options.listen)?;
        let address = listener.local_addr()?;
        tracing::info!(
            %address,
            capacity = %format_size(options.capacity),
            "memory node listening"
        );
        Ok(Self {
            worker,
            listener: Some(listener),
            address,
            options,
            counters,
            inbox,
            clients: HashMap::new(),
            regions: HashMap::new(),
            next_region: 1,
            lent: 0,
            pending: Vec::new(),
        })
    }

    fn run(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::SeqCst) {
            while self.worker.progress() > 0 {}
            let mut busy = self.handle_events();
            busy |= self.complete_pending();
            if !busy {
                // A short timeout bounds how late a stop request (or signal) is noticed.
                if let Err(e) = self.worker.wait(Duration::from_millis(100)) {
                    tracing::error!(error = %e, "waiting for UCX events failed");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        self.shutdown();
    }

    /// Handles connection requests, failed endpoints and requests; true if anything happened.
    fn handle_events(&mut self) -> bool {
        let mut busy = false;
        for request in self.worker.take_conn_requests() {
            busy = true;
            match self.worker.accept(request) {
                Ok(endpoint) => {
                    tracing::info!(client = ?endpoint.id(), "client connected");
                    self.clients.insert(
                        endpoint.id(),
                        Client {
                            endpoint,
                            authenticated: false,
                            regions: Vec::new(),
                        },
                    );
                    self.counters
                        .clients
                        .store(self.clients.len() as u64, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(error = %e, "could not accept a client"),
            }
        }
        for (id, error) in self.worker.take_endpoint_errors() {
            busy = true;
            tracing::info!(client = ?id, reason = %error, "client disconnected");
            self.drop_client(id);
        }
        loop {
            let next = self.inbox.borrow_mut().pop_front();
            let Some(incoming) = next else { break };
            busy = true;
            self.handle_request(incoming);
        }
        busy
    }

    fn drop_client(&mut self, id: EndpointId) {
        if let Some(client) = self.clients.remove(&id) {
            for region in client.regions {
                self.free_region(region);
            }
            // Force: the peer is gone or leaving; nothing left to flush.
            drop(client.endpoint.close(true));
            self.counters
                .clients
                .store(self.clients.len() as u64, Ordering::Relaxed);
        }
    }

    fn free_region(&mut self, region: u64) {
        if let Some(r) = self.regions.remove(&region) {
            self.lent -= r.memory.length as u64;
            self.counters.lent_bytes.store(self.lent, Ordering::Relaxed);
            tracing::info!(
                region,
                size = %format_size(r.memory.length as u64),
                "region freed"
            );
        }
    }

    fn release(&self, payload: Payload) {
        if let Payload::Held(held) = payload {
            held.release(&self.worker);
        }
    }

    fn refuse(&mut self, to: EndpointId, id: u64, status: Status) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(client = ?to, request = id, ?status, "request refused");
        self.reply(to, ReplyHeader::status(id, status), Keep::NOTHING, &[]);
    }

    fn reply(&mut self, to: EndpointId, header: ReplyHeader, keep: Keep, data: &[u8]) {
        let Some(client) = self.clients.get(&to) else {
            return;
        };
        // Eager: the page travels with the reply. Letting UCX use rendezvous for 64 KiB replies
        // (zero-copy into the client's buffer, one more round trip) measured 2x slower over
        // TCP here (461 vs ~1000 MB/s at 32 in flight).
        // SAFETY: `data` points into `keep` (region memory or owned bytes) or is empty; both
        // stay alive in `self.pending` until the send completes.
        let sent = unsafe {
            client
                .endpoint
                .am_send(AM_REPLY, &header.encode(), data.as_ptr(), data.len(), true)
        };
        match sent {
            Ok(request) => self.pending.push(Pending {
                request,
                _keep: keep,
                then_reply: None,
            }),
            Err(e) => tracing::warn!(client = ?to, error = %e, "reply failed"),
        }
    }

    fn handle_request(&mut self, incoming: Incoming) {
        let Some(from) = incoming.reply_to.filter(|id| self.clients.contains_key(id)) else {
            tracing::warn!("request from an unknown endpoint dropped");
            self.release(incoming.data);
            return;
        };
        let Some(header) = incoming.header else {
            self.release(incoming.data);
            self.refuse(from, 0, Status::BadRequest);
            return;
        };
        let authenticated = self.clients.get(&from).is_some_and(|c| c.authenticated);
        match header.op {
            Op::Hello => {
                let token_ok = match &incoming.data {
                    Payload::Copied(bytes) => {
                        constant_time_eq(bytes, self.options.token.as_bytes())
                    }
                    Payload::Held(held) => held
                        .bytes()
                        .is_some_and(|b| constant_time_eq(b, self.options.token.as_bytes())),
                    Payload::None => false,
                };
                self.release(incoming.data);
                if token_ok && header.offset == PROTOCOL_VERSION {
                    if let Some(client) = self.clients.get_mut(&from) {
                        client.authenticated = true;
                    }
                    tracing::info!(client = ?from, "client authenticated");
                    self.reply(
                        from,
                        ReplyHeader::status(header.id, Status::Ok),
                        Keep::NOTHING,
                        &[],
                    );
                } else {
                    self.refuse(from, header.id, Status::Denied);
                }
            }
            _ if !authenticated => {
                self.release(incoming.data);
                self.refuse(from, header.id, Status::NotAuthenticated);
            }
            Op::Alloc => {
                self.release(incoming.data);
                self.alloc(from, header);
            }
            Op::Free => {
                self.release(incoming.data);
                if self.owned(from, header.region) {
                    self.free_region(header.region);
                    if let Some(c) = self.clients.get_mut(&from) {
                        c.regions.retain(|r| *r != header.region);
                    }
                    self.reply(
                        from,
                        ReplyHeader::status(header.id, Status::Ok),
                        Keep::NOTHING,
                        &[],
                    );
                } else {
                    self.refuse(from, header.id, Status::UnknownRegion);
                }
            }
            Op::Read => {
                self.release(incoming.data);
                match self.checked_range(from, &header) {
                    Ok((memory, start, length)) => {
                        self.counters
                            .bytes_read
                            .fetch_add(length as u64, Ordering::Relaxed);
                        // SAFETY: checked_range proved [start, start+length) lies inside the
                        // mapping, which `memory` keeps alive.
                        let bytes =
                            unsafe { std::slice::from_raw_parts(memory.base.add(start), length) };
                        self.reply(
                            from,
                            ReplyHeader::status(header.id, Status::Ok),
                            Keep::memory(memory),
                            bytes,
                        );
                    }
                    Err(status) => self.refuse(from, header.id, status),
                }
            }
            Op::Write => self.write(from, header, incoming.data),
        }
    }

    fn owned(&self, client: EndpointId, region: u64) -> bool {
        self.regions.get(&region).is_some_and(|r| r.owner == client)
    }

    /// The region memory and the in-region byte range a read or write may touch.
    fn checked_range(
        &self,
        client: EndpointId,
        header: &RequestHeader,
    ) -> Result<(Rc<RegionMemory>, usize, usize), Status> {
        let region = self
            .regions
            .get(&header.region)
            .filter(|r| r.owner == client)
            .ok_or(Status::UnknownRegion)?;
        let end = header
            .offset
            .checked_add(header.length)
            .ok_or(Status::OutOfBounds)?;
        if end > region.memory.length as u64 {
            return Err(Status::OutOfBounds);
        }
        let start = usize::try_from(header.offset).map_err(|_| Status::OutOfBounds)?;
        let length = usize::try_from(header.length).map_err(|_| Status::OutOfBounds)?;
        Ok((Rc::clone(&region.memory), start, length))
    }

    fn alloc(&mut self, from: EndpointId, header: RequestHeader) {
        let free = self.options.capacity - self.lent;
        let Ok(length) = usize::try_from(header.length) else {
            return self.refuse(from, header.id, Status::NoCapacity);
        };
        if header.length == 0 {
            return self.refuse(from, header.id, Status::BadRequest);
        }
        if header.length > free {
            tracing::warn!(
                wanted = %format_size(header.length),
                free = %format_size(free),
                "region refused: not enough capacity"
            );
            return self.refuse(from, header.id, Status::NoCapacity);
        }
        let memory = match RegionMemory::allocate(self.worker.context(), length) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "region allocation failed");
                return self.refuse(from, header.id, Status::NoCapacity);
            }
        };
        let remote_key = match memory
            .registration
            .as_ref()
            .map(MemoryHandle::pack_remote_key)
        {
            Some(Ok(k)) => k,
            _ => return self.refuse(from, header.id, Status::NoCapacity),
        };
        let region = self.next_region;
        self.next_region += 1;
        self.lent += header.length;
        self.counters.lent_bytes.store(self.lent, Ordering::Relaxed);
        let reply = ReplyHeader {
            id: header.id,
            status: Status::Ok,
            region,
            base: memory.base as u64,
            size: header.length,
        };
        self.regions.insert(
            region,
            Region {
                owner: from,
                memory: Rc::new(memory),
                remote_key: remote_key.clone(),
            },
        );
        if let Some(c) = self.clients.get_mut(&from) {
            c.regions.push(region);
        }
        tracing::info!(client = ?from, region, size = %format_size(header.length), "region lent");
        let key = self.regions[&region].remote_key.clone();
        let (ptr, len) = (key.as_ptr(), key.len());
        // SAFETY: ptr/len are the bytes of `key`, moved into the Keep that lives until the
        // send completes (moving a Vec does not move its heap buffer).
        let data = unsafe { std::slice::from_raw_parts(ptr, len) };
        self.reply(from, reply, Keep::bytes(key), data);
    }

    fn write(&mut self, from: EndpointId, header: RequestHeader, data: Payload) {
        let (memory, start, length) = match self.checked_range(from, &header) {
            Ok(r) => r,
            Err(status) => {
                self.release(data);
                return self.refuse(from, header.id, status);
            }
        };
        // SAFETY: checked_range proved the range lies inside the live mapping.
        let target = unsafe { memory.base.add(start) };
        let ok = ReplyHeader::status(header.id, Status::Ok);
        match data {
            Payload::Held(held) if held.is_rendezvous() => {
                if held.length() != length {
                    held.release(&self.worker);
                    return self.refuse(from, header.id, Status::BadRequest);
                }
                // SAFETY: target has `length` writable bytes in `memory`, kept alive by the
                // pending entry until the receive completes.
                match unsafe { held.receive_into(&self.worker, target) } {
                    Ok(request) => self.pending.push(Pending {
                        request,
                        _keep: Keep::memory(memory),
                        then_reply: Some((from, ok)),
                    }),
                    Err(e) => {
                        tracing::warn!(error = %e, "receiving write data failed");
                        self.refuse(from, header.id, Status::BadRequest);
                    }
                }
                self.counters
                    .bytes_written
                    .fetch_add(length as u64, Ordering::Relaxed);
            }
            payload => {
                let bytes: &[u8] = match &payload {
                    Payload::Held(held) => held.bytes().unwrap_or_default(),
                    Payload::Copied(bytes) => bytes,
                    Payload::None => &[],
                };
                if bytes.len() != length {
                    self.release(payload);
                    return self.refuse(from, header.id, Status::BadRequest);
                }
                // SAFETY: target has `length` writable bytes (checked above); `bytes` is
                // UCX's or our buffer, which cannot overlap the region mapping.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), target, length) };
                self.counters
                    .bytes_written
                    .fetch_add(length as u64, Ordering::Relaxed);
                self.release(payload);
                self.reply(from, ok, Keep::NOTHING, &[]);
            }
        }
    }

    /// Retires finished operations; true if any finished.
    fn complete_pending(&mut self) -> bool {
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            match self.pending[i].request.poll() {
                Some(outcome) => finished.push((self.pending.swap_remove(i), outcome)),
                None => i += 1,
            }
        }
        let busy = !finished.is_empty();
        for (pending, outcome) in finished {
            if let Err(e) = &outcome {
                tracing::debug!(error = %e, "operation failed (client probably gone)");
            }
            if let Some((to, reply)) = pending.then_reply {
                let reply = match outcome {
                    Ok(()) => reply,
                    Err(_) => ReplyHeader::status(reply.id, Status::BadRequest),
                };
                self.reply(to, reply, Keep::NOTHING, &[]);
            }
        }
        busy
    }

    fn shutdown(&mut self) {
        tracing::info!(clients = self.clients.len(), "memory node shutting down");
        self.listener = None;
        let ids: Vec<EndpointId> = self.clients.keys().copied().collect();
        for id in ids {
            self.drop_client(id);
        }
        // Let cancelled operations finish so no request outlives the memory it names.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !self.pending.is_empty() && std::time::Instant::now() < deadline {
            self.worker.progress();
            self.pending.retain_mut(|p| p.request.poll().is_none());
        }
        self.inbox.borrow_mut().clear();
        tracing::info!("memory node stopped");
    }
}

/// Compares two byte strings in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Set by SIGINT/SIGTERM once [`install_shutdown_signals`] ran.
static SHUTDOWN_SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_shutdown_signal(_signal: libc::c_int) {
    SHUTDOWN_SIGNALLED.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to a flag read by [`shutdown_signalled`], so a node can stop
/// cleanly (close connections, free regions) instead of dying mid-request.
pub fn install_shutdown_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                signal,
                on_shutdown_signal as *const () as libc::sighandler_t,
            )
        };
    }
}

/// Whether SIGINT or SIGTERM arrived since [`install_shutdown_signals`].
pub fn shutdown_signalled() -> bool {
    SHUTDOWN_SIGNALLED.load(Ordering::SeqCst)
}
