//! A bounded fuzz harness for the Umap C API: random and hostile arguments to `umap`,
//! `strata_umap_file`, `uunmap`, `umap_flush`, `umap_prefetch`, `umap_evict`,
//! `strata_umap_evict_range`, `strata_umap_faults` and the `umapcfg_get_*` getters, under
//! valid, invalid and random `UMAP_*` environments. Every call must return (an error with
//! `errno` set, or success), never crash, hang or corrupt data: valid regions are written
//! and read back throughout.
//!
//! Each environment runs in a child process (the configuration is read once per process),
//! for `UMAP_FUZZ_SECS` seconds (default 3). The seed is printed; `UMAP_FUZZ_SEED` replays.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

use std::ffi::{CString, c_int, c_void};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use strata_umap::{
    UmapPrefetchItem, strata_umap_evict_range, strata_umap_faults, strata_umap_file, umap,
    umap_evict, umap_flush, umap_has_write_support, umap_prefetch,
    umapcfg_get_evict_high_water_threshold, umapcfg_get_evict_low_water_threshold,
    umapcfg_get_max_fault_events, umapcfg_get_max_pages_in_buffer, umapcfg_get_num_evictors,
    umapcfg_get_num_fillers, umapcfg_get_read_ahead, umapcfg_get_system_page_size,
    umapcfg_get_umap_page_size, uunmap,
};

const UMAP_FAILED: *mut c_void = usize::MAX as *mut c_void;
const CHILD: &str = "UMAP_FUZZ_CHILD";

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A mapped region the harness owns: its base, length, and what it should hold.
struct Live {
    base: usize,
    len: usize,
    model: Vec<u8>,
    writable: bool,
    /// Backed by the harness's data file (others, such as whatever stdin is, are never
    /// touched: their contents are unknown).
    known: bool,
}

/// Interesting lengths: zero, one, odd, page multiples, huge, overflowing.
fn hostile_len(rng: &mut Rng) -> usize {
    let any = rng.next() as usize;
    rng.pick(&[
        0,
        1,
        4095,
        4096,
        12_345,
        1 << 20,
        (1 << 20) + 7,
        usize::MAX,
        usize::MAX - 4095,
        isize::MAX as usize,
        1 << 47,
        any,
    ])
}

/// Stand-ins in the descriptor list for a fresh data file's read-write and read-only fds.
const FRESH_RW: c_int = -1000;
const FRESH_RO: c_int = -1001;

/// A new 256 KiB file of random bytes: its contents, a read-write and a read-only descriptor.
fn fresh_file(
    dir: &std::path::Path,
    n: u64,
    rng: &mut Rng,
) -> (Vec<u8>, std::fs::File, std::fs::File) {
    let path = dir.join(format!("data-{n}.bin"));
    let data: Vec<u8> = (0..(256 << 10) / 8)
        .flat_map(|_| rng.next().to_le_bytes())
        .collect();
    std::fs::write(&path, &data).unwrap();
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let ro = std::fs::File::open(&path).unwrap();
    // The descriptors keep the file; the name is not needed (umap duplicates descriptors).
    std::fs::remove_file(&path).unwrap();
    (data, rw, ro)
}

fn fuzz(seed: u64, secs: u64) {
    let mut rng = Rng(seed);
    let dir = std::env::temp_dir().join(format!("strata-umap-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_fd = std::fs::File::open(&dir).unwrap();
    let (pipe_r, pipe_w) = {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    };
    let fds = [
        -1,
        0,
        2,
        99_999,
        i32::MIN,
        FRESH_RW,
        FRESH_RW,
        FRESH_RW,
        FRESH_RO,
        dir_fd.as_raw_fd(),
        pipe_r,
        pipe_w,
    ];
    let protections = [
        0,
        libc::PROT_READ,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::PROT_WRITE,
        libc::PROT_EXEC | libc::PROT_READ,
        -1,
        0x7fff_ffff,
    ];
    let flags = [
        0,
        libc::MAP_PRIVATE,
        libc::MAP_PRIVATE,
        libc::MAP_SHARED,
        libc::MAP_PRIVATE | libc::MAP_FIXED,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
    ];
    let offsets = [0i64, 0, 4096, 1, -1, i64::MIN, i64::MAX, 3 << 20, 8 << 20];
    let mut live: Vec<Live> = Vec::new();
    let (mut calls, mut maps, mut refusals) = (0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        calls += 1;
        match rng.below(11) {
            0 | 1 => {
                if live.len() >= 4 {
                    continue;
                }
                // Small lengths mostly, so real regions get made; hostile ones sometimes.
                let length = if rng.below(3) == 0 {
                    hostile_len(&mut rng)
                } else {
                    1 + rng.below(1 << 20) as usize
                };
                // Half the calls well-formed (so real regions come and go), half hostile.
                let sane = rng.below(2) == 0;
                let (prot, flag) = if sane {
                    let prot = rng.pick(&[libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE]);
                    (prot, libc::MAP_PRIVATE)
                } else {
                    (rng.pick(&protections), rng.pick(&flags))
                };
                // Each region over the harness's data gets a file of its own (regions over one
                // file would see each other's write-backs, which the model does not follow).
                let fresh = fresh_file(&dir, maps + refusals, &mut rng);
                let fd = match if sane { FRESH_RW } else { rng.pick(&fds) } {
                    FRESH_RW => fresh.1.as_raw_fd(),
                    FRESH_RO => fresh.2.as_raw_fd(),
                    other => other,
                };
                let offset = if sane {
                    rng.pick(&[0, 4096, 1 << 20])
                } else {
                    rng.pick(&offsets)
                };
                // A fixed address only ever misaligned, or null: the harness owns no range to
                // give away, and UMAP_FIXED over memory the caller does not own is its fault.
                let addr = if sane || rng.below(2) == 0 {
                    std::ptr::null_mut()
                } else {
                    12_345 as *mut c_void
                };
                let flag = if addr.is_null() {
                    flag
                } else {
                    flag | libc::MAP_FIXED
                };
                // SAFETY: with UMAP_FIXED the address is null or misaligned, both refused.
                let p = unsafe { umap(addr, length, prot, flag, fd, offset) };
                if p == UMAP_FAILED {
                    assert_ne!(errno(), 0, "umap failed without errno");
                    refusals += 1;
                    continue;
                }
                maps += 1;
                assert!(!p.is_null(), "umap returned NULL rather than UMAP_FAILED");
                let writable = prot & libc::PROT_WRITE != 0;
                let start = usize::try_from(offset).unwrap();
                let mut model = vec![0u8; length];
                if start < fresh.0.len() {
                    let n = (fresh.0.len() - start).min(length);
                    model[..n].copy_from_slice(&fresh.0[start..start + n]);
                }
                let known = fd == fresh.1.as_raw_fd() || fd == fresh.2.as_raw_fd();
                live.push(Live {
                    base: p as usize,
                    len: length,
                    model,
                    writable,
                    known,
                });
            }
            2 => {
                // SAFETY: null, or a NUL-terminated string.
                let path_arg = match rng.below(4) {
                    0 => None,
                    1 => Some(CString::new("/nonexistent/strata/fuzz").unwrap()),
                    2 => Some(CString::new(dir.to_str().unwrap()).unwrap()),
                    _ => Some(CString::new("x".repeat(5000)).unwrap()),
                };
                let ptr = path_arg.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
                let length = hostile_len(&mut rng);
                // SAFETY: `ptr` is null or NUL-terminated.
                let p = unsafe {
                    strata_umap_file(
                        ptr,
                        length,
                        rng.pick(&protections),
                        rng.pick(&flags),
                        rng.pick(&offsets),
                    )
                };
                if p != UMAP_FAILED {
                    // Only a directory could have been opened, and reading one fails: unmap.
                    assert_eq!(uunmap(p, length), 0);
                } else {
                    assert_ne!(errno(), 0);
                }
            }
            3 => {
                // uunmap: a live base, something inside one, null, garbage.
                let target = if !live.is_empty() && rng.below(2) == 0 {
                    let i = rng.below(live.len() as u64) as usize;
                    if rng.below(3) == 0 {
                        (live[i].base + 1) as *mut c_void
                    } else {
                        let region = live.swap_remove(i);
                        check(&region);
                        assert_eq!(
                            uunmap(region.base as *mut c_void, region.len),
                            0,
                            "uunmap of a live region"
                        );
                        continue;
                    }
                } else {
                    {
                        let any = rng.next() as *mut c_void;
                        rng.pick(&[std::ptr::null_mut(), UMAP_FAILED, any])
                    }
                };
                assert_eq!(uunmap(target, rng.next() as usize), -1);
                assert_eq!(errno(), libc::EINVAL);
            }
            4 => {
                let r = umap_flush();
                assert!(r == 0 || r == -1);
                assert_eq!(r, 0, "flushing healthy file regions fails");
            }
            5 => assert_eq!(umap_evict(), 0, "evicting healthy file regions fails"),
            6 => {
                // Prefetch: negative counts, null arrays, addresses anywhere.
                let n = rng.pick(&[-5, -1, 0, 1, 3, 16]);
                let mut items = Vec::new();
                for _ in 0..n.max(0) {
                    let a = match (live.is_empty(), rng.below(3)) {
                        (false, 0 | 1) => {
                            let r = &live[rng.below(live.len() as u64) as usize];
                            r.base + rng.below(r.len as u64 + 8192) as usize
                        }
                        _ => rng.next() as usize,
                    };
                    items.push(UmapPrefetchItem {
                        page_base_addr: a as *mut c_void,
                    });
                }
                let ptr = if rng.below(5) == 0 {
                    std::ptr::null()
                } else {
                    items.as_ptr()
                };
                let n = if ptr.is_null() {
                    n
                } else {
                    n.min(items.len() as c_int)
                };
                // SAFETY: `ptr` is null or points to at least `n` items.
                unsafe { umap_prefetch(n, ptr) };
            }
            7 => {
                let (a, len) = match (live.is_empty(), rng.below(2)) {
                    (false, 0) => {
                        let r = &live[rng.below(live.len() as u64) as usize];
                        (
                            r.base + rng.below(r.len as u64) as usize,
                            hostile_len(&mut rng),
                        )
                    }
                    _ => (rng.next() as usize, hostile_len(&mut rng)),
                };
                let n = strata_umap_evict_range(a as *mut c_void, len);
                assert!(n >= -1);
                let _ = strata_umap_faults(a as *mut c_void);
            }
            8 => {
                // The getters, whatever the environment.
                assert!(umapcfg_get_system_page_size() >= 4096);
                assert!(umapcfg_get_umap_page_size() >= 4096);
                let _ = (
                    umapcfg_get_max_pages_in_buffer(),
                    umapcfg_get_num_fillers(),
                    umapcfg_get_num_evictors(),
                    umapcfg_get_max_fault_events(),
                    umapcfg_get_read_ahead(),
                    umap_has_write_support(),
                );
                let (lo, hi) = (
                    umapcfg_get_evict_low_water_threshold(),
                    umapcfg_get_evict_high_water_threshold(),
                );
                assert!(
                    (0..=100).contains(&lo) && (0..=100).contains(&hi),
                    "{lo} {hi}"
                );
            }
            _ => {
                // Use a live region: write (if writable) and read back random bytes.
                if live.is_empty() {
                    continue;
                }
                let i = rng.below(live.len() as u64) as usize;
                let r = &mut live[i];
                if !r.known {
                    continue;
                }
                for _ in 0..64 {
                    let k = rng.below(r.len as u64) as usize;
                    let p = (r.base + k) as *mut u8;
                    if r.writable {
                        let v = rng.next() as u8;
                        // SAFETY: `k < len` inside a live writable region.
                        unsafe { p.write_volatile(v) };
                        r.model[k] = v;
                    }
                    // SAFETY: as above (readable).
                    assert_eq!(unsafe { p.read_volatile() }, r.model[k], "byte {k}");
                }
            }
        }
    }
    for region in live.drain(..) {
        check(&region);
        assert_eq!(uunmap(region.base as *mut c_void, region.len), 0);
    }
    // SAFETY: the pipe's descriptors are ours.
    unsafe {
        libc::close(pipe_r);
        libc::close(pipe_w);
    }
    std::fs::remove_dir_all(&dir).unwrap();
    println!("FUZZ DONE: {calls} calls, {maps} regions mapped, {refusals} umap refusals");
}

/// A live region still holds what was written to it.
fn check(r: &Live) {
    if !r.known {
        return;
    }
    // SAFETY: the region is mapped for `len` bytes.
    let got = unsafe { std::slice::from_raw_parts(r.base as *const u8, r.len) };
    assert!(got == &r.model[..], "region at {:#x} lost data", r.base);
}

#[test]
fn hostile_arguments_get_errors_never_crashes() {
    if let Ok(seed) = std::env::var(CHILD) {
        let secs = std::env::var("UMAP_FUZZ_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3);
        return fuzz(seed.parse().unwrap(), secs);
    }
    if let Err(e) = strata_pager::probe::probe() {
        assert!(
            std::env::var_os("CI").is_none(),
            "userfaultfd is required in CI: {e}"
        );
        eprintln!("SKIPPED: userfaultfd unavailable: {e}");
        return;
    }
    let seed = std::env::var("UMAP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("umap fuzz: seed {seed} (replay with UMAP_FUZZ_SEED={seed})");
    let mut rng = Rng(seed);
    let garbage = [
        "",
        "0",
        "-1",
        "abc",
        "4097",
        "18446744073709551616",
        "99999999999",
        "1e9",
        " 8 ",
        "\u{1F600}",
    ];
    let mut envs: Vec<Vec<(&str, String)>> = vec![
        vec![],
        vec![
            ("UMAP_PAGESIZE", "8192".into()),
            ("UMAP_BUFSIZE", "16".into()),
            ("UMAP_PAGE_FILLERS", "2".into()),
            ("UMAP_READ_AHEAD", "2".into()),
        ],
    ];
    let vars = [
        "UMAP_PAGESIZE",
        "UMAP_BUFSIZE",
        "UMAP_PAGE_FILLERS",
        "UMAP_PAGE_EVICTORS",
        "UMAP_EVICT_LOW_WATER_THRESHOLD",
        "UMAP_EVICT_HIGH_WATER_THRESHOLD",
        "UMAP_MAX_FAULT_EVENTS",
        "UMAP_READ_AHEAD",
    ];
    for _ in 0..2 {
        let mut env = Vec::new();
        for &v in &vars {
            if rng.below(2) == 0 {
                continue;
            }
            let value = if rng.below(2) == 0 {
                garbage[rng.below(garbage.len() as u64) as usize].to_string()
            } else {
                (rng.next() >> rng.below(64)).to_string()
            };
            env.push((v, value));
        }
        envs.push(env);
    }
    for env in envs {
        let child_seed = rng.next();
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "hostile_arguments_get_errors_never_crashes",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, child_seed.to_string());
        for v in vars {
            cmd.env_remove(v);
        }
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("env {env:?}, seed {child_seed}: the fuzzer hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        assert!(
            status.success() && out.contains("FUZZ DONE"),
            "env {env:?}, child seed {child_seed}: {status:?}\n{out}"
        );
        eprintln!(
            "env {env:?}: {}",
            out.lines().find(|l| l.contains("FUZZ DONE")).unwrap_or("")
        );
    }
}
