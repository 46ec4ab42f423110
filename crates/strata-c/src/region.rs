//! Pager regions over any store, opened from the same store and codec specs as the CLI
//! (`memory`, `file:PATH`, `remote:HOST:PORT,...`; `none`, `lz4`, `zfp:TOL`). Shared by the C
//! API below and the Python bindings.

use std::ffi::{CStr, c_char, c_void};

use strata_core::config::{CodecKind, StoreKind};
use strata_core::{PagerConfig, StoreConfig};
use strata_pager::Region;

use crate::error::{Error, guard};

/// What a region is opened with (the Rust side of `strata_region_options`).
#[derive(Debug, Clone)]
pub struct RegionSpec {
    /// `memory`, `file:PATH` or `remote:HOST:PORT[,HOST:PORT...]`.
    pub store: String,
    /// `none`, `lz4` or `zfp:TOLERANCE`.
    pub codec: String,
    /// Memory nodes' token (remote stores).
    pub token: Option<String>,
    /// Extend a file store that is shorter than the region.
    pub grow: bool,
    /// Page size in bytes (0: 64 KiB).
    pub page_bytes: u64,
    /// Resident-set budget in bytes (0: 64 MiB, capped at the region's size).
    pub buffer_bytes: u64,
    /// Filler threads (0: the pager's default).
    pub fillers: usize,
    /// Evictor threads (0: the pager's default).
    pub evictors: usize,
}

impl Default for RegionSpec {
    fn default() -> Self {
        RegionSpec {
            store: "memory".into(),
            codec: "none".into(),
            token: None,
            grow: true,
            page_bytes: 0,
            buffer_bytes: 0,
            fillers: 0,
            evictors: 0,
        }
    }
}

const DEFAULT_PAGE: u64 = 64 << 10;
const DEFAULT_BUFFER: u64 = 64 << 20;

/// Opens a region of `size` bytes as `spec` describes.
pub fn open_region(size: u64, spec: &RegionSpec) -> Result<Region, Error> {
    if size == 0 {
        return Err(Error::Invalid(
            "a region of 0 bytes: give a size of at least one byte".into(),
        ));
    }
    let kind: StoreKind = spec.store.parse()?;
    let codec: CodecKind = spec.codec.parse()?;
    let mut store = StoreConfig::builder()
        .kind(kind)
        .codec(codec)
        .grow(spec.grow);
    if let Some(t) = &spec.token {
        store = store.token(t.clone());
    }
    let store = store.build()?;
    let page = if spec.page_bytes == 0 {
        DEFAULT_PAGE
    } else {
        spec.page_bytes
    };
    let buffer = if spec.buffer_bytes == 0 {
        // A whole number of pages, at least the four the pager needs, at most the region.
        DEFAULT_BUFFER.min(size.div_ceil(page).max(4) * page)
    } else {
        spec.buffer_bytes
    };
    let mut config = PagerConfig::builder().page_bytes(page).buffer_bytes(buffer);
    if spec.fillers > 0 {
        config = config.fillers(spec.fillers);
    }
    if spec.evictors > 0 {
        config = config.evictors(spec.evictors);
    }
    let config = config.build()?;
    let store = strata_net::open_store_with_page(&store, size, page)?;
    Ok(Region::new(store, size, config)?)
}

/// A pager region as C sees it (`strata_region`).
#[derive(Debug)]
pub struct CRegion {
    region: Region,
}

/// Options of `strata_region_open` (`strata_region_options` in `strata.h`).
#[repr(C)]
#[derive(Debug)]
pub struct RegionOptions {
    /// Store spec (NULL: `memory`).
    pub store: *const c_char,
    /// Codec spec (NULL: `none`).
    pub codec: *const c_char,
    /// Memory nodes' token (NULL: none).
    pub token: *const c_char,
    /// Non-zero: extend a short file.
    pub grow: i32,
    /// Page size in bytes (0: 64 KiB).
    pub page_bytes: u64,
    /// Resident-set budget (0: 64 MiB capped at the region).
    pub buffer_bytes: u64,
    /// Filler threads (0: default).
    pub fillers: u32,
    /// Evictor threads (0: default).
    pub evictors: u32,
}

/// Region statistics (`strata_region_stats`).
#[repr(C)]
#[derive(Debug, Default)]
pub struct RegionStats {
    /// Page faults served.
    pub faults: u64,
    /// Pages dropped from memory.
    pub evictions: u64,
    /// Dirty pages written back.
    pub writebacks: u64,
    /// Pages read by prefetch or read-ahead.
    pub prefetched_pages: u64,
    /// Failed operations.
    pub errors: u64,
}

/// Reads an optional C string argument.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string.
pub(crate) unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>, Error> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string (documented in strata.h).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| Error::Invalid(format!("{what} is not UTF-8")))
}

pub(crate) fn non_null<'a, T>(p: *const T, what: &str) -> Result<&'a T, Error> {
    // SAFETY: callers pass either null or a pointer from the matching strata_*_open/create
    // call that has not been closed (the contract in strata.h); null is refused here.
    unsafe { p.as_ref() }.ok_or_else(|| Error::Invalid(format!("{what} is NULL")))
}

/// Opens a pager region of `size` bytes over the store `options` describes (NULL: a memory
/// store with defaults) and stores its handle in `*out`.
///
/// # Safety
/// `options` is null or valid with null or NUL-terminated strings; `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_region_open(
    size: u64,
    options: *const RegionOptions,
    out: *mut *mut CRegion,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(Error::Invalid("out is NULL".into()));
        }
        let mut spec = RegionSpec::default();
        if !options.is_null() {
            let o = non_null(options, "options")?;
            // SAFETY: strings in the options are null or NUL-terminated (strata.h).
            unsafe {
                if let Some(s) = opt_str(o.store, "options.store")? {
                    spec.store = s;
                }
                if let Some(s) = opt_str(o.codec, "options.codec")? {
                    spec.codec = s;
                }
                spec.token = opt_str(o.token, "options.token")?;
            }
            spec.grow = o.grow != 0;
            spec.page_bytes = o.page_bytes;
            spec.buffer_bytes = o.buffer_bytes;
            spec.fillers = o.fillers as usize;
            spec.evictors = o.evictors as usize;
        }
        let region = open_region(size, &spec)?;
        let boxed = Box::into_raw(Box::new(CRegion { region }));
        // SAFETY: `out` is non-null and valid for a write (caller's contract).
        unsafe { out.write(boxed) };
        Ok(())
    })
}

/// The region's first byte (its memory is `strata_region_len` bytes from here).
///
/// # Safety
/// `r` is null or a live region.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_region_data(r: *const CRegion) -> *mut c_void {
    match non_null(r, "region") {
        Ok(r) => r.region.as_ptr().cast(),
        Err(_) => std::ptr::null_mut(),
    }
}

/// The region's length in bytes (0 for NULL).
///
/// # Safety
/// `r` is null or a live region.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_region_len(r: *const CRegion) -> u64 {
    non_null(r, "region").map_or(0, |r| r.region.len() as u64)
}

/// Writes every dirty page back and flushes the store.
///
/// # Safety
/// `r` is null or a live region.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_region_flush(r: *const CRegion) -> i32 {
    guard(|| Ok(non_null(r, "region")?.region.flush()?))
}

/// Brings the pages of `[offset, offset+len)` in now.
///
/// # Safety
/// `r` is null or a live region.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_region_prefetch(r: *const CRegion, offset: u64, len: u64) -> i32 {
    guard(|| {
        non_null(r, "region")?.region.prefetch(&[(offset, len)])?;
        Ok(())
    })
}

/// Drops the pages of `[offset, offset+len)` from memory, writing dirty ones back first.
///
/// # Safety
/// `r` is null or a live region.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_region_evict(r: *const CRegion, offset: u64, len: u64) -> i32 {
    guard(|| {
        non_null(r, "region")?.region.evict(offset, len)?;
        Ok(())
    })
}

/// Copies the region's counters into `*out`.
///
/// # Safety
/// `r` is null or a live region; `out` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_region_stats(r: *const CRegion, out: *mut RegionStats) -> i32 {
    guard(|| {
        let s = non_null(r, "region")?.region.stats();
        if out.is_null() {
            return Err(Error::Invalid("out is NULL".into()));
        }
        let stats = RegionStats {
            faults: s.faults,
            evictions: s.evictions,
            writebacks: s.writebacks,
            prefetched_pages: s.prefetched_pages,
            errors: s.errors,
        };
        // SAFETY: `out` is non-null and valid for a write (caller's contract).
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Flushes and unmaps the region. On a failed flush the region stays open (its dirty pages
/// are kept), the error is returned, and the caller may retry or fix the store.
///
/// # Safety
/// `r` is null or a live region, not used again after a successful close.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_region_close(r: *mut CRegion) -> i32 {
    guard(|| {
        if r.is_null() {
            return Ok(());
        }
        // SAFETY: `r` came from Box::into_raw in strata_region_open and is live; the value is
        // moved out here and the slot is either refilled (failure) or freed (success).
        let region = unsafe { std::ptr::read(r) }.region;
        match region.unmap() {
            Ok(()) => {
                // SAFETY: the allocation of Box::into_raw; its value was moved out above, so
                // it is freed as uninitialised memory (no second drop).
                drop(unsafe { Box::from_raw(r.cast::<std::mem::MaybeUninit<CRegion>>()) });
                Ok(())
            }
            Err(e) => {
                let e = *e;
                // SAFETY: the slot is still allocated and holds no value; the region goes
                // back into it, still mapped, so the caller's pointer stays valid.
                unsafe { r.write(CRegion { region: e.region }) };
                Err(e.error.into())
            }
        }
    })
}

const _: () = assert!(size_of::<RegionOptions>() == 56);
const _: () = assert!(size_of::<RegionStats>() == 40);
