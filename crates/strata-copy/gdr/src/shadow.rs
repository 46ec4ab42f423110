//! Shadow mappings: what `gdr_map` returns when no true CPU mapping of GPU memory exists.
//! A shadow is a PROT_NONE reservation of the mapped size. Its addresses name offsets for
//! `gdr_copy_*`; a direct load or store faults, and a SIGSEGV handler prints why before the
//! default action ends the process (so the program fails loudly, never loses data silently).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

const MAX_SHADOWS: usize = 1024;

/// Start and end of each live shadow (0, 0 when free). Read by the signal handler, so only
/// atomics and no locks.
static RANGES: [(AtomicUsize, AtomicUsize); MAX_SHADOWS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_SHADOWS];

static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

const MESSAGE: &[u8] = b"\nstrata-gdr: direct CPU load/store through a gdr_map() pointer at 0x";
const ADVICE: &[u8] = b".\nstrata-gdr: this system gives no CPU mapping of GPU memory (no gdrdrv, no dma-buf mmap), so gdr_map() returns a PROT_NONE shadow: use gdr_copy_to_mapping()/gdr_copy_from_mapping() with that pointer instead of dereferencing it.\n";

fn write_stderr(b: &[u8]) {
    // SAFETY: write(2) is async-signal-safe; the buffer is valid for its length.
    unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
}

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    if contains(addr) {
        write_stderr(MESSAGE);
        let mut hex = [0u8; 16];
        for (i, h) in hex.iter_mut().enumerate() {
            let nibble = (addr >> (60 - 4 * i)) & 0xF;
            *h = b"0123456789abcdef"[nibble];
        }
        write_stderr(&hex);
        write_stderr(ADVICE);
        reset_default(sig);
        return; // The access faults again, now with the default action.
    }
    match PREVIOUS.get() {
        Some(prev) if prev.sa_sigaction == libc::SIG_DFL || prev.sa_sigaction == libc::SIG_IGN => {
            reset_default(sig);
        }
        Some(prev) if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler was installed as an SA_SIGINFO handler.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig, info, uctx);
        }
        Some(prev) => {
            // SAFETY: the previous handler was installed as a plain handler.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev.sa_sigaction) };
            f(sig);
        }
        None => reset_default(sig),
    }
}

fn reset_default(sig: libc::c_int) {
    // SAFETY: an all-zero sigaction with SIG_DFL is valid; sigaction is async-signal-safe.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &raw const dfl, std::ptr::null_mut());
    }
}

fn install() {
    PREVIOUS.get_or_init(|| {
        // SAFETY: zeroed sigaction structs are valid; we install a handler that only uses
        // async-signal-safe operations and keep the previous one to chain to.
        unsafe {
            let mut prev: libc::sigaction = std::mem::zeroed();
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_segv as *const () as libc::sighandler_t;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&raw mut act.sa_mask);
            libc::sigaction(libc::SIGSEGV, &raw const act, &raw mut prev);
            prev
        }
    });
}

/// Whether `addr` falls in a live shadow.
pub fn contains(addr: usize) -> bool {
    RANGES.iter().any(|(s, e)| {
        let start = s.load(Ordering::Acquire);
        start != 0 && addr >= start && addr < e.load(Ordering::Acquire)
    })
}

/// A live shadow mapping; unmapped on drop.
#[derive(Debug)]
pub struct Shadow {
    ptr: *mut u8,
    len: usize,
    index: usize,
}

// SAFETY: the reservation is only an address range; nothing reads or writes it.
unsafe impl Send for Shadow {}
// SAFETY: as above.
unsafe impl Sync for Shadow {}

impl Shadow {
    /// Reserves `len` bytes (rounded up to pages) of PROT_NONE address space.
    pub fn new(len: usize) -> Result<Shadow, i32> {
        install();
        let len = len.div_ceil(4096).max(1) * 4096;
        let ptr = strata_copy::sys::mmap_none(len)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
        for (index, (s, e)) in RANGES.iter().enumerate() {
            if s.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                e.store(ptr as usize + len, Ordering::Release);
                s.store(ptr as usize, Ordering::Release);
                return Ok(Shadow { ptr, len, index });
            }
        }
        // SAFETY: mapped just above, unused.
        unsafe { strata_copy::sys::munmap(ptr, len) };
        Err(libc::ENOMEM)
    }

    /// Its start.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        let (s, e) = &RANGES[self.index];
        s.store(0, Ordering::Release);
        e.store(0, Ordering::Release);
        // SAFETY: our reservation, unmapped once; nothing dereferences it.
        unsafe { strata_copy::sys::munmap(self.ptr, self.len) };
    }
}
