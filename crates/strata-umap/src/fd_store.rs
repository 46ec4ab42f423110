//! A store over a byte range of a file given by descriptor or path (Umap's file store, with
//! the offset honoured).

use std::fs::{File, OpenOptions};
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::FileExt;

use strata_core::store::check_range;
use strata_core::{Store, StoreError, format_size};

/// `len` bytes of `file` starting at `offset`. Bytes past the file's end read as zero;
/// writes extend the file.
#[derive(Debug)]
pub struct FdStore {
    file: File,
    name: String,
    offset: u64,
    len: u64,
}

impl FdStore {
    /// Duplicates `fd` (the caller keeps and may close its own). With `writable`, the
    /// descriptor must be open for writing.
    pub fn from_fd(fd: RawFd, offset: u64, len: u64, writable: bool) -> Result<Self, String> {
        if fd < 0 {
            return Err(format!("bad file descriptor {fd}"));
        }
        // SAFETY: F_GETFL only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(format!(
                "file descriptor {fd} is not open: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mode = flags & libc::O_ACCMODE;
        if mode == libc::O_WRONLY {
            return Err(format!(
                "file descriptor {fd} is open write-only; open the file O_RDWR (or O_RDONLY with PROT_READ)"
            ));
        }
        if writable && mode != libc::O_RDWR {
            return Err(format!(
                "PROT_WRITE needs file descriptor {fd} open O_RDWR (it is read-only); reopen it or map with PROT_READ"
            ));
        }
        // SAFETY: `fd` is open (checked above) and stays open for the duration of this call.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let owned = borrowed
            .try_clone_to_owned()
            .map_err(|e| format!("cannot duplicate file descriptor {fd}: {e}"))?;
        Ok(Self {
            file: File::from(owned),
            name: format!("fd {fd}"),
            offset,
            len,
        })
    }

    /// Opens `path` (created if missing and `writable`).
    pub fn open(path: &str, offset: u64, len: u64, writable: bool) -> Result<Self, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .create(writable)
            .truncate(false)
            .open(path)
            .map_err(|e| format!("cannot open {path}: {e}"))?;
        Ok(Self {
            file,
            name: path.to_string(),
            offset,
            len,
        })
    }

    fn io(&self, op: &'static str, offset: u64, len: usize, source: std::io::Error) -> StoreError {
        StoreError::Io {
            store: self.describe(),
            op,
            offset,
            len: len as u64,
            source,
        }
    }
}

impl Store for FdStore {
    fn size(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        let mut done = 0;
        while done < buf.len() {
            match self
                .file
                .read_at(&mut buf[done..], self.offset + offset + done as u64)
            {
                Ok(0) => {
                    buf[done..].fill(0); // past the end of the file
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io("read", offset, buf.len(), e)),
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        self.file
            .write_all_at(buf, self.offset + offset)
            .map_err(|e| self.io("write", offset, buf.len(), e))
    }

    fn flush(&self) -> Result<(), StoreError> {
        match self.file.sync_data() {
            // A read-only descriptor has nothing to sync.
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => Ok(()),
            other => other.map_err(|e| self.io("flush", 0, 0, e)),
        }
    }

    fn describe(&self) -> String {
        format!(
            "file:{} at +{} ({})",
            self.name,
            self.offset,
            format_size(self.len)
        )
    }
}
