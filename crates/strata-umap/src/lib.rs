//! A Umap-compatible C API over Strata's pager: `libstrata_umap.so` and `include/umap.h`.
//!
//! An existing Umap program builds and runs against Strata by changing its link line from
//! `-lumap` to `-lstrata_umap` (and its include path to this crate's `include/`). The
//! functions keep Umap's names and signatures: `umap`, `uunmap`, `umap_flush`,
//! `umap_prefetch`, `umap_evict`, `umap_has_write_support` and the `umapcfg_get_*` getters,
//! configured by the `UMAP_*` environment variables with Umap's meanings (read once, at the
//! first call): `UMAP_PAGESIZE` (bytes), `UMAP_BUFSIZE` (pages), `UMAP_PAGE_FILLERS`,
//! `UMAP_PAGE_EVICTORS`, `UMAP_EVICT_LOW_WATER_THRESHOLD`, `UMAP_EVICT_HIGH_WATER_THRESHOLD`,
//! `UMAP_MAX_FAULT_EVENTS` and `UMAP_READ_AHEAD`.
//!
//! A region over a file: `umap(NULL, len, PROT_READ|PROT_WRITE, UMAP_PRIVATE, fd, offset)`
//! with a file open for reading and writing, or the extension
//! `strata_umap_file(path, len, prot, UMAP_PRIVATE, offset)` which opens (or creates) it.
//!
//! # Differences from Umap
//! - `offset` is honoured (Umap's `umap()` drops it and always starts at byte 0).
//! - A variable set to `0` is a value, not "unset": `UMAP_PAGE_EVICTORS=0` makes `umap()` fail
//!   with `EINVAL` and a message, rather than being silently ignored. Any unparsable value
//!   fails the same way.
//! - Each region has its own buffer of `UMAP_BUFSIZE` pages (capped at the region's size) and
//!   its own filler and evictor threads; Umap shares one buffer and one pool among all
//!   regions. A region larger than the free memory is not refused.
//! - `UMAP_PAGESIZE` must be a multiple of the system page size up to 2 MiB (Strata's limit).
//! - The length need not be a multiple of the page size (a last partial page reads and writes
//!   only the bytes inside the region).
//! - `uunmap` returns -1 with `errno` set when no region starts at `addr` (`EINVAL`) or when
//!   the dirty pages cannot be written back (`EIO`; the region then stays mapped, so no data is
//!   lost); Umap always returns 0.
//! - `umap_prefetch` returns once the pages are resident (Umap queues them).
//! - `umap_evict()` (evict every buffered page) exists here; in Umap only on an unmerged branch.
//! - `UMAP_MAX_FAULT_EVENTS` is accepted and reported but advisory; `UMAP_MONITOR_FREQ` and the
//!   `UMAP_LOG_*` variables are ignored.
//! - Eviction is a clock with re-fault detection, not FIFO; the `umap_fetch_and_pin` and
//!   `umapcfg_set_*` functions and the C++ `umap_ex`/`Store` API are not provided.
//! - A page that cannot be read from the file delivers `SIGBUS` to the faulting thread (like
//!   `mmap` past the end of a file); see `strata_pager::region`.

#![warn(missing_docs)]

pub mod config;
mod fd_store;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_long, c_longlong, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use config::{UmapConfig, UmapEnvError};
use fd_store::FdStore;
use strata_core::PagerConfig;
use strata_pager::Region;

pub use config::system_page_size;

/// The `UMAP_FAILED` result.
const UMAP_FAILED: *mut c_void = usize::MAX as *mut c_void;

fn config() -> &'static Result<UmapConfig, UmapEnvError> {
    static CONFIG: OnceLock<Result<UmapConfig, UmapEnvError>> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let c = UmapConfig::from_env();
        if let Err(e) = &c {
            eprintln!("strata-umap: {e}; every umap() call will fail until it is fixed");
        }
        c
    })
}

fn config_or_defaults() -> UmapConfig {
    config().clone().unwrap_or_else(|_| UmapConfig::defaults())
}

/// Regions by base address.
fn regions() -> &'static Mutex<BTreeMap<usize, Region>> {
    static REGIONS: OnceLock<Mutex<BTreeMap<usize, Region>>> = OnceLock::new();
    REGIONS.get_or_init(|| Mutex::new(BTreeMap::new()))
}

fn lock_regions() -> std::sync::MutexGuard<'static, BTreeMap<usize, Region>> {
    regions().lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_errno(code: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = code };
}

/// Records `message` as this thread's last error, prints it, sets errno.
fn fail(code: c_int, message: &str) {
    eprintln!("strata-umap: {message}");
    LAST_ERROR.with(|e| {
        *e.borrow_mut() = CString::new(message.replace('\0', " ")).unwrap_or_default();
    });
    set_errno(code);
}

/// Why a `umap` call was refused.
#[derive(Debug, thiserror::Error)]
pub enum UmapError {
    /// A bad argument.
    #[error("{0}")]
    Invalid(String),
    /// A bad environment variable.
    #[error(transparent)]
    Env(#[from] UmapEnvError),
    /// The file could not be used.
    #[error("{0}")]
    File(String),
    /// The region could not be made.
    #[error(transparent)]
    Region(#[from] strata_pager::RegionError),
}

impl UmapError {
    fn errno(&self) -> c_int {
        match self {
            UmapError::Invalid(_) | UmapError::Env(_) => libc::EINVAL,
            UmapError::File(_) => libc::EBADF,
            UmapError::Region(_) => libc::ENOMEM,
        }
    }
}

/// Validates Umap's arguments and creates the region; returns its base address.
fn map_region(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    store: Arc<dyn strata_core::Store>,
) -> Result<*mut c_void, UmapError> {
    let cfg = config().as_ref().map_err(Clone::clone)?;
    if length == 0 {
        return Err(UmapError::Invalid("length 0: map at least one byte".into()));
    }
    if prot & !(libc::PROT_READ | libc::PROT_WRITE) != 0 || prot & libc::PROT_READ == 0 {
        return Err(UmapError::Invalid(format!(
            "prot {prot:#x} not supported: use PROT_READ or PROT_READ|PROT_WRITE"
        )));
    }
    if flags & libc::MAP_PRIVATE == 0 || flags & !(libc::MAP_PRIVATE | libc::MAP_FIXED) != 0 {
        return Err(UmapError::Invalid(format!(
            "flags {flags:#x} not supported: use UMAP_PRIVATE, optionally with UMAP_FIXED"
        )));
    }
    let fixed = flags & libc::MAP_FIXED != 0;
    if fixed && (addr.is_null() || !(addr as u64).is_multiple_of(cfg.page_size)) {
        return Err(UmapError::Invalid(
            "UMAP_FIXED needs a non-null address aligned to UMAP_PAGESIZE".into(),
        ));
    }
    let region_pages = (length as u64).div_ceil(cfg.page_size);
    let buffer_pages = cfg.buffer_pages.min(region_pages).max(4);
    let pager = PagerConfig::builder()
        .page_bytes(cfg.page_size)
        .buffer_bytes(buffer_pages * cfg.page_size)
        .fillers(usize::try_from(cfg.fillers).unwrap_or(1))
        .evictors(usize::try_from(cfg.evictors).unwrap_or(1))
        .read_ahead(cfg.read_ahead)
        .water_marks(cfg.low_water, cfg.high_water)
        .build()
        .map_err(strata_pager::RegionError::from)?;
    let mut builder = Region::builder(store, length as u64)
        .config(pager)
        .read_only(prot & libc::PROT_WRITE == 0);
    if fixed {
        // SAFETY: with UMAP_FIXED the caller asks, as with mmap(MAP_FIXED), for whatever is
        // mapped at [addr, addr+length) to be replaced; that is the contract of the flag.
        builder = unsafe { builder.fixed_address(addr.cast()) };
    }
    let region = builder.build()?;
    let base = region.as_ptr() as usize;
    lock_regions().insert(base, region);
    Ok(base as *mut c_void)
}

fn finish_map(result: Result<*mut c_void, UmapError>) -> *mut c_void {
    match result {
        Ok(p) => p,
        Err(e) => {
            fail(e.errno(), &e.to_string());
            UMAP_FAILED
        }
    }
}

/// Maps `length` bytes of the file open on `fd` from byte `offset`. See `include/umap.h`.
///
/// # Safety
/// As `mmap`: with `UMAP_FIXED`, `addr` must be a range the caller owns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umap(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: libc::off_t,
) -> *mut c_void {
    let result = (|| {
        let offset = u64::try_from(offset)
            .map_err(|_| UmapError::Invalid(format!("offset {offset} is negative")))?;
        let store = FdStore::from_fd(fd, offset, length as u64, prot & libc::PROT_WRITE != 0)
            .map_err(UmapError::File)?;
        map_region(addr, length, prot, flags, Arc::new(store))
    })();
    finish_map(result)
}

/// Maps `length` bytes of the file at `path` from byte `offset` (a Strata extension).
///
/// # Safety
/// `path` must be a NUL-terminated string; `addr` as for [`umap`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_umap_file(
    path: *const c_char,
    length: usize,
    prot: c_int,
    flags: c_int,
    offset: libc::off_t,
) -> *mut c_void {
    if path.is_null() {
        fail(libc::EINVAL, "strata_umap_file: path is NULL");
        return UMAP_FAILED;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let path = unsafe { CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    let result = (|| {
        let offset = u64::try_from(offset)
            .map_err(|_| UmapError::Invalid(format!("offset {offset} is negative")))?;
        let store = FdStore::open(&path, offset, length as u64, prot & libc::PROT_WRITE != 0)
            .map_err(UmapError::File)?;
        map_region(std::ptr::null_mut(), length, prot, flags, Arc::new(store))
    })();
    finish_map(result)
}

/// Flushes and unmaps the region starting at `addr`.
#[unsafe(no_mangle)]
pub extern "C" fn uunmap(addr: *mut c_void, _length: usize) -> c_int {
    let Some(region) = lock_regions().remove(&(addr as usize)) else {
        fail(
            libc::EINVAL,
            &format!("uunmap: no region starts at {addr:p}"),
        );
        return -1;
    };
    match region.unmap() {
        Ok(()) => 0,
        Err(e) => {
            let message = format!("uunmap: {}", e.error);
            lock_regions().insert(addr as usize, e.region);
            fail(libc::EIO, &message);
            -1
        }
    }
}

/// Writes every dirty page of every region back.
#[unsafe(no_mangle)]
pub extern "C" fn umap_flush() -> c_int {
    let mut status = 0;
    for region in lock_regions().values() {
        if let Err(e) = region.flush() {
            fail(libc::EIO, &format!("umap_flush: {e}"));
            status = -1;
        }
    }
    status
}

/// One page to prefetch (`struct umap_prefetch_item`).
#[repr(C)]
#[derive(Debug)]
pub struct UmapPrefetchItem {
    /// Any address inside the page.
    pub page_base_addr: *mut c_void,
}

/// Reads the listed pages in.
///
/// # Safety
/// `page_array` must point to `npages` items.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umap_prefetch(npages: c_int, page_array: *const UmapPrefetchItem) {
    let Ok(n) = usize::try_from(npages) else {
        fail(libc::EINVAL, "umap_prefetch: negative page count");
        return;
    };
    if n == 0 {
        return;
    }
    if page_array.is_null() {
        fail(libc::EINVAL, "umap_prefetch: page_array is NULL");
        return;
    }
    // SAFETY: the caller passes `npages` items.
    let items = unsafe { std::slice::from_raw_parts(page_array, n) };
    let regions = lock_regions();
    for item in items {
        let a = item.page_base_addr as usize;
        let Some((base, region)) = regions.range(..=a).next_back() else {
            fail(
                libc::EINVAL,
                &format!("umap_prefetch: {a:#x} is in no region"),
            );
            continue;
        };
        let off = (a - base) as u64;
        if off >= region.len() as u64 {
            fail(
                libc::EINVAL,
                &format!("umap_prefetch: {a:#x} is in no region"),
            );
            continue;
        }
        let page = region.config().page_bytes;
        let start = off / page * page;
        let len = page.min(region.len() as u64 - start);
        if let Err(e) = region.prefetch(&[(start, len)]) {
            fail(libc::EIO, &format!("umap_prefetch: {e}"));
        }
    }
}

/// Drops every resident page of every region.
#[unsafe(no_mangle)]
pub extern "C" fn umap_evict() -> c_int {
    let mut status = 0;
    for region in lock_regions().values() {
        if let Err(e) = region.evict_all() {
            fail(libc::EIO, &format!("umap_evict: {e}"));
            status = -1;
        }
    }
    status
}

/// Drops the resident pages covering a range.
#[unsafe(no_mangle)]
pub extern "C" fn strata_umap_evict_range(addr: *mut c_void, length: usize) -> c_long {
    let a = addr as usize;
    let regions = lock_regions();
    let Some((base, region)) = regions.range(..=a).next_back() else {
        fail(
            libc::EINVAL,
            &format!("strata_umap_evict_range: {a:#x} is in no region"),
        );
        return -1;
    };
    match region.evict((a - base) as u64, length as u64) {
        Ok(n) => c_long::try_from(n).unwrap_or(c_long::MAX),
        Err(e) => {
            let code = if matches!(e, strata_pager::RegionError::OutOfRange { .. }) {
                libc::EINVAL
            } else {
                libc::EIO
            };
            fail(code, &format!("strata_umap_evict_range: {e}"));
            -1
        }
    }
}

/// Faults served by the region starting at `addr`.
#[unsafe(no_mangle)]
pub extern "C" fn strata_umap_faults(addr: *mut c_void) -> c_longlong {
    match lock_regions().get(&(addr as usize)) {
        Some(r) => c_longlong::try_from(r.stats().faults).unwrap_or(c_longlong::MAX),
        None => {
            fail(
                libc::EINVAL,
                &format!("strata_umap_faults: no region starts at {addr:p}"),
            );
            -1
        }
    }
}

/// This thread's last error message.
#[unsafe(no_mangle)]
pub extern "C" fn strata_umap_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// 1 if writable regions are supported here.
#[unsafe(no_mangle)]
pub extern "C" fn umap_has_write_support() -> c_int {
    c_int::from(strata_pager::probe::probe().is_ok_and(|s| s.write_protect()))
}

/// The system page size.
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_system_page_size() -> c_long {
    c_long::try_from(system_page_size()).unwrap_or(4096)
}

/// `UMAP_PAGESIZE`.
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_umap_page_size() -> u64 {
    config_or_defaults().page_size
}

/// `UMAP_BUFSIZE` (pages per region).
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_max_pages_in_buffer() -> u64 {
    config_or_defaults().buffer_pages
}

/// `UMAP_PAGE_FILLERS`.
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_num_fillers() -> u64 {
    config_or_defaults().fillers
}

/// `UMAP_PAGE_EVICTORS`.
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_num_evictors() -> u64 {
    config_or_defaults().evictors
}

/// `UMAP_MAX_FAULT_EVENTS`.
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_max_fault_events() -> u64 {
    config_or_defaults().max_fault_events
}

/// `UMAP_READ_AHEAD`.
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_read_ahead() -> u64 {
    config_or_defaults().read_ahead
}

/// `UMAP_EVICT_LOW_WATER_THRESHOLD`.
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_evict_low_water_threshold() -> c_int {
    c_int::from(config_or_defaults().low_water)
}

/// `UMAP_EVICT_HIGH_WATER_THRESHOLD`.
#[unsafe(no_mangle)]
pub extern "C" fn umapcfg_get_evict_high_water_threshold() -> c_int {
    c_int::from(config_or_defaults().high_water)
}
