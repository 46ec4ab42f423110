//! GDRCopy's sanity cases ported to Strata's copy API, for whichever backend the machine gets:
//! data validation at every size and offset (unaligned included) on cuMemAlloc and VMM memory,
//! small buffers, many pins and threads, use after free, bad pins, fork, two processes, service
//! restarts and ordering. Each test skips with a message when there is no CUDA driver or GPU.

#![allow(clippy::cast_possible_truncation)] // Sizes and offsets here are small by construction.

use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use strata_copy::{Copier, CopyConfig, CopyError, sys};

fn copier() -> Option<Copier> {
    if !sys::driver_present() {
        eprintln!("skipped: no CUDA driver (libcuda.so not found)");
        return None;
    }
    match Copier::open(0) {
        Ok(c) => {
            eprintln!("backend: {:?}", c.report());
            Some(c)
        }
        Err(e) => {
            eprintln!("skipped: no usable GPU: {e}");
            None
        }
    }
}

fn rng() -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

const SIZES: &[usize] = &[
    1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 63, 64, 65, 127, 128, 239, 240, 241, 255, 256, 257, 1000,
    1023, 1024, 1025, 4095, 4096, 4097, 16_387, 65535, 65536, 65537, 200_000,
];
const OFFSETS: &[u64] = &[0, 1, 2, 3, 4, 5, 6, 7, 11, 129, 1023, 4 * 1023, 65536 + 3];

/// cuMemcpyHtoD from pageable memory may return before the DMA lands: wait for the legacy
/// stream it runs on (the copy service's stream is non-blocking, so this does not wait for it).
fn htod_complete(c: &Copier, dev: u64, data: &[u8]) {
    sys::memcpy_htod(c.context(), dev, data).unwrap();
    // SAFETY: null is the legacy default stream.
    unsafe { sys::stream_synchronize(c.context(), std::ptr::null_mut()).unwrap() };
}

fn validate(c: &Copier, alloc: &sys::DeviceAlloc, rng: &mut StdRng) {
    let pinned = c.pin(alloc.ptr(), alloc.len() as u64).unwrap();
    let map = pinned.map().unwrap();
    for &n in SIZES {
        for &off in OFFSETS {
            if off as usize + n > alloc.len() {
                continue;
            }
            let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            map.copy_to(off, &data).unwrap();
            let mut check = vec![0u8; n];
            sys::memcpy_dtoh(c.context(), &mut check, alloc.ptr() + off).unwrap();
            assert_eq!(check, data, "copy_to: size {n} offset {off}");
            let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            htod_complete(c, alloc.ptr() + off, &data);
            let mut back = vec![0xEEu8; n];
            map.copy_from(off, &mut back).unwrap();
            assert_eq!(back, data, "copy_from: size {n} offset {off}");
            // Round trip through the API alone, neighbours untouched.
            let before: Vec<u8> = (0..n + 2).map(|_| rng.random()).collect();
            if off >= 1 && off as usize + n < alloc.len() {
                map.copy_to(off - 1, &before).unwrap();
                map.copy_to(off, &data).unwrap();
                let mut around = vec![0u8; n + 2];
                map.copy_from(off - 1, &mut around).unwrap();
                assert_eq!(around[0], before[0], "byte before, size {n} offset {off}");
                assert_eq!(
                    around[n + 1],
                    before[n + 1],
                    "byte after, size {n} offset {off}"
                );
                assert_eq!(&around[1..=n], &data[..]);
            }
        }
    }
    map.unmap();
    pinned.unpin();
}

fn validate_with(vmm: bool) {
    let Some(c) = copier() else { return };
    let mut rng = rng();
    let alloc = if vmm {
        c.alloc_vmm(1 << 20)
    } else {
        c.alloc(1 << 20)
    }
    .unwrap();
    validate(&c, &alloc, &mut rng);
}

/// The service's other paths: every size through the service (no copy engine), with many
/// pollers and no ring mirrors; then one poller, hot polls of the header only (inline payloads
/// need a second read), small requests already split over the helper warps, tagged answers up
/// to 256 bytes only, a small block.
#[test]
fn data_validation_service_variants() {
    let Some(_) = copier() else { return };
    let mut rng = rng();
    let mut wide = CopyConfig {
        force_service: true,
        large_threshold: usize::MAX,
        ..CopyConfig::default()
    };
    wide.service.pollers = 4;
    wide.service.mirror_ring = false;
    wide.service.d2h_tagged_max = 4096;
    wide.service.d2h_tagged_min = 0;
    let mut narrow = CopyConfig {
        force_service: true,
        ..CopyConfig::default()
    };
    narrow.service.pollers = 1;
    narrow.service.threads = 128;
    narrow.service.hot_poll_bytes = 32;
    narrow.service.warp_max = 256;
    narrow.service.d2h_tagged_max = 256;
    narrow.service.stage_slot = 4096;
    narrow.service.ring_write_combined = false;
    narrow.service.h2d_stage_write_combined = true;
    for (name, cfg) in [("wide", wide), ("narrow", narrow)] {
        eprintln!("config {name}: {:?}", cfg.service);
        let c = Copier::open_with(0, cfg).unwrap();
        let alloc = c.alloc(1 << 20).unwrap();
        validate(&c, &alloc, &mut rng);
    }
}

/// The pinned pipeline of large copies: chunk boundaries, unaligned offsets, several threads
/// and callers at once, checked against the driver's own copies.
#[test]
fn large_copies_through_the_pinned_pipeline() {
    let Some(_) = copier() else { return };
    let mut rng = rng();
    let c = Copier::open_with(
        0,
        CopyConfig {
            force_service: true,
            large_threshold: 4096,
            large_threshold_d2h: 4096,
            pipeline_min: 0,
            pipeline_min_d2h: 0,
            pipeline_chunk: 256 << 10,
            copy_threads: 3,
            ..CopyConfig::default()
        },
    )
    .unwrap();
    let len = 4 << 20;
    let alloc = c.alloc(len).unwrap();
    let p = c.pin(alloc.ptr(), len as u64).unwrap();
    for &n in &[
        4096usize,
        65535,
        65536,
        65537,
        131_072,
        200_001,
        (1 << 20) + 3,
    ] {
        for &off in &[0u64, 1, 4099] {
            let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            p.copy_to(off, &data).unwrap();
            let mut check = vec![0u8; n];
            sys::memcpy_dtoh(c.context(), &mut check, alloc.ptr() + off).unwrap();
            assert!(check == data, "copy_to: size {n} offset {off}");
            let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            htod_complete(&c, alloc.ptr() + off, &data);
            let mut back = vec![0u8; n];
            p.copy_from(off, &mut back).unwrap();
            assert!(back == data, "copy_from: size {n} offset {off}");
        }
    }
    // Callers in several threads share the staging one copy at a time.
    let seed: u64 = rng.random();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let p = &p;
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed + t);
                let at = t * (1 << 20);
                for _ in 0..5 {
                    let n = rng.random_range(4096..=1 << 20);
                    let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                    p.copy_to(at, &data).unwrap();
                    let mut back = vec![0u8; n];
                    p.copy_from(at, &mut back).unwrap();
                    assert!(back == data, "thread {t}, {n} bytes");
                }
            });
        }
    });
}

/// Bad service settings are refused with a reason, never launched.
#[test]
fn bad_service_configs_are_refused() {
    let Some(_) = copier() else { return };
    let alloc_and_copy = |cfg: CopyConfig| {
        let c = Copier::open_with(0, cfg)?;
        let a = c.alloc(4096)?;
        let p = c.pin(a.ptr(), 4096)?;
        p.copy_to(0, &[1, 2, 3])
    };
    type Breaker = fn(&mut CopyConfig);
    let bad: [(&str, Breaker); 5] = [
        ("no slots", |c| c.service.nslots = 0),
        ("odd staging", |c| c.service.stage_slot = 1000),
        ("threads", |c| c.service.threads = 48),
        ("pollers", |c| c.service.pollers = 9),
        ("tagged above warp_max", |c| {
            c.service.d2h_tagged_max = c.service.warp_max + 1;
        }),
    ];
    for (name, set) in bad {
        let mut cfg = CopyConfig {
            force_service: true,
            ..CopyConfig::default()
        };
        set(&mut cfg);
        let e = alloc_and_copy(cfg).unwrap_err();
        assert!(
            matches!(e, CopyError::Invalid(ref m) if m.contains("service config")),
            "{name}: {e}"
        );
    }
}

/// Threads posting and reading through one copier, across the inline, staged, helper and
/// chunked paths: every read sees the thread's last write (ring order), nothing else changes.
#[test]
fn concurrent_posts_and_reads_keep_order() {
    let Some(_) = copier() else { return };
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let c = Copier::open_with(
        0,
        CopyConfig {
            force_service: true,
            large_threshold: usize::MAX,
            ..CopyConfig::default()
        },
    )
    .unwrap();
    let region = 1usize << 20;
    let alloc = c.alloc(6 * region).unwrap();
    let base = alloc.ptr();
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let c = c.clone();
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed + t);
                let p = c.pin(base + t * region as u64, region as u64).unwrap();
                let mut model = vec![0u8; region];
                p.copy_to(0, &model).unwrap();
                for round in 0..150 {
                    let n = match rng.random_range(0..5) {
                        0 => rng.random_range(1..=240),
                        1 => rng.random_range(241..=4096),
                        2 => rng.random_range(4097..=65536),
                        3 => rng.random_range(65537..=300_000),
                        _ => rng.random_range(1..=16),
                    };
                    let off = rng.random_range(0..region - n);
                    let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                    if rng.random_bool(0.5) {
                        p.post_to(off as u64, &data).unwrap();
                    } else {
                        p.copy_to(off as u64, &data).unwrap();
                    }
                    model[off..off + n].copy_from_slice(&data);
                    let m = rng.random_range(1..=5000).min(region);
                    let at = rng.random_range(0..=region - m);
                    let mut back = vec![0u8; m];
                    p.copy_from(at as u64, &mut back).unwrap();
                    assert_eq!(back, model[at..at + m], "thread {t} round {round}");
                }
                let mut all = vec![0u8; region];
                p.copy_from(0, &mut all).unwrap();
                assert!(all == model, "thread {t}: final contents differ");
            });
        }
    });
}

#[test]
fn data_validation_cumemalloc() {
    validate_with(false);
}

#[test]
fn data_validation_vmmalloc() {
    validate_with(true);
}

#[test]
fn small_buffers_and_posted_writes() {
    let Some(c) = copier() else { return };
    let mut rng = rng();
    let bufs: Vec<_> = (0..8).map(|_| c.alloc(8).unwrap()).collect();
    let pins: Vec<_> = bufs.iter().map(|b| c.pin(b.ptr(), 8).unwrap()).collect();
    let mut model = vec![[0u8; 8]; 8];
    for _ in 0..500 {
        let i = rng.random_range(0..8);
        let v: [u8; 8] = rng.random();
        pins[i].post_to(0, &v).unwrap();
        model[i] = v;
    }
    // Reads come after every posted write of the same copier.
    for (p, m) in pins.iter().zip(&model) {
        let mut out = [0u8; 8];
        p.copy_from(0, &mut out).unwrap();
        assert_eq!(&out, m);
    }
    assert!(matches!(
        pins[0].copy_to(1, &[0u8; 8]),
        Err(CopyError::OutOfRange { .. })
    ));
    assert!(matches!(
        pins[0].copy_from(8, &mut [0u8; 1]),
        Err(CopyError::OutOfRange { .. })
    ));
    pins[0].copy_to(8, &[]).unwrap();
}

#[test]
fn many_pins_and_threads() {
    let Some(c) = copier() else { return };
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let alloc = c.alloc(16 << 20).unwrap();
    let base = alloc.ptr();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let c = c.clone();
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed + t);
                let region = base + t * (2 << 20);
                let pins: Vec<_> = (0..4)
                    .map(|k| c.pin(region + k * (512 << 10), 512 << 10).unwrap())
                    .collect();
                for _ in 0..200 {
                    let p = &pins[rng.random_range(0..4)];
                    let n = rng.random_range(1..=8192);
                    let off = rng.random_range(0..(512 << 10) - n as u64);
                    let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                    p.copy_to(off, &data).unwrap();
                    let mut back = vec![0u8; n];
                    p.copy_from(off, &mut back).unwrap();
                    assert_eq!(back, data, "thread {t}");
                }
            });
        }
    });
}

#[test]
fn bad_pins_and_use_after_free_are_errors() {
    let Some(c) = copier() else { return };
    let host = [0u8; 64];
    let e = c.pin(host.as_ptr() as u64, 64).unwrap_err();
    assert!(matches!(e, CopyError::NotDeviceMemory { .. }), "{e}");
    assert!(matches!(
        c.pin(0, 64),
        Err(CopyError::NotDeviceMemory { .. })
    ));
    let alloc = c.alloc(1 << 20).unwrap();
    assert!(matches!(c.pin(alloc.ptr(), 0), Err(CopyError::BadSize(0))));
    let e = c.pin(alloc.ptr(), 64 << 20).unwrap_err();
    assert!(matches!(e, CopyError::PastAllocation { .. }), "{e}");
    let pinned = c.pin(alloc.ptr(), 4096).unwrap();
    pinned.copy_to(0, &[1, 2, 3]).unwrap();
    drop(alloc);
    let e = pinned.copy_to(0, &[1, 2, 3]).unwrap_err();
    assert!(matches!(e, CopyError::Freed { .. }), "{e}");
    assert!(matches!(
        pinned.copy_from(0, &mut [0u8; 3]),
        Err(CopyError::Freed { .. })
    ));
    // The service is still healthy afterwards.
    let other = c.alloc(4096).unwrap();
    let p2 = c.pin(other.ptr(), 4096).unwrap();
    p2.copy_to(5, b"still fine").unwrap();
    let mut out = [0u8; 10];
    p2.copy_from(5, &mut out).unwrap();
    assert_eq!(&out, b"still fine");
}

#[test]
fn service_stops_restarts_and_idles_out() {
    let Some(_) = copier() else { return };
    let mut cfg = CopyConfig {
        force_service: true,
        ..CopyConfig::default()
    };
    cfg.service.idle_stop = Some(Duration::from_millis(50));
    let c = Copier::open_with(0, cfg).unwrap();
    let alloc = c.alloc(4096).unwrap();
    let p = c.pin(alloc.ptr(), 4096).unwrap();
    assert!(!c.service_running());
    p.copy_to(0, b"one").unwrap();
    assert!(c.service_running());
    c.stop_service().unwrap();
    assert!(!c.service_running());
    p.copy_to(3, b"two").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !c.service_running(),
        "the idle reaper did not stop the kernel"
    );
    let mut out = [0u8; 6];
    p.copy_from(0, &mut out).unwrap();
    assert_eq!(&out, b"onetwo");
}

#[test]
fn stream_ordered_copies() {
    let Some(c) = copier() else { return };
    let alloc = c.alloc(1 << 20).unwrap();
    let p = c.pin(alloc.ptr(), 1 << 20).unwrap();
    let stream = sys::Stream::new(c.context()).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    p.post_to(0, &data[..100]).unwrap();
    // SAFETY: a live stream of this GPU.
    unsafe { p.copy_to_on_stream(stream.raw(), 50, &data).unwrap() };
    let mut out = vec![0u8; data.len()];
    // SAFETY: as above.
    unsafe { p.copy_from_on_stream(stream.raw(), 50, &mut out).unwrap() };
    assert_eq!(out, data);
    let mut head = [0u8; 50];
    p.copy_from(0, &mut head).unwrap();
    assert_eq!(&head[..], &data[..50]);
}

#[test]
fn fork_child_gets_an_error_not_a_crash() {
    let Some(c) = copier() else { return };
    let alloc = c.alloc(4096).unwrap();
    let p = c.pin(alloc.ptr(), 4096).unwrap();
    p.copy_to(0, b"parent").unwrap();
    // SAFETY: the child only calls copy_to, which fails its process check before any CUDA
    // call, and then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match p.copy_to(0, b"child!") {
            Err(CopyError::Forked { .. }) => 0,
            _ => 1,
        };
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &raw mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
    let mut out = [0u8; 6];
    p.copy_from(0, &mut out).unwrap();
    assert_eq!(&out, b"parent");
}

#[test]
fn two_processes_copy_at_once() {
    if std::env::var_os("STRATA_COPY_TEST_CHILD").is_some() {
        // Child: its own copier, buffer and data.
        let c = Copier::open(0).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let alloc = c.alloc(1 << 20).unwrap();
        let p = c.pin(alloc.ptr(), 1 << 20).unwrap();
        for _ in 0..300 {
            let n = rng.random_range(1..4096);
            let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            p.copy_to(0, &data).unwrap();
            let mut back = vec![0u8; n];
            p.copy_from(0, &mut back).unwrap();
            assert_eq!(back, data);
        }
        return;
    }
    let Some(c) = copier() else { return };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "two_processes_copy_at_once"])
        .env("STRATA_COPY_TEST_CHILD", "1")
        .spawn()
        .unwrap();
    let mut rng = rng();
    let alloc = c.alloc(1 << 20).unwrap();
    let p = c.pin(alloc.ptr(), 1 << 20).unwrap();
    for _ in 0..300 {
        let n = rng.random_range(1..4096);
        let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        p.copy_to(0, &data).unwrap();
        let mut back = vec![0u8; n];
        p.copy_from(0, &mut back).unwrap();
        assert_eq!(back, data);
    }
    let start = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "child process failed: {s:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "child process hung"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
