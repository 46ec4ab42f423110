//! Memory nodes and RemoteStores over UCX TCP on 127.0.0.1, in one process (and, for the
//! lost-node tests, a child process that is stopped and killed).
#![allow(clippy::cast_possible_truncation)] // tests run on 64-bit hosts only

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use strata_core::config::{CodecKind, StoreConfig, StoreKind};
use strata_core::store::{ReadRequest, Store, StoreError};
use strata_net::protocol::{AM_REPLY, AM_REQUEST, Op, ReplyHeader, RequestHeader, Status};
use strata_net::{
    AccessPath, MemoryNode, RemoteOpenError, RemoteStore, RemoteStoreOptions, ServeOptions,
};
use strata_ucx::{AmAction, Context, ContextOptions, Worker};

const TOKEN: &str = "test-token-0123456789-\u{1F511}";
const TLS: &str = "tcp";

/// The interface lock: held by every test here while it uses UCX, shared, and alone by the
/// one that adds a network interface. UCX lists the host's interfaces when a worker starts,
/// and a veth pair appearing or going away meanwhile made worker or endpoint creation fail
/// ("No such device", "Destination is unreachable": one suite run in about 40 on CI; most
/// runs with two suites at once). A file lock (held until the file returned is dropped), so
/// that test runners with a process per test and several suites at once agree as well.
fn interface_lock(alone: bool) -> std::fs::File {
    let path = std::env::temp_dir().join("strata-net-tests-interfaces.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    if alone {
        file.lock().expect("lock the interface lock");
    } else {
        file.lock_shared().expect("lock the interface lock shared");
    }
    file
}

fn rng(test: &str) -> StdRng {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("{test}: seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn node(capacity: u64) -> MemoryNode {
    node_on("127.0.0.1:0".parse().unwrap(), capacity, TLS)
}

fn node_on(listen: SocketAddr, capacity: u64, transports: &str) -> MemoryNode {
    let mut o = ServeOptions::new(listen, capacity, TOKEN);
    o.transports = Some(transports.into());
    MemoryNode::start(o)
        .expect("start a memory node on 127.0.0.1 (is UCX installed? apt-get install libucx0)")
}

fn options(nodes: &[SocketAddr], access: AccessPath) -> RemoteStoreOptions {
    let mut o = RemoteStoreOptions::new(
        nodes.iter().map(|a| a.to_string()).collect(),
        TOKEN,
        Duration::from_secs(5),
    );
    o.transports = Some(TLS.into());
    o.access = access;
    o.stripe_bytes = 16 << 10;
    o
}

/// Random page and unaligned reads/writes on `store`, checked against a local copy.
fn exercise(store: &dyn Store, rng: &mut StdRng, rounds: usize) {
    let size = store.size() as usize;
    let page = 16usize << 10;
    let mut reference = vec![0u8; size];
    for round in 0..rounds {
        match rng.random_range(0..5) {
            0 | 1 => {
                // A batch of whole pages.
                let count = rng.random_range(1..12);
                let mut data: Vec<(u64, Vec<u8>)> = (0..count)
                    .map(|_| {
                        let at = rng.random_range(0..size / page) * page;
                        let mut bytes = vec![0u8; page];
                        rng.fill_bytes(&mut bytes);
                        (at as u64, bytes)
                    })
                    .collect();
                data.sort_by_key(|(at, _)| *at);
                data.dedup_by_key(|(at, _)| *at);
                let requests: Vec<(u64, &[u8])> =
                    data.iter().map(|(at, b)| (*at, b.as_slice())).collect();
                store.write_batch(&requests).unwrap();
                for (at, bytes) in &data {
                    reference[*at as usize..*at as usize + page].copy_from_slice(bytes);
                }
            }
            2 => {
                let at = rng.random_range(0..size - 1);
                let len = rng.random_range(1..(5 * page).min(size - at));
                let mut bytes = vec![0u8; len];
                rng.fill_bytes(&mut bytes);
                store.write_at(at as u64, &bytes).unwrap();
                reference[at..at + len].copy_from_slice(&bytes);
            }
            3 => {
                let count = rng.random_range(1..16);
                let offsets: Vec<usize> = (0..count)
                    .map(|_| rng.random_range(0..size / page) * page)
                    .collect();
                let mut bufs: Vec<Vec<u8>> = offsets.iter().map(|_| vec![0u8; page]).collect();
                let mut requests: Vec<ReadRequest<'_>> = bufs
                    .iter_mut()
                    .zip(&offsets)
                    .map(|(b, at)| ReadRequest {
                        offset: *at as u64,
                        buf: b.as_mut_slice(),
                    })
                    .collect();
                store.read_batch(&mut requests).unwrap();
                for (b, at) in bufs.iter().zip(&offsets) {
                    assert!(
                        b[..] == reference[*at..*at + page],
                        "round {round}: page at {at}"
                    );
                }
            }
            _ => {
                let at = rng.random_range(0..size - 1);
                let len = rng.random_range(1..(5 * page).min(size - at));
                let mut bytes = vec![0u8; len];
                store.read_at(at as u64, &mut bytes).unwrap();
                assert!(
                    bytes == reference[at..at + len],
                    "round {round}: {len} bytes at {at}"
                );
            }
        }
    }
    let mut all = vec![0u8; size];
    store.read_at(0, &mut all).unwrap();
    assert!(
        all == reference,
        "final full read differs from the reference"
    );
}

#[test]
fn several_clients_read_and_write_random_pages_on_striped_nodes() {
    let _interfaces = interface_lock(false);
    let mut seed_rng = rng("several_clients");
    let nodes = [node(64 << 20), node(64 << 20)];
    let addresses: Vec<SocketAddr> = nodes.iter().map(MemoryNode::address).collect();
    let threads: Vec<_> = (0..4)
        .map(|client: u8| {
            let addresses = addresses.clone();
            let seed = seed_rng.random::<u64>();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed);
                // Clients 0, 1 and 3 stripe over both nodes; 2 uses node 0.
                let (targets, access) = match client {
                    2 => (&addresses[..1], AccessPath::Messages),
                    _ => (&addresses[..], AccessPath::Messages),
                };
                let size = 3 << 20; // not a multiple of the stripe times the node count
                let store =
                    RemoteStore::connect(size + 4096 * u64::from(client), options(targets, access))
                        .unwrap();
                exercise(&store, &mut rng, 150);
                let c = store.counters();
                assert!(c.bytes_sent.load(Ordering::Relaxed) > 0);
                assert!(c.bytes_received.load(Ordering::Relaxed) >= store.size());
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread failed");
    }
    // Every client disconnected: the nodes must have freed all regions.
    let deadline = Instant::now() + Duration::from_secs(5);
    while nodes
        .iter()
        .any(|n| n.counters().lent_bytes.load(Ordering::Relaxed) != 0)
    {
        assert!(
            Instant::now() < deadline,
            "regions still lent after every client left"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn wrong_token_and_too_little_capacity_are_refused() {
    let _interfaces = interface_lock(false);
    let n = node(1 << 20);
    let mut o = options(&[n.address()], AccessPath::Messages);
    o.token = "not-the-token".into();
    let e = RemoteStore::connect(1 << 20, o).unwrap_err();
    assert!(matches!(e, RemoteOpenError::Refused { .. }), "{e}");
    assert!(e.to_string().contains("refused the token"), "{e}");
    // A failed proof throttles this host for 250 ms: right away the node turns it away.
    let e =
        RemoteStore::connect(1 << 20, options(&[n.address()], AccessPath::Messages)).unwrap_err();
    assert!(e.to_string().contains("throttles"), "{e}");
    std::thread::sleep(Duration::from_millis(400));
    // Over TCP the node has no RMA: one-sided access is refused, never emulated.
    let e =
        RemoteStore::connect(1 << 20, options(&[n.address()], AccessPath::OneSided)).unwrap_err();
    assert!(e.to_string().contains("one-sided"), "{e}");
    let e =
        RemoteStore::connect(2 << 20, options(&[n.address()], AccessPath::Messages)).unwrap_err();
    assert!(e.to_string().contains("too little free capacity"), "{e}");
    // The refusal says both numbers: what the store asked, and what the node had free.
    assert!(
        matches!(
            e,
            RemoteOpenError::NoCapacity {
                asked,
                free,
                ..
            } if asked == 2 << 20 && free == 1 << 20
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("1 MiB free") && e.to_string().contains("needs 2 MiB"),
        "{e}"
    );
    assert!(n.counters().refused.load(Ordering::Relaxed) >= 1);
    assert!(n.counters().handshakes_failed.load(Ordering::Relaxed) >= 2);
    // Nothing listens on this port: a clear error within the timeout, not a hang.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unused = free.local_addr().unwrap();
    drop(free);
    let mut o = options(&[unused], AccessPath::Messages);
    o.timeout = Duration::from_secs(2);
    let started = Instant::now();
    let e = RemoteStore::connect(1 << 20, o).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    println!("no node: {e}");
}

#[test]
fn client_side_bounds_are_checked() {
    let _interfaces = interface_lock(false);
    let n = node(1 << 20);
    let store =
        RemoteStore::connect(1 << 20, options(&[n.address()], AccessPath::Messages)).unwrap();
    let mut buf = [0u8; 16];
    let e = store.read_at((1 << 20) - 8, &mut buf).unwrap_err();
    assert!(matches!(e, StoreError::OutOfRange { .. }), "{e}");
    let e = store.write_at(u64::MAX - 4, &buf).unwrap_err();
    assert!(matches!(e, StoreError::OutOfRange { .. }), "{e}");
}

/// A hand-driven protocol client, to send what RemoteStore never would.
type Replies = std::rc::Rc<std::cell::RefCell<Vec<(ReplyHeader, Vec<u8>)>>>;

struct RawClient {
    /// Send requests' data eagerly (as clients do) or let UCX choose (rendezvous when big).
    eager: bool,
    worker: Worker,
    endpoint: strata_ucx::Endpoint,
    replies: Replies,
    next: u64,
    session: strata_net::handshake::Session,
    /// The front-door connection: closing it ends the session.
    door: Option<std::net::TcpStream>,
}

impl RawClient {
    fn connect(address: SocketAddr) -> Self {
        let context = Context::new(&ContextOptions {
            transports: Some(TLS.into()),
            rma: true,
            settings: Vec::new(),
        })
        .unwrap();
        let worker = Worker::new(&context).unwrap();
        let replies: Replies = Default::default();
        let sink = replies.clone();
        worker
            .set_am_handler(AM_REPLY, move |m| {
                let data = m.data().map(<[u8]>::to_vec).unwrap_or_default();
                sink.borrow_mut()
                    .push((ReplyHeader::decode(m.header()).unwrap(), data));
                AmAction::Done
            })
            .unwrap();
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        let welcome = strata_net::handshake::client_side(
            &mut stream,
            TOKEN.as_bytes(),
            &worker.address().unwrap(),
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap();
        // The node reaches a client on its host without peer-failure handling (so UCX may
        // use shared memory); the two ends must agree.
        let endpoint = if strata_net::handshake::on_this_host(&stream) {
            worker.connect_worker_on_host(&welcome.node_address)
        } else {
            worker.connect_worker(&welcome.node_address)
        }
        .unwrap();
        Self {
            eager: true,
            worker,
            endpoint,
            replies,
            next: 1,
            session: welcome.session,
            door: Some(stream),
        }
    }

    /// Sends a request; returns its reply, or `None` if none came within `wait`.
    fn send(
        &mut self,
        session: strata_net::handshake::Session,
        (op, region, offset, length): (Op, u64, u64, u64),
        data: &[u8],
        wait: Duration,
    ) -> Option<ReplyHeader> {
        let id = self.next;
        self.next += 1;
        let header = RequestHeader {
            op,
            session,
            id,
            region,
            offset,
            length,
        };
        self.send_bytes(&header.encode(), id, data, wait)
    }

    /// Sends raw header bytes (any length, any content); waits for a reply with `id`.
    fn send_bytes(
        &mut self,
        header: &[u8],
        id: u64,
        data: &[u8],
        wait: Duration,
    ) -> Option<ReplyHeader> {
        // SAFETY: `data` outlives the loop below, which waits for the send and the reply.
        let mut request = unsafe {
            self.endpoint
                .am_send(AM_REQUEST, header, data.as_ptr(), data.len(), self.eager)
        }
        .unwrap();
        let deadline = Instant::now() + wait;
        let mut sent = false;
        loop {
            self.worker.progress();
            if !sent && request.poll().is_some() {
                sent = true;
            }
            let found = self.replies.borrow().iter().position(|(h, _)| h.id == id);
            if let (Some(pos), true) = (found, sent) {
                return Some(self.replies.borrow_mut().remove(pos).0);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    fn call(&mut self, op: Op, region: u64, offset: u64, length: u64, data: &[u8]) -> ReplyHeader {
        let session = self.session;
        self.send(
            session,
            (op, region, offset, length),
            data,
            Duration::from_secs(5),
        )
        .unwrap_or_else(|| panic!("no reply to {op:?}"))
    }
}

#[test]
fn the_node_checks_tokens_bounds_and_ownership() {
    let _interfaces = interface_lock(false);
    let n = node(4 << 20);
    let mut a = RawClient::connect(n.address());
    let mut b = RawClient::connect(n.address());
    let region = a.call(Op::Alloc, 0, 0, 1 << 20, &[]);
    assert_eq!(region.status, Status::Ok);
    assert_eq!(region.size, 1 << 20);
    let r = region.region;
    // In bounds: fine. Out of bounds, overflowing, or someone else's region: refused.
    assert_eq!(
        a.call(Op::Write, r, (1 << 20) - 4, 4, &[1, 2, 3, 4]).status,
        Status::Ok
    );
    assert_eq!(
        a.call(Op::Read, r, (1 << 20) - 4, 8, &[]).status,
        Status::OutOfBounds
    );
    assert_eq!(
        a.call(Op::Write, r, 1 << 20, 4, &[1, 2, 3, 4]).status,
        Status::OutOfBounds
    );
    assert_eq!(
        a.call(Op::Read, r, u64::MAX - 2, 8, &[]).status,
        Status::OutOfBounds
    );
    assert_eq!(
        a.call(Op::Write, r, 0, 8, &[1, 2, 3]).status,
        Status::BadRequest
    );
    assert_eq!(b.call(Op::Read, r, 0, 8, &[]).status, Status::UnknownRegion);
    // A request with a forged session (a reachable worker, no handshake) is dropped
    // unanswered: no read of a's page, no write into it, no region.
    let forged = [0x5a; 16];
    let quiet = Duration::from_millis(300);
    for (request, data) in [
        ((Op::Read, r, 0, 8), &[][..]),
        ((Op::Write, r, 0, 4), &[9, 9, 9, 9][..]),
        ((Op::Alloc, 0, 0, 4096), &[][..]),
        ((Op::Write, r, 0x10, 4), &[0, 0, 0, 0][..]),
    ] {
        assert_eq!(b.send(forged, request, data, quiet), None);
    }
    assert!(n.counters().unauthenticated_dropped.load(Ordering::Relaxed) >= 4);
    assert_eq!(
        a.call(Op::Read, r, (1 << 20) - 4, 4, &[]).status,
        Status::Ok
    );
    assert_eq!(b.call(Op::Free, r, 0, 0, &[]).status, Status::UnknownRegion);
    assert_eq!(
        a.call(Op::Alloc, 0, 0, 8 << 20, &[]).status,
        Status::NoCapacity
    );
    assert_eq!(n.counters().lent_bytes.load(Ordering::Relaxed), 1 << 20);
    assert_eq!(a.call(Op::Free, r, 0, 0, &[]).status, Status::Ok);
    assert_eq!(n.counters().lent_bytes.load(Ordering::Relaxed), 0);
    assert_eq!(a.call(Op::Read, r, 0, 8, &[]).status, Status::UnknownRegion);
}

#[test]
fn a_client_that_leaves_by_the_front_door_is_cut_off_and_the_node_lives() {
    let _interfaces = interface_lock(false);
    let n = node(4 << 20);
    for _ in 0..3 {
        let mut a = RawClient::connect(n.address());
        let r = a.call(Op::Alloc, 0, 0, 1 << 20, &[]).region;
        assert_eq!(n.counters().lent_bytes.load(Ordering::Relaxed), 1 << 20);
        // Closing the TCP connection ends the session: its region is freed, and requests
        // still on the way over UCX are dropped unanswered.
        a.door = None;
        let deadline = Instant::now() + Duration::from_secs(5);
        while n.counters().lent_bytes.load(Ordering::Relaxed) != 0 {
            assert!(
                Instant::now() < deadline,
                "region not freed after the client left"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let session = a.session;
        for _ in 0..20 {
            assert_eq!(
                a.send(
                    session,
                    (Op::Write, r, 0, 4),
                    &[1, 2, 3, 4],
                    Duration::from_millis(20)
                ),
                None
            );
        }
    }
    let mut b = RawClient::connect(n.address());
    assert_eq!(b.call(Op::Alloc, 0, 0, 1 << 20, &[]).status, Status::Ok);
}

/// Seconds each fuzz loop runs: `NET_FUZZ_SECS`, default 3 (CI).
fn fuzz_budget() -> Duration {
    let secs = std::env::var("NET_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    Duration::from_secs(secs)
}

/// The node decoding hostile requests from an authenticated client: random and mutated
/// headers (ops, sessions, regions, offsets, lengths, truncation) with random payloads. The
/// node must answer or drop each, never crash, and keep serving.
#[test]
fn fuzz_the_node_with_hostile_requests() {
    let _interfaces = interface_lock(false);
    let mut rng = rng("fuzz_node");
    let n = node(8 << 20);
    let mut a = RawClient::connect(n.address());
    let r = a.call(Op::Alloc, 0, 0, 1 << 20, &[]).region;
    let ops = [Op::Alloc, Op::Free, Op::Read, Op::Write];
    let end = Instant::now() + fuzz_budget();
    let (mut sent, mut answered) = (0u64, 0u64);
    while Instant::now() < end {
        let pick = |choices: &[u64], rng: &mut StdRng| {
            if rng.random_bool(0.3) {
                rng.random::<u64>()
            } else {
                choices[rng.random_range(0..choices.len())]
            }
        };
        let id = 1_000_000 + sent;
        let header = RequestHeader {
            op: ops[rng.random_range(0..ops.len())],
            session: if rng.random_bool(0.9) {
                a.session
            } else {
                rng.random()
            },
            id,
            region: pick(&[r, 0, r + 1, u64::MAX], &mut rng),
            offset: pick(&[0, 4096, (1 << 20) - 1, 1 << 20, u64::MAX - 7], &mut rng),
            length: pick(
                &[0, 1, 4096, 65536, 1 << 20, (1 << 20) + 1, u64::MAX],
                &mut rng,
            ),
        };
        let mut bytes = header.encode().to_vec();
        match rng.random_range(0..10) {
            0 => bytes[0] = rng.random(),
            1 => bytes.truncate(rng.random_range(0..bytes.len())),
            2 => bytes.extend_from_slice(&[0x41; 9]),
            3 => {
                let at = rng.random_range(0..bytes.len());
                bytes[at] ^= 1 << rng.random_range(0..8);
            }
            _ => {}
        }
        let data_len = match rng.random_range(0..4) {
            0 => 0,
            1 => usize::try_from(header.length.min(70_000)).unwrap(),
            _ => rng.random_range(0..70_000),
        };
        let mut data = vec![0u8; data_len];
        rng.fill_bytes(&mut data);
        if let Some(reply) = a.send_bytes(&bytes, id, &data, Duration::from_millis(20)) {
            assert_eq!(reply.id, id);
            answered += 1;
        }
        sent += 1;
    }
    println!("fuzz_node: {sent} hostile requests, {answered} answered");
    assert!(sent >= 10, "the fuzz loop barely ran");
    let mut b = RawClient::connect(n.address());
    let region = b.call(Op::Alloc, 0, 0, 4096, &[]);
    assert_eq!(region.status, Status::Ok);
    assert_eq!(
        b.call(Op::Write, region.region, 0, 4, &[1, 2, 3, 4]).status,
        Status::Ok
    );
}

/// Runs a memory node in a child process (this test binary, re-executed), for the tests
/// that stop or kill it. Ignored in normal runs; the parent runs it with `--ignored`.
#[test]
#[ignore = "helper: the lost-node tests run it in a child process"]
fn child_memory_node() {
    // No interface lock here: the parent test holds one for it (alone, for the namespace).
    let Ok(capacity) = std::env::var("NET_TEST_CHILD_NODE") else {
        return;
    };
    let listen = std::env::var("NET_TEST_CHILD_LISTEN").unwrap_or_else(|_| "127.0.0.1:0".into());
    let transports = std::env::var("NET_TEST_CHILD_TLS").unwrap_or_else(|_| TLS.into());
    let n = node_on(
        listen.parse().unwrap(),
        capacity.parse().unwrap(),
        &transports,
    );
    println!("LISTENING {}", n.address());
    std::thread::sleep(Duration::from_secs(60));
}

struct ChildNode {
    child: Child,
    address: SocketAddr,
}

impl ChildNode {
    fn start() -> Self {
        Self::start_with(&[], Command::new(std::env::current_exe().unwrap()))
    }

    /// Starts the child with `env` set, through `command` (this test binary, or a wrapper
    /// such as `ip netns exec NS` that runs it).
    fn start_with(env: &[(&str, &str)], mut command: Command) -> Self {
        let mut child = command
            .args(["--exact", "child_memory_node", "--ignored", "--nocapture"])
            .env("NET_TEST_CHILD_NODE", (64u64 << 20).to_string())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let address = loop {
            let line = lines
                .next()
                .expect("child exited before listening")
                .unwrap();
            if let Some(a) = line.strip_prefix("LISTENING ") {
                break a.parse().unwrap();
            }
        };
        Self { child, address }
    }
    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) with the pid of our own child process and a standard signal.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}): {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads until the store fails; returns the error and how long the failing call took.
fn first_failure(store: &RemoteStore) -> (StoreError, Duration) {
    let mut buf = vec![0u8; 64 << 10];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let started = Instant::now();
        match store.read_at(0, &mut buf) {
            Ok(()) => assert!(Instant::now() < deadline, "the store never failed"),
            Err(e) => return (e, started.elapsed()),
        }
    }
}

#[test]
fn a_killed_node_is_an_error_within_the_timeout() {
    let _interfaces = interface_lock(false);
    let mut rng = rng("killed_node");
    killed_node(AccessPath::Messages, &mut rng);
}

fn killed_node(access: AccessPath, rng: &mut StdRng) {
    let child = ChildNode::start();
    let local = node(64 << 20);
    let mut o = options(&[local.address(), child.address], access);
    o.timeout = Duration::from_secs(2);
    let store = RemoteStore::connect(8 << 20, o).unwrap();
    let mut page = vec![0u8; 16 << 10];
    rng.fill_bytes(&mut page);
    store.write_at(16 << 10, &page).unwrap(); // stripe 1 lives on the child
    let mut back = vec![0u8; 16 << 10];
    store.read_at(16 << 10, &mut back).unwrap();
    assert_eq!(back, page);
    child.signal(libc::SIGKILL);
    let started = Instant::now();
    let e = loop {
        match store.read_at(16 << 10, &mut back) {
            Ok(()) => {
                assert_eq!(back, page, "a read after the kill returned wrong data");
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "no error after the kill"
                );
            }
            Err(e) => break e,
        }
    };
    let started_kill = started.elapsed();
    assert!(
        started_kill < Duration::from_secs(4),
        "took {started_kill:?}"
    );
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e}");
    assert!(e.to_string().contains("lost"), "{e}");
    // Later requests to the lost node fail at once; the surviving node still serves.
    let started = Instant::now();
    assert!(store.read_at(16 << 10, &mut back).is_err());
    assert!(started.elapsed() < Duration::from_millis(500));
    store.write_at(0, &page).unwrap();
    store.read_at(0, &mut back).unwrap();
    assert_eq!(back, page);
    println!("{access:?}: after kill ({started_kill:?} to the first error): {e}");
}

#[test]
fn a_stopped_node_is_an_error_within_the_timeout() {
    let _interfaces = interface_lock(false);
    let child = ChildNode::start();
    let mut o = options(&[child.address], AccessPath::Messages);
    o.timeout = Duration::from_secs(2);
    let store = RemoteStore::connect(1 << 20, o).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    store.read_at(0, &mut buf).unwrap();
    child.signal(libc::SIGSTOP);
    let (e, took) = first_failure(&store);
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert!(e.to_string().contains("no answer within"), "{e}");
    child.signal(libc::SIGCONT);
}

#[test]
fn open_store_builds_remote_stores_with_codecs() {
    let _interfaces = interface_lock(false);
    let mut rng = rng("open_store");
    let n = node(64 << 20);
    for codec in [CodecKind::None, CodecKind::Lz4] {
        let config = StoreConfig::builder()
            .kind(StoreKind::Remote {
                nodes: vec![n.address().to_string()],
            })
            .codec(codec)
            .token(TOKEN)
            .timeout_secs(5)
            .build()
            .unwrap();
        let store: Arc<dyn Store> = strata_net::open_store(&config, 2 << 20).unwrap();
        assert!(store.describe().contains("remote:"), "{}", store.describe());
        exercise(store.as_ref(), &mut rng, 40);
    }
    let config = StoreConfig::builder()
        .kind(StoreKind::Remote {
            nodes: vec![n.address().to_string()],
        })
        .build();
    assert!(
        config.is_err(),
        "a remote store without a token must be refused"
    );
}

#[test]
fn one_store_serves_many_threads_at_once() {
    let _interfaces = interface_lock(false);
    let mut seed_rng = rng("one_store_many_threads");
    let nodes = [node(32 << 20), node(32 << 20)];
    let addresses: Vec<SocketAddr> = nodes.iter().map(MemoryNode::address).collect();
    // Messages only: over TCP the node offers no one-sided access (its refusal is tested in
    // wrong_token_and_too_little_capacity_are_refused).
    {
        let access = AccessPath::Messages;
        let store = Arc::new(RemoteStore::connect(8 << 20, options(&addresses, access)).unwrap());
        let share = store.size() / 4;
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let store = Arc::clone(&store);
                let seed = seed_rng.random::<u64>();
                std::thread::spawn(move || {
                    // Each thread owns one quarter; unaligned ranges cross stripes and nodes.
                    let mut rng = StdRng::seed_from_u64(seed);
                    let base = t * share;
                    let mut reference = vec![0u8; share as usize];
                    for _ in 0..200 {
                        let at = rng.random_range(0..share - 1);
                        let len = rng.random_range(1..=(100_000).min(share - at)) as usize;
                        if rng.random_bool(0.5) {
                            let mut bytes = vec![0u8; len];
                            rng.fill_bytes(&mut bytes);
                            store.write_at(base + at, &bytes).unwrap();
                            reference[at as usize..at as usize + len].copy_from_slice(&bytes);
                        } else {
                            let mut bytes = vec![0u8; len];
                            store.read_at(base + at, &mut bytes).unwrap();
                            assert!(bytes[..] == reference[at as usize..at as usize + len]);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a thread failed");
        }
    }
}

#[test]
fn a_pager_region_pages_through_a_compressed_remote_store() {
    let _interfaces = interface_lock(false);
    let mut rng = rng("pager_region");
    let n = node(64 << 20);
    let page = 64u64 << 10;
    let size = 8u64 << 20;
    let config = StoreConfig::builder()
        .kind(StoreKind::Remote {
            nodes: vec![n.address().to_string()],
        })
        .codec(CodecKind::Lz4)
        .token(TOKEN)
        .timeout_secs(5)
        .build()
        .unwrap();
    let store = strata_net::open_store_with_page(&config, size, page).unwrap();
    let pager = strata_core::PagerConfig::builder()
        .page_bytes(page)
        .buffer_bytes(1 << 20) // 16 pages resident of 128: most accesses fault over the network
        .fillers(2)
        .evictors(1)
        .build()
        .unwrap();
    let mut region = strata_pager::Region::new(store.clone(), size, pager).unwrap();
    // Half the pages random, half repetitive: both codec paths go over the wire.
    let mut reference = vec![0u8; size as usize];
    for (i, chunk) in reference.chunks_mut(page as usize).enumerate() {
        if i % 2 == 0 {
            rng.fill_bytes(chunk);
        } else {
            chunk.fill(rng.random());
        }
    }
    region.as_mut_slice().copy_from_slice(&reference);
    region.flush().unwrap();
    region.evict_all().unwrap();
    assert!(
        region.as_slice() == &reference[..],
        "pages read back through the pager differ"
    );
    drop(region);
    // The store itself holds the same bytes.
    let mut direct = vec![0u8; size as usize];
    store.read_at(0, &mut direct).unwrap();
    assert!(direct == reference);
}

/// Shared memory only, so nothing can fall back to TCP.
const SHM: &str = "posix,sysv";

#[test]
fn a_node_on_this_host_serves_over_shared_memory_without_one_sided_access() {
    let _interfaces = interface_lock(false);
    let mut rng = rng("shared_memory");
    let n = node_on("127.0.0.1:0".parse().unwrap(), 64 << 20, SHM);
    let mut o = options(&[n.address()], AccessPath::Messages);
    o.transports = Some(SHM.into());
    let door = std::net::TcpStream::connect(n.address()).unwrap();
    assert!(strata_net::handshake::on_this_host(&door));
    drop(door);
    let store = RemoteStore::connect(4 << 20, o.clone()).unwrap();
    exercise(&store, &mut rng, 150);
    drop(store);
    // Shared memory gives no one-sided access: the node has no RMA there and lends no key.
    o.access = AccessPath::OneSided;
    let e = RemoteStore::connect(1 << 20, o).unwrap_err();
    assert!(e.to_string().contains("one-sided"), "{e}");
    let mut so = ServeOptions::new("127.0.0.1:0".parse().unwrap(), 1 << 20, TOKEN);
    so.transports = Some(SHM.into());
    so.one_sided = true;
    assert!(matches!(
        MemoryNode::start(so),
        Err(strata_net::ServeError::OneSidedNeedsHardware)
    ));
}

#[test]
fn a_killed_node_on_this_host_is_noticed_through_its_front_door() {
    let _interfaces = interface_lock(false);
    let mut rng = rng("killed_shm_node");
    let child = ChildNode::start_with(
        &[("NET_TEST_CHILD_TLS", SHM)],
        Command::new(std::env::current_exe().unwrap()),
    );
    let mut o = options(&[child.address], AccessPath::Messages);
    o.transports = Some(SHM.into());
    // Far longer than the bound below: only the front door can tell in time.
    o.timeout = Duration::from_secs(30);
    let store = RemoteStore::connect(1 << 20, o).unwrap();
    let mut page = vec![0u8; 16 << 10];
    rng.fill_bytes(&mut page);
    store.write_at(0, &page).unwrap();
    let mut back = vec![0u8; 16 << 10];
    store.read_at(0, &mut back).unwrap();
    assert_eq!(back, page);
    child.signal(libc::SIGKILL);
    let killed = Instant::now();
    let e = loop {
        match store.read_at(0, &mut back) {
            Ok(()) => {
                assert_eq!(back, page, "a read after the kill returned wrong data");
                assert!(killed.elapsed() < Duration::from_secs(5), "no error");
            }
            Err(e) => break e,
        }
    };
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(e.to_string().contains("front-door"), "{e}");
    println!("killed node on this host: {e} after {took:?}");
}

#[test]
fn the_node_refuses_rendezvous_writes_unread() {
    let _interfaces = interface_lock(false);
    let mut rng = rng("rendezvous");
    let n = node(8 << 20);
    let mut c = RawClient::connect(n.address());
    let region = c.call(Op::Alloc, 0, 0, 4 << 20, &[]);
    assert_eq!(region.status, Status::Ok);
    let mut data = vec![0u8; 2 << 20];
    rng.fill_bytes(&mut data);
    // Not eager: UCX sends 2 MiB by rendezvous, which would have the node fetch the bytes
    // from where the client's address and key say.
    c.eager = false;
    let reply = c.call(Op::Write, region.region, 0, data.len() as u64, &data);
    assert_eq!(reply.status, Status::BadRequest);
    assert_eq!(n.counters().bytes_written.load(Ordering::Relaxed), 0);
    c.eager = true;
    let reply = c.call(Op::Write, region.region, 0, 4096, &data[..4096]);
    assert_eq!(reply.status, Status::Ok);
    assert_eq!(n.counters().bytes_written.load(Ordering::Relaxed), 4096);
}

/// A network namespace joined to this one by a veth pair: another host address on this
/// host. Removed (with its veth pair) when dropped.
struct NetNs {
    name: String,
    outer: String,
    inner: String,
    /// The pair's end in this namespace.
    outside: String,
}

impl NetNs {
    /// `None` where namespaces cannot be made (not root, no iproute2).
    fn create(rng: &mut StdRng) -> Option<Self> {
        let tag = rng.random_range(0..1_000_000u32);
        let (b, c) = (rng.random_range(16..250u8), rng.random_range(1..250u8));
        let ns = Self {
            name: format!("strata-net-{tag}"),
            outer: format!("10.{b}.{c}.1"),
            inner: format!("10.{b}.{c}.2"),
            outside: format!("snt{tag}a"),
        };
        let (outside, inside) = (ns.outside.clone(), format!("snt{tag}b"));
        let ip = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ip(&["netns", "add", &ns.name]) {
            return None;
        }
        let outer = format!("{}/30", ns.outer);
        let inner = format!("{}/30", ns.inner);
        let ok = ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]) && ip(&["link", "set", &inside, "netns", &ns.name])
            && ip(&["addr", "add", &outer, "dev", &outside])
            && ip(&["link", "set", &outside, "up"])
            && ip(&["-n", &ns.name, "addr", "add", &inner, "dev", &inside])
            && ip(&["-n", &ns.name, "link", "set", &inside, "up"])
            && ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        if !ok {
            let _ = ip(&["link", "del", &outside]);
            drop(ns);
            return None;
        }
        Some(ns)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // The pair goes first, at once: deleting the namespace alone deletes its end later,
        // from the kernel's cleanup, after the interface lock is given back.
        let _ = Command::new("ip")
            .args(["link", "del", &self.outside])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let gone = Instant::now() + Duration::from_secs(5);
        while std::path::Path::new("/sys/class/net")
            .join(&self.outside)
            .exists()
            && Instant::now() < gone
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn a_node_at_another_host_address_is_reached_over_tcp() {
    let _interfaces = interface_lock(true);
    let mut rng = rng("other_host");
    let Some(ns) = NetNs::create(&mut rng) else {
        println!("skipped: cannot make a network namespace here (needs root and iproute2)");
        return;
    };
    let mut command = Command::new("ip");
    command.args(["netns", "exec", &ns.name]);
    command.arg(std::env::current_exe().unwrap());
    let listen = format!("{}:0", ns.inner);
    // UCX may choose among all its transports on both sides; shared memory must not be
    // among them for a node whose front door has another address than ours.
    let child = ChildNode::start_with(
        &[
            ("NET_TEST_CHILD_LISTEN", &listen),
            ("NET_TEST_CHILD_TLS", "all"),
        ],
        command,
    );
    // The two ends of a front door to the namespace have different addresses.
    let door = std::net::TcpStream::connect(child.address).unwrap();
    assert!(!strata_net::handshake::on_this_host(&door));
    drop(door);
    // Such a node lends no file (its pages could not be opened here); a store asked for
    // through the front door is reached over messages.
    let mut door = std::net::TcpStream::connect(child.address).unwrap();
    let refused = strata_net::handshake::ask_for_file(
        &mut door,
        TOKEN.as_bytes(),
        1 << 20,
        Instant::now() + Duration::from_secs(30),
    )
    .unwrap_err();
    assert!(
        matches!(
            refused,
            strata_net::handshake::HandshakeError::Refused(strata_net::handshake::Refusal::NoFile)
        ),
        "{refused}"
    );
    drop(door);
    let config = StoreConfig {
        kind: StoreKind::Remote {
            nodes: vec![child.address.to_string()],
        },
        codec: CodecKind::None,
        direct: false,
        grow: false,
        token: Some(TOKEN.into()),
        timeout_secs: 30,
    };
    let through_config = strata_net::open_store(&config, 1 << 20).unwrap();
    assert!(
        !through_config.describe().contains("files lent"),
        "{}",
        through_config.describe()
    );
    exercise(through_config.as_ref(), &mut rng, 20);
    drop(through_config);
    let mut o = options(&[child.address], AccessPath::Messages);
    o.transports = None;
    o.timeout = Duration::from_secs(30);
    let store = RemoteStore::connect(4 << 20, o).unwrap();
    exercise(&store, &mut rng, 100);
    child.signal(libc::SIGKILL);
    let (e, _) = first_failure(&store);
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e}");
    println!(
        "node at {} (from {}): after the kill: {e}",
        ns.inner, ns.outer
    );
    drop(store);
    drop(child);
}
