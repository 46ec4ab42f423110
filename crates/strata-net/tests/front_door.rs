//! Hostile clients at a memory node's front door, on 127.0.0.1: garbage, stalls, floods,
//! oversized hellos, churn, wrong tokens and clients killed mid-flight. After each probe the
//! node must still serve an honest client. Every probe is bounded (deadlines, timeouts).
#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)] // small test values

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_core::store::Store;
use strata_net::handshake::{
    self, CLIENT_MAGIC, GREETING_BYTES, HANDSHAKE_VERSION, HandshakeError, PROOF_BYTES, Refusal,
};
use strata_net::{AccessPath, MemoryNode, RemoteStore, RemoteStoreOptions, ServeOptions};

const TOKEN: &str = "front-door-test-token-4f1c9a";
const TLS: &str = "tcp";

fn rng(test: &str) -> StdRng {
    let seed: u64 = rand::rng().random();
    println!("{test}: seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn node_with(configure: impl FnOnce(&mut ServeOptions)) -> MemoryNode {
    let mut o = ServeOptions::new("127.0.0.1:0".parse().unwrap(), 64 << 20, TOKEN);
    o.transports = Some(TLS.into());
    configure(&mut o);
    MemoryNode::start(o).expect("start a memory node on 127.0.0.1 (is UCX installed?)")
}

fn options(node: SocketAddr, token: &str) -> RemoteStoreOptions {
    let mut o = RemoteStoreOptions::new(vec![node.to_string()], token, Duration::from_secs(5));
    o.transports = Some(TLS.into());
    o.stripe_bytes = 16 << 10;
    o
}

/// An honest client must get in (waiting out a throttle of at most `patience`), write random
/// bytes and read them back.
fn honest_client_works(node: &MemoryNode, rng: &mut StdRng, patience: Duration) {
    let deadline = Instant::now() + patience;
    let store = loop {
        match RemoteStore::connect(1 << 20, options(node.address(), TOKEN)) {
            Ok(store) => break store,
            Err(e) if Instant::now() < deadline && e.to_string().contains("throttles") => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("an honest client was refused: {e}"),
        }
    };
    let mut page = vec![0u8; 16 << 10];
    rng.fill(&mut page[..]);
    let offset = rng.random_range(0..64u64) * (16 << 10);
    store.write_at(offset, &page).unwrap();
    let mut back = vec![0u8; page.len()];
    store.read_at(offset, &mut back).unwrap();
    assert!(back == page, "read back differs");
}

/// Sends `bytes` to the node's port and reads until the node closes (bounded).
fn send_raw(node: SocketAddr, bytes: &[u8]) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(node).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The node may close before taking everything: a reset here is fine.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    (got, started.elapsed())
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn garbage_before_authentication_is_refused_and_the_node_lives() {
    let mut rng = rng("garbage");
    let mut random = vec![0u8; 3000];
    rng.fill(&mut random[..]);
    // A fresh node per probe, so each meets the handshake itself rather than the throttle.
    for probe in [vec![0u8; 3000], vec![b'A'; 3000], random] {
        let n = node_with(|_| {});
        let (reply, took) = send_raw(n.address(), &probe);
        // The node greets, then closes once the proof is malformed: no spin, no abort.
        assert_eq!(reply.len(), GREETING_BYTES, "{} bytes back", reply.len());
        assert_eq!(reply[16], 0, "the first connection must be greeted");
        assert!(
            took < Duration::from_secs(3),
            "the node held the garbage {took:?}"
        );
        wait_for("the failure counted", Duration::from_secs(3), || {
            n.counters().handshakes_failed.load(Ordering::Relaxed) == 1
        });
        assert_eq!(n.counters().clients.load(Ordering::Relaxed), 0);
        honest_client_works(&n, &mut rng, Duration::from_secs(5));
    }
}

#[test]
fn oversized_hellos_are_refused_before_anything_is_read() {
    let mut rng = rng("oversized");
    // (A length of 0 is a capacity query: see `capacity_queries_prove_the_token`.)
    for claimed in [u32::MAX, (handshake::MAX_WORKER_ADDRESS + 1) as u32] {
        let n = node_with(|_| {});
        let mut proof = vec![0u8; PROOF_BYTES];
        proof[..8].copy_from_slice(&CLIENT_MAGIC);
        proof[8..16].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
        proof[PROOF_BYTES - 4..].copy_from_slice(&claimed.to_le_bytes());
        // Then start streaming the promised gigabytes; the node must stop reading at once.
        let mut bytes = proof;
        bytes.extend(std::iter::repeat_n(0x42u8, 1 << 20));
        let (_, took) = send_raw(n.address(), &bytes);
        assert!(took < Duration::from_secs(3), "claimed {claimed}: {took:?}");
        wait_for("the failure counted", Duration::from_secs(3), || {
            n.counters().handshakes_failed.load(Ordering::Relaxed) == 1
        });
        assert_eq!(n.counters().clients.load(Ordering::Relaxed), 0);
        honest_client_works(&n, &mut rng, Duration::from_secs(5));
    }
}

#[test]
fn idle_connections_hit_the_caps_and_the_handshake_deadline() {
    let mut rng = rng("idle");
    let n = node_with(|o| {
        o.max_clients = 8;
        o.max_per_peer = 6;
        o.handshake_timeout = Duration::from_millis(800);
    });
    // Twenty silent connections: six get a handshake slot, the rest are turned away at once.
    let idle: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(n.address()).unwrap())
        .collect();
    let mut busy = 0;
    for mut s in &idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut greeting = [0u8; GREETING_BYTES];
        s.read_exact(&mut greeting).unwrap();
        if greeting[16] == 2 {
            busy += 1;
        }
    }
    assert_eq!(
        busy, 14,
        "connections past the per-peer cap must be turned away"
    );
    // Past the deadline the six slots are free again: an honest client gets in.
    std::thread::sleep(Duration::from_millis(1200));
    honest_client_works(&n, &mut rng, Duration::from_secs(3));
    // The silent connections stayed open throughout.
    drop(idle);
}

#[test]
fn connection_churn_leaves_nothing_behind() {
    let mut rng = rng("churn");
    let n = node_with(|_| {});
    for i in 0..300 {
        let mut s = TcpStream::connect(n.address()).unwrap();
        if i % 3 == 1 {
            let _ = s.write_all(&CLIENT_MAGIC);
        }
        drop(s);
    }
    // The churned connections hold handshake slots until their threads see the close: an
    // honest client may be turned away (the per-peer cap) for a moment, never for long.
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..20 {
        let store = loop {
            match RemoteStore::connect(1 << 20, options(n.address(), TOKEN)) {
                Ok(store) => break store,
                Err(e) if Instant::now() < deadline && e.to_string().contains("limit") => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("an honest client was refused after the churn: {e}"),
            }
        };
        store.write_at(0, &[7u8; 4096]).unwrap();
        drop(store);
    }
    wait_for("every region freed", Duration::from_secs(10), || {
        n.counters().lent_bytes.load(Ordering::Relaxed) == 0
            && n.counters().clients.load(Ordering::Relaxed) == 0
    });
    honest_client_works(&n, &mut rng, Duration::from_secs(5));
}

#[test]
fn wrong_tokens_are_throttled_with_a_growing_delay() {
    let mut rng = rng("throttle");
    let n = node_with(|_| {});
    let wrong = options(n.address(), "this-is-not-the-token-at-all");
    let e = RemoteStore::connect(1 << 20, wrong.clone()).unwrap_err();
    assert!(e.to_string().contains("refused the token"), "{e}");
    // Inside the first delay (250 ms) even the right token is turned away.
    let e = RemoteStore::connect(1 << 20, options(n.address(), TOKEN)).unwrap_err();
    assert!(e.to_string().contains("throttles"), "{e}");
    std::thread::sleep(Duration::from_millis(350));
    let e = RemoteStore::connect(1 << 20, wrong).unwrap_err();
    assert!(e.to_string().contains("refused the token"), "{e}");
    // The second failure doubles the delay (500 ms): still turned away after 300 ms.
    std::thread::sleep(Duration::from_millis(300));
    let e = RemoteStore::connect(1 << 20, options(n.address(), TOKEN)).unwrap_err();
    assert!(e.to_string().contains("throttles"), "{e}");
    honest_client_works(&n, &mut rng, Duration::from_secs(2));
}

#[test]
fn a_node_refuses_weak_tokens_one_sided_over_tcp_and_too_much_capacity() {
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let e = MemoryNode::start(ServeOptions::new(listen, 1 << 20, "short")).unwrap_err();
    assert!(e.to_string().contains("at least 16"), "{e}");
    let mut o = ServeOptions::new(listen, 1 << 20, TOKEN);
    o.one_sided = true;
    o.transports = Some("tcp".into());
    let e = MemoryNode::start(o).unwrap_err();
    assert!(e.to_string().contains("InfiniBand/RoCE"), "{e}");
    let e = MemoryNode::start(ServeOptions::new(listen, u64::MAX / 2, TOKEN)).unwrap_err();
    assert!(e.to_string().contains("--overcommit"), "{e}");
}

/// Runs a client in a child process (this test binary, re-executed) that keeps many reads
/// and writes in flight until it is killed. Ignored in normal runs.
#[test]
#[ignore = "helper: the killed-client test runs it in a child process"]
fn child_busy_client() {
    let Ok(node) = std::env::var("NET_TEST_CHILD_CLIENT") else {
        return;
    };
    let mut o = options(node.parse().unwrap(), TOKEN);
    o.max_in_flight = 64;
    let store = std::sync::Arc::new(RemoteStore::connect(8 << 20, o).unwrap());
    println!("CONNECTED");
    let threads: Vec<_> = (0..4)
        .map(|t: u64| {
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let offset = (t * (2 << 20)) % (7 << 20);
                    store.write_at(offset, &buf).unwrap();
                    store.read_at(offset, &mut buf).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[test]
fn a_client_killed_with_requests_in_flight_never_takes_the_node_down() {
    let mut rng = rng("killed-client");
    let n = node_with(|_| {});
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_busy_client", "--ignored", "--nocapture"])
            .env("NET_TEST_CHILD_CLIENT", n.address().to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            let line = lines
                .next()
                .expect("child exited before connecting")
                .unwrap();
            if line == "CONNECTED" {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100 + 100 * round));
        child.kill().unwrap();
        child.wait().unwrap();
        wait_for(
            "the killed client's region freed",
            Duration::from_secs(20),
            || n.counters().lent_bytes.load(Ordering::Relaxed) == 0,
        );
        honest_client_works(&n, &mut rng, Duration::from_secs(5));
    }
    assert!(n.counters().bytes_read.load(Ordering::Relaxed) > 0);
}

#[test]
fn honest_clients_still_share_one_node() {
    let mut rng = rng("honest");
    let n = node_with(|_| {});
    let stores: Vec<RemoteStore> = (0..4)
        .map(|_| {
            let mut o = options(n.address(), TOKEN);
            o.access = AccessPath::Messages;
            RemoteStore::connect(1 << 20, o).unwrap()
        })
        .collect();
    for (i, s) in stores.iter().enumerate() {
        s.write_at(0, &[i as u8; 512]).unwrap();
    }
    for (i, s) in stores.iter().enumerate() {
        let mut b = [0u8; 512];
        s.read_at(0, &mut b).unwrap();
        assert!(
            b.iter().all(|&x| x == i as u8),
            "client {i} saw another's bytes"
        );
    }
    drop(stores);
    honest_client_works(&n, &mut rng, Duration::from_secs(2));
}

#[test]
fn absurd_timeouts_are_refused_not_panicked_on() {
    let n = node_with(|_| {});
    for timeout in [Duration::MAX, Duration::from_secs(u64::MAX), Duration::ZERO] {
        let mut o = options(n.address(), TOKEN);
        o.timeout = timeout;
        let e = RemoteStore::connect(1 << 20, o).unwrap_err();
        assert!(e.to_string().contains("one day"), "{e}");
    }
}

/// Copies `from` to `to`, mutating chunks at random (flip a byte, drop a tail, insert bytes),
/// until either side closes.
fn mutating_pipe(mut from: TcpStream, mut to: TcpStream, seed: u64, rate: f64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = buf[..n].to_vec();
        if rng.random_bool(rate) {
            match rng.random_range(0..3) {
                0 => {
                    let at = rng.random_range(0..chunk.len());
                    chunk[at] ^= 1 << rng.random_range(0..8);
                }
                1 => chunk.truncate(rng.random_range(0..chunk.len())),
                _ => {
                    let at = rng.random_range(0..=chunk.len());
                    let extra: Vec<u8> =
                        (0..rng.random_range(1..64)).map(|_| rng.random()).collect();
                    chunk.splice(at..at, extra);
                }
            }
        }
        if to.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Both sides of the handshake decoding hostile bytes: a client and a node talk through a
/// pipe that mutates their messages, or one side faces pure random bytes. Neither may panic
/// or overrun its deadline, and when both sides succeed they must agree on everything the
/// MACs bind (session, both worker addresses).
#[test]
fn fuzz_both_sides_of_the_handshake() {
    let mut rng = rng("fuzz_handshake");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let pair = || {
        let a = TcpStream::connect(at).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
    };
    let budget: u64 = std::env::var("NET_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let end = Instant::now() + Duration::from_secs(budget);
    let (mut rounds, mut both_ok) = (0u64, 0u64);
    while Instant::now() < end {
        let mut client_address = vec![0u8; rng.random_range(1..300)];
        rng.fill(&mut client_address[..]);
        let mut node_address = vec![0u8; rng.random_range(1..300)];
        rng.fill(&mut node_address[..]);
        let session = handshake::new_session();
        let deadline = Instant::now() + Duration::from_millis(500);
        let mode: u32 = rng.random_range(0..4);
        // Some clients ask for the node's capacity instead of a session.
        let query = rng.random_bool(0.3);
        let capacity = strata_net::NodeCapacity {
            free: rng.random(),
            capacity: rng.random(),
        };
        // Node side: talks to `node_end`.
        let (client_end, node_end, pipes) = if mode < 2 {
            let (c, p1) = pair();
            let (p2, nd) = pair();
            let rate = if mode == 0 { 0.5 } else { 0.05 };
            let (s1, s2) = (rng.random(), rng.random());
            let (p1r, p2r) = (p1.try_clone().unwrap(), p2.try_clone().unwrap());
            let pipes = vec![
                std::thread::spawn(move || mutating_pipe(p1, p2r, s1, rate)),
                std::thread::spawn(move || mutating_pipe(p2, p1r, s2, rate)),
            ];
            (c, nd, pipes)
        } else {
            let (c, nd) = pair();
            (c, nd, Vec::new())
        };
        let junk_seed: u64 = rng.random();
        let node_thread = {
            let node_address = node_address.clone();
            std::thread::spawn(move || {
                let mut s = node_end;
                let mut seen = None;
                let mut garbage = StdRng::seed_from_u64(junk_seed);
                if mode == 3 {
                    // A hostile "node": random bytes instead of a greeting.
                    let mut junk = vec![0u8; garbage.random_range(0..400)];
                    garbage.fill(&mut junk[..]);
                    let _ = s.write_all(&junk);
                    return (Err(()), seen);
                }
                let out = handshake::node_side(
                    &mut s,
                    TOKEN.as_bytes(),
                    &node_address,
                    deadline,
                    |a| {
                        seen = Some(a.client_address);
                        Ok(session)
                    },
                    || capacity,
                );
                (out.map_err(|_| ()), seen)
            })
        };
        let mut c = client_end;
        let client_out = if mode == 2 {
            // A hostile "client": random bytes after the greeting.
            let mut junk = vec![0u8; rng.random_range(0..400)];
            rng.fill(&mut junk[..]);
            let _ = c.write_all(&junk);
            let _ = c.shutdown(std::net::Shutdown::Write);
            None
        } else if query {
            let asked = handshake::query_capacity(&mut c, TOKEN.as_bytes(), deadline);
            if let Ok(answer) = &asked {
                assert_eq!(*answer, capacity, "the MAC binds the numbers");
            }
            None
        } else {
            Some(handshake::client_side(
                &mut c,
                TOKEN.as_bytes(),
                &client_address,
                deadline,
            ))
        };
        drop(c);
        let (node_out, seen) = node_thread.join().expect("the node side panicked");
        for p in pipes {
            p.join().expect("a pipe panicked");
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(2),
            "a handshake overran its deadline"
        );
        if query && mode == 1 && node_out == Ok(handshake::Visit::Capacity) {
            both_ok += 1;
        }
        if let (Some(Ok(welcome)), Ok(handshake::Visit::Session)) = (&client_out, &node_out) {
            both_ok += 1;
            assert_eq!(welcome.session, session);
            assert_eq!(welcome.node_address, node_address);
            assert_eq!(seen.as_deref(), Some(&client_address[..]));
        }
        rounds += 1;
    }
    println!("fuzz_handshake: {rounds} rounds, {both_ok} completed");
    assert!(rounds >= 10, "the fuzz loop barely ran");
    // Header decoders on pure noise: never a panic.
    for _ in 0..100_000 {
        let mut b = vec![0u8; rng.random_range(0..80)];
        rng.fill(&mut b[..]);
        let _ = strata_net::protocol::RequestHeader::decode(&b);
        let _ = strata_net::protocol::ReplyHeader::decode(&b);
    }
}

/// Listening TCP ports of this process other than `except` (UCX's own transport ports).
fn own_listening_ports(except: u16) -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let t = target.to_string_lossy().to_string();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(i.to_string());
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let port = u16::from_str_radix(f[1].rsplit(':').next().unwrap(), 16).unwrap();
                if port != except {
                    ports.push(port);
                }
            }
        }
    }
    ports
}

/// CPU seconds this process has used (user + system).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / hz as f64
}

/// Garbage straight at UCX's own TCP transport ports (UCX opens them for its connections;
/// they come before any session check): the node must neither abort nor spin.
#[test]
fn garbage_on_ucx_transport_ports_neither_aborts_nor_spins() {
    // In a process of its own: the CPU check must not count other tests, and an abort must
    // fail this test rather than take the whole test binary down.
    if std::env::var_os("NET_TEST_UCX_PORT_CHILD").is_none() {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "garbage_on_ucx_transport_ports_neither_aborts_nor_spins",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env("NET_TEST_UCX_PORT_CHILD", "1")
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the probe process hung");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "the probe process failed: {status}");
        return;
    }
    let mut rng = rng("ucx_port");
    let n = node_with(|_| {});
    let _client = RemoteStore::connect(1 << 20, options(n.address(), TOKEN)).unwrap();
    let ports = own_listening_ports(n.address().port());
    println!("UCX ports: {ports:?}");
    for port in &ports {
        for probe in [vec![0u8; 3000], vec![b'A'; 3000]] {
            let at: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            if let Ok(mut s) = TcpStream::connect_timeout(&at, Duration::from_secs(1)) {
                let _ = s.write_all(&probe);
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
    honest_client_works(&n, &mut rng, Duration::from_secs(5));
    // Idle now: a spinning thread would burn about a core-second per second.
    let before = cpu_seconds();
    std::thread::sleep(Duration::from_secs(1));
    let burnt = cpu_seconds() - before;
    println!("the node survived garbage on UCX's ports; idle CPU {burnt:.2} s/s");
    assert!(
        burnt < 0.5,
        "something spins after the garbage: {burnt:.2} CPU s in 1 s"
    );
}

/// A hostile memory node that knows the token: it passes the handshake, then answers every
/// request with a random reply (random ids, statuses, sizes and payload lengths, sometimes a
/// truncated header, sometimes nothing). Runs until `end`.
fn hostile_node(listener: std::net::TcpListener, seed: u64, end: Instant) {
    use strata_net::protocol::{AM_REPLY, AM_REQUEST, REPLY_HEADER_BYTES, ReplyHeader, Status};
    use strata_ucx::{AmAction, Context, ContextOptions, Worker};
    let mut rng = StdRng::seed_from_u64(seed);
    let context = Context::new(&ContextOptions {
        transports: Some(TLS.into()),
        rma: false,
        settings: Vec::new(),
    })
    .unwrap();
    let worker = Worker::new(&context).unwrap();
    let ids = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = std::rc::Rc::clone(&ids);
    worker
        .set_am_handler(AM_REQUEST, move |m| {
            if let Some(h) = strata_net::protocol::RequestHeader::decode(m.header()) {
                sink.borrow_mut().push((h.id, h.length));
            }
            AmAction::Done
        })
        .unwrap();
    let own = worker.address().unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut endpoints = Vec::new();
    let mut doors = Vec::new();
    let mut keep = Vec::new();
    while Instant::now() < end {
        if let Ok((mut s, _)) = listener.accept() {
            s.set_nonblocking(false).unwrap();
            let mut client = None;
            let deadline = Instant::now() + Duration::from_secs(2);
            let ok = handshake::node_side(
                &mut s,
                TOKEN.as_bytes(),
                &own,
                deadline,
                |a| {
                    client = Some(a.client_address);
                    Ok(handshake::new_session())
                },
                || strata_net::NodeCapacity {
                    free: 0,
                    capacity: 0,
                },
            );
            if ok.is_ok()
                && let Some(address) = client
            {
                endpoints.push(worker.connect_worker(&address).unwrap());
                doors.push(s);
            }
        }
        worker.progress();
        let pending: Vec<(u64, u64)> = ids.borrow_mut().drain(..).collect();
        for (id, length) in pending {
            let Some(endpoint) = endpoints.last() else {
                continue;
            };
            if rng.random_bool(0.1) {
                continue; // no answer at all
            }
            let header = ReplyHeader {
                id: if rng.random_bool(0.8) {
                    id
                } else {
                    rng.random()
                },
                status: Status::from_u32(if rng.random_bool(0.7) {
                    0
                } else {
                    rng.random_range(0..9)
                }),
                region: rng.random(),
                base: rng.random(),
                size: if rng.random_bool(0.5) {
                    length
                } else {
                    rng.random()
                },
            };
            let mut bytes = header.encode().to_vec();
            if rng.random_bool(0.1) {
                bytes.truncate(rng.random_range(0..REPLY_HEADER_BYTES));
            }
            let data_len = match rng.random_range(0..3) {
                0 => usize::try_from(length.min(1 << 20)).unwrap(),
                1 => 0,
                _ => rng.random_range(0..100_000),
            };
            let mut data = vec![0u8; data_len];
            rng.fill(&mut data[..]);
            // SAFETY: `data` (a heap buffer that moving the Vec does not move) goes into
            // `keep` with its request and lives until the send completes or the node ends.
            let sent =
                unsafe { endpoint.am_send(AM_REPLY, &bytes, data.as_ptr(), data.len(), true) };
            if let Ok(request) = sent {
                keep.push((request, data));
            }
        }
        keep.retain_mut(|(r, _)| r.poll().is_none());
        std::thread::sleep(Duration::from_micros(200));
    }
    // Wind down: let sends settle before the memory they read goes away.
    let settle = Instant::now() + Duration::from_secs(1);
    while !keep.is_empty() && Instant::now() < settle {
        worker.progress();
        keep.retain_mut(|(r, _)| r.poll().is_none());
    }
    for e in endpoints {
        drop(e.close(true));
    }
    for _ in 0..100 {
        worker.progress();
    }
    drop(doors);
}

/// The client decoding hostile replies from a node that knows the token: opening the store,
/// reads and writes either succeed or fail with an error within the timeout, never a panic
/// or a hang.
#[test]
fn fuzz_the_client_with_a_hostile_node() {
    let mut rng = rng("fuzz_client");
    let budget: u64 = std::env::var("NET_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let end = Instant::now() + Duration::from_secs(budget);
    let seed = rng.random();
    let node =
        std::thread::spawn(move || hostile_node(listener, seed, end + Duration::from_millis(1500)));
    let (mut opened, mut ok_ops, mut failed_ops) = (0u32, 0u32, 0u32);
    while Instant::now() < end {
        let mut o = options(at, TOKEN);
        o.timeout = Duration::from_millis(500);
        let started = Instant::now();
        let store = match RemoteStore::connect(1 << 20, o) {
            Ok(store) => store,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(3), "open hung: {e}");
                continue;
            }
        };
        opened += 1;
        for _ in 0..20 {
            let mut buf = vec![0u8; rng.random_range(1..70_000)];
            let offset = rng.random_range(0..(1u64 << 20) - buf.len() as u64);
            let started = Instant::now();
            let outcome = if rng.random_bool(0.5) {
                store.read_at(offset, &mut buf)
            } else {
                store.write_at(offset, &buf)
            };
            assert!(started.elapsed() < Duration::from_secs(3), "a request hung");
            match outcome {
                Ok(()) => ok_ops += 1,
                Err(_) => failed_ops += 1,
            }
        }
    }
    node.join().expect("the hostile node panicked");
    println!("fuzz_client: {opened} stores opened, {ok_ops} ops ok, {failed_ops} failed");
}

/// A remote store configuration for `probe_store`.
fn remote_config(node: String, token: Option<&str>, timeout_secs: u64) -> strata_core::StoreConfig {
    strata_core::StoreConfig {
        kind: strata_core::config::StoreKind::Remote { nodes: vec![node] },
        codec: strata_core::config::CodecKind::None,
        direct: false,
        grow: false,
        token: token.map(str::to_string),
        timeout_secs,
    }
}

/// Probes `node` with the right token. The door greets a probe that arrives while the
/// handshake slots of earlier probes are still held (their threads have not yet seen the
/// close; on a busy machine they run late) with "at its connection limit": that is the
/// per-peer cap at work, as in `connection_churn_leaves_nothing_behind`, and is retried for
/// up to `patience`. Returns how long the admitted probe took.
fn probe_until_admitted(node: SocketAddr, patience: Duration) -> Duration {
    let deadline = Instant::now() + patience;
    loop {
        let started = Instant::now();
        match strata_net::probe_store(&remote_config(node.to_string(), Some(TOKEN), 5)) {
            Ok(()) => return started.elapsed(),
            Err(e) if Instant::now() < deadline && e.to_string().contains("connection limit") => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("a node on loopback answers a probe: {e}"),
        }
    }
}

#[test]
fn probes_read_the_greeting_only_and_tell_nodes_from_strangers() {
    let mut rng = rng("probes");
    let node = node_with(|_| {});
    // A node answers, quickly, without UCX; probes are not failed proofs, so many of them
    // in a row leave the prober unthrottled.
    for _ in 0..20 {
        let took = probe_until_admitted(node.address(), Duration::from_secs(5));
        assert!(took < Duration::from_secs(2), "a probe took {took:?}");
    }
    honest_client_works(&node, &mut rng, Duration::from_millis(10));
    // The door takes a connection when it arrives. Before, it polled its listener every
    // 20 ms, so 20 probes waited about 200 ms in all (10 ms each on average), on any
    // machine. A busy machine can stall one batch of 20 past 100 ms with the door intact, so
    // the fastest of up to five batches is judged (a polling door is slow in every batch),
    // and a batch counts only the admitted probes' own time (not a turned-away probe's
    // retry, see above).
    let mut batches = Vec::new();
    for _ in 0..5 {
        let twenty: Duration = (0..20)
            .map(|_| probe_until_admitted(node.address(), Duration::from_secs(5)))
            .sum();
        batches.push(twenty);
        if twenty < Duration::from_millis(100) {
            break;
        }
    }
    println!("20 probes: {batches:?}");
    let fastest = batches.iter().min().expect("five batches");
    assert!(
        *fastest < Duration::from_millis(100),
        "20 probes took at best {fastest:?}: the door is slow to accept"
    );
    // A probe proves nothing about the token (the store's opening does).
    strata_net::probe_store(&remote_config(
        node.address().to_string(),
        Some("wrong-token-but-long"),
        5,
    ))
    .expect("probes do not check the token");
    // No token at all is refused before any connection.
    let e =
        strata_net::probe_store(&remote_config(node.address().to_string(), None, 5)).unwrap_err();
    assert!(e.to_string().contains("token"), "{e}");
    // A port where nobody listens.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = free.local_addr().unwrap();
    drop(free);
    let e =
        strata_net::probe_store(&remote_config(closed.to_string(), Some(TOKEN), 5)).unwrap_err();
    assert!(e.to_string().contains("failed"), "{e}");
    // A stranger that talks first, and one that never talks (bounded by the timeout).
    let stranger = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (stranger_at, silent_at) = (stranger.local_addr().unwrap(), silent.local_addr().unwrap());
    let talker = std::thread::spawn(move || {
        let (mut c, _) = stranger.accept().unwrap();
        let _ = c.write_all(&[b'H'; GREETING_BYTES]);
        std::thread::sleep(Duration::from_millis(200));
    });
    let e = strata_net::probe_store(&remote_config(stranger_at.to_string(), Some(TOKEN), 5))
        .unwrap_err();
    assert!(e.to_string().contains("not a Strata memory node"), "{e}");
    talker.join().unwrap();
    let started = Instant::now();
    let e =
        strata_net::probe_store(&remote_config(silent_at.to_string(), Some(TOKEN), 1)).unwrap_err();
    assert!(e.to_string().contains("did not answer"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(silent);
    node.shutdown();
}

#[test]
fn capacity_queries_prove_the_token_and_follow_what_is_lent() {
    let mut rng = rng("capacity");
    let capacity = 64u64 << 20;
    let node = node_with(|_| {});
    let ask = |token: &str| {
        strata_net::node_capacities(&remote_config(node.address().to_string(), Some(token), 5))
    };
    let all_free = strata_net::NodeCapacity {
        free: capacity,
        capacity,
    };
    assert_eq!(ask(TOKEN).unwrap(), vec![all_free]);
    // A store of a random size borrows its share; the node then reports the rest free, and
    // all of it again once the store is gone.
    let size = rng.random_range(1..48u64) << 20;
    let store = RemoteStore::connect(size, options(node.address(), TOKEN)).unwrap();
    let lent = strata_net::client::bytes_per_node(size, 16 << 10, 1);
    assert_eq!(
        ask(TOKEN).unwrap(),
        vec![strata_net::NodeCapacity {
            free: capacity - lent,
            capacity,
        }]
    );
    drop(store);
    wait_for("the region freed", Duration::from_secs(5), || {
        ask(TOKEN).unwrap() == vec![all_free]
    });
    // The store's client leaves after its region is freed (the node closes its endpoint
    // first), so wait for it; then a query is no client: nothing admitted, nothing failed.
    wait_for("the store's client gone", Duration::from_secs(5), || {
        node.counters().clients.load(Ordering::Relaxed) == 0
    });
    assert_eq!(ask(TOKEN).unwrap(), vec![all_free]);
    assert_eq!(node.counters().clients.load(Ordering::Relaxed), 0);
    assert_eq!(node.counters().handshakes_failed.load(Ordering::Relaxed), 0);
    // A wrong token learns nothing and counts as a failed attempt (throttled like one).
    let e = ask("wrong-token-but-long").unwrap_err();
    assert!(e.to_string().contains("token"), "{e}");
    wait_for("the failure counted", Duration::from_secs(3), || {
        node.counters().handshakes_failed.load(Ordering::Relaxed) == 1
    });
    // A hand-made query proof with a garbage MAC is refused the same way, after the throttle.
    std::thread::sleep(Duration::from_millis(400));
    let mut proof = vec![0u8; PROOF_BYTES];
    proof[..8].copy_from_slice(&CLIENT_MAGIC);
    proof[8..16].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    rng.fill(&mut proof[16..PROOF_BYTES - 4]);
    let (reply, took) = send_raw(node.address(), &proof);
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(
        reply.len(),
        GREETING_BYTES + 1,
        "greeting and a verdict only"
    );
    assert_eq!(reply[GREETING_BYTES], 1, "denied");
    wait_for("the second failure counted", Duration::from_secs(3), || {
        node.counters().handshakes_failed.load(Ordering::Relaxed) == 2
    });
    // No token at all is refused before any connection.
    let e = strata_net::node_capacities(&remote_config(node.address().to_string(), None, 5))
        .unwrap_err();
    assert!(e.to_string().contains("token"), "{e}");
    honest_client_works(&node, &mut rng, Duration::from_secs(5));
    node.shutdown();
}

/// A node that accepts the token but gives no session tells the client why, and the client's
/// message says what to check: the node serves its maximum of clients, or it cannot reach the
/// client's UCX worker (firewall, transports), or it did not answer in time. A node that sends
/// no reason (it closes after the verdict, or stalls) leaves the client naming both causes,
/// within about a second.
#[test]
fn a_client_given_no_session_is_told_why() {
    let mut rng = rng("refusals");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let mut address = vec![0u8; rng.random_range(1..300)];
    rng.fill(&mut address[..]);
    let cases = [
        (
            Refusal::Full,
            vec!["maximum number of clients", "--max-clients"],
        ),
        (
            Refusal::Unreachable,
            vec!["cannot reach this host's UCX worker", "firewall", "UCX_TLS"],
        ),
        (Refusal::NoAnswer, vec!["handshake deadline"]),
    ];
    for (refusal, phrases) in cases {
        let client = {
            let address = address.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(at).unwrap();
                let deadline = Instant::now() + Duration::from_secs(5);
                handshake::client_side(&mut s, TOKEN.as_bytes(), &address, deadline)
            })
        };
        let (mut s, _) = listener.accept().unwrap();
        let node = handshake::node_side(
            &mut s,
            TOKEN.as_bytes(),
            b"node worker",
            Instant::now() + Duration::from_secs(5),
            |a| {
                assert_eq!(a.client_address, address);
                Err(refusal)
            },
            || unreachable!("no capacity query here"),
        );
        assert!(
            matches!(node, Err(HandshakeError::Refused(r)) if r == refusal),
            "{node:?}"
        );
        drop(s);
        let e = client.join().unwrap().expect_err("no session");
        assert!(
            matches!(e, HandshakeError::Refused(r) if r == refusal),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(message.contains("accepted the token"), "{message}");
        for phrase in phrases {
            assert!(message.contains(phrase), "{refusal:?}: {message}");
        }
        assert!(
            !message.contains("connection limit"),
            "{refusal:?}: {message}"
        );
    }
    // A node that sends no reason: it closes after the verdict, or keeps the connection open.
    for stall in [false, true] {
        let client = {
            let address = address.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(at).unwrap();
                let deadline = Instant::now() + Duration::from_secs(10);
                let started = Instant::now();
                let out = handshake::client_side(&mut s, TOKEN.as_bytes(), &address, deadline);
                (out, started.elapsed())
            })
        };
        let (mut s, _) = listener.accept().unwrap();
        let mut greeting = [0u8; GREETING_BYTES];
        greeting[..8].copy_from_slice(&handshake::NODE_MAGIC);
        greeting[8..16].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
        rng.fill(&mut greeting[17..]);
        s.write_all(&greeting).unwrap();
        let mut proof = vec![0u8; PROOF_BYTES + address.len()];
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.read_exact(&mut proof).unwrap();
        s.write_all(&[2]).unwrap(); // Busy, and nothing after it
        if !stall {
            drop(s);
        }
        let (out, took) = client.join().unwrap();
        let message = out.expect_err("no session").to_string();
        for phrase in [
            "accepted the token",
            "maximum number of clients",
            "cannot reach this host's UCX worker",
            "firewall",
            "the node's log says which",
        ] {
            assert!(message.contains(phrase), "stall {stall}: {message}");
        }
        assert!(
            took < Duration::from_secs(4),
            "stall {stall}: the client waited {took:?} for a reason"
        );
    }
}

/// A node that serves its maximum number of clients tells the next one so, through the whole
/// client stack (not "at its connection limit", which is the door's cap on handshakes).
#[test]
fn a_full_node_says_it_serves_its_maximum_of_clients() {
    let n = node_with(|o| o.max_clients = 1);
    let first = RemoteStore::connect(1 << 20, options(n.address(), TOKEN)).expect("first client");
    // The first client's handshake slot is freed a moment after it got its session: until
    // then the door turns the second away as at its connection limit.
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match RemoteStore::connect(1 << 20, options(n.address(), TOKEN)) {
            Ok(_) => panic!("a second client got in past max_clients = 1"),
            Err(e) if Instant::now() < deadline && e.to_string().contains("connection limit") => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => break e.to_string(),
        }
    };
    assert!(e.contains("serves its maximum number of clients"), "{e}");
    assert!(!e.contains("cannot reach"), "{e}");
    first
        .write_at(0, &[1u8; 4096])
        .expect("the first client still works");
    drop(first);
    wait_for("the first client gone", Duration::from_secs(10), || {
        n.counters().clients.load(Ordering::Relaxed) == 0
    });
    let mut rng = rng("full_node");
    honest_client_works(&n, &mut rng, Duration::from_secs(5));
}
