//! Memory nodes on this host lending memory as files (`server/lent_file.rs`,
//! `lent_file_store.rs`): data, capacity, fallback to messages, wrong tokens, lost nodes.
#![allow(clippy::cast_possible_truncation)] // tests run on 64-bit hosts only

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use strata_core::config::{CodecKind, StoreConfig, StoreKind};
use strata_core::store::{Store, StoreError};
use strata_net::handshake::{self, HandshakeError};
use strata_net::{MemoryNode, ServeOptions};

const TOKEN: &str = "lent-files-token-0123456789";

fn rng(test: &str) -> StdRng {
    let seed: u64 = rand::rng().random();
    println!("{test}: seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn node_with(capacity: u64, change: impl FnOnce(&mut ServeOptions)) -> MemoryNode {
    let mut o = ServeOptions::new("127.0.0.1:0".parse().unwrap(), capacity, TOKEN);
    o.transports = Some("tcp".into());
    change(&mut o);
    MemoryNode::start(o).expect("start a memory node on 127.0.0.1")
}

fn config(nodes: &[SocketAddr], token: &str, codec: CodecKind) -> StoreConfig {
    StoreConfig {
        kind: StoreKind::Remote {
            nodes: nodes.iter().map(ToString::to_string).collect(),
        },
        codec,
        direct: false,
        grow: false,
        token: Some(token.into()),
        timeout_secs: 5,
    }
}

/// Random unaligned writes and reads, checked against a local copy.
fn exercise(store: &dyn Store, rng: &mut StdRng, rounds: usize) {
    let size = store.size() as usize;
    let mut reference = vec![0u8; size];
    for _ in 0..rounds {
        let len = rng.random_range(1..=(200 << 10).min(size));
        let at = rng.random_range(0..=size - len);
        if rng.random_bool(0.5) {
            let mut bytes = vec![0u8; len];
            rng.fill_bytes(&mut bytes);
            store.write_at(at as u64, &bytes).unwrap();
            reference[at..at + len].copy_from_slice(&bytes);
        } else {
            let mut got = vec![0u8; len];
            store.read_at(at as u64, &mut got).unwrap();
            assert!(
                got == reference[at..at + len],
                "read at {at} of {len} differs"
            );
        }
    }
    let mut all = vec![0u8; size];
    store.read_at(0, &mut all).unwrap();
    assert!(
        all == reference,
        "the whole store differs from what was written"
    );
}

/// Waits up to 5 s for `done`.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what} never happened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_node_on_this_host_lends_a_file_that_holds_the_data_and_is_given_back() {
    let mut rng = rng("lend");
    let node = node_with(64 << 20, |_| {});
    let size = (rng.random_range(1..=24) << 20) + rng.random_range(0..4096) * 16;
    let store =
        strata_net::open_store(&config(&[node.address()], TOKEN, CodecKind::None), size).unwrap();
    assert!(
        store.describe().contains("files lent on this host"),
        "{}",
        store.describe()
    );
    let c = node.counters();
    assert_eq!(c.files_lent.load(Ordering::Relaxed), 1);
    assert_eq!(c.file_loans.load(Ordering::Relaxed), 1);
    let lent = c.lent_bytes.load(Ordering::Relaxed);
    assert!(
        lent >= size && lent < size + (64 << 10),
        "lent {lent} for {size}"
    );
    // The capacity query counts the loan.
    let free = strata_net::node_capacities(&config(&[node.address()], TOKEN, CodecKind::None))
        .unwrap()[0]
        .free;
    assert_eq!(free, (64 << 20) - lent);
    exercise(store.as_ref(), &mut rng, 300);
    // No page crossed the node's messages.
    assert_eq!(c.bytes_written.load(Ordering::Relaxed), 0);
    assert_eq!(c.bytes_read.load(Ordering::Relaxed), 0);
    drop(store);
    eventually("the loan's end", || {
        c.file_loans.load(Ordering::Relaxed) == 0 && c.lent_bytes.load(Ordering::Relaxed) == 0
    });
}

#[test]
fn lz4_over_a_lent_file_round_trips() {
    let mut rng = rng("lz4");
    let node = node_with(64 << 20, |_| {});
    let store =
        strata_net::open_store(&config(&[node.address()], TOKEN, CodecKind::Lz4), 4 << 20).unwrap();
    assert_eq!(node.counters().files_lent.load(Ordering::Relaxed), 1);
    exercise(store.as_ref(), &mut rng, 200);
}

#[test]
fn two_nodes_on_this_host_each_lend_their_stripes() {
    let mut rng = rng("two");
    let (a, b) = (node_with(64 << 20, |_| {}), node_with(64 << 20, |_| {}));
    let store = strata_net::open_store(
        &config(&[a.address(), b.address()], TOKEN, CodecKind::None),
        8 << 20,
    )
    .unwrap();
    for n in [&a, &b] {
        assert_eq!(n.counters().files_lent.load(Ordering::Relaxed), 1);
        assert_eq!(n.counters().lent_bytes.load(Ordering::Relaxed), 4 << 20);
    }
    exercise(store.as_ref(), &mut rng, 300);
}

/// Nodes that lend no files (turned off, or overcommitting) are reached over messages, with
/// the same data.
#[test]
fn nodes_that_lend_no_files_serve_over_messages() {
    let mut rng = rng("messages");
    let off = node_with(64 << 20, |o| o.lend_files = false);
    let over = node_with(64 << 20, |o| o.overcommit = true);
    for node in [&off, &over] {
        let store =
            strata_net::open_store(&config(&[node.address()], TOKEN, CodecKind::None), 2 << 20)
                .unwrap();
        assert!(
            !store.describe().contains("files lent"),
            "{}",
            store.describe()
        );
        exercise(store.as_ref(), &mut rng, 100);
        let c = node.counters();
        assert_eq!(c.files_lent.load(Ordering::Relaxed), 0);
        assert!(c.bytes_written.load(Ordering::Relaxed) > 0);
    }
}

#[test]
fn a_wrong_token_gets_no_file() {
    let node = node_with(64 << 20, |_| {});
    let mut stream = TcpStream::connect(node.address()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = handshake::ask_for_file(&mut stream, b"not-the-token-at-all-xx", 1 << 20, deadline)
        .unwrap_err();
    assert!(matches!(err, HandshakeError::Denied), "{err}");
    // Through the store (a second node: the first now throttles this host for a while).
    let second = node_with(64 << 20, |_| {});
    let err = strata_net::open_store(
        &config(
            &[second.address()],
            "not-the-token-at-all-xx",
            CodecKind::None,
        ),
        1 << 20,
    )
    .unwrap_err();
    assert!(err.to_string().contains("refused the token"), "{err}");
    for n in [&node, &second] {
        let c = n.counters();
        assert_eq!(c.files_lent.load(Ordering::Relaxed), 0);
        assert_eq!(c.lent_bytes.load(Ordering::Relaxed), 0);
    }
}

/// More than the node has free: no file, and the refusal (over messages) says how much.
#[test]
fn a_file_larger_than_the_free_capacity_is_refused_with_the_numbers() {
    let node = node_with(1 << 20, |_| {});
    let err = strata_net::open_store(&config(&[node.address()], TOKEN, CodecKind::None), 4 << 20)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("capacity") && text.contains("1 MiB"),
        "{text}"
    );
    let c = node.counters();
    assert_eq!(c.files_lent.load(Ordering::Relaxed), 0);
    assert_eq!(c.lent_bytes.load(Ordering::Relaxed), 0);
    // Asking for nothing is refused too, and takes nothing.
    let mut stream = TcpStream::connect(node.address()).unwrap();
    let err = handshake::ask_for_file(
        &mut stream,
        TOKEN.as_bytes(),
        0,
        Instant::now() + Duration::from_secs(5),
    )
    .unwrap_err();
    assert!(matches!(err, HandshakeError::Refused(_)), "{err}");
    assert_eq!(c.lent_bytes.load(Ordering::Relaxed), 0);
}

/// A node that stops is lost for its borrowers, as over messages: reads and writes fail, no
/// zeros, no old data.
#[test]
fn a_stopped_node_is_lost_for_its_lent_file() {
    let node = node_with(64 << 20, |_| {});
    let store: Arc<dyn Store> =
        strata_net::open_store(&config(&[node.address()], TOKEN, CodecKind::None), 1 << 20)
            .unwrap();
    store.write_at(0, &[7u8; 4096]).unwrap();
    node.shutdown();
    let start = Instant::now();
    let err = loop {
        let mut page = [0u8; 4096];
        match store.read_at(0, &mut page) {
            Ok(()) => {
                assert_eq!(page, [7u8; 4096]);
                assert!(start.elapsed() < Duration::from_secs(5), "never noticed");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("is lost"), "{err}");
    assert!(store.write_at(0, &[1u8; 16]).is_err());
}

/// A file request of the wrong shape (a stranger's garbage) is refused as a failed
/// handshake: nothing lent, the peer throttled.
#[test]
fn a_malformed_file_request_lends_nothing() {
    use std::io::{Read as _, Write as _};
    let node = node_with(64 << 20, |_| {});
    for length in [0u32, 7, 9, 1 << 20] {
        std::thread::sleep(Duration::from_millis(600)); // the node throttles a failed one
        let mut s = TcpStream::connect(node.address()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut greeting = [0u8; handshake::GREETING_BYTES];
        s.read_exact(&mut greeting).unwrap();
        let mut proof = Vec::new();
        proof.extend_from_slice(&handshake::CLIENT_FILE_MAGIC);
        proof.extend_from_slice(&handshake::HANDSHAKE_VERSION.to_le_bytes());
        proof.extend_from_slice(&[0x5a; 64]); // nonce and a tag that proves nothing
        proof.extend_from_slice(&length.to_le_bytes());
        proof.extend_from_slice(&[1u8; 8]);
        let _ = s.write_all(&proof);
        let mut answer = [0u8; 64];
        let n = s.read(&mut answer).unwrap_or(0);
        // Either closed at once (wrong shape) or denied (right shape, wrong tag).
        assert!(
            n == 0 || answer[0] == 1,
            "length {length}: answered {:?}",
            &answer[..n]
        );
    }
    let c = node.counters();
    assert_eq!(c.files_lent.load(Ordering::Relaxed), 0);
    assert_eq!(c.lent_bytes.load(Ordering::Relaxed), 0);
    assert!(c.handshakes_failed.load(Ordering::Relaxed) >= 4);
}
