//! The lending broker for neighbour GPUs' idle memory (issue 13, "inter-job harvesting").
//!
//! One broker per host (`strata broker`) listens on a Unix socket. Lenders (`strata lend`, or
//! [`Lender`] in a program) offer part of a GPU's memory; borrowers ([`Borrower`], wired to a
//! `strata_gpu` space's peer tier) ask for it and receive 2 MiB chunks as CUDA VMM POSIX file
//! descriptors passed with `SCM_RIGHTS` (not `pidfd_getfd`, which needs ptrace rights that
//! containers deny). The broker keeps the books ([`ledger`]) and runs reclaims with deadlines
//! ([`broker`] documents the whole protocol's failure handling: missed deadlines, dead
//! borrowers, dead lenders, a dead broker). The GPU is behind [`ChunkSource`] and
//! [`ChunkSink`], so everything here is tested without one ([`fake`]: memfd chunks).
//!
//! Wire format: [`wire`] (versioned 12-byte header, JSON body, one frame per
//! `SOCK_SEQPACKET` packet); messages: [`message`].

pub mod borrower;
pub mod broker;
pub mod client;
pub mod fake;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod ledger;
pub mod lender;
pub mod message;
pub mod socket;
pub mod wire;

use std::path::PathBuf;

pub use borrower::{BorrowOutcome, Borrower, ChunkSink, Grant};
pub use broker::{Broker, BrokerConfig, BrokerError, Enforcer, Sigkill};
pub use client::{ClientError, status};
pub use lender::{ChunkSource, Lender, LenderEvent, ReclaimReport};

/// Where the broker listens unless told otherwise: `$STRATA_BROKER_SOCKET`, else
/// `$XDG_RUNTIME_DIR/strata/broker.sock`, else `/run/strata/broker.sock` for root and
/// `/tmp/strata-$UID/broker.sock` for others.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("STRATA_BROKER_SOCKET").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        return PathBuf::from(d).join("strata").join("broker.sock");
    }
    let uid = rustix::process::getuid();
    if uid.is_root() {
        PathBuf::from("/run/strata/broker.sock")
    } else {
        PathBuf::from(format!("/tmp/strata-{}/broker.sock", uid.as_raw()))
    }
}
