//! The broker protocol's messages (the JSON body of a frame, see `wire`).
//!
//! Conversation, in order:
//! 1. Every client opens with `Hello` naming its role; the broker answers `Welcome` (or
//!    `Error` and closes).
//! 2. A lender sends `Offer` (its GPU, chunk size, most bytes it lends). The broker asks it for
//!    chunks with `CreateChunks`; it answers `Chunks` with one exported descriptor per chunk
//!    attached, or `ChunksFailed`.
//! 3. A borrower sends `Borrow`; the broker splits the request over lenders (round robin,
//!    whole chunks), forwards each lender's chunks as `Granted` (descriptors attached, one
//!    lease per lender) and ends with `BorrowDone`. The broker closes its copies of the
//!    descriptors as soon as they are sent on: an open descriptor pins GPU memory.
//! 4. Reclaim: a lender sends `Reclaim` (bytes, deadline). The broker sends `Revoke` to the
//!    borrowers holding those chunks; a borrower stops using them, unmaps them and answers
//!    `Released`; the broker passes each release to the lender as `ChunksFreed` and ends with
//!    `ReclaimDone`. A borrower may also give chunks back on its own with `Released`.
//! 5. `Status` (any client) is answered with `StatusReply`.

use serde::{Deserialize, Serialize};

/// What a client is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Role {
    /// Lends memory of one GPU.
    Lender {
        /// The lender's GPU ordinal.
        gpu: u32,
    },
    /// Borrows memory for kernels on one GPU (never from that GPU itself).
    Borrower {
        /// The borrower's GPU ordinal.
        gpu: u32,
    },
    /// Only asks for status.
    Observer,
}

/// Why chunks came back to their lender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FreeReason {
    /// The borrower released them (on a revoke or on its own).
    Released,
    /// The borrower's connection ended (it exited, crashed or closed the socket).
    BorrowerGone,
    /// The borrower missed a reclaim deadline and was killed.
    BorrowerKilled,
    /// The chunks were created for a borrow request whose borrower had gone meanwhile.
    NeverDelivered,
}

/// What the broker knows about one GPU's lending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuLending {
    /// GPU ordinal.
    pub gpu: u32,
    /// Lending processes on it.
    pub lenders: u32,
    /// Bytes offered in all.
    pub offered_bytes: u64,
    /// Bytes lent now.
    pub lent_bytes: u64,
    /// Bytes a new borrow could get now.
    pub available_bytes: u64,
    /// Chunk size.
    pub chunk_bytes: u64,
}

/// One lease as `Status` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseReport {
    /// Lease id.
    pub lease: u64,
    /// Borrower's process id.
    pub borrower_pid: u32,
    /// Borrower's GPU.
    pub borrower_gpu: u32,
    /// Lender's GPU.
    pub lender_gpu: u32,
    /// Bytes held.
    pub bytes: u64,
}

/// An error code with the `Error` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame was not understood; the connection is closed.
    Protocol,
    /// A message out of place for the client's role or state.
    Unexpected,
    /// The client named a lease or chunk it does not hold.
    NotHeld,
    /// Not enough lendable memory.
    NotEnough,
    /// A value out of range.
    Invalid,
}

/// A broker protocol message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// Client -> broker, first message.
    Hello {
        /// What the client is.
        role: Role,
    },
    /// Broker -> client: accepted.
    Welcome {
        /// The client's id at the broker.
        client: u64,
        /// The broker's process id.
        broker_pid: u32,
    },
    /// Broker -> client: a request was refused (the connection stays open unless the code is
    /// `protocol`).
    Error {
        /// Kind.
        code: ErrorCode,
        /// What happened and what to do.
        message: String,
    },
    /// Lender -> broker: lend up to `max_bytes` of this GPU in chunks of `chunk_bytes` (again
    /// to change the amount; lowering it below what is lent does not revoke: use `Reclaim`).
    Offer {
        /// Most bytes lent at once.
        max_bytes: u64,
        /// Chunk size (a multiple of the GPU's allocation granularity, 2 MiB on current GPUs).
        chunk_bytes: u64,
    },
    /// Broker -> lender: create and export `count` chunks.
    CreateChunks {
        /// Broker's request id, echoed in the answer.
        request: u64,
        /// Chunks wanted (at most `MAX_FDS_PER_FRAME`).
        count: u32,
    },
    /// Lender -> broker: the chunks, one descriptor per id attached in order.
    Chunks {
        /// From `CreateChunks`.
        request: u64,
        /// Lender-chosen chunk ids, unique per lender.
        chunks: Vec<u64>,
    },
    /// Lender -> broker: the chunks could not be created.
    ChunksFailed {
        /// From `CreateChunks`.
        request: u64,
        /// Why.
        message: String,
    },
    /// Lender -> broker: give back `bytes` of what is lent (and lend that much less from now
    /// on), with borrowers given `deadline_ms` to comply.
    Reclaim {
        /// Lender's id for this reclaim, echoed in `ReclaimDone`.
        reclaim: u64,
        /// Bytes wanted back.
        bytes: u64,
        /// Milliseconds the borrowers get.
        deadline_ms: u64,
    },
    /// Broker -> lender: these chunks are no longer mapped by anyone the broker handed them
    /// to; release them.
    ChunksFreed {
        /// Chunk ids.
        chunks: Vec<u64>,
        /// Why.
        reason: FreeReason,
    },
    /// Broker -> lender: a reclaim has ended.
    ReclaimDone {
        /// From `Reclaim`.
        reclaim: u64,
        /// Bytes released by borrowers in time.
        freed_bytes: u64,
        /// Borrowers killed for missing the deadline (their chunks come back as
        /// `ChunksFreed` with `borrower_killed` when their connection ends).
        killed_pids: Vec<u32>,
        /// Bytes still mapped by borrowers when the reclaim ended.
        outstanding_bytes: u64,
    },
    /// Borrower -> broker: lend me `bytes` (rounded up to whole chunks).
    Borrow {
        /// Borrower's id, echoed in the answers.
        request: u64,
        /// Bytes wanted.
        bytes: u64,
        /// Lender GPUs acceptable (empty: any GPU but the borrower's own).
        from: Vec<u32>,
    },
    /// Broker -> borrower: chunks of one lender, one descriptor per id attached in order.
    Granted {
        /// From `Borrow`.
        request: u64,
        /// The lease they belong to.
        lease: u64,
        /// The lender's GPU.
        lender_gpu: u32,
        /// Chunk size.
        chunk_bytes: u64,
        /// Chunk ids.
        chunks: Vec<u64>,
    },
    /// Broker -> borrower: the borrow request is complete.
    BorrowDone {
        /// From `Borrow`.
        request: u64,
        /// Bytes granted in all.
        granted_bytes: u64,
        /// Why less than asked was granted (a lender failed or left meanwhile), if so.
        shortfall: Option<String>,
    },
    /// Broker -> borrower: stop using these chunks, unmap them and answer `Released` within
    /// `deadline_ms`, or be killed.
    Revoke {
        /// The lease.
        lease: u64,
        /// The chunks.
        chunks: Vec<u64>,
        /// Milliseconds left.
        deadline_ms: u64,
    },
    /// Borrower -> broker: these chunks are unmapped and their descriptors closed.
    Released {
        /// The lease.
        lease: u64,
        /// The chunks.
        chunks: Vec<u64>,
    },
    /// Any -> broker: what is lendable and lent.
    Status,
    /// Broker -> client.
    StatusReply {
        /// Per GPU.
        gpus: Vec<GpuLending>,
        /// Every lease.
        leases: Vec<LeaseReport>,
    },
}

impl Message {
    /// The message's name, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Welcome { .. } => "welcome",
            Message::Error { .. } => "error",
            Message::Offer { .. } => "offer",
            Message::CreateChunks { .. } => "create_chunks",
            Message::Chunks { .. } => "chunks",
            Message::ChunksFailed { .. } => "chunks_failed",
            Message::Reclaim { .. } => "reclaim",
            Message::ChunksFreed { .. } => "chunks_freed",
            Message::ReclaimDone { .. } => "reclaim_done",
            Message::Borrow { .. } => "borrow",
            Message::Granted { .. } => "granted",
            Message::BorrowDone { .. } => "borrow_done",
            Message::Revoke { .. } => "revoke",
            Message::Released { .. } => "released",
            Message::Status => "status",
            Message::StatusReply { .. } => "status_reply",
        }
    }
}
