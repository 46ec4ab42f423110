//! `libstrata_gdr.so`: GDRCopy's C API (`include/gdrapi.h`) over strata-copy, so a program
//! written for GDRCopy builds against Strata by changing its link line, with no kernel module.
//!
//! Every call returns 0 or a positive errno (and sets `errno`), like GDRCopy's. Handles are
//! numbers looked up in tables, never dereferenced, so a stale or bogus handle gets `EINVAL`
//! instead of a crash. Where no true CPU mapping exists, `gdr_map` returns a PROT_NONE shadow
//! ([`shadow`]): `gdr_copy_*` through it works, a direct load or store faults with a message.

pub mod shadow;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_ulong, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use strata_copy::{Copier, CopyError, Pinned};

/// GDRCopy API version this library implements.
pub const API_MAJOR: c_int = 2;
/// Minor part.
pub const API_MINOR: c_int = 4;
/// GPU page size GDRCopy reports and aligns mappings to.
pub const GPU_PAGE_SIZE: u64 = 1 << 16;

/// `gdr_mh_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GdrMh {
    /// The handle number.
    pub h: c_ulong,
}

/// `gdr_info_v2_t` (the bitfields `mapped:1, wc_mapping:1` share one `unsigned`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GdrInfo {
    /// Start of the pinned range.
    pub va: u64,
    /// Bytes mapped (pinned size rounded up to GPU pages within the allocation).
    pub mapped_size: u64,
    /// GPU page size.
    pub page_size: u32,
    /// Always 0 (no invalidation timing).
    pub tm_cycles: u64,
    /// Always 0.
    pub cycles_per_ms: u32,
    /// Bit 0: mapped; bit 1: write-combined mapping.
    pub flags: u32,
    /// `gdr_mapping_type_t`.
    pub mapping_type: c_int,
}

#[derive(Debug)]
struct Gdr {
    pid: u32,
    copiers: Mutex<HashMap<usize, Copier>>,
}

#[derive(Debug)]
struct Pin {
    gdr: u64,
    pinned: Arc<Pinned>,
    mapping: Option<shadow::Shadow>,
    cpu_map: Option<*mut u8>,
}

// SAFETY: `cpu_map` is only an address handed to the caller; we never dereference it here.
unsafe impl Send for Pin {}

#[derive(Debug, Default)]
struct Tables {
    gdrs: HashMap<u64, Arc<Gdr>>,
    pins: HashMap<u64, Pin>,
}

static TABLES: Mutex<Option<Tables>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn tables() -> MutexGuard<'static, Option<Tables>> {
    TABLES.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_tables<R>(f: impl FnOnce(&mut Tables) -> R) -> R {
    let mut t = tables();
    f(t.get_or_insert_with(Tables::default))
}

fn set_errno(e: c_int) -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
    e
}

fn fail(e: &CopyError) -> c_int {
    set_errno(e.errno())
}

fn gdr_id(g: *mut c_void) -> u64 {
    g as u64
}

fn lookup_gdr(g: *mut c_void) -> Result<Arc<Gdr>, c_int> {
    let gdr = with_tables(|t| t.gdrs.get(&gdr_id(g)).cloned()).ok_or(libc::EINVAL)?;
    if gdr.pid != std::process::id() {
        return Err(libc::EPERM);
    }
    Ok(gdr)
}

/// Opens the library: returns a handle, or NULL with `errno` set (ENODEV without a driver).
#[unsafe(no_mangle)]
pub extern "C" fn gdr_open() -> *mut c_void {
    if !strata_copy::sys::driver_present() {
        set_errno(libc::ENODEV);
        return std::ptr::null_mut();
    }
    // Opening GPU 0 initialises CUDA and checks a GPU exists; other GPUs open on first pin.
    let copier = match Copier::open(0) {
        Ok(c) => c,
        Err(e) => {
            fail(&e);
            return std::ptr::null_mut();
        }
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) << 4;
    let gdr = Arc::new(Gdr {
        pid: std::process::id(),
        copiers: Mutex::new(HashMap::from([(0, copier)])),
    });
    with_tables(|t| t.gdrs.insert(id, gdr));
    id as *mut c_void
}

/// Closes the handle: unmaps and unpins everything still pinned through it.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_close(g: *mut c_void) -> c_int {
    let id = gdr_id(g);
    let (gdr, pins) = with_tables(|t| {
        let gdr = t.gdrs.remove(&id);
        let keys: Vec<u64> = t
            .pins
            .iter()
            .filter(|(_, p)| p.gdr == id)
            .map(|(k, _)| *k)
            .collect();
        let pins: Vec<Pin> = keys.iter().filter_map(|k| t.pins.remove(k)).collect();
        (gdr, pins)
    });
    drop(pins);
    match gdr {
        Some(_) => 0,
        None => set_errno(libc::EINVAL),
    }
}

/// Pins `[addr, addr + size)` of device memory. Tokens are accepted and ignored (GDRCopy
/// deprecated them).
///
/// # Safety
/// `handle` must be NULL or point to writable memory for a `gdr_mh_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_pin_buffer(
    g: *mut c_void,
    addr: c_ulong,
    size: usize,
    _p2p_token: u64,
    _va_space: u32,
    handle: *mut GdrMh,
) -> c_int {
    if handle.is_null() {
        return set_errno(libc::EINVAL);
    }
    let gdr = match lookup_gdr(g) {
        Ok(g) => g,
        Err(e) => return set_errno(e),
    };
    let result = (|| -> Result<Pinned, CopyError> {
        let first = gdr
            .copiers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .next()
            .cloned()
            .ok_or_else(|| CopyError::Invalid("no GPU opened".into()))?;
        let info = strata_copy::sys::pointer_info(first.context(), addr).map_err(|e| {
            CopyError::NotDeviceMemory {
                addr,
                ordinal: 0,
                why: e.to_string(),
            }
        })?;
        let ordinal = usize::try_from(info.ordinal)
            .map_err(|_| CopyError::Invalid("device ordinal".into()))?;
        let copier = {
            let mut c = gdr.copiers.lock().unwrap_or_else(|e| e.into_inner());
            match c.get(&ordinal) {
                Some(c) => c.clone(),
                None => {
                    let new = Copier::open(ordinal)?;
                    c.insert(ordinal, new.clone());
                    new
                }
            }
        };
        // Pin whole GPU pages where the allocation allows, as gdrdrv does.
        let size = size as u64;
        let end = (addr.checked_add(size).ok_or(CopyError::BadSize(size))?).div_ceil(GPU_PAGE_SIZE)
            * GPU_PAGE_SIZE;
        let end = end.min(info.base + info.size).max(addr + size);
        copier.pin(addr, end - addr)
    })();
    match result {
        Ok(pinned) => {
            let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            with_tables(|t| {
                t.pins.insert(
                    id,
                    Pin {
                        gdr: gdr_id(g),
                        pinned: Arc::new(pinned),
                        mapping: None,
                        cpu_map: None,
                    },
                )
            });
            // SAFETY: checked non-null; the caller provides writable memory.
            unsafe { handle.write(GdrMh { h: id }) };
            0
        }
        Err(e) => fail(&e),
    }
}

fn pin_of_gdr(g: *mut c_void, h: GdrMh) -> Result<(), c_int> {
    lookup_gdr(g)?;
    with_tables(|t| match t.pins.get(&h.h) {
        Some(p) if p.gdr == gdr_id(g) => Ok(()),
        _ => Err(libc::EINVAL),
    })
}

/// Unpins (unmapping first if still mapped).
#[unsafe(no_mangle)]
pub extern "C" fn gdr_unpin_buffer(g: *mut c_void, handle: GdrMh) -> c_int {
    if let Err(e) = pin_of_gdr(g, handle) {
        return set_errno(e);
    }
    let pin = with_tables(|t| t.pins.remove(&handle.h));
    drop(pin);
    0
}

/// Sets `*flag` to 1 when the pinned device memory was freed since pinning, else 0.
///
/// # Safety
/// `flag` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_get_callback_flag(
    g: *mut c_void,
    handle: GdrMh,
    flag: *mut c_int,
) -> c_int {
    if flag.is_null() {
        return set_errno(libc::EINVAL);
    }
    if let Err(e) = pin_of_gdr(g, handle) {
        return set_errno(e);
    }
    let pinned = with_tables(|t| t.pins.get(&handle.h).map(|p| p.pinned.clone()));
    let freed = pinned.is_some_and(|p| matches!(p.check(0, 0), Err(CopyError::Freed { .. })));
    // SAFETY: checked non-null; the caller provides writable memory.
    unsafe { flag.write(c_int::from(freed)) };
    0
}

/// Fills `*info` for a pinned handle.
///
/// # Safety
/// `info` must be NULL or point to writable memory for a `gdr_info_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_get_info_v2(
    g: *mut c_void,
    handle: GdrMh,
    info: *mut GdrInfo,
) -> c_int {
    if info.is_null() {
        return set_errno(libc::EINVAL);
    }
    if let Err(e) = pin_of_gdr(g, handle) {
        return set_errno(e);
    }
    let out = with_tables(|t| {
        t.pins.get(&handle.h).map(|p| {
            let mapped = p.mapping.is_some() || p.cpu_map.is_some();
            let wc = p.cpu_map.is_some();
            GdrInfo {
                va: p.pinned.addr(),
                mapped_size: p.pinned.size(),
                page_size: 1 << 16,
                tm_cycles: 0,
                cycles_per_ms: 0,
                flags: u32::from(mapped) | (u32::from(wc) << 1),
                mapping_type: if wc { 1 } else { 0 },
            }
        })
    });
    match out {
        Some(v) => {
            // SAFETY: checked non-null; the caller provides writable memory.
            unsafe { info.write(v) };
            0
        }
        None => set_errno(libc::EINVAL),
    }
}

/// Maps a pinned handle. The pinned address must be GPU-page (64 KiB) aligned, as with
/// GDRCopy. Without a true CPU mapping `*va` is a PROT_NONE shadow: use `gdr_copy_*`.
///
/// # Safety
/// `va` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_map(
    g: *mut c_void,
    handle: GdrMh,
    va: *mut *mut c_void,
    size: usize,
) -> c_int {
    if va.is_null() {
        return set_errno(libc::EINVAL);
    }
    if let Err(e) = pin_of_gdr(g, handle) {
        return set_errno(e);
    }
    let r = with_tables(|t| {
        let p = t.pins.get_mut(&handle.h).ok_or(libc::EINVAL)?;
        if p.mapping.is_some() || p.cpu_map.is_some() {
            return Err(libc::EAGAIN);
        }
        if p.pinned.addr() % GPU_PAGE_SIZE != 0 || size == 0 || size as u64 > p.pinned.size() {
            return Err(libc::EINVAL);
        }
        if let Some(cpu) = p.pinned.cpu_mapping() {
            p.cpu_map = Some(cpu);
            return Ok(cpu);
        }
        let s = shadow::Shadow::new(size)?;
        let ptr = s.ptr();
        p.mapping = Some(s);
        Ok(ptr)
    });
    match r {
        Ok(ptr) => {
            // SAFETY: checked non-null; the caller provides writable memory.
            unsafe { va.write(ptr.cast()) };
            0
        }
        Err(e) => set_errno(e),
    }
}

/// Unmaps what `gdr_map` returned.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_unmap(g: *mut c_void, handle: GdrMh, va: *mut c_void, _size: usize) -> c_int {
    if let Err(e) = pin_of_gdr(g, handle) {
        return set_errno(e);
    }
    let r = with_tables(|t| {
        let p = t.pins.get_mut(&handle.h).ok_or(libc::EINVAL)?;
        match (&p.mapping, p.cpu_map) {
            (Some(s), _) if s.ptr().cast::<c_void>() == va => {
                p.mapping = None;
                Ok(())
            }
            (_, Some(cpu)) if cpu.cast::<c_void>() == va => {
                p.cpu_map = None;
                Ok(())
            }
            _ => Err(libc::EINVAL),
        }
    });
    match r {
        Ok(()) => 0,
        Err(e) => set_errno(e),
    }
}

fn mapped_offset(
    handle: GdrMh,
    map_ptr: *const c_void,
    len: usize,
) -> Result<(Arc<Pinned>, u64), c_int> {
    with_tables(|t| {
        let p = t.pins.get(&handle.h).ok_or(libc::EINVAL)?;
        let base = match (&p.mapping, p.cpu_map) {
            (Some(s), _) => s.ptr() as usize,
            (None, Some(cpu)) => cpu as usize,
            (None, None) => return Err(libc::EINVAL),
        };
        let off = (map_ptr as usize).checked_sub(base).ok_or(libc::EINVAL)? as u64;
        if off
            .checked_add(len as u64)
            .is_none_or(|end| end > p.pinned.size())
        {
            return Err(libc::EINVAL);
        }
        Ok((p.pinned.clone(), off))
    })
}

/// Copies `size` bytes from host `h_ptr` to the mapping at `map_d_ptr`; returns once they are
/// in device memory (visible to kernels launched afterwards).
///
/// # Safety
/// `h_ptr` must be readable for `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_copy_to_mapping(
    handle: GdrMh,
    map_d_ptr: *mut c_void,
    h_ptr: *const c_void,
    size: usize,
) -> c_int {
    if size == 0 {
        return 0;
    }
    if h_ptr.is_null() {
        return set_errno(libc::EINVAL);
    }
    let (pinned, off) = match mapped_offset(handle, map_d_ptr, size) {
        Ok(v) => v,
        Err(e) => return set_errno(e),
    };
    // SAFETY: the caller guarantees h_ptr is readable for size bytes.
    let src = unsafe { std::slice::from_raw_parts(h_ptr.cast::<u8>(), size) };
    match pinned.copy_to(off, src) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// Copies `size` bytes from the mapping at `map_d_ptr` to host `h_ptr`.
///
/// # Safety
/// `h_ptr` must be writable for `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_copy_from_mapping(
    handle: GdrMh,
    h_ptr: *mut c_void,
    map_d_ptr: *const c_void,
    size: usize,
) -> c_int {
    if size == 0 {
        return 0;
    }
    if h_ptr.is_null() {
        return set_errno(libc::EINVAL);
    }
    let (pinned, off) = match mapped_offset(handle, map_d_ptr, size) {
        Ok(v) => v,
        Err(e) => return set_errno(e),
    };
    // SAFETY: the caller guarantees h_ptr is writable for size bytes.
    let dst = unsafe { std::slice::from_raw_parts_mut(h_ptr.cast::<u8>(), size) };
    match pinned.copy_from(off, dst) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// The API version implemented.
///
/// # Safety
/// Each pointer must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_runtime_get_version(major: *mut c_int, minor: *mut c_int) {
    // SAFETY: written only when non-null; the caller provides writable memory.
    unsafe {
        if !major.is_null() {
            major.write(API_MAJOR);
        }
        if !minor.is_null() {
            minor.write(API_MINOR);
        }
    }
}

/// There is no gdrdrv: reports the interface level emulated (2.4) for a valid handle.
///
/// # Safety
/// Each pointer must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_driver_get_version(
    g: *mut c_void,
    major: *mut c_int,
    minor: *mut c_int,
) -> c_int {
    if let Err(e) = lookup_gdr(g) {
        return set_errno(e);
    }
    if major.is_null() || minor.is_null() {
        return set_errno(libc::EINVAL);
    }
    // SAFETY: checked non-null; the caller provides writable memory.
    unsafe {
        major.write(API_MAJOR);
        minor.write(API_MINOR);
    }
    0
}

/// Strata extension: a static description of the backend behind `g` (NULL for a bad handle).
#[unsafe(no_mangle)]
pub extern "C" fn strata_gdr_backend(g: *mut c_void) -> *const c_char {
    let Ok(gdr) = lookup_gdr(g) else {
        return std::ptr::null();
    };
    let c = gdr.copiers.lock().unwrap_or_else(|e| e.into_inner());
    match c.values().next().map(|c| c.report().backend) {
        Some(strata_copy::Backend::DmaBufMmap) => c"dma-buf mmap".as_ptr(),
        _ => c"gpu copy service (no CPU mapping: gdr_map returns a PROT_NONE shadow)".as_ptr(),
    }
}
