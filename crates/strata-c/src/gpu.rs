//! GPU spaces from C: open a GPU (`strata_gpu`), create spaces on it (`strata_space`), fill
//! and read them back, prefetch, evict and flush ranges, read statistics, and hand kernels the
//! `StrataSpace` handle (`strata_space_handle`, the same 96 bytes as `strata.cuh`'s struct).

use std::ffi::c_void;

use strata_gpu::layout::SpaceHandle;
use strata_gpu::{ElementType, EvictionPolicy, GpuStats, Space, SpaceOptions, Strata};

use crate::error::{Error, guard};
use crate::region::non_null;

/// A GPU with Strata's kernels loaded (`strata_gpu`).
#[derive(Debug)]
pub struct CGpu {
    pub(crate) strata: Strata,
}

/// A space (`strata_space`).
#[derive(Debug)]
pub struct CSpace {
    space: Space,
}

/// Options of a new space (`strata_space_options`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CSpaceOptions {
    /// Page size in bytes (power of two, 4 KiB to 2 MiB).
    pub page_size: u64,
    /// GPU memory for the page cache in bytes.
    pub cache_bytes: u64,
    /// `STRATA_ELEM_*`.
    pub element: u32,
    /// `STRATA_POLICY_CLOCK` (0) or `STRATA_POLICY_SCAN_RESISTANT` (1).
    pub policy: u32,
    /// Scan-resistant policy: fraction of frames the protected segment may hold.
    pub protected_fraction: f64,
    /// Non-zero: read-through for pages with no history (read-only data).
    pub read_through: u32,
}

/// Space statistics (`strata_space_stats`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CSpaceStats {
    /// Accesses that found their page resident.
    pub hits: u64,
    /// Page faults served.
    pub faults: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Dirty pages written back.
    pub writebacks: u64,
    /// Pages brought in by prefetch.
    pub prefetched: u64,
    /// Bytes copied into frames.
    pub bytes_in: u64,
    /// Bytes written back.
    pub bytes_out: u64,
    /// Total fault service time (ns).
    pub fault_ns_total: u64,
    /// Longest fault (ns).
    pub fault_ns_max: u64,
}

impl From<GpuStats> for CSpaceStats {
    fn from(s: GpuStats) -> Self {
        CSpaceStats {
            hits: s.hits,
            faults: s.faults,
            evictions: s.evictions,
            writebacks: s.writebacks,
            prefetched: s.prefetched,
            bytes_in: s.bytes_in,
            bytes_out: s.bytes_out,
            fault_ns_total: s.fault_ns_total,
            fault_ns_max: s.fault_ns_max,
        }
    }
}

/// Converts C options into the runtime's, refusing unknown values.
pub fn space_options(o: &CSpaceOptions) -> Result<SpaceOptions, Error> {
    let element = match o.element {
        0 => ElementType::I32,
        1 => ElementType::U32,
        2 => ElementType::I64,
        3 => ElementType::U64,
        4 => ElementType::F32,
        5 => ElementType::F64,
        e => {
            return Err(Error::Invalid(format!(
                "element type {e} is unknown: use one of STRATA_ELEM_I32 .. STRATA_ELEM_F64 (0..5)"
            )));
        }
    };
    let policy = match o.policy {
        0 => EvictionPolicy::Clock,
        1 => EvictionPolicy::ScanResistant {
            protected_fraction: o.protected_fraction,
        },
        p => {
            return Err(Error::Invalid(format!(
                "eviction policy {p} is unknown: use STRATA_POLICY_CLOCK (0) or STRATA_POLICY_SCAN_RESISTANT (1)"
            )));
        }
    };
    Ok(SpaceOptions {
        page_size: o.page_size,
        cache_bytes: o.cache_bytes,
        element,
        policy,
        read_through: o.read_through != 0,
        host_cache_bytes: None,
        // Not in the C options (yet): on by default, STRATA_GPU_WRITE_BACK=off turns it off.
        background_write_back: strata_gpu::space::default_write_back(),
        peers: Vec::new(),
        // Not in the C options (yet): auto by default, STRATA_GPU_REMOTE_ACCESS=off|auto|N.
        remote_access: SpaceOptions::default().remote_access,
        // Not in the C options (yet): whole pages, STRATA_GPU_SECTOR=SIZE turns sub-page
        // fetch on (an unreadable value is reported as invalid).
        sector_bytes: strata_gpu::space::sector_from_env()
            .map_err(|e| Error::Invalid(e.to_string()))?
            .flatten(),
    })
}

/// Fills `*o` with the defaults (64 KiB pages, 1 GiB cache, u64 elements, clock).
///
/// # Safety
/// `o` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_options_default(o: *mut CSpaceOptions) {
    let d = SpaceOptions::default();
    if o.is_null() {
        return;
    }
    let c = CSpaceOptions {
        page_size: d.page_size,
        cache_bytes: d.cache_bytes,
        element: 3,
        policy: 0,
        protected_fraction: 0.5,
        read_through: 0,
    };
    // SAFETY: `o` is non-null and valid for a write (caller's contract).
    unsafe { o.write(c) };
}

pub(crate) fn put<T>(out: *mut T, value: T) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::Invalid("out is NULL".into()));
    }
    // SAFETY: `out` is non-null and valid for a write (the contract of every strata_* call
    // with an out parameter, stated in strata.h).
    unsafe { out.write(value) };
    Ok(())
}

/// Opens GPU `ordinal` (its primary context, which the CUDA runtime shares) and loads
/// Strata's kernels. Fails with `STRATA_E_NO_DRIVER` where no CUDA driver is installed.
///
/// # Safety
/// `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_gpu_open(ordinal: i32, out: *mut *mut CGpu) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(Error::Invalid("out is NULL".into()));
        }
        let ordinal = usize::try_from(ordinal)
            .map_err(|_| Error::Invalid(format!("GPU ordinal {ordinal} is negative")))?;
        let strata = Strata::new(ordinal)?;
        put(out, Box::into_raw(Box::new(CGpu { strata })))
    })
}

/// Releases a GPU opened by `strata_gpu_open` (NULL is ignored). Destroy its spaces first.
///
/// # Safety
/// `g` is null or a live GPU, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_gpu_close(g: *mut CGpu) {
    if !g.is_null() {
        // SAFETY: from Box::into_raw in strata_gpu_open, closed once (caller's contract).
        drop(unsafe { Box::from_raw(g) });
    }
}

/// Creates a zero-filled space of `size_bytes` on `g` (`options` NULL: defaults).
///
/// # Safety
/// `g` is a live GPU; `options` is null or valid; `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_create(
    g: *const CGpu,
    size_bytes: u64,
    options: *const CSpaceOptions,
    out: *mut *mut CSpace,
) -> i32 {
    guard(|| {
        let g = non_null(g, "gpu")?;
        let options = if options.is_null() {
            SpaceOptions::default()
        } else {
            space_options(non_null(options, "options")?)?
        };
        let space = g.strata.space(size_bytes, &options)?;
        put(out, Box::into_raw(Box::new(CSpace { space })))
    })
}

/// Destroys a space (NULL is ignored). Read back what you need first: its data is freed.
///
/// # Safety
/// `s` is null or a live space, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_destroy(s: *mut CSpace) {
    if !s.is_null() {
        // SAFETY: from Box::into_raw in strata_space_create, destroyed once.
        drop(unsafe { Box::from_raw(s) });
    }
}

fn space_mut<'a>(s: *mut CSpace) -> Result<&'a mut CSpace, Error> {
    // SAFETY: null or a live space from strata_space_create (strata.h's contract), not used
    // by another thread at the same time.
    unsafe { s.as_mut() }.ok_or_else(|| Error::Invalid("space is NULL".into()))
}

fn bytes<'a>(data: *const c_void, len: u64) -> Result<&'a [u8], Error> {
    let len = usize::try_from(len).map_err(|_| Error::Invalid("length too large".into()))?;
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(Error::Invalid("data is NULL".into()));
    }
    // SAFETY: the caller passes `len` readable bytes at `data` (strata.h's contract).
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
}

/// The handle kernels take by value (`StrataSpace` in `strata.cuh`, same 96 bytes).
///
/// # Safety
/// `s` is a live space; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_handle(
    s: *const CSpace,
    out: *mut SpaceHandle<'static>,
) -> i32 {
    guard(|| put(out, non_null(s, "space")?.space.handle()))
}

/// The space's size in bytes and page size (either out pointer may be NULL).
///
/// # Safety
/// `s` is a live space; non-null outs are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_info(
    s: *const CSpace,
    size_bytes: *mut u64,
    page_size: *mut u64,
    frames: *mut u32,
) -> i32 {
    guard(|| {
        let s = &non_null(s, "space")?.space;
        for (p, v) in [(size_bytes, s.size()), (page_size, s.page_size())] {
            if !p.is_null() {
                put(p, v)?;
            }
        }
        if !frames.is_null() {
            put(frames, s.frames())?;
        }
        Ok(())
    })
}

/// Copies `len` bytes from `data` into the space at byte `offset`.
///
/// # Safety
/// `s` is a live space; `data` has `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_fill(
    s: *mut CSpace,
    offset: u64,
    data: *const c_void,
    len: u64,
) -> i32 {
    guard(|| {
        let s = space_mut(s)?;
        Ok(s.space.fill_from_slice(offset, bytes(data, len)?)?)
    })
}

/// Copies `len` bytes of the space at byte `offset` into `out` (dirty pages are flushed
/// first). Synchronize your own kernels (`cudaDeviceSynchronize`) before calling.
///
/// # Safety
/// `s` is a live space; `out` has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_read(
    s: *const CSpace,
    offset: u64,
    out: *mut c_void,
    len: u64,
) -> i32 {
    guard(|| {
        let s = non_null(s, "space")?;
        let len = usize::try_from(len).map_err(|_| Error::Invalid("length too large".into()))?;
        if len == 0 {
            return Ok(());
        }
        if out.is_null() {
            return Err(Error::Invalid("out is NULL".into()));
        }
        // SAFETY: the caller passes `len` writable bytes at `out` (strata.h's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len) };
        Ok(s.space.read_back(offset, dst)?)
    })
}

fn range(offset: u64, len: u64) -> Result<std::ops::Range<u64>, Error> {
    let end = offset
        .checked_add(len)
        .ok_or_else(|| Error::Invalid(format!("range {offset}+{len} overflows")))?;
    Ok(offset..end)
}

/// Brings the pages of `[offset, offset+len)` into the GPU cache now.
///
/// # Safety
/// `s` is a live space.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_prefetch(s: *const CSpace, offset: u64, len: u64) -> i32 {
    guard(|| Ok(non_null(s, "space")?.space.prefetch(range(offset, len)?)?))
}

/// Drops the pages of `[offset, offset+len)` from the GPU cache (dirty ones written back).
///
/// # Safety
/// `s` is a live space.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_evict(s: *const CSpace, offset: u64, len: u64) -> i32 {
    guard(|| Ok(non_null(s, "space")?.space.evict(range(offset, len)?)?))
}

/// Writes every dirty cached page back to the host copy.
///
/// # Safety
/// `s` is a live space.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_flush(s: *const CSpace) -> i32 {
    guard(|| Ok(non_null(s, "space")?.space.flush()?))
}

/// Returns `STRATA_E_KERNEL_OUT_OF_RANGE` (with the first bad index in the message) if a
/// kernel accessed an element outside the space.
///
/// # Safety
/// `s` is a live space.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_check_errors(s: *const CSpace) -> i32 {
    guard(|| Ok(non_null(s, "space")?.space.check_errors()?))
}

/// Copies the space's counters into `*out`.
///
/// # Safety
/// `s` is a live space; `out` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_stats(s: *const CSpace, out: *mut CSpaceStats) -> i32 {
    guard(|| put(out, non_null(s, "space")?.space.stats()?.into()))
}

/// Zeroes the space's counters.
///
/// # Safety
/// `s` is a live space.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_space_reset_stats(s: *const CSpace) -> i32 {
    guard(|| Ok(non_null(s, "space")?.space.reset_stats()?))
}

const _: () = assert!(size_of::<CSpaceOptions>() == 40);
const _: () = assert!(size_of::<CSpaceStats>() == 72);
