//! Memory a node lends a client on its own host as a file.
//!
//! A client whose front-door connection shows it on the node's host may ask for memory as a
//! file instead of a session ([`crate::handshake::ask_for_file`]). The node makes a memory
//! file (`memfd`) of the size asked, allocates every page of it at once, seals its size, and
//! tells the client (under its proof) its process id, the file's descriptor and the random
//! part of its name. The client opens `/proc/PID/fd/FD`, checks the name, and then reads and
//! writes the pages itself: no message, no thread of the node, no UCX on the path.
//!
//! Why: a node on the same host exists to hold memory outside the program's memory group
//! (as zram's pool is kernel memory outside it). Pages are charged to whoever allocates them,
//! so the node allocates them all when it lends: the program's writes then land in pages the
//! node already holds. Over messages each page crossed four threads (40-80 us on two cores);
//! a read of a lent file is one copy.
//!
//! What it costs and whom it trusts: the file is committed memory for as long as the loan
//! lasts (a node that overcommits lends no files, since its pages would be charged to the
//! client that touches them first). Opening another process's descriptor through `/proc` takes
//! the right to inspect that process (same user, or root), which already lets a process read
//! the node's memory: a client of another user falls back to messages. The loan ends when the
//! front-door connection closes; the node then forgets the file, and its pages go back once
//! the client has closed it too (a client that outlives its node keeps its data).

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::NodeCounters;
use crate::handshake::FileGrant;

/// A file lent to one client; dropping it ends the loan and gives its bytes back to the
/// node's capacity.
pub(super) struct LentFile {
    _file: File,
    bytes: u64,
    counters: Arc<NodeCounters>,
}

impl LentFile {
    /// Makes and commits a file of `bytes`, already reserved from the node's capacity: the
    /// returned loan gives them back when dropped, a failure here at once.
    pub(super) fn create(
        bytes: u64,
        counters: Arc<NodeCounters>,
    ) -> Result<(Self, FileGrant), String> {
        let grant = FileGrant::with_random_name(std::process::id());
        let made = (|| {
            let file = crate::sys::memory_file(&grant.file_name())
                .map_err(|e| format!("memfd_create: {e}"))?;
            file.set_len(bytes)
                .map_err(|e| format!("sizing the file to {bytes} bytes: {e}"))?;
            crate::sys::commit(&file, bytes)
                .map_err(|e| format!("allocating {bytes} bytes of the file: {e}"))?;
            crate::sys::seal_size(&file).map_err(|e| format!("sealing its size: {e}"))?;
            let fd = u32::try_from(file.as_raw_fd()).map_err(|e| e.to_string())?;
            Ok::<_, String>((file, fd))
        })();
        let (file, fd) = made.inspect_err(|_| counters.release(bytes))?;
        counters.files_lent.fetch_add(1, Ordering::Relaxed);
        counters.file_loans.fetch_add(1, Ordering::Relaxed);
        let lent = Self {
            _file: file,
            bytes,
            counters,
        };
        Ok((lent, FileGrant { fd, ..grant }))
    }
}

impl Drop for LentFile {
    fn drop(&mut self) {
        self.counters.file_loans.fetch_sub(1, Ordering::Relaxed);
        self.counters.release(self.bytes);
    }
}
