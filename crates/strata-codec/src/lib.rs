//! Page codecs that wrap any [`Store`]: LZ4 (lossless, `lz4_flex`) and ZFP (lossy, for pages
//! of `f64`/`f32` only, and only when the user gives an absolute error bound).
//!
//! # How variable-size pages map onto the inner store
//! Each logical page `i` owns a fixed *slot* in the inner store at `i * slot_bytes`, where
//! `slot_bytes = page_bytes + HEADER_BYTES`. A slot holds a 24-byte header (magic, format,
//! stored length, CRC-32 of the stored bytes, CRC-32 of the header, ZFP tolerance) followed
//! by the stored bytes: the compressed page, or the raw page when compression would not make
//! it smaller. Capacity therefore does not shrink, but *traffic* does: a write sends only the
//! header and the compressed bytes, and a read fetches only those, sized from an in-memory
//! table of stored lengths kept by this store (4 bytes per page). A page whose length is not
//! in the table (written by an earlier process, for a persistent inner store) is read whole
//! once. The alternative, a packed log with an index, saves capacity but needs compaction and
//! makes the index the only way to find a page; fixed slots keep every page self-describing,
//! and the remote-memory use case is bound by network bytes, not node capacity.
//!
//! A slot that was never written reads as all zero bytes, which this store reports as a zero
//! page (the `Store` contract). Any other header that fails its checks, a CRC mismatch, or a
//! decoder failure is [`StoreError::Corrupt`]: a damaged page is never returned as data.
//!
//! Concurrency: different pages may be read and written from many threads at once. A read
//! that races a write of the *same* page can see the new header with old bytes and then fails
//! with `Corrupt` rather than returning a torn page; pagers serialise I/O per page, so this
//! does not arise there.
//!
//! ZFP is lossy: with tolerance `t`, each value read back differs from the value written by
//! at most `t`. Every ZFP page is decoded again right after compression and checked against
//! that bound; a page that misses it, or holds NaN, infinity or a subnormal value (what pointers
//! and small integers look like read as floats), is stored raw (exactly).
#![warn(missing_docs)]

mod zfp;

pub use zfp::{Zfp, ZfpDecodeError, ZfpElement};

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use strata_core::config::CodecKind;
use strata_core::store::{ReadRequest, Store, StoreError, check_range};

/// Bytes of the header at the start of each slot.
pub const HEADER_BYTES: usize = 24;
/// Most page bytes encoded and written together (see `CompressedStore::write_pages`): a few
/// pages in flight to a remote inner store, a quarter of a MiB of images at most.
const WRITE_BATCH_BYTES: usize = 256 << 10;

/// Largest codec page: a slot's stored length is recorded in 32 bits. Far above any page
/// Strata uses (2 MiB at most).
pub const MAX_PAGE_BYTES: u64 = 1 << 30;
const MAGIC: u16 = 0x5354; // "ST"

/// How a slot's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Format {
    Raw = 1,
    Lz4 = 2,
    ZfpF64 = 3,
    ZfpF32 = 4,
}

impl Format {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Format::Raw,
            2 => Format::Lz4,
            3 => Format::ZfpF64,
            4 => Format::ZfpF32,
            _ => return None,
        })
    }
}

/// Why a [`CompressedStore`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The page size is unusable.
    #[error(
        "codec page size {0} is not a positive multiple of 8 bytes up to 1 GiB; use the region's page size (such as 64KiB)"
    )]
    PageSize(u64),
    /// The inner store is smaller than the slots need.
    #[error(
        "the inner store holds {inner} bytes but {pages} compressed pages of {page} bytes need {needed}; create it with CompressedStore::inner_size"
    )]
    InnerTooSmall {
        /// Inner store size.
        inner: u64,
        /// Logical pages.
        pages: u64,
        /// Page size.
        page: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// libzfp is missing.
    #[error(
        "the ZFP codec needs libzfp ({0}); install it (Debian/Ubuntu: apt-get install libzfp1) or choose --codec lz4 or none"
    )]
    ZfpUnavailable(String),
    /// A ZFP tolerance that is not a positive finite number.
    #[error("ZFP tolerance {0} must be a positive finite number, such as 1e-6")]
    Tolerance(f64),
    /// The size does not fit this machine.
    #[error("a store of {0} bytes is too large for this machine's address space")]
    TooLarge(u64),
}

/// Counters of what the codec did.
#[derive(Debug, Default)]
pub struct CodecCounters {
    /// Pages stored compressed.
    pub pages_compressed: AtomicU64,
    /// Pages stored raw because they did not compress (or, for ZFP, were not finite or
    /// missed the bound).
    pub pages_raw: AtomicU64,
    /// Logical bytes written.
    pub logical_bytes_written: AtomicU64,
    /// Bytes written to the inner store (headers included).
    pub stored_bytes_written: AtomicU64,
    /// Bytes read from the inner store (headers included).
    pub stored_bytes_read: AtomicU64,
}

/// A store that compresses each page on its way into `inner`. See the crate docs.
#[derive(Debug)]
pub struct CompressedStore {
    inner: Arc<dyn Store>,
    codec: CodecKind,
    zfp: Option<Zfp>,
    element: ZfpElement,
    page: usize,
    size: u64,
    /// Per page: bytes to read for the slot (header + stored), 0 when unknown.
    known_lengths: Box<[AtomicU32]>,
    counters: CodecCounters,
}

impl CompressedStore {
    /// Bytes per slot for pages of `page_bytes`.
    pub fn slot_bytes(page_bytes: u64) -> u64 {
        page_bytes + HEADER_BYTES as u64
    }

    /// Inner-store size needed for a logical store of `size` bytes in pages of `page_bytes`.
    ///
    /// # Errors
    /// A page size that is not a multiple of 8 up to [`MAX_PAGE_BYTES`], or slots that do not
    /// fit in 64 bits.
    pub fn inner_size(size: u64, page_bytes: u64) -> Result<u64, CodecError> {
        if page_bytes == 0 || !page_bytes.is_multiple_of(8) || page_bytes > MAX_PAGE_BYTES {
            return Err(CodecError::PageSize(page_bytes));
        }
        size.div_ceil(page_bytes)
            .checked_mul(Self::slot_bytes(page_bytes))
            .ok_or(CodecError::TooLarge(size))
    }

    /// Wraps `inner` (at least [`CompressedStore::inner_size`] bytes) as a store of `size`
    /// bytes. ZFP pages hold `f64` values; see [`CompressedStore::with_zfp_element`].
    pub fn new(
        inner: Arc<dyn Store>,
        codec: CodecKind,
        page_bytes: u64,
        size: u64,
    ) -> Result<Self, CodecError> {
        let needed = Self::inner_size(size, page_bytes)?;
        let pages = size.div_ceil(page_bytes);
        if inner.size() < needed {
            return Err(CodecError::InnerTooSmall {
                inner: inner.size(),
                pages,
                page: page_bytes,
                needed,
            });
        }
        let zfp = match codec {
            CodecKind::Zfp { tolerance } => {
                if !(tolerance.is_finite() && tolerance > 0.0) {
                    return Err(CodecError::Tolerance(tolerance));
                }
                Some(Zfp::load().map_err(CodecError::ZfpUnavailable)?)
            }
            _ => None,
        };
        let page = usize::try_from(page_bytes).map_err(|_| CodecError::TooLarge(page_bytes))?;
        let count = usize::try_from(pages).map_err(|_| CodecError::TooLarge(size))?;
        // 4 bytes per page: refuse a table this machine cannot hold rather than abort. It
        // comes zeroed from the allocator and is never written whole, so only the entries of
        // pages written take memory (64 MiB of table over a 64 GiB arena of 4 KiB pages was
        // all resident before a program's first fault).
        let known_lengths = bytemuck::allocation::try_zeroed_slice_box::<AtomicU32>(count)
            .map_err(|()| CodecError::TooLarge(size))?;
        Ok(Self {
            inner,
            codec,
            zfp,
            element: ZfpElement::F64,
            page,
            size,
            known_lengths,
            counters: CodecCounters::default(),
        })
    }

    /// Sets the element type ZFP pages hold (default `f64`).
    pub fn with_zfp_element(mut self, element: ZfpElement) -> Self {
        self.element = element;
        self
    }

    /// What the codec did so far.
    pub fn counters(&self) -> &CodecCounters {
        &self.counters
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn slot(&self) -> u64 {
        Self::slot_bytes(self.page as u64)
    }

    /// Bytes of page `index` that exist (the last page may be short).
    fn page_len(&self, index: u64) -> usize {
        let start = index * self.page as u64;
        usize::try_from((self.size - start).min(self.page as u64)).expect("at most one page")
    }

    /// Encodes one page into a slot image (header + stored bytes) in `slot`, whose earlier
    /// contents go. LZ4 compresses straight into the slot, so a page costs one buffer, not
    /// three (the compressor's own, its shrunk copy and the slot): in a program under `strata
    /// run` these buffers are charged to its memory like the rest of it.
    fn encode_into(&self, page: &[u8], slot: &mut Vec<u8>) {
        slot.clear();
        let mut stored: Option<(Format, f64)> = None;
        match self.codec {
            CodecKind::Lz4 => {
                slot.resize(
                    HEADER_BYTES + lz4_flex::block::get_maximum_output_size(page.len()),
                    0,
                );
                if let Ok(n) = lz4_flex::block::compress_into(page, &mut slot[HEADER_BYTES..])
                    && n < page.len()
                {
                    slot.truncate(HEADER_BYTES + n);
                    stored = Some((Format::Lz4, 0.0));
                }
            }
            CodecKind::Zfp { tolerance } => {
                if let Some(bytes) = self.zfp_encode(page, tolerance) {
                    let format = match self.element {
                        ZfpElement::F64 => Format::ZfpF64,
                        ZfpElement::F32 => Format::ZfpF32,
                    };
                    slot.reserve_exact(HEADER_BYTES + bytes.len());
                    slot.resize(HEADER_BYTES, 0);
                    slot.extend_from_slice(&bytes);
                    stored = Some((format, tolerance));
                }
            }
            CodecKind::None => {}
        }
        let (format, tolerance) = match stored {
            Some(kept) => {
                self.counters
                    .pages_compressed
                    .fetch_add(1, Ordering::Relaxed);
                kept
            }
            None => {
                self.counters.pages_raw.fetch_add(1, Ordering::Relaxed);
                slot.clear();
                slot.reserve_exact(HEADER_BYTES + page.len());
                slot.resize(HEADER_BYTES, 0);
                slot.extend_from_slice(page);
                (Format::Raw, 0.0)
            }
        };
        let header = encode_header(format, &slot[HEADER_BYTES..], tolerance);
        slot[..HEADER_BYTES].copy_from_slice(&header);
    }

    /// ZFP-compresses a page if it is all finite and the result honours the bound.
    fn zfp_encode(&self, page: &[u8], tolerance: f64) -> Option<Vec<u8>> {
        let zfp = self.zfp.as_ref()?;
        if !page.len().is_multiple_of(self.element.bytes()) || !lossy_safe(self.element, page) {
            return None;
        }
        let compressed = zfp.compress(self.element, page, tolerance)?;
        if compressed.len() >= page.len() {
            return None;
        }
        let mut check = vec![0u8; page.len()];
        zfp.decompress(self.element, &compressed, tolerance, &mut check)
            .ok()?;
        within_bound(self.element, page, &check, tolerance).then_some(compressed)
    }

    /// Decodes a slot image (at least the header) into `page`.
    fn decode(&self, index: u64, slot: &[u8], page: &mut [u8]) -> Result<(), StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt {
            store: self.describe(),
            offset: index * self.page as u64,
            detail,
        };
        let header = &slot[..HEADER_BYTES];
        if header.iter().all(|b| *b == 0) {
            // A slot never written is zero throughout. A zero header over anything else, or on
            // a page this store wrote, is damage (a lost or torn write), not an empty page.
            let written = self.known_lengths[usize::try_from(index).expect("page index fits")]
                .load(Ordering::Relaxed)
                != 0;
            let whole = slot.len() == HEADER_BYTES + page.len();
            if written || !whole || slot.iter().any(|b| *b != 0) {
                return Err(corrupt(
                    "slot header is all zero but the page was written; its header was lost".into(),
                ));
            }
            page.fill(0);
            return Ok(());
        }
        let (format, length, checksum, tolerance) = decode_header(header).map_err(corrupt)?;
        let stored = slot
            .get(HEADER_BYTES..HEADER_BYTES + length)
            .ok_or_else(|| corrupt(format!("stored length {length} exceeds the slot")))?;
        if crc32fast::hash(stored) != checksum {
            return Err(corrupt(
                "checksum of the stored bytes does not match".into(),
            ));
        }
        match format {
            Format::Raw => {
                if stored.len() != page.len() {
                    return Err(corrupt(format!(
                        "raw page of {} bytes, expected {}",
                        stored.len(),
                        page.len()
                    )));
                }
                page.copy_from_slice(stored);
            }
            Format::Lz4 => {
                let n = lz4_flex::block::decompress_into(stored, page)
                    .map_err(|e| corrupt(format!("LZ4 data does not decode: {e}")))?;
                if n != page.len() {
                    return Err(corrupt(format!(
                        "LZ4 page decoded to {n} bytes, expected {}",
                        page.len()
                    )));
                }
            }
            Format::ZfpF64 | Format::ZfpF32 => {
                let element = if format == Format::ZfpF64 {
                    ZfpElement::F64
                } else {
                    ZfpElement::F32
                };
                let zfp = match &self.zfp {
                    Some(z) => z.clone(),
                    None => Zfp::load().map_err(|e| StoreError::Unavailable {
                        store: self.describe(),
                        reason: format!("the page is ZFP-compressed but libzfp cannot be loaded ({e}); install libzfp1"),
                    })?,
                };
                if let CodecKind::Zfp { tolerance: bound } = self.codec
                    && tolerance > bound
                {
                    return Err(corrupt(format!(
                        "ZFP page stored with tolerance {tolerance:e}, looser than this store's {bound:e}; open it with zfp:{tolerance:e} to read it"
                    )));
                }
                if !page.len().is_multiple_of(element.bytes()) {
                    return Err(corrupt(format!(
                        "ZFP page of {} bytes is not a whole number of {}-byte values",
                        page.len(),
                        element.bytes()
                    )));
                }
                zfp.decompress(element, stored, tolerance, page)
                    .map_err(|e| corrupt(format!("ZFP data does not decode: {e}")))?;
            }
        }
        Ok(())
    }

    /// Reads whole pages (each output one page long) with one batched inner read, so a
    /// remote inner store keeps them all in flight.
    fn read_pages(&self, pages: &mut [(u64, &mut [u8])]) -> Result<(), StoreError> {
        let slot = self.slot();
        let mut images = SlotImages::take(pages.len());
        for (image, (index, _)) in images.iter_mut().zip(pages.iter()) {
            let known = self.known_lengths[usize::try_from(*index).expect("page index fits")]
                .load(Ordering::Relaxed) as usize;
            let whole = HEADER_BYTES + self.page_len(*index);
            image.clear();
            image.resize(if known == 0 { whole } else { known.min(whole) }, 0);
        }
        {
            let mut requests: Vec<ReadRequest<'_>> = images
                .iter_mut()
                .zip(pages.iter())
                .map(|(buf, (index, _))| ReadRequest {
                    offset: index * slot,
                    buf: buf.as_mut_slice(),
                })
                .collect();
            self.inner.read_batch(&mut requests)?;
        }
        for (image, (index, out)) in images.iter_mut().zip(pages.iter_mut()) {
            let index = *index;
            self.counters
                .stored_bytes_read
                .fetch_add(image.len() as u64, Ordering::Relaxed);
            // A concurrent writer may have stored a longer page since the length was noted:
            // fetch the rest before decoding.
            if let Ok((_, length, _, _)) = decode_header(&image[..HEADER_BYTES]) {
                let whole = HEADER_BYTES + length;
                if whole > image.len() && whole <= HEADER_BYTES + self.page_len(index) {
                    let have = image.len();
                    image.resize(whole, 0);
                    self.inner
                        .read_at(index * slot + have as u64, &mut image[have..])?;
                }
            }
            self.decode(index, image, out)?;
        }
        Ok(())
    }

    /// Writes whole pages with batched inner writes of at most [`WRITE_BATCH_BYTES`] of
    /// pages each: a pager's write-back batch (64 pages) encoded at once held up to twice its
    /// size in slot images, charged to the program's memory.
    fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let per_batch = (WRITE_BATCH_BYTES / self.page.max(1)).max(1);
        for batch in pages.chunks(per_batch) {
            self.write_batch_of_pages(batch)?;
        }
        Ok(())
    }

    fn write_batch_of_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let slot = self.slot();
        let mut images = SlotImages::take(pages.len());
        for (image, (_, page)) in images.iter_mut().zip(pages) {
            self.encode_into(page, image);
        }
        let requests: Vec<(u64, &[u8])> = images
            .iter()
            .zip(pages)
            .map(|(image, (index, _))| (index * slot, image.as_slice()))
            .collect();
        self.inner.write_batch(&requests)?;
        for (image, (index, page)) in images.iter().zip(pages) {
            let index = usize::try_from(*index).expect("page index fits");
            let length = u32::try_from(image.len()).expect("a slot fits in u32");
            self.known_lengths[index].store(length, Ordering::Relaxed);
            self.counters
                .logical_bytes_written
                .fetch_add(page.len() as u64, Ordering::Relaxed);
            self.counters
                .stored_bytes_written
                .fetch_add(image.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Splits `[offset, offset+len)` into (page index, offset in page, length) pieces.
    fn spans(&self, offset: u64, len: usize) -> Vec<(u64, usize, usize)> {
        let page = self.page as u64;
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len as u64;
        while pos < end {
            let index = pos / page;
            let within = usize::try_from(pos % page).expect("below the page size");
            let take = usize::try_from((page - pos % page).min(end - pos)).expect("at most a page");
            out.push((index, within, take));
            pos += take as u64;
        }
        out
    }
}

impl Store for CompressedStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let mut requests = [ReadRequest { offset, buf }];
        self.read_batch(&mut requests)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.write_batch(&[(offset, buf)])
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn describe(&self) -> String {
        let codec = match self.codec {
            CodecKind::None => "none".to_string(),
            CodecKind::Lz4 => "lz4".to_string(),
            CodecKind::Zfp { tolerance } => format!("zfp:{tolerance:e}"),
        };
        format!("{codec}({})", self.inner.describe())
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        for r in requests.iter() {
            check_range(self, r.offset, r.buf.len())?;
        }
        // Whole pages decode straight into the caller's buffer; partial ones via a scratch page.
        let mut whole: Vec<(u64, &mut [u8])> = Vec::new();
        let mut partial: Vec<(u64, usize, &mut [u8])> = Vec::new();
        for r in requests.iter_mut() {
            let mut rest: &mut [u8] = r.buf;
            for (index, within, take) in self.spans(r.offset, rest.len()) {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(take);
                rest = tail;
                if within == 0 && take == self.page_len(index) {
                    whole.push((index, head));
                } else {
                    partial.push((index, within, head));
                }
            }
        }
        if !whole.is_empty() {
            self.read_pages(&mut whole)?;
        }
        for (index, within, out) in partial {
            let mut scratch = vec![0u8; self.page_len(index)];
            self.read_pages(&mut [(index, scratch.as_mut_slice())])?;
            out.copy_from_slice(&scratch[within..within + out.len()]);
        }
        Ok(())
    }

    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        for (offset, buf) in requests {
            check_range(self, *offset, buf.len())?;
        }
        let mut whole: Vec<(u64, &[u8])> = Vec::new();
        let mut partial: Vec<(u64, usize, &[u8])> = Vec::new();
        for (offset, buf) in requests {
            let mut done = 0;
            for (index, within, take) in self.spans(*offset, buf.len()) {
                let piece = &buf[done..done + take];
                done += take;
                if within == 0 && take == self.page_len(index) {
                    whole.push((index, piece));
                } else {
                    partial.push((index, within, piece));
                }
            }
        }
        if !whole.is_empty() {
            self.write_pages(&whole)?;
        }
        for (index, within, piece) in partial {
            // Read-modify-write of a partly covered page.
            let mut scratch = vec![0u8; self.page_len(index)];
            self.read_pages(&mut [(index, scratch.as_mut_slice())])?;
            scratch[within..within + piece.len()].copy_from_slice(piece);
            self.write_pages(&[(index, scratch.as_slice())])?;
        }
        Ok(())
    }
}

/// Slot images lent to one read or write batch by a pool shared by the process's threads,
/// and given back to it when dropped.
///
/// Why a pool: under `strata run` a page is encoded as it is evicted, often while the
/// program's memory group is at its limit, and the eviction is what makes room. A fresh
/// buffer per page (as before) made the C library touch new heap pages now and then (after
/// trimming its heap), and a page the group cannot charge gets the program OOM-killed: one
/// in a few `sort` runs over LZ4 on a memory node died that way, in the room keeper's
/// eviction. The pool keeps the images of the batches in flight at once, so steady work
/// touches no new memory. One pool rather than one per thread: per thread, each of the
/// pager's six or so threads kept its largest batch for good, 0.25 MiB more charged beside
/// the budget of `sort` over LZ4 on a node (measured), where the shared pool holds only what
/// was ever in flight together.
struct SlotImages {
    images: Vec<Vec<u8>>,
}

/// Images the pool keeps at most (a few batches' worth); more are freed when given back.
const POOL_MOST: usize = 64;

static POOL: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

impl SlotImages {
    /// `count` images from the pool (empty ones where it has too few).
    fn take(count: usize) -> Self {
        let mut images = Vec::with_capacity(count);
        {
            let mut pool = POOL
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let keep = pool.len().saturating_sub(count);
            images.extend(pool.drain(keep..));
        }
        images.resize_with(count, Vec::new);
        Self { images }
    }

    fn iter(&self) -> std::slice::Iter<'_, Vec<u8>> {
        self.images.iter()
    }

    fn iter_mut(&mut self) -> std::slice::IterMut<'_, Vec<u8>> {
        self.images.iter_mut()
    }
}

impl Drop for SlotImages {
    fn drop(&mut self) {
        let mut pool = POOL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let room = POOL_MOST.saturating_sub(pool.len());
        pool.extend(self.images.drain(..).take(room));
    }
}

fn encode_header(format: Format, stored: &[u8], tolerance: f64) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    h[2] = format as u8;
    let length = u32::try_from(stored.len()).expect("a page fits in u32");
    h[4..8].copy_from_slice(&length.to_le_bytes());
    h[8..12].copy_from_slice(&crc32fast::hash(stored).to_le_bytes());
    h[16..24].copy_from_slice(&tolerance.to_le_bytes());
    let header_crc = header_checksum(&h);
    h[12..16].copy_from_slice(&header_crc.to_le_bytes());
    h
}

fn header_checksum(h: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&h[0..12]);
    hasher.update(&h[16..24]);
    hasher.finalize()
}

/// Parses a header: (format, stored length, stored-bytes checksum, tolerance).
fn decode_header(h: &[u8]) -> Result<(Format, usize, u32, f64), String> {
    let word = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    if u16::from_le_bytes([h[0], h[1]]) != MAGIC {
        return Err("slot header has no Strata magic".into());
    }
    if word(12) != header_checksum(h) {
        return Err("slot header checksum does not match".into());
    }
    let format = Format::from_u8(h[2]).ok_or_else(|| format!("unknown page format {}", h[2]))?;
    let mut tolerance = [0u8; 8];
    tolerance.copy_from_slice(&h[16..24]);
    Ok((
        format,
        word(4) as usize,
        word(8),
        f64::from_le_bytes(tolerance),
    ))
}

fn values(element: ZfpElement, bytes: &[u8]) -> impl Iterator<Item = f64> + '_ {
    bytes
        .chunks_exact(element.bytes())
        .map(move |c| match element {
            ZfpElement::F64 => f64::from_le_bytes(c.try_into().expect("8 bytes")),
            ZfpElement::F32 => f64::from(f32::from_le_bytes(c.try_into().expect("4 bytes"))),
        })
}

/// Whether every value of the page is zero or a normal number, so ZFP may store it within the
/// tolerance. NaN and infinity have no error bound, and subnormal bit patterns are what
/// pointers and non-negative integers below 2^52 (2^23 for `f32`) look like read as floats:
/// rounding one of them within the tolerance (often to zero) would hand a program another
/// pointer or integer, so such pages are stored exactly.
fn lossy_safe(element: ZfpElement, page: &[u8]) -> bool {
    match element {
        ZfpElement::F64 => page.chunks_exact(8).all(|c| {
            let v = f64::from_le_bytes(c.try_into().expect("8 bytes"));
            v == 0.0 || v.is_normal()
        }),
        ZfpElement::F32 => page.chunks_exact(4).all(|c| {
            let v = f32::from_le_bytes(c.try_into().expect("4 bytes"));
            v == 0.0 || v.is_normal()
        }),
    }
}

fn within_bound(element: ZfpElement, original: &[u8], decoded: &[u8], tolerance: f64) -> bool {
    values(element, original)
        .zip(values(element, decoded))
        .all(|(a, b)| (a - b).abs() <= tolerance)
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
