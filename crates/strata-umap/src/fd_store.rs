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
        Self::checked(File::from(owned), format!("fd {fd}"), offset, len)
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
        Self::checked(file, path.to_string(), offset, len)
    }

    /// Refuses what cannot back a region: anything but a regular file or a block device (a
    /// pipe, socket, terminal or directory would fail every fault with `SIGBUS`), and a range
    /// reaching past the largest file offset.
    fn checked(file: File, name: String, offset: u64, len: u64) -> Result<Self, String> {
        use std::os::unix::fs::FileTypeExt;
        let kind = file
            .metadata()
            .map_err(|e| format!("cannot inspect {name}: {e}"))?
            .file_type();
        if !(kind.is_file() || kind.is_block_device()) {
            return Err(format!(
                "{name} is not a regular file or block device ({kind:?}); map a file"
            ));
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(format!(
                "offset {offset} + length {len} reaches past the largest file offset; map a smaller range"
            ));
        }
        Ok(Self {
            file,
            name,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn refuses_what_cannot_back_a_region() {
        let dir = std::env::temp_dir().join(format!("strata-fd-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = FdStore::open(dir.to_str().unwrap(), 0, 4096, false).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let path = dir.join("f.bin");
        std::fs::write(&path, [1u8; 8192]).unwrap();
        let p = path.to_str().unwrap();
        let e = FdStore::open(p, i64::MAX as u64, 2, false).unwrap_err();
        assert!(e.contains("largest file offset"), "{e}");
        let e = FdStore::open(p, u64::MAX, 2, false).unwrap_err();
        assert!(e.contains("largest file offset"), "{e}");
        let store = FdStore::open(p, 4096, 4096, false).unwrap();
        let mut b = [0u8; 8];
        store.read_at(0, &mut b).unwrap();
        assert_eq!(b, [1; 8]);
        let (r, w) = std::io::pipe().unwrap();
        let e = FdStore::from_fd(r.as_raw_fd(), 0, 4096, false).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        drop(w);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
