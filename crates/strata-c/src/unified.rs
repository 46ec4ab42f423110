//! Unified allocations from C (`strata_alloc` ... `strata_free`): one copy of the data that C
//! code reads and writes through a pointer and kernels built with nvcc through
//! `strata/unified.cuh`, with hints, prefetch, discard and syncs (crate strata-unified).
//!
//! Allocations are named by handles (`strata_unified_t`, a number) kept in a registry rather
//! than by pointers, so a freed or never-allocated handle is reported (`STRATA_E_HANDLE`) by
//! every call instead of being followed: a double free or a use after free is an error, not a
//! crash. Handles are never reused.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use strata_unified::{Advice, DirtyTracking, Location, Unified, UnifiedHandle, UnifiedOptions};

use crate::error::{Error, guard};
use crate::gpu::{CGpu, put};

/// Options of a new unified allocation (`strata_unified_options_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUnifiedOptions {
    /// Page size in bytes (power of two, 4 KiB to 2 MiB).
    pub page_size: u64,
    /// GPU memory for the allocation's page cache in bytes.
    pub cache_bytes: u64,
    /// `STRATA_TRACK_WRITE_PROTECT` (2, the default), `STRATA_TRACK_HASH` (0) or
    /// `STRATA_TRACK_DECLARED` (1).
    pub dirty_tracking: u32,
    /// `STRATA_UNIFIED_*` bits (0, the default: kernels read missed pages in place). Other
    /// bits are refused, so a bit added later is never silently ignored by an older library.
    pub flags: u32,
}

/// `STRATA_UNIFIED_NO_READS_IN_PLACE`: kernels bring every page they miss into the GPU cache
/// instead of reading it in place over the bus ([`UnifiedOptions::reads_in_place`] off).
pub const NO_READS_IN_PLACE: u32 = 1;

/// Every flag bit this library knows.
const KNOWN_FLAGS: u32 = NO_READS_IN_PLACE;

impl Default for CUnifiedOptions {
    fn default() -> Self {
        let d = UnifiedOptions::default();
        CUnifiedOptions {
            page_size: d.page_size,
            cache_bytes: d.cache_bytes,
            dirty_tracking: 2,
            flags: 0,
        }
    }
}

/// Converts C options, refusing unknown values.
fn options(o: &CUnifiedOptions) -> Result<UnifiedOptions, Error> {
    let dirty_tracking = match o.dirty_tracking {
        0 => DirtyTracking::Hash,
        1 => DirtyTracking::Declared,
        2 => DirtyTracking::WriteProtect,
        t => {
            return Err(Error::Invalid(format!(
                "dirty tracking {t} is unknown: use STRATA_TRACK_WRITE_PROTECT (2), STRATA_TRACK_HASH (0) or STRATA_TRACK_DECLARED (1)"
            )));
        }
    };
    let unknown = o.flags & !KNOWN_FLAGS;
    if unknown != 0 {
        return Err(Error::Invalid(format!(
            "strata_unified_options_t.flags has unknown bits {unknown:#x}: the only flag is STRATA_UNIFIED_NO_READS_IN_PLACE ({NO_READS_IN_PLACE:#x}); start from strata_unified_options_default"
        )));
    }
    Ok(UnifiedOptions {
        page_size: o.page_size,
        cache_bytes: o.cache_bytes,
        dirty_tracking,
        reads_in_place: o.flags & NO_READS_IN_PLACE == 0,
        ..UnifiedOptions::default()
    })
}

fn location(l: i32, what: &str) -> Result<Option<Location>, Error> {
    match l {
        0 => Ok(None),
        1 => Ok(Some(Location::Cpu)),
        2 => Ok(Some(Location::Gpu)),
        _ => Err(Error::Invalid(format!(
            "{what} {l} is unknown: use STRATA_LOCATION_NONE (0), STRATA_LOCATION_CPU (1) or STRATA_LOCATION_GPU (2)"
        ))),
    }
}

fn some_location(l: i32, what: &str) -> Result<Location, Error> {
    location(l, what)?.ok_or_else(|| {
        Error::Invalid(format!(
            "{what} must be STRATA_LOCATION_CPU (1) or STRATA_LOCATION_GPU (2), not NONE"
        ))
    })
}

/// The live allocations by handle.
#[derive(Default)]
struct Registry {
    next: u64,
    live: HashMap<u64, Arc<Mutex<Unified>>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    // A panic while the lock was held left the map itself intact (inserts and removes are
    // single calls), so the guard is taken back.
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

fn not_live(h: u64) -> Error {
    Error::Handle(format!(
        "handle {h} is not a live unified allocation: it was freed already or never returned by strata_alloc (each allocation is freed once, and not used after)"
    ))
}

/// Runs `f` on the allocation `h`.
fn with<R>(h: u64, f: impl FnOnce(&mut Unified) -> Result<R, Error>) -> Result<R, Error> {
    let a = registry()
        .as_ref()
        .and_then(|r| r.live.get(&h).cloned())
        .ok_or_else(|| not_live(h))?;
    let mut u = a.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut u)
}

fn range(offset: u64, len: u64) -> Result<std::ops::Range<u64>, Error> {
    let end = offset.checked_add(len).ok_or_else(|| {
        Error::Invalid(format!(
            "offset {offset} + len {len} overflows: pass a range inside the allocation"
        ))
    })?;
    Ok(offset..end)
}

/// Fills `*out` with the default options.
///
/// # Safety
/// `out` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_unified_options_default(out: *mut CUnifiedOptions) -> i32 {
    guard(|| put(out, CUnifiedOptions::default()))
}

/// Allocates `size` bytes (zero-filled) on `gpu`, stores the handle in `*out` and, if `cpu`
/// is not NULL, the CPU address of byte 0 in `*cpu`. Size and options are checked before the
/// GPU is needed.
///
/// # Safety
/// `gpu` is null or a live GPU; `options` null or valid; `out` valid for a write; `cpu` null
/// or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_alloc(
    gpu: *const CGpu,
    size: u64,
    opts: *const CUnifiedOptions,
    out: *mut u64,
    cpu: *mut *mut c_void,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(Error::Invalid("out is NULL".into()));
        }
        // SAFETY: null or valid (the caller's contract).
        let o = unsafe { opts.as_ref() }.copied().unwrap_or_default();
        let o = options(&o)?;
        o.validate(size)?;
        // SAFETY: null or a live GPU from strata_gpu_open (the caller's contract).
        let g = unsafe { gpu.as_ref() }
            .ok_or_else(|| Error::Invalid("gpu is NULL: open one with strata_gpu_open".into()))?;
        let u = Unified::new(&g.strata, size, &o)?;
        let ptr = u.as_ptr().cast::<c_void>();
        let h = {
            let mut r = registry();
            let r = r.get_or_insert_with(Registry::default);
            r.next += 1;
            r.live.insert(r.next, Arc::new(Mutex::new(u)));
            r.next
        };
        put(out, h)?;
        if !cpu.is_null() {
            put(cpu, ptr)?;
        }
        Ok(())
    })
}

/// Frees an allocation (after waiting for the GPU's kernels). A handle freed already, or
/// never allocated, is `STRATA_E_HANDLE`; the pointer is invalid after a successful free.
#[unsafe(no_mangle)]
pub extern "C" fn strata_free(h: u64) -> i32 {
    guard(|| {
        let a = registry()
            .as_mut()
            .and_then(|r| r.live.remove(&h))
            .ok_or_else(|| not_live(h))?;
        // The allocation is dropped here, outside the registry's lock (dropping waits for the
        // GPU); a call on another thread still holding it finishes first.
        drop(a);
        Ok(())
    })
}

/// The CPU address of byte 0 and the size in bytes (either out may be NULL).
///
/// # Safety
/// Non-null outs are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_unified_info(
    h: u64,
    cpu: *mut *mut c_void,
    size: *mut u64,
    page_size: *mut u64,
) -> i32 {
    guard(|| {
        with(h, |u| {
            if !cpu.is_null() {
                put(cpu, u.as_ptr().cast::<c_void>())?;
            }
            if !size.is_null() {
                put(size, u.len())?;
            }
            if !page_size.is_null() {
                put(page_size, u.page_size())?;
            }
            Ok(())
        })
    })
}

/// The value kernels take (`strata_unified_handle_t`, `StrataUnified` in unified.cuh); it may
/// be kept and reused. Sync to the GPU before launching kernels with it, to the CPU after.
///
/// # Safety
/// `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_unified_handle(h: u64, out: *mut UnifiedHandle<'static>) -> i32 {
    guard(|| {
        with(h, |u| {
            let handle = u.handle();
            // The handle is plain data the kernel reads; the allocation outlives its use by the
            // C API's contract (free only after the kernels), as for strata_space_handle.
            put(out.cast::<UnifiedHandle<'_>>(), handle)
        })
    })
}

/// Advice on `[offset, offset + len)`: `STRATA_ADVISE_READ_MOSTLY` (1),
/// `STRATA_ADVISE_UNSET_READ_MOSTLY` (2), `STRATA_ADVISE_PREFERRED_LOCATION` (3, `location`
/// NONE/CPU/GPU), `STRATA_ADVISE_ACCESSED_BY` (4, `location` CPU/GPU).
#[unsafe(no_mangle)]
pub extern "C" fn strata_advise(h: u64, offset: u64, len: u64, advice: i32, loc: i32) -> i32 {
    guard(|| {
        let a = match advice {
            1 => Advice::ReadMostly(true),
            2 => Advice::ReadMostly(false),
            3 => Advice::PreferredLocation(location(loc, "location")?),
            4 => Advice::AccessedBy(some_location(loc, "location")?),
            _ => {
                return Err(Error::Invalid(format!(
                    "advice {advice} is unknown: use STRATA_ADVISE_READ_MOSTLY (1), STRATA_ADVISE_UNSET_READ_MOSTLY (2), STRATA_ADVISE_PREFERRED_LOCATION (3) or STRATA_ADVISE_ACCESSED_BY (4)"
                )));
            }
        };
        let r = range(offset, len)?;
        with(h, |u| Ok(u.advise(r, a)?))
    })
}

/// Moves `[offset, offset + len)` toward `location` (CPU or GPU) ahead of use.
#[unsafe(no_mangle)]
pub extern "C" fn strata_prefetch(h: u64, offset: u64, len: u64, loc: i32) -> i32 {
    guard(|| {
        let to = some_location(loc, "prefetch destination")?;
        let r = range(offset, len)?;
        with(h, |u| u.prefetch(r, to).map(|_| ()).map_err(Error::from))
    })
}

/// Discards the whole pages inside `[offset, offset + len)`: GPU copies dropped without
/// write-back. `*pages` (if not NULL) gets the number of pages discarded.
///
/// # Safety
/// `pages` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strata_discard(h: u64, offset: u64, len: u64, pages: *mut u64) -> i32 {
    guard(|| {
        let r = range(offset, len)?;
        let n = with(h, |u| Ok(u.discard(r)?))?;
        if !pages.is_null() {
            put(pages, n)?;
        }
        Ok(())
    })
}

/// Syncs `[offset, offset + len)`: `STRATA_SYNC_TO_GPU` (1) before kernels, `STRATA_SYNC_TO_CPU`
/// (2) after them, `STRATA_SYNC_TO_CPU_OVERWRITING` (3: conflicts resolved in the GPU's favour).
#[unsafe(no_mangle)]
pub extern "C" fn strata_sync(h: u64, offset: u64, len: u64, direction: i32) -> i32 {
    guard(|| {
        let r = range(offset, len)?;
        match direction {
            1 => with(h, |u| u.sync_to_gpu(r).map(|_| ()).map_err(Error::from)),
            2 => with(h, |u| u.sync_to_cpu(r).map(|_| ()).map_err(Error::from)),
            3 => with(h, |u| {
                u.sync_to_cpu_overwriting(r)
                    .map(|_| ())
                    .map_err(Error::from)
            }),
            d => Err(Error::Invalid(format!(
                "sync direction {d} is unknown: use STRATA_SYNC_TO_GPU (1), STRATA_SYNC_TO_CPU (2) or STRATA_SYNC_TO_CPU_OVERWRITING (3)"
            ))),
        }
    })
}

/// Declares that the CPU wrote `[offset, offset + len)` (needed with `STRATA_TRACK_DECLARED`).
#[unsafe(no_mangle)]
pub extern "C" fn strata_mark_written(h: u64, offset: u64, len: u64) -> i32 {
    guard(|| {
        let r = range(offset, len)?;
        with(h, |u| Ok(u.mark_cpu_written(r)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_reach_the_options_and_unknown_bits_are_named() {
        let d = CUnifiedOptions::default();
        assert_eq!(d.flags, 0);
        assert!(options(&d).expect("defaults").reads_in_place);
        let off = CUnifiedOptions {
            flags: NO_READS_IN_PLACE,
            ..d
        };
        let o = options(&off).expect("the flag is accepted");
        assert!(!o.reads_in_place);
        assert_eq!(
            (o.page_size, o.cache_bytes, o.dirty_tracking),
            (d.page_size, d.cache_bytes, DirtyTracking::WriteProtect),
            "the other options are kept"
        );
        for bad in [2u32, 0x8000_0000, NO_READS_IN_PLACE | 0x30] {
            let e = options(&CUnifiedOptions { flags: bad, ..d })
                .expect_err("unknown bits are refused")
                .to_string();
            let unknown = format!("{:#x}", bad & !NO_READS_IN_PLACE);
            assert!(
                e.contains(&format!("unknown bits {unknown}")),
                "{bad:#x}: {e}"
            );
            assert!(e.contains("STRATA_UNIFIED_NO_READS_IN_PLACE"), "{e}");
        }
    }
}
