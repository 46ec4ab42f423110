//! The exported C functions that replace the C library's (`LD_PRELOAD`), and the Rust global
//! allocator of this library, which calls the real C allocator directly so that nothing
//! Strata allocates for itself ever comes back through these functions.
//!
//! Each export decides in a few instructions whether a request is Strata's (at or above the
//! threshold, not from inside Strata, not in a forked child) and otherwise forwards it.
//! Pointers Strata did not hand out are recognised by address (outside the arena) and
//! forwarded untouched. No export unwinds: a panic inside Strata is caught and the request
//! is served by the real allocator (or refused where that is impossible).

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::runtime::{self, Guard, in_arena, wants_arena};
use crate::sys::{self, Real};

/// Runs `f`, turning a panic into `fallback` (a panic must not cross into C).
fn no_unwind<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        sys::write_stderr(b"strata run: internal error (panic) in the interposer; request served by the C library\n");
        fallback
    })
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The real functions; `None` only while they are being looked up.
fn real() -> Option<&'static Real> {
    sys::real()
}

// -----------------------------------------------------------------------------------------
// Rust's allocator for this library: the real C allocator, always.

struct RealAllocator;

// SAFETY: forwards to the C allocator, which meets GlobalAlloc's contract for any layout
// when alignment is honoured (posix_memalign above 16 bytes).
unsafe impl GlobalAlloc for RealAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(r) = real() else {
            return sys::bootstrap_alloc(layout.size().max(layout.align()));
        };
        if layout.align() <= 16 {
            // SAFETY: the real malloc.
            unsafe { (r.malloc)(layout.size()).cast() }
        } else {
            let mut p = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the alignment is a power of two >= pointer size.
            let rc = unsafe { (r.posix_memalign)(&raw mut p, layout.align(), layout.size()) };
            if rc == 0 {
                p.cast()
            } else {
                std::ptr::null_mut()
            }
        }
    }
    /// The real `calloc` where the alignment allows: for large tables (the arena's page table,
    /// 8 bytes per page of a 64 GiB arena) it hands out fresh anonymous memory the kernel
    /// backs only where it is written. The default (`alloc`, then writing zeros) made all of
    /// it resident at start: 145 MiB and 0.1 s for 4 KiB pages.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match real() {
            Some(r) if layout.align() <= 16 => {
                // SAFETY: the real calloc, which returns zeroed memory aligned to 16 bytes.
                unsafe { (r.calloc)(layout.size(), 1).cast() }
            }
            // The bootstrap heap is zeroed and never reused.
            None => sys::bootstrap_alloc(layout.size().max(layout.align())),
            Some(_) => {
                // SAFETY: forwarding the caller's layout to `alloc` above.
                let p = unsafe { self.alloc(layout) };
                if !p.is_null() {
                    // SAFETY: `p` holds `layout.size()` bytes just allocated.
                    unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
                }
                p
            }
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        if sys::is_bootstrap(ptr) {
            return;
        }
        if let Some(r) = real() {
            // SAFETY: `ptr` came from the real allocator (above).
            unsafe { (r.free)(ptr.cast()) };
        }
    }
}

#[global_allocator]
static ALLOCATOR: RealAllocator = RealAllocator;

// -----------------------------------------------------------------------------------------
// malloc family.

unsafe fn real_malloc(size: usize) -> *mut c_void {
    match real() {
        // SAFETY: forwarding to the real malloc.
        Some(r) => unsafe { (r.malloc)(size) },
        None => sys::bootstrap_alloc(size).cast(),
    }
}

/// Arena allocation, or the real allocator if the arena is full.
fn big(size: usize, align: usize, zeroed: bool) -> *mut c_void {
    let p = no_unwind(std::ptr::null_mut(), || {
        runtime::runtime_for(size).alloc(size, align, zeroed, false)
    });
    if !p.is_null() {
        return p.cast();
    }
    let Some(r) = real() else {
        return std::ptr::null_mut();
    };
    let mut out = std::ptr::null_mut();
    // SAFETY: valid out-pointer and a power-of-two alignment.
    let rc = unsafe { (r.posix_memalign)(&raw mut out, align.max(16), size) };
    if rc != 0 {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    }
    no_unwind((), || runtime::runtime_for(size).served_unpaged(size));
    if zeroed {
        // SAFETY: `out` holds `size` bytes.
        unsafe { std::ptr::write_bytes(out.cast::<u8>(), 0, size) };
    }
    out
}

/// # Safety
/// C `malloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    if wants_arena(size) {
        return big(size, 16, false);
    }
    // SAFETY: forwarding.
    unsafe { real_malloc(size) }
}

/// # Safety
/// C `calloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    if wants_arena(total) {
        return big(total, 16, true);
    }
    match real() {
        // SAFETY: forwarding.
        Some(r) => unsafe { (r.calloc)(n, size) },
        // The bootstrap heap is zeroed and never reused.
        None => sys::bootstrap_alloc(total).cast(),
    }
}

/// # Safety
/// C `free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || sys::is_bootstrap(p.cast()) {
        return;
    }
    if in_arena(p as usize) {
        if let Some(rt) = runtime::started() {
            // A forked child has no pager: its copy of the arena is gone, nothing to do.
            if !runtime::forked() {
                no_unwind((), || rt.free(p as usize));
            }
        }
        return;
    }
    if let Some(r) = real() {
        // SAFETY: not ours, so it came from the real allocator.
        unsafe { (r.free)(p) };
    }
}

/// Bytes usable at `p`, whoever allocated it.
unsafe fn usable(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if sys::is_bootstrap(p.cast()) {
        // SAFETY: a bootstrap block.
        return unsafe { sys::bootstrap_size(p.cast()) };
    }
    if in_arena(p as usize) {
        return match runtime::started() {
            Some(rt) if !runtime::forked() => no_unwind(0, || rt.usable(p as usize)),
            _ => 0,
        };
    }
    match real() {
        // SAFETY: a real-allocator block.
        Some(r) => unsafe { (r.malloc_usable_size)(p) },
        None => 0,
    }
}

/// # Safety
/// C `realloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { malloc(size) };
    }
    let ours = in_arena(p as usize);
    if ours
        && !runtime::forked()
        && let Some(rt) = runtime::started()
    {
        if size == 0 {
            no_unwind((), || rt.free(p as usize));
            return std::ptr::null_mut();
        }
        if wants_arena(size) {
            let q = no_unwind(std::ptr::null_mut(), || rt.realloc(p as usize, size));
            if !q.is_null() {
                return q.cast();
            }
        }
        // Shrinking below the threshold (or the arena is full): move to the C library.
        // SAFETY: forwarding.
        let q = unsafe { real_malloc(size) };
        if q.is_null() {
            return q;
        }
        // SAFETY: our block holds `usable(p)` bytes; `q` holds `size`.
        let n = unsafe { usable(p) }.min(size);
        // SAFETY: distinct live blocks of at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), n) };
        no_unwind((), || rt.free(p as usize));
        return q;
    }
    if ours {
        // A forked child: the parent's arena is not in this process (see the crate docs).
        sys::write_stderr(
            b"strata run: a forked child called realloc on memory that Strata pages for its parent; refused\n",
        );
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    }
    let boot = sys::is_bootstrap(p.cast());
    if boot || (!ours && wants_arena(size)) {
        // A C-library (or bootstrap) block growing past the threshold moves into the arena.
        // SAFETY: allocation of the new block.
        let q = unsafe { malloc(size) };
        if q.is_null() {
            return q;
        }
        // SAFETY: `p` is live with `usable(p)` bytes; `q` holds `size`.
        let n = unsafe { usable(p) }.min(size);
        // SAFETY: distinct live blocks of at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), n) };
        // SAFETY: `p` is the caller's block.
        unsafe { free(p) };
        return q;
    }
    match real() {
        // SAFETY: a C-library block, forwarded.
        Some(r) => unsafe { (r.realloc)(p, size) },
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// C `malloc_usable_size`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: forwarding the caller's pointer.
    unsafe { usable(p) }
}

fn aligned(align: usize, size: usize) -> *mut c_void {
    if wants_arena(size) {
        return big(size, align, false);
    }
    let Some(r) = real() else {
        let p = sys::bootstrap_alloc(size + align);
        return if p.is_null() {
            p.cast()
        } else {
            // Bootstrap blocks are 16-aligned; bigger alignments are not needed that early.
            p.cast()
        };
    };
    let mut out = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the caller checked the alignment.
    let rc = unsafe { (r.posix_memalign)(&raw mut out, align, size) };
    if rc == 0 {
        out
    } else {
        set_errno(rc);
        std::ptr::null_mut()
    }
}

/// # Safety
/// C `posix_memalign`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || align < std::mem::size_of::<usize>() {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() && size != 0 {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid out-pointer.
    unsafe { *out = p };
    0
}

/// # Safety
/// C `aligned_alloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align.max(std::mem::size_of::<usize>()), size)
}

/// # Safety
/// C `memalign`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align.max(std::mem::size_of::<usize>()), size)
}

/// # Safety
/// C `valloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(4096, size)
}

/// # Safety
/// C `pvalloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(4096, size.next_multiple_of(4096))
}

// -----------------------------------------------------------------------------------------
// Anonymous mappings.

const PASS_FLAGS: c_int = libc::MAP_FIXED
    | libc::MAP_FIXED_NOREPLACE
    | libc::MAP_SHARED
    | libc::MAP_HUGETLB
    | libc::MAP_GROWSDOWN
    | libc::MAP_STACK
    | libc::MAP_POPULATE
    | libc::MAP_32BIT
    | libc::MAP_LOCKED;

/// Whether a mapping asks for what arena memory is: private, anonymous, read-write, with
/// none of [`PASS_FLAGS`] but those in `allowed`.
fn plain_anonymous(prot: c_int, flags: c_int, fd: c_int, allowed: c_int) -> bool {
    fd == -1
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & PASS_FLAGS & !allowed == 0
}

fn is_ours_to_map(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int) -> bool {
    addr.is_null() && plain_anonymous(prot, flags, fd, 0) && wants_arena(len)
}

/// # Safety
/// C `mmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    if flags & libc::MAP_FIXED != 0
        && runtime::overlaps_arena(addr as usize, len)
        && runtime::program_thread()
    {
        return fixed_over_arena(addr, len, prot, flags, fd);
    }
    let ours = is_ours_to_map(addr, len, prot, flags, fd);
    if ours {
        let p = no_unwind(std::ptr::null_mut(), || {
            runtime::runtime_for(len).alloc(len, 4096, true, true)
        });
        if !p.is_null() {
            return p.cast();
        }
    }
    match real() {
        Some(r) => {
            // SAFETY: forwarding.
            let p = unsafe { (r.mmap)(addr, len, prot, flags, fd, off) };
            if ours && p != libc::MAP_FAILED {
                no_unwind((), || runtime::runtime_for(len).served_unpaged(len));
            }
            p
        }
        None => {
            set_errno(libc::ENOMEM);
            libc::MAP_FAILED
        }
    }
}

/// `mmap(MAP_FIXED)` over arena memory. A fresh private anonymous read-write mapping there
/// is what the arena already is, so the range is cleared in place (what the new mapping would
/// read). Anything else (a file, shared memory, another protection, or a range reaching
/// past the arena) would split the pager's mapping under it, which the pager cannot fill
/// nor track: refused with `EINVAL`, saying so, rather than served wrongly.
fn fixed_over_arena(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
) -> *mut c_void {
    if plain_anonymous(prot, flags, fd, libc::MAP_FIXED)
        && runtime::inside_arena(addr as usize, len)
        && !runtime::forked()
    {
        // SAFETY: the program owns the range it maps over (its own arena memory).
        unsafe { std::ptr::write_bytes(addr.cast::<u8>(), 0, len) };
        return addr;
    }
    sys::write_stderr(
        b"strata run: mmap(MAP_FIXED) of a file, shared memory or another protection over memory Strata pages is not supported (it would split the pager's mapping); refused with EINVAL\n",
    );
    set_errno(libc::EINVAL);
    libc::MAP_FAILED
}

/// # Safety
/// C `mmap64` (the same call on 64-bit Linux).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// C `munmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    if in_arena(addr as usize) {
        if runtime::forked() {
            return 0;
        }
        if let Some(rt) = runtime::started() {
            no_unwind(false, || rt.munmap(addr as usize, len));
        }
        // Unmapping arena space that is no mapping of ours changes nothing, as munmap of
        // an unmapped range does.
        return 0;
    }
    match real() {
        // SAFETY: forwarding.
        Some(r) => unsafe { (r.munmap)(addr, len) },
        None => 0,
    }
}

/// # Safety
/// C `mremap` (the optional fifth argument is read only with `MREMAP_FIXED`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    if flags & libc::MREMAP_FIXED != 0
        && runtime::overlaps_arena(new_addr as usize, new_len)
        && !runtime::forked()
    {
        // Moving another mapping onto paged memory would split the pager's mapping.
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    if in_arena(old as usize) && !runtime::forked() {
        if flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 {
            set_errno(libc::EINVAL);
            return libc::MAP_FAILED;
        }
        if let Some(rt) = runtime::started() {
            let may_move = flags & libc::MREMAP_MAYMOVE != 0;
            let _g = Guard::enter();
            let p = no_unwind(std::ptr::null_mut(), || {
                rt.mremap(old as usize, old_len, new_len, may_move)
            });
            if !p.is_null() {
                return p.cast();
            }
        }
        set_errno(libc::ENOMEM);
        return libc::MAP_FAILED;
    }
    match real() {
        // SAFETY: forwarding all five arguments (the kernel ignores the fifth without
        // MREMAP_FIXED).
        Some(r) => unsafe { (r.mremap)(old, old_len, new_len, flags, new_addr) },
        None => {
            set_errno(libc::ENOMEM);
            libc::MAP_FAILED
        }
    }
}

// -----------------------------------------------------------------------------------------
// Calls that would split the arena's mapping under the pager: userfaultfd refuses to
// install pages into a mapping whose layout changed, so these never reach the kernel for
// arena addresses.

/// # Safety
/// C `madvise`. On arena memory, `MADV_DONTNEED`/`MADV_FREE`/`MADV_REMOVE` clear the range
/// (what private anonymous memory reads afterwards); every other advice (hugepages, access
/// patterns) is accepted and ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    if in_arena(addr as usize) && runtime::program_thread() {
        if matches!(
            advice,
            libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE
        ) && !runtime::forked()
        {
            // SAFETY: the program owns the range it advises on (a mapping it holds).
            unsafe { std::ptr::write_bytes(addr.cast::<u8>(), 0, len) };
        }
        return 0;
    }
    match real() {
        // SAFETY: forwarding.
        Some(r) => unsafe { (r.madvise)(addr, len, advice) },
        None => 0,
    }
}

/// # Safety
/// C `mprotect`. Arena memory stays readable and writable (guard pages that allocators place
/// inside a mapping are not enforced there); other memory is forwarded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    if in_arena(addr as usize) && runtime::program_thread() {
        return 0;
    }
    match real() {
        // SAFETY: forwarding.
        Some(r) => unsafe { (r.mprotect)(addr, len, prot) },
        None => 0,
    }
}

/// `mlock` over paged memory cannot be honoured (Strata evicts within its budget) and would
/// split the pager's mapping: refused with `ENOMEM`, saying why.
fn refuse_lock() -> c_int {
    sys::write_stderr(
        b"strata run: mlock/mlockall of memory Strata pages is not supported (its pages are evicted within the budget); refused with ENOMEM\n",
    );
    set_errno(libc::ENOMEM);
    -1
}

/// # Safety
/// C `mlock`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: usize) -> c_int {
    if runtime::overlaps_arena(addr as usize, len) && runtime::program_thread() {
        return refuse_lock();
    }
    match real() {
        // SAFETY: forwarding.
        Some(r) => unsafe { (r.mlock)(addr, len) },
        None => 0,
    }
}

/// # Safety
/// C `mlock2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: usize, flags: libc::c_uint) -> c_int {
    if runtime::overlaps_arena(addr as usize, len) && runtime::program_thread() {
        return refuse_lock();
    }
    match real() {
        // SAFETY: forwarding.
        Some(r) => unsafe { (r.mlock2)(addr, len, flags) },
        None => 0,
    }
}

/// # Safety
/// C `mlockall`: locking every mapping would fault in the whole arena (64 GiB by default),
/// and locking future ones would do so when it is made, so it is refused under Strata.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlockall(flags: c_int) -> c_int {
    if runtime::program_thread() && !runtime::forked() {
        return refuse_lock();
    }
    match real() {
        // SAFETY: forwarding.
        Some(r) => unsafe { (r.mlockall)(flags) },
        None => 0,
    }
}

/// # Safety
/// C `_exit`: writes this process's report (programs whose workers leave with `_exit`, such
/// as stress-ng's, would otherwise report nothing), then exits.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(code: c_int) -> ! {
    no_unwind((), runtime::report_at_exit);
    match real() {
        // SAFETY: forwarding.
        Some(r) => unsafe { (r.exit_now)(code) },
        // SAFETY: the raw system call never returns.
        None => unsafe {
            libc::syscall(libc::SYS_exit_group, code);
            std::hint::unreachable_unchecked()
        },
    }
}
