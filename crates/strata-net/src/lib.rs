//! Remote memory over UCX: the memory-node server ([`server::MemoryNode`], `strata serve`) and
//! the [`client::RemoteStore`] client, plus [`open_store`], which turns a
//! [`StoreConfig`] (memory, file or remote, with or without a codec) into a store.
//!
//! The transport sits behind UCX's UCP API (TCP and shared memory here, InfiniBand and RoCE on
//! clusters), reached through `strata-ucx`, which loads UCX at run time so the `strata`
//! binary also starts where UCX is absent. The [`Transport`] trait names what the client
//! needs from a transport so a libfabric backend can be added beside UCX.
//!
//! # Protocol and security
//! A client first passes the node's *front door*, a TCP handshake in our code
//! ([`handshake`]): mutual HMAC-SHA256 challenge-response over the shared token (the token
//! never travels), fixed-size messages, one deadline for the whole handshake, caps on
//! handshakes in total and per peer address, and a doubling delay for a peer after a wrong
//! proof or garbage. Only then do the two sides swap UCX worker addresses and the node issues
//! a random 128-bit *session*; UCX's connection manager never listens. Every request carries
//! the session; the node serves only live sessions and checks that the region belongs to that
//! session and that the range lies inside it. A client may instead ask, by the same proof,
//! how much the node can lend now ([`node_capacities`]): no session, no UCX. The client's
//! front-door connection stays open as its lifeline: when it closes (the client exits, crashes or is killed) the node ends the
//! session and frees its regions at once. Tokens have at least 16 bytes; `strata serve` reads
//! them from a file or the environment, never from its command line.
//!
//! What is protected: a party without the token cannot authenticate, learns nothing that
//! helps it guess the token, cannot read or write any region, and cannot exhaust the node
//! with garbage, stalls, floods of connections or oversized hellos before authentication
//! (each is a test in `tests/front_door.rs`). One client cannot touch another's regions.
//! On TCP and shared memory the node's UCX context has no RMA at all, so no emulated
//! `get`/`put` reaches its memory; one-sided access exists only with `one_sided` on
//! InfiniBand/RoCE transports, where the NIC enforces each region's own registration and key.
//!
//! What is not protected: the traffic is neither encrypted nor integrity-protected after the
//! handshake. An on-path attacker sees pages and the session and can then act as that client
//! (the session is a bearer capability); run nodes on a private fabric (as HPC interconnects
//! are) or inside a VPN. UCX's own transport ports (which UCX opens for its connections) take
//! bytes before any session check; garbage there was tested not to crash or spin the node
//! (UCX 1.13.1), but their parsing is UCX's code. An authenticated client can send large
//! messages that UCX buffers before our handler sees them; the client holds the token, so it
//! is trusted not to. On InfiniBand a client that knows a region's key can reach only that
//! region, as the NIC enforces.
//! Caps: `max_clients` bounds clients and handshakes under way in total, `max_per_peer`
//! handshakes under way from one address; there is no separate cap on admitted clients per
//! address (each needs the token). No eager/rendezvous limit is set on the node: UCX's
//! thresholds are chosen by the sender, so a node-side setting would not bound what a peer
//! sends; the front door is what keeps strangers from sending at all.
//!
//! UCX version: Debian's 1.13.1 stays. The aborts, spins and heap damage seen before came
//! through UCX's connection manager and its software RMA; the node now uses neither (no
//! listener, endpoints from worker addresses swapped after authentication; no RMA on TCP or
//! shared memory), so newer UCX fixes there would not change what a stranger can reach.
//!
//! # Messages or one-sided?
//! [`AccessPath::Messages`] (request/response active messages, the default) against
//! [`AccessPath::OneSided`] (UCX get/put on the region's remote key), measured by
//! `strata bench remote` over UCX TCP on 127.0.0.1 on the 2-core development VM (shared with
//! other builds, so runs vary by up to 50%), 64 KiB pages in random order, two threads with
//! 32-page batches: messages read 0.92-1.42 GB/s (median of five runs 1.20 GB/s), one-sided
//! 0.45-1.06 GB/s (median 0.67 GB/s); one TCP socket moved 1.6-3.2 GB/s in the same runs. One
//! page at a time: messages 88-98 us, one-sided 106-150 us. The ~1 ms per `get` seen with
//! `ucx_perftest` does not appear, because the node's thread keeps progressing its worker. Over
//! TCP, UCX emulates RMA in software, so messages win (and a node no longer offers one-sided
//! access there at all: the emulation trusted whatever address a peer sent; the figures above
//! predate that); on InfiniBand/RoCE one-sided access needs no node CPU and is the one to use. Replies carry the page eagerly: letting UCX use its
//! rendezvous protocol for them measured 2x slower over TCP.
//!
//! # A node on the client's host
//! When the two ends of a front-door connection have the same address (the node runs on the
//! client's host, in its network namespace), both sides connect their UCX endpoints without
//! peer-failure handling, the only way UCX 1.13 lets them use shared memory (`sysv`,
//! `posix`); elsewhere they keep it and UCX picks TCP or InfiniBand as before. Such an
//! endpoint cannot see its peer die, so each side watches the front-door connection instead:
//! the node already did (a client that leaves loses its session), and the client's I/O
//! thread now wakes when the node's end closes and marks the node lost at once. Shared
//! memory adds no way into a node's memory: the node still has no RMA, a client's messages
//! land in the node's receive FIFO only, and both sides refuse rendezvous data unread
//! (receiving it would make them fetch bytes from wherever the peer's worker address and key
//! say, which on one host includes `cma`, reading any process they may trace); clients and
//! nodes send eagerly anyway. Both ends must agree (handshake version 3 or later). A client and a node
//! of different users on one host cannot attach each other's shared memory: give both
//! `--transports tcp` there. On this 2-core VM, 64 KiB pages over a node on loopback: one
//! page alone 131 -> 54 us, 32 x 2 in flight 537 -> 1453 MB/s reading (medians of 3,
//! interleaved). The shared-memory FIFOs have 128 entries at both ends (handshake version 5;
//! 1024 before, UCX's default is 64), and a client inside a program held to a memory limit
//! (`strata run`) opens one shared-memory transport with small pools: see [`footprint`].
//!
//! # Memory lent as files
//! A node on the client's host lends memory as a file by default ([`lent_file_store`], the
//! node's side in `server/lent_file.rs`): the client asks at the front door, opens the
//! node's memory file through `/proc` and copies pages itself, with no UCX in the program
//! and no thread hand-off. The node allocates the whole file when it lends it, so its pages
//! are charged to the node (outside a program's memory group, as zram's pool is). `sort` of
//! 32 MiB in a 32 MiB memory group at a 24.8 MiB budget: 7.7 s against 11.9 s over shared
//! memory messages at the same budget (one run each, this 2-core VM). Nodes elsewhere, nodes
//! that overcommit or run with `--lend-files false`, and clients that cannot open the file
//! (another user, another PID namespace) use messages; `STRATA_REMOTE_FILES=false` asks for
//! messages. A node whose front-door connection closes is lost either way.
//!
//! # Lost nodes
//! Every request carries a deadline (`STRATA_REMOTE_TIMEOUT`). A missed deadline or an
//! endpoint error marks the node lost: its endpoint is closed with force (cancelling every
//! operation still aimed at callers' buffers) and waiting and later requests fail with
//! `StoreError::Unavailable`. A killed node was reported within 1 ms in the tests (its
//! connection resets), a stopped one after the timeout; reads never return zeros for lost
//! pages.
#![warn(missing_docs)]

pub mod client;
pub mod footprint;
pub mod handshake;
pub mod lent_file_store;
pub mod protocol;
pub mod server;
mod sys;

use std::sync::Arc;
use std::time::Duration;

use strata_codec::{CodecError, CompressedStore};
use strata_core::config::{CodecKind, StoreConfig, StoreKind};
use strata_core::store::{FileStore, FileStoreOptions, MemoryStore, PackedMemoryStore, Store};

pub use client::{AccessPath, NetworkCounters, RemoteOpenError, RemoteStore, RemoteStoreOptions};
pub use footprint::UcxFootprint;
pub use handshake::NodeCapacity;
pub use server::{MemoryNode, ServeError, ServeOptions};

/// What Strata needs from a network transport: a store over memory lent by remote nodes.
/// UCX is the one implementation today; libfabric (Slingshot, EFA) is the planned second.
pub trait Transport: Send + Sync + std::fmt::Debug {
    /// A short name, such as `ucx`.
    fn name(&self) -> &'static str;
    /// Opens a store of `size` bytes striped over the given nodes.
    fn open_store(
        &self,
        size: u64,
        options: RemoteStoreOptions,
    ) -> Result<Arc<dyn Store>, RemoteOpenError>;
}

/// The UCX transport.
#[derive(Debug, Clone, Copy, Default)]
pub struct UcxTransport;

impl Transport for UcxTransport {
    fn name(&self) -> &'static str {
        "ucx"
    }
    fn open_store(
        &self,
        size: u64,
        options: RemoteStoreOptions,
    ) -> Result<Arc<dyn Store>, RemoteOpenError> {
        Ok(Arc::new(RemoteStore::connect(size, options)?))
    }
}

/// Why [`open_store`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenStoreError {
    /// The file store could not be opened (`strata-core` does not re-export its error type,
    /// so it is carried boxed).
    #[error(transparent)]
    File(Box<dyn std::error::Error + Send + Sync>),
    /// The remote store could not be opened.
    #[error(transparent)]
    Remote(#[from] RemoteOpenError),
    /// The codec could not be set up.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// `STRATA_UCX_FOOTPRINT` names no footprint.
    #[error("{0}")]
    Footprint(String),
    /// `STRATA_REMOTE_FILES` is not a switch.
    #[error("{0}")]
    Files(String),
    /// A remote store needs a token.
    #[error(
        "a remote store needs the memory nodes' token; set STRATA_REMOTE_TOKEN or pass --token"
    )]
    MissingToken,
}

/// Checks that every memory node of a remote store `config` answers as a Strata memory node
/// of this version that takes clients now (one TCP round trip each, no UCX: about 1 ms on
/// loopback against 20-40 ms for opening the store), and that a token is set. It does not
/// prove the token: a wrong one is found when the store is opened. Other stores pass.
pub fn probe_store(config: &StoreConfig) -> Result<(), OpenStoreError> {
    let StoreKind::Remote { nodes } = &config.kind else {
        return Ok(());
    };
    if config.token.is_none() {
        return Err(OpenStoreError::MissingToken);
    }
    client::probe_nodes(nodes, Duration::from_secs(config.timeout_secs))?;
    Ok(())
}

/// How much each memory node of a remote store `config` can lend now, in the order of its
/// nodes (one authenticated TCP conversation each, no UCX: about 1 ms on loopback). Unlike
/// [`probe_store`] it proves the token, so a wrong one is refused here. Other stores have no
/// nodes: an empty list.
pub fn node_capacities(config: &StoreConfig) -> Result<Vec<NodeCapacity>, OpenStoreError> {
    let StoreKind::Remote { nodes } = &config.kind else {
        return Ok(Vec::new());
    };
    let token = config
        .token
        .as_deref()
        .ok_or(OpenStoreError::MissingToken)?;
    Ok(client::query_capacities(
        nodes,
        token,
        Duration::from_secs(config.timeout_secs),
    )?)
}

/// Each node's free capacity in words, for messages: `HOST:PORT has 12 MiB of 1 GiB free`,
/// joined by commas (`names` and `nodes` in the same order).
pub fn describe_free(names: &[String], nodes: &[NodeCapacity]) -> String {
    names
        .iter()
        .zip(nodes)
        .map(|(name, n)| {
            format!(
                "{name} has {} of {} free",
                strata_core::format_size(n.free),
                strata_core::format_size(n.capacity)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a process's memory cannot be paged over these nodes at all (none has room for one
/// page of `page_bytes` on each), and what to do: the refusal `strata run` gives before it
/// starts a program and the one a preloaded process gives, in the same words.
pub fn no_room(names: &[String], nodes: &[NodeCapacity], page_bytes: u64) -> String {
    format!(
        "the memory nodes have no room for the program's memory ({}; the arena needs at least one page, {}, on each): other clients hold the rest; end some, start the nodes with a larger --capacity, or add nodes",
        describe_free(names, nodes),
        strata_core::format_size(page_bytes)
    )
}

/// The unit a remote store is striped in with pages of `page_bytes`: one page, or one codec
/// slot, so that a page never straddles two nodes.
fn stripe_bytes(codec: CodecKind, page_bytes: u64) -> u64 {
    match codec {
        CodecKind::None => page_bytes,
        _ => CompressedStore::slot_bytes(page_bytes),
    }
}

/// Bytes each memory node lends for the store [`open_store_with_page`] opens with these
/// arguments (0 for a store that is not remote).
pub fn bytes_per_node(
    config: &StoreConfig,
    size: u64,
    page_bytes: u64,
) -> Result<u64, OpenStoreError> {
    let StoreKind::Remote { nodes } = &config.kind else {
        return Ok(0);
    };
    Ok(client::bytes_per_node(
        inner_size(config, size, page_bytes)?,
        stripe_bytes(config.codec, page_bytes),
        nodes.len(),
    ))
}

/// The largest store, in whole pages of `page_bytes`, that [`open_store_with_page`] can open
/// over nodes with these free capacities (one per node, in any order): pages are striped
/// evenly over the nodes, so each lends the same share, and the smallest free capacity
/// bounds them all (the nodes' number times the smallest, less a codec's slot headers).
/// 0 when the nodes have less than a stripe free, or none are given.
pub fn largest_store_within(config: &StoreConfig, page_bytes: u64, nodes: &[NodeCapacity]) -> u64 {
    let Some(smallest) = nodes.iter().map(|n| n.free).min() else {
        return 0;
    };
    let stripes_each = smallest / stripe_bytes(config.codec, page_bytes).max(1);
    stripes_each
        .saturating_mul(nodes.len() as u64)
        .saturating_mul(page_bytes)
}

/// Default codec page size for [`open_store`]: the pager's default page.
pub const DEFAULT_CODEC_PAGE: u64 = 64 << 10;

/// Opens the store `config` describes, `size` bytes long, with its codec (pages of
/// [`DEFAULT_CODEC_PAGE`] bytes).
pub fn open_store(config: &StoreConfig, size: u64) -> Result<Arc<dyn Store>, OpenStoreError> {
    open_store_with_page(config, size, DEFAULT_CODEC_PAGE)
}

/// Opens the store `config` describes, with codec pages of `page_bytes` (use the region's
/// page size so each fault reads one compressed page).
pub fn open_store_with_page(
    config: &StoreConfig,
    size: u64,
    page_bytes: u64,
) -> Result<Arc<dyn Store>, OpenStoreError> {
    let inner = open_inner_store(config, inner_size(config, size, page_bytes)?, page_bytes)?;
    with_codec(config, inner, page_bytes, size)
}

/// Bytes of the store under `config`'s codec for a store of `size` bytes in pages of
/// `page_bytes` (`size` itself without a codec; one slot per page with one).
pub fn inner_size(config: &StoreConfig, size: u64, page_bytes: u64) -> Result<u64, OpenStoreError> {
    Ok(match config.codec {
        CodecKind::None => size,
        _ => CompressedStore::inner_size(size, page_bytes)?,
    })
}

/// Opens the store under `config`'s codec: `inner_size` bytes ([`inner_size`]) of memory,
/// file or memory nodes (striped in pages, or codec slots, of `page_bytes`; with the UCX
/// footprint [`footprint::FOOTPRINT_VAR`] names, standard when unset).
pub fn open_inner_store(
    config: &StoreConfig,
    inner_size: u64,
    page_bytes: u64,
) -> Result<Arc<dyn Store>, OpenStoreError> {
    Ok(match &config.kind {
        // Under a codec each slot is kept at its compressed size, not a whole slot.
        StoreKind::Memory => match config.codec {
            CodecKind::None => Arc::new(MemoryStore::new(inner_size)),
            _ => Arc::new(PackedMemoryStore::new(
                inner_size,
                CompressedStore::slot_bytes(page_bytes),
            )),
        },
        StoreKind::File { path } => Arc::new(
            FileStore::open(
                path,
                inner_size,
                &FileStoreOptions {
                    create: true,
                    grow: config.grow,
                    direct: config.direct,
                    read_only: false,
                },
            )
            .map_err(|e| OpenStoreError::File(Box::new(e)))?,
        ),
        StoreKind::Remote { nodes } => {
            let token = config.token.clone().ok_or(OpenStoreError::MissingToken)?;
            let mut options = RemoteStoreOptions::new(
                nodes.clone(),
                token,
                Duration::from_secs(config.timeout_secs),
            );
            options.stripe_bytes = stripe_bytes(config.codec, page_bytes);
            options.footprint = UcxFootprint::from_env().map_err(OpenStoreError::Footprint)?;
            // Nodes on this host lend files the program reads itself: no UCX, no hand-off.
            let files = lent_file_store::files_allowed_by_env().map_err(OpenStoreError::Files)?;
            if files && let Some(store) = lent_file_store::open(&options, inner_size)? {
                return Ok(Arc::new(store));
            }
            UcxTransport.open_store(inner_size, options)?
        }
    })
}

/// Wraps `inner` ([`open_inner_store`], or stores composed of such) in `config`'s codec as a
/// store of `size` bytes in pages of `page_bytes` (`inner` itself without a codec).
pub fn with_codec(
    config: &StoreConfig,
    inner: Arc<dyn Store>,
    page_bytes: u64,
    size: u64,
) -> Result<Arc<dyn Store>, OpenStoreError> {
    Ok(match config.codec {
        CodecKind::None => inner,
        codec => Arc::new(CompressedStore::new(inner, codec, page_bytes, size)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn remote(nodes: usize, codec: CodecKind) -> StoreConfig {
        StoreConfig {
            kind: StoreKind::Remote {
                nodes: (0..nodes)
                    .map(|i| format!("127.0.0.1:{}", 7400 + i))
                    .collect(),
            },
            codec,
            direct: false,
            grow: false,
            token: None,
            timeout_secs: 5,
        }
    }

    /// The largest store within the nodes' free capacity fits every node, and one page more
    /// does not fit the fullest one.
    #[test]
    fn the_largest_store_within_free_capacity_is_exact() {
        let seed: u64 = rand::rng().random();
        println!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..2000 {
            let nodes = rng.random_range(1..=5);
            let codec = if rng.random_bool(0.5) {
                CodecKind::None
            } else {
                CodecKind::Lz4
            };
            let page = 4096u64 << rng.random_range(0..=9);
            let free: Vec<NodeCapacity> = (0..nodes)
                .map(|_| {
                    let free = rng.random_range(0..(4u64 << 30));
                    NodeCapacity {
                        free,
                        capacity: free + rng.random_range(0..(1u64 << 30)),
                    }
                })
                .collect();
            let config = remote(nodes, codec);
            let smallest = free.iter().map(|n| n.free).min().unwrap();
            let largest = largest_store_within(&config, page, &free);
            assert_eq!(largest % page, 0, "whole pages");
            if largest > 0 {
                let share = bytes_per_node(&config, largest, page).unwrap();
                assert!(
                    share <= smallest,
                    "{largest} over {nodes} nodes asks {share} of each, {smallest} free"
                );
            }
            let more = bytes_per_node(&config, largest + page, page).unwrap();
            assert!(
                more > smallest,
                "one page more ({}) still fits {smallest}: {largest} is not the largest",
                largest + page
            );
        }
        // Edge cases: no nodes, nothing free, less than a stripe free.
        let config = remote(2, CodecKind::None);
        assert_eq!(largest_store_within(&config, 65536, &[]), 0);
        let nothing = NodeCapacity {
            free: 0,
            capacity: 1 << 30,
        };
        let half_page = NodeCapacity {
            free: 32768,
            capacity: 1 << 30,
        };
        assert_eq!(largest_store_within(&config, 65536, &[nothing, nothing]), 0);
        assert_eq!(
            largest_store_within(&config, 65536, &[half_page, half_page]),
            0
        );
        // Two nodes with 1 GiB and 3 GiB free hold 2 GiB striped evenly.
        let uneven = [
            NodeCapacity {
                free: 1 << 30,
                capacity: 1 << 30,
            },
            NodeCapacity {
                free: 3 << 30,
                capacity: 4 << 30,
            },
        ];
        assert_eq!(largest_store_within(&config, 65536, &uneven), 2 << 30);
        assert_eq!(
            bytes_per_node(&StoreConfig::builder().build().unwrap(), 1 << 30, 65536).unwrap(),
            0
        );
    }
}
