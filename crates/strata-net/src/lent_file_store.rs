//! [`LentFileStore`]: a store over memory that nodes on this host lent as files.
//!
//! When every node of a remote store runs on the client's host (its front-door connection
//! has the same address at both ends), the client asks each for its share as a file
//! ([`crate::handshake::ask_for_file`], the node's side in `server/lent_file.rs`), opens it
//! through `/proc`, and from then on reads and writes pages with `pread`/`pwrite`: one copy,
//! no thread hand-off, no UCX in the program. The pages stay charged to the node, which
//! allocated them when it lent them, so a program held to a memory limit pages into memory
//! outside its limit as zram's pool is.
//!
//! Where a node is elsewhere, refuses ([`crate::handshake::Refusal::NoFile`]), or its file
//! cannot be opened here (another user, another PID namespace), [`open`] returns `None` and
//! the caller reaches the nodes over messages instead ([`crate::client::RemoteStore`]).
//! `STRATA_REMOTE_FILES=false` skips the attempt.
//!
//! A loan ends when this store drops (its front-door connections close). A node whose
//! connection closes (it stopped or died) is lost, as over messages: later reads and writes
//! of its pages fail with [`StoreError::Unavailable`], so a program sees the same failure
//! (SIGBUS under `strata run`) whichever way its node was reached, and the node's memory is
//! not kept alive by clients it no longer counts. One small thread per node waits on its
//! connection.

use std::fs::File;
use std::io::Read as _;
use std::net::{Shutdown, TcpStream};
use std::os::unix::fs::FileExt as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use strata_core::store::{Store, StoreError, check_range};
use strata_core::units::format_size;

use crate::client::{self, NetworkCounters, RemoteOpenError, RemoteStoreOptions};
use crate::handshake::{self, FileGrant, HandshakeError, Refusal};

/// The variable that turns the attempt off (`false`/`0`) or on (`true`/`1`, the default).
pub const FILES_VAR: &str = "STRATA_REMOTE_FILES";

/// Whether [`FILES_VAR`] lets a client ask nodes on its host for files; an error names a
/// value that is not a switch.
pub fn files_allowed_by_env() -> Result<bool, String> {
    let env = strata_core::config::process_env().map_err(|e| e.to_string())?;
    files_allowed(&env)
}

/// [`files_allowed_by_env`] for the `STRATA_*` variables `env`.
fn files_allowed(env: &strata_core::config::EnvVars) -> Result<bool, String> {
    strata_core::config::env_bool(env, FILES_VAR)
        .map(|on| on.unwrap_or(true))
        .map_err(|e| e.to_string())
}

/// A store whose bytes live in files lent by memory nodes on this host. See the module docs.
#[derive(Debug)]
pub struct LentFileStore {
    size: u64,
    stripe: u64,
    node_names: Vec<String>,
    files: Vec<File>,
    /// Each node's front-door connection: the loan lasts while it is open.
    lifelines: Vec<TcpStream>,
    /// Per node: its connection closed while this store lived.
    lost: Arc<Vec<AtomicBool>>,
    /// Set before this store closes the connections itself (not a loss).
    closing: Arc<AtomicBool>,
    watchers: Vec<JoinHandle<()>>,
    counters: NetworkCounters,
}

/// Borrows `size` bytes striped over `options.nodes` as lent files, if every node is on
/// this host and lends one; `None` if any is not or does not (the caller then uses
/// messages). Errors are those no other path would get past: a wrong token, a node that
/// does not answer.
pub fn open(
    options: &RemoteStoreOptions,
    size: u64,
) -> Result<Option<LentFileStore>, RemoteOpenError> {
    client::check_nodes(&options.nodes, options.timeout)?;
    if options.stripe_bytes == 0 {
        return Err(RemoteOpenError::BadStripe(options.stripe_bytes));
    }
    let per_node = client::bytes_per_node(size, options.stripe_bytes, options.nodes.len());
    let mut files = Vec::with_capacity(options.nodes.len());
    let mut lifelines = Vec::with_capacity(options.nodes.len());
    for node in &options.nodes {
        let (grant, lifeline) = client::through_door(
            node,
            client::resolve(node)?,
            options.timeout,
            |stream, deadline| {
                if !handshake::on_this_host(stream) {
                    return Ok(None);
                }
                match handshake::ask_for_file(stream, options.token.as_bytes(), per_node, deadline)
                {
                    Ok(grant) => Ok(Some(grant)),
                    Err(HandshakeError::Refused(Refusal::NoFile)) => Ok(None),
                    Err(e) => Err(e),
                }
            },
        )?;
        let Some(grant) = grant else {
            tracing::debug!(node, "no file from this node; using messages");
            return Ok(None);
        };
        match open_grant(&grant, per_node) {
            Ok(file) => files.push(file),
            Err(why) => {
                tracing::info!(node, why, "cannot open the node's file; using messages");
                return Ok(None);
            }
        }
        lifelines.push(lifeline);
    }
    tracing::debug!(nodes = ?options.nodes, size = %format_size(size), "lent files open");
    let lost: Arc<Vec<AtomicBool>> =
        Arc::new(lifelines.iter().map(|_| AtomicBool::new(false)).collect());
    let closing = Arc::new(AtomicBool::new(false));
    let mut store = LentFileStore {
        size,
        stripe: options.stripe_bytes,
        node_names: options.nodes.clone(),
        files,
        lifelines: Vec::new(),
        lost,
        closing,
        watchers: Vec::new(),
        counters: NetworkCounters::default(),
    };
    for (index, lifeline) in lifelines.into_iter().enumerate() {
        let watcher = watch(
            lifeline.try_clone(),
            index,
            Arc::clone(&store.lost),
            Arc::clone(&store.closing),
        )
        .map_err(|e| RemoteOpenError::Thread(format!("cannot watch the node's connection: {e}")))?;
        store.lifelines.push(lifeline);
        store.watchers.push(watcher);
    }
    Ok(Some(store))
}

/// Waits on a node's front-door connection (a node never sends on it after the grant) and
/// marks the node lost when it closes, unless the store is closing it.
fn watch(
    connection: std::io::Result<TcpStream>,
    index: usize,
    lost: Arc<Vec<AtomicBool>>,
    closing: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    let mut connection = connection?;
    connection.set_read_timeout(None)?;
    std::thread::Builder::new()
        .name("strata-lent-watch".into())
        .stack_size(64 << 10)
        .spawn(move || {
            let mut byte = [0u8; 1];
            loop {
                match connection.read(&mut byte) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // Closed, reset, or a byte no node sends: the loan is over.
                    _ => break,
                }
            }
            if !closing.load(Ordering::Acquire) {
                lost[index].store(true, Ordering::Release);
            }
        })
}

/// Opens the file `grant` names and checks that it is the one the node made (its name) and
/// holds `bytes`.
fn open_grant(grant: &FileGrant, bytes: u64) -> Result<File, String> {
    let path = format!("/proc/{}/fd/{}", grant.pid, grant.fd);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {path}: {e}"))?;
    // The name is checked on the file opened, not the link read before: nothing can swap it
    // in between.
    let own = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
    let target = std::fs::read_link(&own).map_err(|e| format!("reading {own}: {e}"))?;
    let expected = format!("/memfd:{}", grant.file_name());
    if !target.to_string_lossy().starts_with(&expected) {
        return Err(format!(
            "{path} is {}, not the node's file {expected}",
            target.display()
        ));
    }
    let len = file
        .metadata()
        .map_err(|e| format!("reading {path}'s size: {e}"))?
        .len();
    if len < bytes {
        return Err(format!("{path} holds {len} bytes, not the {bytes} lent"));
    }
    Ok(file)
}

impl LentFileStore {
    /// Bytes moved so far (`bytes_received`: read from the files, `bytes_sent`: written).
    pub fn counters(&self) -> &NetworkCounters {
        &self.counters
    }

    /// Runs `each(file, offset in it, range of buf)` over the per-node pieces of
    /// `[offset, offset + len)`; fails at a lost node's piece without touching its file.
    fn pieces(
        &self,
        op: &'static str,
        offset: u64,
        len: usize,
        mut each: impl FnMut(&File, u64, std::ops::Range<usize>) -> std::io::Result<()>,
    ) -> Result<(), StoreError> {
        for piece in client::stripe_pieces(offset, len, self.stripe, self.files.len()) {
            if self.lost[piece.node].load(Ordering::Acquire) {
                return Err(client::lost_error(
                    &self.node_names[piece.node],
                    "it closed its front-door connection (it stopped or died)",
                ));
            }
            let range = piece.start..piece.start + piece.length;
            each(&self.files[piece.node], piece.at, range).map_err(|source| StoreError::Io {
                store: self.describe(),
                op,
                offset,
                len: len as u64,
                source,
            })?;
        }
        Ok(())
    }
}

impl Store for LentFileStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        let len = buf.len();
        self.pieces("read", offset, len, |file, at, range| {
            file.read_exact_at(&mut buf[range], at)
        })?;
        self.counters
            .bytes_received
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        self.pieces("write", offset, buf.len(), |file, at, range| {
            file.write_all_at(&buf[range], at)
        })?;
        self.counters
            .bytes_sent
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Writes land in the node's memory at once; there is nothing to persist.
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "remote:{} (files lent on this host, {})",
            self.node_names.join(","),
            format_size(self.size)
        )
    }
}

impl Drop for LentFileStore {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        for lifeline in &self.lifelines {
            // Wakes the watcher (its read returns) and tells the node the loan is over.
            let _ = lifeline.shutdown(Shutdown::Both);
        }
        for watcher in self.watchers.drain(..) {
            let _ = watcher.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_takes_true_and_false_words_and_refuses_others() {
        let set = |v: &str| vec![(FILES_VAR.to_string(), v.to_string())];
        assert_eq!(files_allowed(&Vec::new()), Ok(true));
        for on in ["1", "true", " yes", "on "] {
            assert_eq!(files_allowed(&set(on)), Ok(true), "{on:?}");
        }
        for off in ["0", "false", "no", "off"] {
            assert_eq!(files_allowed(&set(off)), Ok(false), "{off:?}");
        }
        let err = files_allowed(&set("maybe")).unwrap_err();
        assert!(err.contains(FILES_VAR) && err.contains("true"), "{err}");
    }

    /// A grant is honoured only for the very file the node named, of at least the size lent.
    #[test]
    fn a_grant_opens_only_the_named_file_of_the_size_lent() {
        let real = FileGrant::with_random_name(std::process::id());
        let file = crate::sys::memory_file(&real.file_name()).unwrap();
        file.set_len(1 << 20).unwrap();
        let fd = u32::try_from(std::os::fd::AsRawFd::as_raw_fd(&file)).unwrap();
        let grant = FileGrant { fd, ..real };
        let opened = open_grant(&grant, 1 << 20).expect("the named file opens");
        opened.write_all_at(b"lent", 4096).unwrap();
        let mut back = [0u8; 4];
        file.read_exact_at(&mut back, 4096).unwrap();
        assert_eq!(&back, b"lent", "the same file, not a copy");
        // Another name: some other file at that descriptor.
        let mut other = grant;
        other.name[0] ^= 1;
        let err = open_grant(&other, 1 << 20).unwrap_err();
        assert!(err.contains("not the node's file"), "{err}");
        // Smaller than lent.
        let err = open_grant(&grant, (1 << 20) + 1).unwrap_err();
        assert!(err.contains("not the"), "{err}");
        // A descriptor that is not open, and a process that does not exist.
        assert!(
            open_grant(
                &FileGrant {
                    fd: 999_999,
                    ..grant
                },
                1
            )
            .is_err()
        );
        assert!(
            open_grant(
                &FileGrant {
                    pid: u32::MAX,
                    ..grant
                },
                1
            )
            .is_err()
        );
    }
}
