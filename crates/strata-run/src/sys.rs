//! Every raw call of the interposer: the next definitions of the allocation functions (found
//! with `dlsym(RTLD_NEXT)`), a small bootstrap heap for the allocations `dlsym` itself makes
//! before those are known, and the few kernel calls the runtime needs.

use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The allocation functions of the next library in the lookup order (normally glibc).
#[derive(Debug, Clone, Copy)]
pub struct Real {
    pub malloc: unsafe extern "C" fn(usize) -> *mut c_void,
    pub free: unsafe extern "C" fn(*mut c_void),
    pub calloc: unsafe extern "C" fn(usize, usize) -> *mut c_void,
    pub realloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    pub posix_memalign: unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int,
    pub aligned_alloc: unsafe extern "C" fn(usize, usize) -> *mut c_void,
    pub memalign: unsafe extern "C" fn(usize, usize) -> *mut c_void,
    pub valloc: unsafe extern "C" fn(usize) -> *mut c_void,
    pub malloc_usable_size: unsafe extern "C" fn(*mut c_void) -> usize,
    pub mmap: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void,
    pub munmap: unsafe extern "C" fn(*mut c_void, usize) -> c_int,
    pub mremap: unsafe extern "C" fn(*mut c_void, usize, usize, c_int, ...) -> *mut c_void,
    pub madvise: unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int,
    pub mprotect: unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int,
    pub mlock: unsafe extern "C" fn(*const c_void, usize) -> c_int,
    pub mlock2: unsafe extern "C" fn(*const c_void, usize, libc::c_uint) -> c_int,
    pub mlockall: unsafe extern "C" fn(c_int) -> c_int,
    pub exit_now: unsafe extern "C" fn(c_int) -> !,
}

/// 0 until resolved, then a leaked `&'static Real`.
static REAL: AtomicUsize = AtomicUsize::new(0);
/// Set while one thread runs `dlsym`: allocations then come from the bootstrap heap.
static RESOLVING: AtomicBool = AtomicBool::new(false);

/// The real functions, or `None` while they are being looked up (the caller then serves the
/// request from the bootstrap heap).
pub fn real() -> Option<&'static Real> {
    let p = REAL.load(Ordering::Acquire);
    if p != 0 {
        // SAFETY: a non-zero value is the address of a leaked, never-freed `Real` published
        // with release ordering below.
        return Some(unsafe { &*(p as *const Real) });
    }
    resolve()
}

fn resolve() -> Option<&'static Real> {
    if RESOLVING.swap(true, Ordering::AcqRel) {
        // Another call (dlsym's own calloc on this thread, or another thread in the same
        // short window) is resolving: serve it from the bootstrap heap.
        return None;
    }
    let real = Real {
        malloc: next(c"malloc"),
        free: next(c"free"),
        calloc: next(c"calloc"),
        realloc: next(c"realloc"),
        posix_memalign: next(c"posix_memalign"),
        aligned_alloc: next(c"aligned_alloc"),
        memalign: next(c"memalign"),
        valloc: next(c"valloc"),
        malloc_usable_size: next(c"malloc_usable_size"),
        mmap: next(c"mmap"),
        munmap: next(c"munmap"),
        mremap: next(c"mremap"),
        madvise: next(c"madvise"),
        mprotect: next(c"mprotect"),
        mlock: next(c"mlock"),
        mlock2: next(c"mlock2"),
        mlockall: next(c"mlockall"),
        exit_now: next(c"_exit"),
    };
    // The `Real` lives in the bootstrap heap, which is never freed.
    let slot = bootstrap_alloc(std::mem::size_of::<Real>()).cast::<Real>();
    if slot.is_null() {
        die(b"strata run: the bootstrap heap is exhausted while looking up malloc\n");
    }
    // SAFETY: `slot` is a fresh, 16-byte aligned bootstrap block of `size_of::<Real>()` bytes.
    unsafe { slot.write(real) };
    REAL.store(slot as usize, Ordering::Release);
    RESOLVING.store(false, Ordering::Release);
    // SAFETY: just written and never freed.
    Some(unsafe { &*slot })
}

/// Looks `name` up in the libraries after this one; a missing allocation function means
/// there is no C library to forward to, and nothing can work.
fn next<F: Copy>(name: &CStr) -> F {
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid pseudo-handle.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        die(b"strata run: dlsym(RTLD_NEXT) found no C library allocation function\n");
    }
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `F` is the function-pointer type of `name`'s C prototype (see `Real`), and
    // function pointers and data pointers have one size and representation on Linux.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

// ---------------------------------------------------------------------------------------
// Bootstrap heap: serves `dlsym`'s own calloc (and anything else that allocates while the
// real functions are looked up). Blocks carry their size in a 16-byte header and are never
// reused; freeing one is a no-op.

const BOOT_BYTES: usize = 256 << 10;
#[repr(C, align(16))]
struct BootHeap(std::cell::UnsafeCell<[u8; BOOT_BYTES]>);
// SAFETY: blocks are handed out by an atomic bump pointer, so no two callers share bytes.
unsafe impl Sync for BootHeap {}
static BOOT: BootHeap = BootHeap(std::cell::UnsafeCell::new([0; BOOT_BYTES]));
static BOOT_USED: AtomicUsize = AtomicUsize::new(0);
const HEADER: usize = 16;

/// A zeroed block from the bootstrap heap, or null when it is exhausted.
pub fn bootstrap_alloc(size: usize) -> *mut u8 {
    let Some(need) = size.checked_add(HEADER + 15).map(|n| n & !15) else {
        return std::ptr::null_mut();
    };
    let start = BOOT_USED.fetch_add(need, Ordering::Relaxed);
    if start.saturating_add(need) > BOOT_BYTES {
        return std::ptr::null_mut();
    }
    let base = BOOT.0.get().cast::<u8>();
    // SAFETY: `[start, start+need)` lies inside the heap and belongs to this caller alone;
    // the header is 16-byte aligned because `start` and the heap are.
    unsafe {
        base.add(start).cast::<usize>().write(size);
        base.add(start + HEADER)
    }
}

/// Whether `p` points into the bootstrap heap.
pub fn is_bootstrap(p: *const u8) -> bool {
    let base = BOOT.0.get() as usize;
    (base..base + BOOT_BYTES).contains(&(p as usize))
}

/// The size a bootstrap block was asked for.
///
/// # Safety
/// `p` must be a pointer returned by [`bootstrap_alloc`].
pub unsafe fn bootstrap_size(p: *const u8) -> usize {
    // SAFETY: the caller vouches that a header precedes `p`.
    unsafe { p.sub(HEADER).cast::<usize>().read() }
}

// ---------------------------------------------------------------------------------------
// Kernel calls.

/// Writes `msg` to standard error with one `write(2)`; safe in signal handlers and inside
/// malloc (no allocation).
pub fn write_stderr(msg: &[u8]) {
    // SAFETY: `msg` is a valid buffer; a short or failed write is acceptable for a message.
    let _ = unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// Writes `msg` to `fd` (a report descriptor) with one `write(2)`.
pub fn write_fd(fd: c_int, msg: &[u8]) -> bool {
    // SAFETY: as in `write_stderr`.
    let n = unsafe { libc::write(fd, msg.as_ptr().cast(), msg.len()) };
    usize::try_from(n).is_ok_and(|n| n == msg.len())
}

/// Prints `msg` and ends the process at once (no atexit handlers, no unwinding).
pub fn die(msg: &[u8]) -> ! {
    write_stderr(msg);
    // SAFETY: `_exit` never returns and touches no user-space state.
    unsafe { libc::_exit(125) }
}

/// This thread's name as the kernel holds it (`PR_GET_NAME`, at most 15 bytes).
pub fn thread_name_starts_with(prefix: &[u8]) -> bool {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer.
    let rc = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    rc == 0 && name.starts_with(prefix)
}

/// Keeps `[addr, addr+len)` out of forked children (`MADV_DONTFORK`): a child has no pager
/// behind it, so it gets no mapping there rather than one that silently reads zeros.
pub fn dont_fork(addr: *mut u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the range is a mapping the runtime owns; MADV_DONTFORK changes only how fork
    // copies it.
    let rc = unsafe { libc::madvise(addr.cast(), len, libc::MADV_DONTFORK) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Registers `child` to run in the child after every `fork`.
pub fn at_fork_child(child: unsafe extern "C" fn()) {
    // SAFETY: `child` is a valid `extern "C"` function for the life of the process.
    let _ = unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// Registers `f` to run at normal process exit.
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: `f` is a valid function for the life of the process (this library is never
    // unloaded: it is preloaded).
    let _ = unsafe { libc::atexit(f) };
}

/// Signal handler type used with `SA_SIGINFO`.
pub type SigInfoHandler = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

/// Installs `handler` for `sig` (with `SA_SIGINFO | SA_NODEFER`-free defaults); returns the
/// previous action so the handler can chain to it.
pub fn install_handler(sig: c_int, handler: SigInfoHandler) -> Option<libc::sigaction> {
    // SAFETY: zeroed sigaction is a valid starting point; the mask is emptied explicitly.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO;
    // SAFETY: `act.sa_mask` is a valid sigset_t.
    unsafe { libc::sigemptyset(&raw mut act.sa_mask) };
    // SAFETY: zeroed is valid output storage.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    let rc = unsafe { libc::sigaction(sig, &raw const act, &raw mut old) };
    (rc == 0).then_some(old)
}

/// Puts `old` back as the action for `sig`.
pub fn restore_handler(sig: c_int, old: &libc::sigaction) {
    // SAFETY: `old` came from a successful sigaction call.
    let _ = unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
}

/// The faulting address of a SIGSEGV/SIGBUS.
///
/// # Safety
/// `info` must be the `siginfo_t` the kernel passed to an `SA_SIGINFO` handler.
pub unsafe fn fault_address(info: *mut libc::siginfo_t) -> usize {
    // SAFETY: per the caller, `info` is valid; si_addr is set for SIGSEGV and SIGBUS.
    unsafe { (*info).si_addr() as usize }
}

/// This process's id.
pub fn pid() -> u32 {
    std::process::id()
}

/// The parent's process id.
pub fn parent_pid() -> u32 {
    // SAFETY: getppid cannot fail.
    let p = unsafe { libc::getppid() };
    u32::try_from(p).unwrap_or(0)
}

/// Reads an environment variable without allocating (safe before init and inside malloc).
pub fn getenv(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated; the returned string lives in the environment block,
    // which this library never modifies.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: getenv returns a NUL-terminated string.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }
}

/// Bytes of address space this process may still map under its soft `RLIMIT_AS` (`None`:
/// no limit). Reads the process's mapped size from `/proc/self/statm`.
pub fn address_space_left() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &raw mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    Some(limit.rlim_cur.saturating_sub(pages.saturating_mul(page)))
}

/// The regular files this process has open and wrote, listed from `/proc/self/fd` ahead of
/// need.
///
/// Only files the program writes count: open for writing, or changed since the list was
/// first made (a temporary file written, closed and opened again to be read). The page cache
/// of a file it only reads may be another program's (a shared data set, or this program's
/// input cached by whoever read it first, charged to their group): dropping it would make
/// every reader go to the disk again, and this program's own reads charge its group anew,
/// with the cache read-ahead brings in locked under I/O where reclaim cannot take it (sort
/// in a 32 MiB group, killed at start-up: results, session 13).
///
/// Listing `/proc/self/fd` makes the kernel allocate an inode per descriptor, charged to
/// the memory group: done when the group has room ([`OwnFds::refresh`]), never when it is
/// short, where [`OwnFds::probe`] asks descriptor numbers one by one instead.
#[derive(Debug)]
pub struct OwnFds {
    dir: std::os::fd::OwnedFd,
    files: Vec<c_int>,
    /// The highest descriptor the last listing found.
    highest: c_int,
    /// Files changed at or after this time (seconds, nanoseconds since the epoch) are the
    /// program's own output.
    since: (i64, i64),
}

/// Most descriptors remembered (a program with more gets the first ones' cache dropped).
const MOST_FILES: usize = 256;
/// Descriptor numbers [`OwnFds::probe`] asks beyond the highest the last listing found.
pub const PROBE_BEYOND: c_int = 32;

impl OwnFds {
    /// Opens `/proc/self/fd` (the list is empty until [`OwnFds::refresh`]).
    pub fn open() -> std::io::Result<Self> {
        let dir = std::fs::File::open("/proc/self/fd")?;
        // File times are stamped from the real-time clock, at the file system's (coarser)
        // granularity: a second's grace.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        Ok(Self {
            dir: dir.into(),
            files: Vec::with_capacity(MOST_FILES),
            highest: 0,
            since: (secs - 1, i64::from(now.subsec_nanos())),
        })
    }

    /// Lists the regular files open now; `buf` holds the directory entries.
    pub fn refresh(&mut self, buf: &mut [u8]) {
        use std::os::fd::AsRawFd;
        let dir = self.dir.as_raw_fd();
        self.files.clear();
        self.highest = 0;
        // SAFETY: `dir` is our open directory; rewinding it has no other effect.
        if unsafe { libc::lseek(dir, 0, libc::SEEK_SET) } != 0 {
            return;
        }
        loop {
            // SAFETY: `buf` is valid for `buf.len()` bytes, which getdents64 fills with whole
            // `linux_dirent64` records and reports how many bytes it wrote.
            let n =
                unsafe { libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len()) };
            let Ok(n) = usize::try_from(n) else { break };
            if n == 0 {
                break;
            }
            let mut at = 0;
            while at + 19 < n {
                // linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, then the name.
                let reclen = usize::from(u16::from_ne_bytes([buf[at + 16], buf[at + 17]]));
                if reclen == 0 || at + reclen > n {
                    break;
                }
                let name = &buf[at + 19..at + reclen];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                at += reclen;
                if let Some(fd) = std::str::from_utf8(name)
                    .ok()
                    .and_then(|s| s.parse::<c_int>().ok())
                    && fd != dir
                {
                    self.highest = self.highest.max(fd);
                    if self.files.len() < MOST_FILES && written_file(fd, self.since) {
                        self.files.push(fd);
                    }
                }
            }
        }
    }

    /// Lists the regular files open now among descriptors up to [`PROBE_BEYOND`] above the
    /// highest the last [`OwnFds::refresh`] found, by asking each number (`fstat`, `fcntl`):
    /// slower than a listing, but it charges nothing, so it serves while the group is short.
    /// A program opens a new file at the lowest free number, so one opened since the
    /// listing is found (GNU sort's temporary runs, opened while the group is short).
    pub fn probe(&mut self) {
        use std::os::fd::AsRawFd;
        let dir = self.dir.as_raw_fd();
        self.files.clear();
        for fd in 0..=self.highest.saturating_add(PROBE_BEYOND) {
            if fd != dir && self.files.len() < MOST_FILES && written_file(fd, self.since) {
                // No allocation: `files` was made with room for `MOST_FILES`.
                self.files.push(fd);
            }
        }
    }

    /// Asks the kernel to drop the page cache of the regular files listed at the last
    /// refresh (`POSIX_FADV_DONTNEED`: clean pages not in use go, dirty ones start their
    /// write-back). Allocates nothing, in user space or (as far as this code goes) in the
    /// kernel: the caller is short of memory. Returns how many files were advised. Advice
    /// only: no file's contents change.
    pub fn drop_file_cache(&self) -> usize {
        let mut advised = 0;
        for &fd in &self.files {
            // A descriptor closed or reused since the listing: skipped if no longer a
            // regular file, else advice on another file of this process, harmless.
            if !regular_file(fd) {
                continue;
            }
            // SAFETY: advice on a descriptor of this process; it changes no file's contents.
            if unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) } == 0 {
                advised += 1;
            }
        }
        advised
    }
}

/// Whether `fd` is open on a regular file that this process may write (open for writing)
/// or that was changed at or after `since`.
fn written_file(fd: c_int, since: (i64, i64)) -> bool {
    let Some(st) = regular_file_stat(fd) else {
        return false;
    };
    // SAFETY: F_GETFL reads the descriptor's status flags; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    (flags >= 0 && flags & libc::O_ACCMODE != libc::O_RDONLY)
        || (st.st_mtime, st.st_mtime_nsec) >= since
}

/// Whether `fd` is open on a regular file.
fn regular_file(fd: c_int) -> bool {
    regular_file_stat(fd).is_some()
}

/// The status of the regular file `fd` is open on; None for anything else.
fn regular_file_stat(fd: c_int) -> Option<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is valid storage for a stat.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    (st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(st)
}

/// Memory held in reserve: an anonymous private mapping whose pages are touched (so charged
/// to the process's memory group) when it is made, and given back to the kernel at once when
/// it is dropped (`munmap`). Only for threads inside Strata ([`crate::runtime::Guard`]), so
/// that the interposer passes `mmap` and `munmap` through.
#[derive(Debug)]
pub struct Reserve {
    addr: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is owned by the value alone; nothing reads or writes it after it is
// made, so moving it between threads shares nothing.
unsafe impl Send for Reserve {}

impl Reserve {
    /// `len` bytes (whole pages), every page touched; None when the kernel refuses.
    pub fn new(len: usize) -> Option<Self> {
        // SAFETY: a fresh anonymous private mapping at an address the kernel chooses; it
        // overlaps nothing of the program's.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        (addr != libc::MAP_FAILED).then_some(Self { addr, len })
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of `len` bytes, unmapped once here.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Pages of the first `len` bytes of `file` in the page cache (`mincore` over a mapping).
    fn cached_pages(file: &std::fs::File, len: usize) -> usize {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared read-only mapping of an open file, unmapped below; nothing
        // reads through it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let mut vec = vec![0u8; len.div_ceil(4096)];
        // SAFETY: `p` maps `len` bytes; `vec` has a byte per page.
        assert_eq!(unsafe { libc::mincore(p, len, vec.as_mut_ptr()) }, 0);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, len) };
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// A file of `len` fresh random bytes in a new directory, written and read once (so cached),
    /// with its modification time set `age` in the past.
    fn cached_file(
        name: &str,
        len: usize,
        age: std::time::Duration,
    ) -> (std::path::PathBuf, Vec<u8>) {
        let dir = std::env::temp_dir().join(format!("strata-run-{name}-{}", pid()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data");
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos());
        let data: Vec<u8> = (0..len)
            .map(|i: usize| (i as u64).wrapping_mul(u64::from(seed | 1)).to_le_bytes()[2])
            .collect();
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&data).unwrap();
        file.sync_all().unwrap();
        file.set_modified(std::time::SystemTime::now() - age)
            .unwrap();
        drop(file);
        assert_eq!(std::fs::read(&path).unwrap(), data, "read once: cached");
        (dir, data)
    }

    #[test]
    fn cache_of_files_only_read_stays_and_of_files_written_since_goes() {
        let len = 1 << 20;
        let hour = std::time::Duration::from_secs(3600);
        // An old file the program only reads: someone else's cache, left alone.
        let (old_dir, old_data) = cached_file("old-input", len, hour);
        // The same, opened read-only, but written during the run (a temporary file read
        // back): the program's own cache, dropped.
        let mut fds = OwnFds::open().unwrap();
        let (new_dir, new_data) = cached_file("temp-read-back", len, std::time::Duration::ZERO);
        let old = std::fs::File::open(old_dir.join("data")).unwrap();
        let new = std::fs::File::open(new_dir.join("data")).unwrap();
        let (old_before, new_before) = (cached_pages(&old, len), cached_pages(&new, len));
        assert!(
            old_before > 200 && new_before > 200,
            "{old_before} and {new_before} pages cached"
        );
        // A pipe (not a regular file) is never listed, written or not.
        let mut pipe = [0 as c_int; 2];
        // SAFETY: `pipe` holds the two descriptors pipe(2) writes; both are closed below.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        let mut buf = [0u8; 512];
        fds.refresh(&mut buf);
        assert!(
            !fds.files.contains(&pipe[0]) && !fds.files.contains(&pipe[1]),
            "a pipe was listed: {:?}",
            fds.files
        );
        // SAFETY: closing the pipe made above, used by nothing else.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
        fds.drop_file_cache();
        let (old_after, new_after) = (cached_pages(&old, len), cached_pages(&new, len));
        assert_eq!(
            old_after, old_before,
            "an old file only read keeps its cache"
        );
        assert!(
            new_after < new_before / 4,
            "{new_after} of {new_before} pages of a file written since still cached"
        );
        assert_eq!(std::fs::read(old_dir.join("data")).unwrap(), old_data);
        assert_eq!(std::fs::read(new_dir.join("data")).unwrap(), new_data);
        std::fs::remove_dir_all(&old_dir).unwrap();
        std::fs::remove_dir_all(&new_dir).unwrap();
    }

    #[test]
    fn a_file_opened_after_the_listing_is_found_by_asking_descriptor_numbers() {
        use std::os::fd::AsRawFd;
        let len = 1 << 20;
        let mut fds = OwnFds::open().unwrap();
        let mut buf = [0u8; 512];
        fds.refresh(&mut buf);
        // Written during the run, opened after the listing (as sort opens its temporary
        // runs while the group is short): not listed until probed.
        let (dir, data) = cached_file("opened-later", len, std::time::Duration::ZERO);
        let file = std::fs::File::open(dir.join("data")).unwrap();
        let fd = file.as_raw_fd();
        assert!(!fds.files.contains(&fd), "listed before it was open");
        assert!(
            fd <= fds.highest + PROBE_BEYOND,
            "descriptor {fd} far above the highest listed ({})",
            fds.highest
        );
        fds.probe();
        assert!(
            fds.files.contains(&fd),
            "probing missed {fd}: {:?}",
            fds.files
        );
        let before = cached_pages(&file, len);
        assert!(before > 200, "{before} pages cached after a read");
        fds.drop_file_cache();
        let after = cached_pages(&file, len);
        assert!(after < before / 4, "{after} of {before} pages still cached");
        // A descriptor far above the listing's highest is beyond the probe (the next listing
        // finds it): the probe asks a bounded range.
        // SAFETY: F_DUPFD duplicates our open descriptor onto the lowest free number at or
        // above the one given, so it replaces no descriptor of another test; closed below.
        let far = unsafe { libc::fcntl(fd, libc::F_DUPFD, fds.highest + PROBE_BEYOND + 100) };
        assert!(far > fds.highest + PROBE_BEYOND, "F_DUPFD gave {far}");
        fds.probe();
        assert!(!fds.files.contains(&far));
        fds.refresh(&mut buf);
        assert!(fds.files.contains(&far), "the listing finds {far}");
        // SAFETY: closing the duplicate made above.
        unsafe { libc::close(far) };
        assert_eq!(std::fs::read(dir.join("data")).unwrap(), data);
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn open_files_cache_is_dropped_and_their_bytes_stay() {
        let len = 1 << 20;
        // Old, but open for writing: the program's to drop.
        let (dir, data) = cached_file("fadvise", len, std::time::Duration::from_secs(3600));
        let path = dir.join("data");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let before = cached_pages(&file, len);
        assert!(before > 200, "{before} pages cached after a read");
        let mut fds = OwnFds::open().unwrap();
        let mut buf = [0u8; 512];
        assert_eq!(fds.drop_file_cache(), 0, "nothing listed before a refresh");
        fds.refresh(&mut buf);
        let advised = fds.drop_file_cache();
        assert!(advised >= 1, "{advised} files advised");
        let after = cached_pages(&file, len);
        assert!(after < before / 4, "{after} of {before} pages still cached");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            data,
            "the bytes are the file's still"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
