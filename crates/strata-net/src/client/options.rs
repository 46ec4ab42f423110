//! What a [`RemoteStore`](super::RemoteStore)(super::RemoteStore) is opened with (nodes, token, timeout, access
//! path), why opening can fail, and the traffic counters it reports.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use strata_core::units::format_size;
use strata_ucx::UcxError;

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

/// Longest request timeout a [`RemoteStore`](super::RemoteStore) accepts (one day).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// How to open a [`RemoteStore`](super::RemoteStore).
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
    /// UCX transports (`None`: UCX's choice, or [`crate::footprint::LEAN_LEAVES_OUT`] for a
    /// lean footprint).
    pub transports: Option<String>,
    /// How much memory the client's UCX queues may take (see [`crate::footprint`]).
    pub footprint: crate::UcxFootprint,
    /// Emulate a link of this many bytes per second in each direction (for benchmarks of
    /// compression when the network is the bottleneck); `None`: no limit.
    pub link_bytes_per_sec: Option<u64>,
}

impl RemoteStoreOptions {
    /// Options with defaults: messages, 64 KiB stripes, 32 pieces in flight per node,
    /// standard UCX queues.
    pub fn new(nodes: Vec<String>, token: impl Into<String>, timeout: Duration) -> Self {
        Self {
            nodes,
            token: token.into(),
            timeout,
            stripe_bytes: 64 << 10,
            access: AccessPath::Messages,
            max_in_flight: 32,
            transports: None,
            footprint: crate::UcxFootprint::Standard,
            link_bytes_per_sec: None,
        }
    }
}

/// Why a [`RemoteStore`](super::RemoteStore) could not be opened.
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
    /// The node has less free capacity than the store needs there.
    #[error(
        "memory node {node} has too little free capacity: {} free, and this store needs {} there; start it with a larger --capacity (with --overcommit beyond its memory), add nodes, or ask for less",
        format_size(*.free),
        format_size(*.asked)
    )]
    NoCapacity {
        /// The node.
        node: String,
        /// Bytes the store asked the node to lend.
        asked: u64,
        /// Bytes the node had free.
        free: u64,
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

/// Bytes moved over the network by a [`RemoteStore`](super::RemoteStore) (payload, without headers).
#[derive(Debug, Default)]
pub struct NetworkCounters {
    /// Bytes fetched from nodes.
    pub bytes_received: AtomicU64,
    /// Bytes sent to nodes.
    pub bytes_sent: AtomicU64,
    /// Pieces issued.
    pub operations: AtomicU64,
}
