//! The store tier: a space whose bytes live in any [`Store`], reached through a bounded pinned
//! host cache that faulting warps load from directly, and a request ring that host threads
//! (the [`RingServer`]) serve with `read_batch`/`write_batch`. This module makes the shared
//! memory (pinned, mapped into the GPU), the ring's descriptor in GPU memory, and the server.

use std::ops::Range;
use std::sync::Arc;

use strata_core::store::Store;

use crate::driver::{DeviceBuffer, Gpu, MappedHostBuffer};
use crate::ring::layout::{RingDescriptor, RingRequest};
use crate::ring::{RingGeometry, RingServer, RingServerOptions, SharedRing};
use crate::space::SpaceError;

/// Most bytes of staging pages (one per ring entry) a space pins.
const STAGING_BYTES: u64 = 64 << 20;

/// A space's store, host cache, ring and server.
#[derive(Debug)]
pub(crate) struct StoreTier {
    pub(crate) store: Arc<dyn Store>,
    /// `None` only after `close` took it.
    server: Option<RingServer>,
    /// The ring's descriptor (kernels reach it through the handle).
    pub(crate) descriptor: DeviceBuffer,
    size: u64,
}

/// Entries in the ring for pages of `page_size`: enough staging for 64 MiB of pages on their
/// way down, between 32 and 4096 entries, a power of two.
pub(crate) fn ring_capacity(page_size: u64) -> u32 {
    let n = (STAGING_BYTES / page_size).clamp(32, 4096);
    let pow2 = 1u64 << (63 - n.leading_zeros());
    u32::try_from(pow2).unwrap_or(4096)
}

/// The host cache's slots: `requested` bytes, or a quarter of the host's available memory; at
/// most the space's pages, at least 2.
pub(crate) fn host_cache_slots(
    requested: Option<u64>,
    page_size: u64,
    pages: u64,
) -> Result<u64, SpaceError> {
    let bytes = match requested {
        Some(b) => b,
        None => available_memory().unwrap_or(1 << 30) / 4,
    };
    let slots = (bytes / page_size).min(pages);
    if slots < 2 && pages >= 2 {
        return Err(SpaceError::Invalid(format!(
            "a host cache of {} holds fewer than 2 pages of {}: ask for at least {}",
            strata_core::units::format_size(bytes),
            strata_core::units::format_size(page_size),
            strata_core::units::format_size(2 * page_size)
        )));
    }
    Ok(slots.max(1))
}

/// The ring server's options, with `STRATA_GPU_RING_THREADS` (store I/O threads) and
/// `STRATA_GPU_READ_AHEAD` (pages read ahead of a sequential run) applied when set.
fn ring_options_from_env() -> Result<RingServerOptions, SpaceError> {
    use strata_core::config::{env_number, process_env};
    let invalid = |e: strata_core::config::ConfigError| SpaceError::Invalid(e.to_string());
    let env = process_env().map_err(invalid)?;
    let mut options = RingServerOptions::default();
    if let Some(t) = env_number(&env, "STRATA_GPU_RING_THREADS").map_err(invalid)? {
        options.threads = t;
    }
    if let Some(p) = env_number(&env, "STRATA_GPU_READ_AHEAD").map_err(invalid)? {
        options.read_ahead_pages = p;
    }
    Ok(options)
}

/// MemAvailable from /proc/meminfo, in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn pinned(gpu: &Arc<Gpu>, bytes: u64) -> Result<MappedHostBuffer, SpaceError> {
    let n = usize::try_from(bytes)
        .map_err(|_| SpaceError::Invalid(format!("{bytes} bytes is too large")))?;
    let mut b = MappedHostBuffer::new(gpu, n)?;
    b.as_mut_slice().fill(0);
    Ok(b)
}

/// The pinned buffers the GPU and the server share; kept alive by the server.
#[derive(Debug)]
struct SharedBuffers {
    entries: MappedHostBuffer,
    head: MappedHostBuffer,
    done: MappedHostBuffer,
    slot_words: MappedHostBuffer,
    slot_refs: MappedHostBuffer,
    slots: MappedHostBuffer,
    staging: MappedHostBuffer,
}

impl StoreTier {
    /// Makes the shared memory, the descriptor and the server for a space of `size` bytes in
    /// `pages` pages of `page_size` over `store`.
    pub(crate) fn new(
        gpu: &Arc<Gpu>,
        store: Arc<dyn Store>,
        size: u64,
        page_size: u64,
        pages: u64,
        host_cache_bytes: Option<u64>,
    ) -> Result<Self, SpaceError> {
        if store.size() < size {
            return Err(SpaceError::Invalid(format!(
                "{} holds {} bytes, fewer than the space's {size}: make the store at least as large as the space",
                store.describe(),
                store.size()
            )));
        }
        let slot_count = host_cache_slots(host_cache_bytes, page_size, pages)?;
        let capacity = ring_capacity(page_size);
        let cap = u64::from(capacity);
        let bufs = SharedBuffers {
            entries: pinned(gpu, cap * std::mem::size_of::<RingRequest>() as u64)?,
            head: pinned(gpu, 64)?,
            done: pinned(gpu, cap * 8)?,
            slot_words: pinned(gpu, pages * 8)?,
            slot_refs: pinned(gpu, slot_count)?,
            slots: pinned(gpu, slot_count * page_size)?,
            staging: pinned(gpu, cap * page_size)?,
        };
        let descriptor = RingDescriptor {
            tail: 0,
            entries: bufs.entries.device_ptr(),
            head: bufs.head.device_ptr(),
            done: bufs.done.device_ptr(),
            slot_words: bufs.slot_words.device_ptr(),
            slot_refs: bufs.slot_refs.device_ptr(),
            slots: bufs.slots.device_ptr(),
            staging: bufs.staging.device_ptr(),
            slot_count,
            capacity,
            flags: 0,
        };
        let descriptor_buf = DeviceBuffer::zeroed(gpu, std::mem::size_of::<RingDescriptor>())?;
        descriptor_buf.upload(0, std::slice::from_ref(&descriptor))?;
        // SAFETY: every pointer is the host address of a live pinned buffer of the size the
        // ring's geometry needs (allocated just above, zero-filled), and `bufs` (moved into the
        // ring as its keep-alive) owns them for as long as the ring exists.
        let geometry = RingGeometry {
            capacity,
            pages,
            slot_count,
            page_size,
            space_size: size,
        };
        let (entries, head, done, slot_words, slot_refs, slots, staging) = (
            bufs.entries.host_mut_ptr().cast(),
            bufs.head.host_mut_ptr().cast(),
            bufs.done.host_mut_ptr().cast(),
            bufs.slot_words.host_mut_ptr().cast(),
            bufs.slot_refs.host_mut_ptr(),
            bufs.slots.host_mut_ptr(),
            bufs.staging.host_mut_ptr(),
        );
        // SAFETY: every pointer is the host address of a live, zero-filled pinned buffer of the
        // size `geometry` needs (allocated just above: entries capacity*32 bytes, head 64,
        // done capacity*8, slot words pages*8, references slot_count, slots
        // slot_count*page_size, staging capacity*page_size; cuMemHostAlloc aligns to pages),
        // and `bufs`, moved into the ring as its keep-alive, owns them for the ring's life.
        let shared = unsafe {
            SharedRing::from_raw(
                entries,
                head,
                done,
                slot_words,
                slot_refs,
                slots,
                staging,
                geometry,
                Box::new(bufs),
            )?
        };
        let server = RingServer::start(shared, store.clone(), ring_options_from_env()?)?;
        Ok(StoreTier {
            store,
            server: Some(server),
            descriptor: descriptor_buf,
            size,
        })
    }

    /// Whether `close` already ended the server.
    pub(crate) fn is_closed(&self) -> bool {
        self.server.is_none()
    }

    pub(crate) fn server(&self) -> Result<&RingServer, SpaceError> {
        self.server
            .as_ref()
            .ok_or_else(|| SpaceError::Invalid("the space was closed: make a new one".into()))
    }

    /// Host cache -> store, then the store's durability point.
    pub(crate) fn flush(&self) -> Result<(), SpaceError> {
        Ok(self.server()?.flush()?)
    }

    /// A store error as the space reports it (naming the store).
    fn store_error(&self, source: strata_core::store::StoreError) -> SpaceError {
        SpaceError::Store {
            store: self.store.describe(),
            source,
        }
    }

    /// Reads from the store (after a flush: the store is current).
    pub(crate) fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), SpaceError> {
        self.store
            .read_at(offset, out)
            .map_err(|e| self.store_error(e))
    }

    fn pages_of(&self, range: &Range<u64>) -> Range<u64> {
        let ps = self.server.as_ref().map_or(1, |r| r.shared().page_size());
        range.start / ps..range.end.div_ceil(ps)
    }

    /// Writes through to the store, after the host cache dropped the pages of the range
    /// (writing its dirty ones first, so bytes outside `data` in a partial page survive).
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), SpaceError> {
        let range = offset..offset + data.len() as u64;
        self.server()?.invalidate(self.pages_of(&range))?;
        self.store
            .write_at(offset, data)
            .map_err(|e| self.store_error(e))
    }

    /// Zeroes a range of the store in 8 MiB writes.
    pub(crate) fn zero(&mut self, range: Range<u64>) -> Result<(), SpaceError> {
        self.server()?.invalidate(self.pages_of(&range))?;
        let zeros = vec![0u8; 8 << 20];
        let mut at = range.start;
        while at < range.end.min(self.size) {
            let n = (range.end - at).min(zeros.len() as u64);
            let len = usize::try_from(n).unwrap_or(zeros.len());
            self.store
                .write_at(at, &zeros[..len])
                .map_err(|e| self.store_error(e))?;
            at += n;
        }
        Ok(())
    }

    /// Stops the server after a flush; on failure, the pages still dirty come back with the
    /// error.
    pub(crate) fn close(&mut self) -> Result<(), SpaceError> {
        let Some(server) = self.server.take() else {
            return Ok(());
        };
        if let Err(e) = server.flush() {
            let pages = server.dirty_pages();
            // The server stays alive inside nothing: stop its threads without another flush.
            drop(server);
            return Err(SpaceError::Unflushed {
                pages,
                source: Box::new(e.into()),
            });
        }
        server.shutdown()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_geometry_is_bounded() {
        assert_eq!(ring_capacity(4096), 4096);
        assert_eq!(ring_capacity(64 << 10), 1024);
        assert_eq!(ring_capacity(2 << 20), 32);
        assert_eq!(host_cache_slots(Some(1 << 20), 4096, 1000).unwrap(), 256);
        assert_eq!(host_cache_slots(Some(1 << 30), 4096, 1000).unwrap(), 1000);
        assert!(host_cache_slots(Some(4096), 4096, 1000).is_err());
        assert!(host_cache_slots(None, 4096, 1000).unwrap() >= 2);
    }
}
