//! `FileStore`: a file read and written with `pread`/`pwrite`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::sys::WriteRing;
use super::{ReadRequest, Store, StoreError, check_range};
use crate::units::format_size;

/// Alignment `O_DIRECT` needs for offsets, lengths and buffers on every Linux file system we
/// target (4 KiB covers 512-byte and 4 KiB logical sectors).
const DIRECT_ALIGN: usize = 4096;

/// How to open a [`FileStore`].
#[derive(Debug, Clone, Default)]
pub struct FileStoreOptions {
    /// Create the file if it does not exist (sparse, of the requested size).
    pub create: bool,
    /// Extend an existing file that is shorter than the requested size (with a sparse tail).
    /// Without it a short file is an error, because a region over it would read past its end.
    pub grow: bool,
    /// Bypass the page cache with `O_DIRECT`. Unaligned requests go through an aligned bounce
    /// buffer (read-modify-write for writes).
    pub direct: bool,
    /// Open read-only; writes fail with an error.
    pub read_only: bool,
}

/// Why a [`FileStore`] could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum FileStoreOpenError {
    /// `open(2)` failed.
    #[error(
        "cannot open {path}: {source}; check that the path exists (or ask to create it) and is accessible"
    )]
    Open {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than the store must be.
    #[error(
        "{path} holds {actual} bytes but the store needs {wanted}; pass a smaller size, or allow growing the file (FileStoreOptions::grow, --grow)"
    )]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its current length.
        actual: u64,
        /// The size asked for.
        wanted: u64,
    },
    /// Sizing the file failed.
    #[error(
        "cannot size {path} to {wanted} bytes: {source}; check free space and file-size limits"
    )]
    Resize {
        /// The file.
        path: PathBuf,
        /// The size asked for.
        wanted: u64,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A read-only store cannot create or grow its file.
    #[error(
        "{path}: a read-only store cannot create or grow its file; drop read_only or the create/grow options"
    )]
    ReadOnlyResize {
        /// The file.
        path: PathBuf,
    },
}

/// A store over a regular file.
#[derive(Debug)]
pub struct FileStore {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
    read_only: bool,
    /// Held across each read-modify-write of an unaligned write with `O_DIRECT`: two such
    /// writes to neighbouring byte ranges that share a block (a codec's slots are not block
    /// aligned) would otherwise each write back the other's old bytes.
    unaligned_writes: Mutex<()>,
    /// Idle rings for [`Store::write_batch`], one taken per batch in flight.
    rings: Mutex<Vec<WriteRing>>,
    /// The kernel refused a ring once: batches are written one request at a time.
    no_ring: AtomicBool,
    /// Requests written through a ring (see [`FileStore::queued_writes`]).
    queued_writes: AtomicU64,
}

impl FileStore {
    /// Opens (or creates) `path` as a store of `size` bytes. An existing file longer than
    /// `size` is used as is: only its first `size` bytes are touched.
    pub fn open(
        path: impl AsRef<Path>,
        size: u64,
        options: &FileStoreOptions,
    ) -> Result<Self, FileStoreOpenError> {
        let path = path.as_ref().to_path_buf();
        if options.read_only && (options.create || options.grow) {
            return Err(FileStoreOpenError::ReadOnlyResize { path });
        }
        let mut open = OpenOptions::new();
        open.read(true)
            .write(!options.read_only)
            .create(options.create);
        if options.direct {
            open.custom_flags(libc::O_DIRECT);
        }
        let file = open
            .open(&path)
            .map_err(|source| FileStoreOpenError::Open {
                path: path.clone(),
                source,
            })?;
        let actual = file
            .metadata()
            .map_err(|source| FileStoreOpenError::Open {
                path: path.clone(),
                source,
            })?
            .len();
        if actual < size {
            // A file we just created is empty and may be sized; so may one we were told to grow.
            if !(options.grow || (options.create && actual == 0)) {
                return Err(FileStoreOpenError::TooShort {
                    path,
                    actual,
                    wanted: size,
                });
            }
            file.set_len(size)
                .map_err(|source| FileStoreOpenError::Resize {
                    path: path.clone(),
                    wanted: size,
                    source,
                })?;
        }
        Ok(Self {
            file,
            path,
            size,
            direct: options.direct,
            read_only: options.read_only,
            unaligned_writes: Mutex::new(()),
            rings: Mutex::new(Vec::new()),
            no_ring: AtomicBool::new(false),
            queued_writes: AtomicU64::new(0),
        })
    }

    /// Creates `path` (truncating any existing file) as a sparse store of `size` bytes.
    pub fn create(path: impl AsRef<Path>, size: u64) -> Result<Self, FileStoreOpenError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path);
        drop(file.map_err(|source| FileStoreOpenError::Open {
            path: path.into(),
            source,
        })?);
        Self::open(
            path,
            size,
            &FileStoreOptions {
                create: true,
                ..Default::default()
            },
        )
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many requests of [`Store::write_batch`] went to the file through an `io_uring`
    /// (all at once) rather than one `pwrite` after another: 0 where the kernel refuses rings.
    pub fn queued_writes(&self) -> u64 {
        self.queued_writes.load(Ordering::Relaxed)
    }

    /// Whether the kernel refused this store an `io_uring` (a seccomp filter, as in a
    /// container's default profile, or `kernel.io_uring_disabled`): batches are then written
    /// one request at a time.
    pub fn ring_refused(&self) -> bool {
        self.no_ring.load(Ordering::Relaxed)
    }

    /// An idle ring, or a new one; None where the kernel refuses rings.
    fn take_ring(&self) -> Option<WriteRing> {
        if let Some(ring) = self.rings.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Some(ring);
        }
        if self.no_ring.load(Ordering::Relaxed) {
            return None;
        }
        match WriteRing::new() {
            Ok(ring) => Some(ring),
            Err(_) => {
                self.no_ring.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// Whether a batch request may go through a ring: `O_DIRECT` needs it aligned (the rest
    /// take the bounce buffer of [`Store::write_at`]), and a ring entry carries at most
    /// [`WriteRing::MAX_REQUEST`] bytes.
    fn ring_fits(&self, offset: u64, buf: &[u8]) -> bool {
        !buf.is_empty()
            && buf.len() <= WriteRing::MAX_REQUEST
            && (!self.direct || Self::is_aligned(offset, buf.len(), buf.as_ptr()))
    }

    /// Gives a ring taken with [`FileStore::take_ring`] back for the next batch, unless it broke.
    fn put_ring(&self, ring: WriteRing) {
        if !ring.is_broken() {
            self.rings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ring);
        }
    }

    /// Writes `requests` (checked, writable, not overlapping, each [`FileStore::ring_fits`])
    /// through a ring, all at once; None when no ring is available (nothing was written).
    fn write_queued(&self, requests: &[(u64, &[u8])]) -> Option<Result<(), StoreError>> {
        let mut ring = self.take_ring()?;
        let results = ring.write_many(self.file.as_fd(), requests);
        self.put_ring(ring);
        let mut first_error = None;
        let mut written = 0u64;
        for (&(offset, buf), result) in requests.iter().zip(results) {
            // A short write (the kernel may stop early) or an interrupted one is finished
            // here; any other error fails the batch, after the other requests are written.
            let done = match bytes_done(result, buf.len()) {
                Ok(n) => n,
                Err(e) => {
                    first_error.get_or_insert_with(|| self.io_error("write", offset, buf.len(), e));
                    continue;
                }
            };
            if done == buf.len() {
                written += 1;
            } else if let Err(e) = self.write_at(offset + done as u64, &buf[done..]) {
                first_error.get_or_insert(e);
            }
        }
        self.queued_writes.fetch_add(written, Ordering::Relaxed);
        Some(first_error.map_or(Ok(()), Err))
    }

    /// Reads `requests` (checked, each [`FileStore::ring_fits`]) through a ring, all at once;
    /// None when no ring is available (nothing was read). A short or interrupted read is
    /// finished with [`Store::read_at`].
    fn read_queued(&self, requests: &mut [(u64, &mut [u8])]) -> Option<Result<(), StoreError>> {
        let mut ring = self.take_ring()?;
        let results = ring.read_many(self.file.as_fd(), requests);
        self.put_ring(ring);
        for ((offset, buf), result) in requests.iter_mut().zip(results) {
            let done = match bytes_done(result, buf.len()) {
                Ok(n) => n,
                Err(e) => return Some(Err(self.io_error("read", *offset, buf.len(), e))),
            };
            if done < buf.len()
                && let Err(e) = self.read_at(*offset + done as u64, &mut buf[done..])
            {
                return Some(Err(e));
            }
        }
        Some(Ok(()))
    }

    fn io_error(&self, op: &'static str, offset: u64, len: usize, source: io::Error) -> StoreError {
        StoreError::Io {
            store: self.describe(),
            op,
            offset,
            len: len as u64,
            source,
        }
    }

    fn is_aligned(offset: u64, len: usize, ptr: *const u8) -> bool {
        offset.is_multiple_of(DIRECT_ALIGN as u64)
            && len.is_multiple_of(DIRECT_ALIGN)
            && (ptr as usize).is_multiple_of(DIRECT_ALIGN)
    }

    /// The aligned window `[start, start + span)` covering `[offset, offset + len)`.
    fn aligned_window(offset: u64, len: usize) -> (u64, usize) {
        let align = DIRECT_ALIGN as u64;
        let start = offset - offset % align;
        let end = (offset + len as u64).div_ceil(align) * align;
        // The span of one request is at most `len + 2 * DIRECT_ALIGN`, so it fits in usize.
        (
            start,
            usize::try_from(end - start).expect("request span fits in memory"),
        )
    }

    /// Reads `[start, start+span)` into an aligned bounce buffer. Bytes past the store's end
    /// may lie past the file's end too (the aligned tail of the last block) and read as zero;
    /// an end of file before the store's end means the file was shortened, an error.
    fn read_aligned(&self, start: u64, span: usize) -> io::Result<AlignedBuf> {
        let mut bounce = AlignedBuf::zeroed(span);
        let buf = bounce.as_mut_slice();
        // Bytes of the window inside the store: these must come from the file.
        let needed = usize::try_from(self.size.min(start + span as u64).saturating_sub(start))
            .expect("at most the window");
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], start + done as u64) {
                Ok(0) if done < needed => return Err(self.shortened()),
                Ok(0) => break, // past the store's end: the rest stays zero
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(bounce)
    }

    /// The error for a file that ends before the store does (another program truncated it).
    fn shortened(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the file is shorter than the store ({} bytes): another program truncated it",
                self.size
            ),
        )
    }

    /// `read_exact_at` with an early end of file reported as [`FileStore::shortened`].
    fn read_exact(&self, buf: &mut [u8], offset: u64) -> Result<(), StoreError> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            let e = if e.kind() == io::ErrorKind::UnexpectedEof {
                self.shortened()
            } else {
                e
            };
            self.io_error("read", offset, buf.len(), e)
        })
    }
}

impl Store for FileStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        if !self.direct || Self::is_aligned(offset, buf.len(), buf.as_ptr()) {
            return self.read_exact(buf, offset);
        }
        let (start, span) = Self::aligned_window(offset, buf.len());
        let bounce = self
            .read_aligned(start, span)
            .map_err(|e| self.io_error("read", offset, buf.len(), e))?;
        let skip = usize::try_from(offset - start).expect("skip is below DIRECT_ALIGN");
        buf.copy_from_slice(&bounce.as_slice()[skip..skip + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        if self.read_only {
            return Err(self.io_error(
                "write",
                offset,
                buf.len(),
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the store was opened read-only",
                ),
            ));
        }
        if !self.direct || Self::is_aligned(offset, buf.len(), buf.as_ptr()) {
            return self
                .file
                .write_all_at(buf, offset)
                .map_err(|e| self.io_error("write", offset, buf.len(), e));
        }
        // Read-modify-write of the covering aligned blocks, one at a time: concurrent ones
        // that share a block would lose each other's bytes. (An aligned write never shares a
        // block with another write's bytes, so it takes the path above unlocked.)
        let _one_at_a_time = self
            .unaligned_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (start, span) = Self::aligned_window(offset, buf.len());
        let mut bounce = self
            .read_aligned(start, span)
            .map_err(|e| self.io_error("write", offset, buf.len(), e))?;
        let skip = usize::try_from(offset - start).expect("skip is below DIRECT_ALIGN");
        bounce.as_mut_slice()[skip..skip + buf.len()].copy_from_slice(buf);
        // A window reaching past the store's end may lengthen the file with the zeros read
        // there; cut it back so that only the store's bytes are ever touched.
        let end = start + span as u64;
        let length_before = if end > self.size {
            let meta = self.file.metadata();
            Some(
                meta.map_err(|e| self.io_error("write", offset, buf.len(), e))?
                    .len(),
            )
        } else {
            None
        };
        self.file
            .write_all_at(bounce.as_slice(), start)
            .map_err(|e| self.io_error("write", offset, buf.len(), e))?;
        match length_before {
            Some(before) if end > before => self
                .file
                .set_len(before.max(self.size))
                .map_err(|e| self.io_error("write", offset, buf.len(), e)),
            _ => Ok(()),
        }
    }

    /// Every request is checked first (a bad one fails the batch before anything is
    /// written); then, where the kernel allows, the aligned requests go to the file through an
    /// `io_uring` all at once (see `sys.rs` for why), and the rest one by one. Overlapping
    /// requests are written in order, one by one, so the last one wins as with `write_at`.
    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        for &(offset, buf) in requests {
            check_range(self, offset, buf.len())?;
        }
        let mut rest = requests.to_vec();
        if !self.read_only && !overlapping(requests) {
            let (queued, others): (Vec<_>, Vec<_>) = requests
                .iter()
                .copied()
                .partition(|&(offset, buf)| self.ring_fits(offset, buf));
            if queued.len() >= 2
                && let Some(written) = self.write_queued(&queued)
            {
                written?;
                rest = others;
            }
        }
        for (offset, buf) in rest {
            self.write_at(offset, buf)?;
        }
        Ok(())
    }

    /// Reads a batch through an `io_uring` (one submission, the disk serving the reads in
    /// parallel) where the requests fit one; the rest one by one.
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        for r in requests.iter() {
            check_range(self, r.offset, r.buf.len())?;
        }
        let (mut queued, rest): (Vec<_>, Vec<_>) = requests
            .iter_mut()
            .map(|r| (r.offset, &mut *r.buf))
            .partition(|(offset, buf)| self.ring_fits(*offset, buf));
        if queued.len() >= 2
            && let Some(read) = self.read_queued(&mut queued)
        {
            read?;
            queued.clear();
        }
        for (offset, buf) in queued.into_iter().chain(rest) {
            self.read_at(offset, buf)?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        if self.read_only {
            return Ok(());
        }
        self.file
            .sync_data()
            .map_err(|e| self.io_error("flush", 0, 0, e))
    }

    fn describe(&self) -> String {
        format!("file:{} ({})", self.path.display(), format_size(self.size))
    }
}

/// Bytes a queued request of `len` bytes got done: an interrupted (or would-block) request
/// did none, and the caller finishes the rest itself; any other error is the request's.
fn bytes_done(result: io::Result<usize>, len: usize) -> io::Result<usize> {
    match result {
        Ok(n) => Ok(n.min(len)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) =>
        {
            Ok(0)
        }
        Err(e) => Err(e),
    }
}

/// Whether any two requests of a batch share a byte.
fn overlapping(requests: &[(u64, &[u8])]) -> bool {
    let mut spans: Vec<(u64, u64)> = requests
        .iter()
        .map(|&(offset, buf)| (offset, offset + buf.len() as u64))
        .collect();
    spans.sort_unstable();
    spans.windows(2).any(|w| w[1].0 < w[0].1)
}

/// A heap buffer whose slice starts on a `DIRECT_ALIGN` boundary, built without unsafe code by
/// over-allocating and skipping to the first aligned byte.
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn zeroed(len: usize) -> Self {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let start = storage.as_ptr().align_offset(DIRECT_ALIGN);
        Self {
            storage,
            start,
            len,
        }
    }
    fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}
