//! `strata bench copy`: small CPU<->GPU copies through strata-copy next to cudaMemcpy and
//! cudaMemcpyAsync + sync (driver-API equivalents) in the same run, after GDRCopy's copylat,
//! copybw, pplat and apiperf; plus what each tuning choice of the copy service buys.
//! Percentiles over per-operation timings after a warm-up; JSON and an SVG plot.

use std::ffi::c_void;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use strata_copy::sys::{self, HostMem, Kernel, Stream};
use strata_copy::{Copier, CopyConfig};

/// Arguments of `strata bench copy`.
#[derive(Debug, clap::Args)]
pub struct CopyBenchArgs {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Timed operations per small size (fewer for large sizes).
    #[arg(long, default_value_t = 2000)]
    iters: usize,
    /// Untimed operations first.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Largest copylat size in bytes (powers of two from 1 B).
    #[arg(long, default_value_t = 16 << 20)]
    max_size: usize,
    /// Write results here (JSON) and next to it with .svg (plot of copylat p50).
    #[arg(long, default_value = "copy-bench.json")]
    json: PathBuf,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Stats {
    iters: usize,
    min_us: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    mean_us: f64,
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn stats(mut ns: Vec<u64>) -> Stats {
    ns.sort_unstable();
    let us = |v: u64| v as f64 / 1000.0;
    let pick = |q: f64| us(ns[((ns.len() - 1) as f64 * q).round() as usize]);
    Stats {
        iters: ns.len(),
        min_us: us(ns[0]),
        p50_us: pick(0.5),
        p90_us: pick(0.9),
        p99_us: pick(0.99),
        mean_us: ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0,
    }
}

fn time_ops(
    warmup: usize,
    iters: usize,
    mut op: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<Stats> {
    for i in 0..warmup {
        op(i)?;
    }
    let mut ns = Vec::with_capacity(iters);
    for i in 0..iters {
        let t = Instant::now();
        op(i)?;
        ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    Ok(stats(ns))
}

/// Times only `op`, running untimed `setup` before each.
fn time_split(
    iters: usize,
    mut setup: impl FnMut() -> anyhow::Result<()>,
    mut op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Stats> {
    let mut ns = Vec::with_capacity(iters);
    for _ in 0..iters {
        setup()?;
        let t = Instant::now();
        op()?;
        ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    Ok(stats(ns))
}

#[derive(Debug, serde::Serialize)]
struct Row {
    test: &'static str,
    method: String,
    size: usize,
    #[serde(flatten)]
    stats: Stats,
    gb_per_s: f64,
}

fn row(test: &'static str, method: impl Into<String>, size: usize, stats: Stats) -> Row {
    let gb_per_s = if stats.p50_us > 0.0 {
        size as f64 / stats.p50_us / 1000.0
    } else {
        0.0
    };
    Row {
        test,
        method: method.into(),
        size,
        stats,
        gb_per_s,
    }
}

fn print_row(r: &Row) {
    println!(
        "{:<8} {:<34} {:>9} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.2}",
        r.test,
        r.method,
        r.size,
        r.stats.iters,
        r.stats.min_us,
        r.stats.p50_us,
        r.stats.p90_us,
        r.stats.p99_us,
        r.gb_per_s
    );
}

fn header() {
    println!(
        "{:<8} {:<34} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "test", "method", "bytes", "iters", "min us", "p50 us", "p90 us", "p99 us", "GB/s@p50"
    );
}

#[derive(Debug, serde::Serialize)]
struct Report {
    gpu: String,
    backend: strata_copy::BackendReport,
    rows: Vec<Row>,
}

const ECHO_CU: &str = r#"
extern "C" __global__ void strata_bench_echo(volatile unsigned* flag, volatile unsigned* host,
                                             unsigned long long timeout_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    // Start from 0 and say so: the host's first write may land before this kernel starts.
    unsigned last = 0;
    *host = 0xfffffffeu;
    __threadfence_system();
    for (;;) {
        unsigned v = *flag;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (v != last) {
            last = v;
            *host = v;
            __threadfence_system();
            if (v == 0xffffffffu) return;
            start = now;
        } else if (now - start > timeout_ns) {
            return;
        }
    }
}
"#;

/// What bounds the copy service, measured by one GPU thread with `%globaltimer`: dependent
/// reads of pinned host memory (the PCIe round trip R every poll pays), a store to host memory
/// followed by a system-scope fence, a store to device memory followed by a GPU-scope fence.
/// Then a mailbox: `pollers` warps poll their own copy of a word in write-combined host memory
/// and the first to see a new value writes it back into cached host memory (the floor of any
/// doorbell protocol: one poll and one posted write, no copy).
const PROBE_CU: &str = r#"
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void strata_bench_costs(unsigned long long* host, unsigned long long* dev,
                                              unsigned long long* out, unsigned iters) {
    if (threadIdx.x != 0) return;
    unsigned long long x = 0, t = now_ns();
    for (unsigned i = 0; i < iters; ++i) {
        unsigned long long v;
        asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(host + (x & 1)) : "memory");
        x += v + 2;
    }
    out[0] = (now_ns() - t) / iters;
    t = now_ns();
    for (unsigned i = 0; i < iters; ++i) {
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(host + 8), "l"(x + i) : "memory");
        __threadfence_system();
    }
    out[1] = (now_ns() - t) / iters;
    t = now_ns();
    for (unsigned i = 0; i < iters; ++i) {
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dev), "l"(x + i) : "memory");
        __threadfence();
    }
    out[2] = (now_ns() - t) / iters;
    t = now_ns();
    for (unsigned i = 0; i < iters; ++i) {
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dev), "l"(x + i) : "memory");
        __threadfence_system();
    }
    out[3] = (now_ns() - t) / iters;
    t = now_ns();
    for (unsigned i = 0; i < iters; ++i) {
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dev), "l"(x + i) : "memory");
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    out[4] = (now_ns() - t) / iters;
    t = now_ns();
    for (unsigned i = 0; i < iters; ++i) {
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(host + 8), "l"(x + i) : "memory");
        asm volatile("fence.acq_rel.sys;" ::: "memory");
    }
    out[5] = (now_ns() - t) / iters;
    t = now_ns();
    unsigned long long* word = dev + 64;
    for (unsigned i = 0; i < iters; ++i) x += atomicCAS(word, x, x + 1) & 1;
    out[6] = (now_ns() - t) / iters;
    out[7] = x;
}
extern "C" __global__ void strata_bench_mailbox(const unsigned long long* flags,
                                                unsigned long long* acks, unsigned load_kind,
                                                unsigned stagger_ns, unsigned long long timeout_ns) {
    // Poller i (one per warp, in any block) polls its own word, a page apart from the others,
    // and acknowledges into its own word.
    const unsigned lane = threadIdx.x & 31;
    const unsigned i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (lane != 0) return;
    __nanosleep(i * stagger_ns);
    const unsigned long long* flag = flags + 512 * i;
    unsigned long long last = 0, seen = now_ns();
    for (;;) {
        unsigned long long v;
        if (load_kind == 0) {
            asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
        } else if (load_kind == 1) {
            asm volatile("ld.global.cv.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
        } else {
            asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory");
        }
        const unsigned long long now = now_ns();
        if (v == ~0ull) return;
        if (v != last) {
            last = v;
            asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(acks + 8 * i), "l"(v) : "memory");
            seen = now;
        } else if (now - seen > timeout_ns) {
            return;
        }
    }
}
"#;

/// Runs the probes of [`PROBE_CU`]; rows in `rows`.
fn probe_limits(
    ctx: &strata_copy::sys::Context,
    arch: &str,
    args: &CopyBenchArgs,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let cubin = sys::nvrtc_compile(PROBE_CU, "probe.cu", arch)?;
    let costs = Kernel::load(ctx, &cubin, "strata_bench_costs")?;
    let mailbox = Kernel::load(ctx, &cubin, "strata_bench_mailbox")?;
    let stream = Stream::new(ctx)?;
    let host = HostMem::new(ctx, 4096, false)?;
    let out = HostMem::new(ctx, 4096, false)?;
    let dev = sys::DeviceAlloc::new(ctx, 4096)?;
    {
        let mut h = host.device_ptr()?;
        let mut d = dev.ptr();
        let mut o = out.device_ptr()?;
        let mut iters: u32 = 2000;
        let mut params: [*mut c_void; 4] = [
            (&raw mut h).cast(),
            (&raw mut d).cast(),
            (&raw mut o).cast(),
            (&raw mut iters).cast(),
        ];
        // SAFETY: parameters match strata_bench_costs; the buffers outlive the synchronised
        // launch.
        unsafe { costs.launch(stream.raw(), 1, 32, &mut params)? };
        stream.synchronize()?;
    }
    let o = out.ptr().cast::<u64>();
    let names = [
        "GPU read of pinned host memory (R)",
        "GPU host store + sys fence",
        "GPU device store + gpu fence",
        "GPU device store + sys fence",
        "GPU device store + acq_rel gpu fence",
        "GPU host store + acq_rel sys fence",
        "GPU atomicCAS on device memory",
    ];
    for (i, name) in names.iter().enumerate() {
        // SAFETY: word i of our synchronised pinned buffer.
        let ns = unsafe { o.add(i).read_volatile() };
        #[allow(clippy::cast_precision_loss)]
        let us = ns as f64 / 1000.0;
        let r = row(
            "limits",
            *name,
            8,
            Stats {
                iters: 2000,
                min_us: us,
                p50_us: us,
                p90_us: us,
                p99_us: us,
                mean_us: us,
            },
        );
        print_row(&r);
        rows.push(r);
    }
    // Mailbox round trips: pollers in one block or one per block, three kinds of load.
    let flags = HostMem::new(ctx, 4 << 12, true)?;
    let acks = HostMem::new(ctx, 4096, false)?;
    let ack_words = acks.ptr().cast::<u64>();
    let cached_flags = HostMem::new(ctx, 4 << 12, false)?;
    let layouts: [(u32, u32, u32, &str); 8] = [
        (1, 1, 0, "1 poller, volatile loads"),
        (1, 1, 3, "1 poller, flag in cached memory"),
        (1, 2, 0, "2 pollers in one block, volatile"),
        (1, 4, 0, "4 pollers in one block, volatile"),
        (4, 1, 0, "4 pollers in 4 blocks, volatile"),
        (1, 1, 1, "1 poller, ld.cv"),
        (1, 4, 1, "4 pollers in one block, ld.cv"),
        (1, 4, 2, "4 pollers in one block, relaxed.sys"),
    ];
    for (grid, per_block, layout_kind, name) in layouts {
        let pollers = (grid * per_block) as usize;
        // Kind 3: volatile loads of a flag in cached (not write-combined) host memory.
        let (kind, flags) = if layout_kind == 3 {
            (0, &cached_flags)
        } else {
            (layout_kind, &flags)
        };
        let flag_words = flags.ptr().cast::<u64>();
        let write_all = |v: u64| {
            for w in 0..pollers {
                // SAFETY: word 512w of our 16 KiB pinned buffer (w < 4).
                unsafe { flag_words.add(512 * w).write_volatile(v) };
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: sfence has no preconditions.
            unsafe {
                std::arch::x86_64::_mm_sfence();
            }
        };
        write_all(0);
        for w in 0..pollers {
            // SAFETY: our pinned words.
            unsafe { ack_words.add(8 * w).write_volatile(0) };
        }
        let mut f = flags.device_ptr()?;
        let mut a = acks.device_ptr()?;
        let mut k = kind;
        let mut stagger: u32 = 1200 / u32::try_from(pollers).unwrap_or(1);
        let mut timeout: u64 = 10_000_000_000;
        let mut params: [*mut c_void; 5] = [
            (&raw mut f).cast(),
            (&raw mut a).cast(),
            (&raw mut k).cast(),
            (&raw mut stagger).cast(),
            (&raw mut timeout).cast(),
        ];
        // SAFETY: parameters match strata_bench_mailbox; the buffers outlive the kernel, which
        // is stopped (flags = all ones) and synchronised below.
        unsafe { mailbox.launch(stream.raw(), grid, 32 * per_block, &mut params)? };
        let mut v = 0u64;
        let res = time_ops(args.warmup, args.iters, |_| {
            v += 1;
            write_all(v);
            let t = Instant::now();
            // SAFETY: our pinned words, written by the kernel.
            while !(0..pollers).any(|w| unsafe { ack_words.add(8 * w).read_volatile() } == v) {
                std::hint::spin_loop();
                if t.elapsed() > Duration::from_secs(2) {
                    anyhow::bail!("the mailbox kernel did not answer within 2 s");
                }
            }
            Ok(())
        });
        write_all(u64::MAX);
        stream.synchronize()?;
        let r = row("limits", format!("mailbox round trip, {name}"), 8, res?);
        print_row(&r);
        rows.push(r);
    }
    Ok(())
}

/// Runs the benchmark.
pub fn bench(args: &CopyBenchArgs) -> anyhow::Result<()> {
    if args.iters == 0 || args.max_size == 0 {
        anyhow::bail!("--iters and --max-size must be positive");
    }
    let copier = Copier::open(args.gpu).context("opening the GPU for copies")?;
    let ctx = copier.context().clone();
    println!("gpu {}: {}", args.gpu, copier.gpu_name());
    println!("backend: {}", copier.report().backend);
    println!("  gdrdrv: {}", copier.report().gdrdrv);
    println!("  dma-buf mmap: {}", copier.report().dmabuf);
    let max = args.max_size.next_power_of_two();
    let dev = copier.alloc(max.max(1 << 20))?;
    let pinned = copier.pin(dev.ptr(), dev.len() as u64)?;
    let map = pinned.map()?;
    let stream = Stream::new(&ctx)?;
    let host_pinned = HostMem::new(&ctx, max.max(1 << 20), false)?;
    let mut pageable = vec![0x5Au8; max.max(1 << 20)];
    let mut rows = Vec::new();
    // Every size through the copy service (no copy engine), to place the default's switch.
    let mut service_cfg = CopyConfig {
        force_service: true,
        large_threshold: usize::MAX,
        large_threshold_d2h: usize::MAX,
        ..CopyConfig::default()
    };
    service_cfg.service.h2d_stage_write_combined = false;
    let service_only = Copier::open_with(args.gpu, service_cfg)?;
    let service_pin = service_only.pin(dev.ptr(), dev.len() as u64)?;
    // Large copies through the pinned pipeline from 128 KiB.
    let piped = Copier::open_with(
        args.gpu,
        CopyConfig {
            force_service: true,
            large_threshold: 128 << 10,
            large_threshold_d2h: 128 << 10,
            pipeline_min: 0,
            pipeline_min_d2h: 0,
            ..CopyConfig::default()
        },
    )?;
    let piped_pin = piped.pin(dev.ptr(), dev.len() as u64)?;
    header();

    // copylat / copybw.
    let mut size = 1usize;
    while size <= max {
        let iters = (args.iters).min(((256usize << 20) / size).max(20));
        let warm = args.warmup.min(iters);
        let n = size;
        let mut push = |r: Row| {
            print_row(&r);
            rows.push(r);
        };
        let data = pageable[..n].to_vec();
        push(row(
            "copylat",
            "strata copy_to (H2D)",
            n,
            time_ops(warm, iters, |_| Ok(map.copy_to(0, &data)?))?,
        ));
        push(row(
            "copylat",
            "cudaMemcpy H2D (pageable)",
            n,
            time_ops(warm, iters, |_| {
                Ok(sys::memcpy_htod(&ctx, dev.ptr(), &data)?)
            })?,
        ));
        push(row(
            "copylat",
            "cudaMemcpyAsync+sync H2D (pinned)",
            n,
            time_ops(warm, iters, |_| {
                // SAFETY: the pinned buffer outlives the copy, which is waited for at once.
                unsafe {
                    sys::memcpy_htod_async(&ctx, dev.ptr(), host_pinned.ptr(), n, stream.raw())?
                };
                Ok(stream.synchronize()?)
            })?,
        ));
        if n >= 128 << 10 {
            push(row(
                "copylat",
                "strata copy_to, pinned pipeline (H2D)",
                n,
                time_ops(warm, iters, |_| Ok(piped_pin.copy_to(0, &data)?))?,
            ));
        }
        if n >= 16 << 10 {
            push(row(
                "copylat",
                "strata copy_to, service only (H2D)",
                n,
                time_ops(warm, iters, |_| Ok(service_pin.copy_to(0, &data)?))?,
            ));
        }
        let out = &mut pageable[..n];
        push(row(
            "copylat",
            "strata copy_from (D2H)",
            n,
            time_ops(warm, iters, |_| Ok(map.copy_from(0, out)?))?,
        ));
        if n >= 128 << 10 {
            push(row(
                "copylat",
                "strata copy_from, pinned pipeline (D2H)",
                n,
                time_ops(warm, iters, |_| Ok(piped_pin.copy_from(0, out)?))?,
            ));
        }
        if n >= 16 << 10 {
            push(row(
                "copylat",
                "strata copy_from, service only (D2H)",
                n,
                time_ops(warm, iters, |_| Ok(service_pin.copy_from(0, out)?))?,
            ));
            service_only.stop_service()?;
        }
        push(row(
            "copylat",
            "cudaMemcpy D2H (pageable)",
            n,
            time_ops(warm, iters, |_| Ok(sys::memcpy_dtoh(&ctx, out, dev.ptr())?))?,
        ));
        push(row(
            "copylat",
            "cudaMemcpyAsync+sync D2H (pinned)",
            n,
            time_ops(warm, iters, |_| {
                // SAFETY: as above.
                unsafe {
                    sys::memcpy_dtoh_async(&ctx, host_pinned.ptr(), dev.ptr(), n, stream.raw())?
                };
                Ok(stream.synchronize()?)
            })?,
        ));
        size *= 2;
    }

    // pplat: CPU writes a 4-byte flag to device memory; a GPU kernel polling it echoes the value
    // into pinned host memory; the CPU spins on that.
    let echo_stream = Stream::new(&ctx)?;
    let arch = {
        use cudarc::driver::sys::CUdevice_attribute as A;
        format!(
            "sm_{}{}",
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
        )
    };
    let echo = Kernel::load(
        &ctx,
        &sys::nvrtc_compile(ECHO_CU, "echo.cu", &arch)?,
        "strata_bench_echo",
    )?;
    let echo_host = HostMem::new(&ctx, 64, false)?;
    let flag_dev = copier.alloc(4096)?;
    let flag = copier.pin(flag_dev.ptr(), 4)?;
    flag.copy_to(0, &0u32.to_le_bytes())?;
    let host_word = echo_host.ptr().cast::<u32>();
    let wait_echo = |v: u32| -> anyhow::Result<()> {
        let t = Instant::now();
        // SAFETY: a live, aligned word of pinned memory the echo kernel writes.
        while unsafe { host_word.read_volatile() } != v {
            std::hint::spin_loop();
            if t.elapsed() > Duration::from_secs(2) {
                anyhow::bail!("the echo kernel did not answer within 2 s");
            }
        }
        Ok(())
    };
    {
        let mut flag_ptr = flag_dev.ptr();
        let mut host_dev = echo_host.device_ptr()?;
        let mut timeout: u64 = 30_000_000_000;
        let mut params: [*mut c_void; 3] = [
            (&raw mut flag_ptr).cast(),
            (&raw mut host_dev).cast(),
            (&raw mut timeout).cast(),
        ];
        // SAFETY: parameters match strata_bench_echo(unsigned*, unsigned*, unsigned long long);
        // both buffers outlive the kernel, which is stopped (flag = 0xffffffff) below.
        unsafe { echo.launch(echo_stream.raw(), 1, 1, &mut params)? };
    }
    wait_echo(0xffff_fffe).context("waiting for the echo kernel to start")?;
    let mut counter = 0u32;
    let mut next = || {
        counter = counter.wrapping_add(1) % 0xffff_fff0 + 1;
        counter
    };
    let pp_iters = args.iters.max(20);
    let mut pp = |name: &str, r: Stats| {
        let r = row("pplat", name, 4, r);
        print_row(&r);
        rows.push(r);
    };
    pp(
        "strata post_to + GPU echo",
        time_ops(args.warmup, pp_iters, |_| {
            let v = next();
            flag.post_to(0, &v.to_le_bytes())?;
            wait_echo(v)
        })?,
    );
    pp(
        "strata copy_to + GPU echo",
        time_ops(args.warmup, pp_iters, |_| {
            let v = next();
            flag.copy_to(0, &v.to_le_bytes())?;
            wait_echo(v)
        })?,
    );
    pp(
        "cudaMemcpy H2D + GPU echo",
        time_ops(args.warmup, pp_iters, |_| {
            let v = next();
            sys::memcpy_htod(&ctx, flag_dev.ptr(), &v.to_le_bytes())?;
            wait_echo(v)
        })?,
    );
    let staging = host_pinned.ptr().cast::<u32>();
    pp(
        "cudaMemcpyAsync+sync H2D + GPU echo",
        time_ops(args.warmup, pp_iters, |_| {
            let v = next();
            // SAFETY: aligned word of our pinned buffer; the copy below is waited for.
            unsafe { staging.write_volatile(v) };
            // SAFETY: as above.
            unsafe {
                sys::memcpy_htod_async(&ctx, flag_dev.ptr(), host_pinned.ptr(), 4, stream.raw())?
            };
            stream.synchronize()?;
            wait_echo(v)
        })?,
    );
    flag.copy_to(0, &u32::MAX.to_le_bytes())?;
    echo_stream.synchronize()?;
    copier.stop_service()?;
    if let Err(e) = probe_limits(&ctx, &arch, args, &mut rows) {
        println!("limits   probes failed: {e:#}");
    }

    // apiperf.
    let api_size = 64usize << 10;
    let api_buf = copier.alloc(api_size)?;
    let mut ap = |name: &str, r: Stats| {
        let r = row("apiperf", name, api_size, r);
        print_row(&r);
        rows.push(r);
    };
    ap(
        "Copier::open (probes backends)",
        time_ops(1, 5, |_| {
            Copier::open(args.gpu)?;
            Ok(())
        })?,
    );
    ap(
        "pin",
        time_ops(10, 200, |_| {
            std::hint::black_box(copier.pin(api_buf.ptr(), api_size as u64)?);
            Ok(())
        })?,
    );
    let p = copier.pin(api_buf.ptr(), api_size as u64)?;
    ap(
        "map + unmap",
        time_ops(10, 200, |_| {
            std::hint::black_box(p.map()?);
            Ok(())
        })?,
    );
    ap(
        "liveness check of a pin (one driver query)",
        time_ops(10, 200, |_| {
            std::hint::black_box(p.check(0, 8)?);
            Ok(())
        })?,
    );
    ap(
        "copy_to 8 B, service already running",
        time_ops(10, 200, |_| Ok(p.copy_to(0, &[1u8; 8])?))?,
    );
    ap(
        "post_to 8 B (host side only, no wait)",
        time_split(200, || Ok(copier.flush()?), || Ok(p.post_to(0, &[1u8; 8])?))?,
    );
    ap(
        "stop_service (running, idle)",
        time_split(
            20,
            || Ok(p.copy_to(0, &[1u8; 8])?),
            || Ok(copier.stop_service()?),
        )?,
    );
    ap(
        "first copy_to 8 B (starts the service)",
        time_split(
            20,
            || Ok(copier.stop_service()?),
            || Ok(p.copy_to(0, &[1u8; 8])?),
        )?,
    );
    ap(
        "cudaMemcpy H2D 8 B (reference)",
        time_ops(10, 200, |_| {
            Ok(sys::memcpy_htod(&ctx, api_buf.ptr(), &[1u8; 8])?)
        })?,
    );

    // Tuning: what each choice buys (same sizes, one knob changed per line).
    let tune_buf = copier.alloc(1 << 20)?;
    let with = |set: &dyn Fn(&mut CopyConfig)| {
        let mut c = CopyConfig::default();
        set(&mut c);
        c
    };
    let variants: [(&str, CopyConfig); 15] = [
        ("default", CopyConfig::default()),
        ("1 poller", with(&|c| c.service.pollers = 1)),
        ("2 pollers, stagger 600 ns", {
            with(&|c| {
                c.service.pollers = 2;
                c.service.poll_stagger_ns = 600;
            })
        }),
        (
            "no rephase after serving",
            with(&|c| c.service.rephase_ns = 0),
        ),
        ("no ring mirrors", with(&|c| c.service.mirror_ring = false)),
        ("hot poll 128 B", with(&|c| c.service.hot_poll_bytes = 128)),
        ("no hot window", with(&|c| c.service.hot_ns = 0)),
        ("no tagged D2H", with(&|c| c.service.d2h_tagged_max = 0)),
        ("tagged D2H from 1 B to 4 KiB", {
            with(&|c| {
                c.service.d2h_tagged_min = 0;
                c.service.d2h_tagged_max = 4096;
            })
        }),
        ("ring in cached memory", {
            with(&|c| c.service.ring_write_combined = false)
        }),
        ("WC H2D staging", {
            with(&|c| c.service.h2d_stage_write_combined = true)
        }),
        (
            "no per-copy liveness check",
            with(&|c| c.check_liveness = false),
        ),
        (
            "sys fence after H2D",
            with(&|c| c.service.sys_fence_h2d = true),
        ),
        ("polls with ld.cv", with(&|c| c.service.poll_cv = true)),
        ("acq_rel fences", with(&|c| c.service.acq_rel_fences = true)),
    ];
    for (name, mut cfg) in variants {
        cfg.force_service = true;
        if let Err(e) = tune_variant(args, name, cfg, &tune_buf, &mut rows) {
            println!("tune     {name}: failed: {e:#}");
        }
    }
    // Batching: 16 small writes posted then one flush, per write, against 16 waited writes.
    let p = copier.pin(tune_buf.ptr(), 1 << 20)?;
    let data = [3u8; 64];
    let batched = time_ops(args.warmup / 16, args.iters / 16, |_| {
        for k in 0..16u64 {
            p.post_to(k * 64, &data)?;
        }
        Ok(copier.flush()?)
    })?;
    let r = row(
        "tune",
        "16 x 64 B: post_to x16 + flush (per batch)",
        64 * 16,
        batched,
    );
    print_row(&r);
    rows.push(r);
    let waited = time_ops(args.warmup / 16, args.iters / 16, |_| {
        for k in 0..16u64 {
            p.copy_to(k * 64, &data)?;
        }
        Ok(())
    })?;
    let r = row(
        "tune",
        "16 x 64 B: copy_to x16 (per batch)",
        64 * 16,
        waited,
    );
    print_row(&r);
    rows.push(r);

    let report = Report {
        gpu: copier.gpu_name(),
        backend: copier.report().clone(),
        rows,
    };
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    let svg_path = args.json.with_extension("svg");
    std::fs::write(&svg_path, svg(&report.rows))
        .with_context(|| format!("writing {}", svg_path.display()))?;
    println!("wrote {} and {}", args.json.display(), svg_path.display());
    Ok(())
}

/// One tuning variant: the small sizes both ways on a fresh service with config `cfg`.
fn tune_variant(
    args: &CopyBenchArgs,
    name: &str,
    cfg: CopyConfig,
    buf: &sys::DeviceAlloc,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let c = Copier::open_with(args.gpu, cfg)?;
    let p = c.pin(buf.ptr(), 1 << 20)?;
    for &n in &[8usize, 240, 241, 512, 1024, 4096] {
        let data = vec![7u8; n];
        let mut out = vec![0u8; n];
        let r = row(
            "tune",
            format!("H2D {name}"),
            n,
            time_ops(args.warmup, args.iters, |_| Ok(p.copy_to(0, &data)?))?,
        );
        print_row(&r);
        rows.push(r);
        let r = row(
            "tune",
            format!("D2H {name}"),
            n,
            time_ops(args.warmup, args.iters, |_| Ok(p.copy_from(0, &mut out)?))?,
        );
        print_row(&r);
        rows.push(r);
    }
    Ok(())
}

/// Log-log plot of copylat p50 against size, one line per method.
fn svg(rows: &[Row]) -> String {
    let lat: Vec<&Row> = rows.iter().filter(|r| r.test == "copylat").collect();
    let mut methods: Vec<&str> = lat.iter().map(|r| r.method.as_str()).collect();
    methods.dedup();
    methods.sort_unstable();
    methods.dedup();
    let (w, h, ml, mb, mt, mr) = (900.0, 560.0, 70.0, 50.0, 30.0, 330.0);
    let max_size = lat.iter().map(|r| r.size).max().unwrap_or(1).max(2) as f64;
    let (ymin, ymax) = lat.iter().fold((f64::MAX, 0.0f64), |(lo, hi), r| {
        (lo.min(r.stats.p50_us), hi.max(r.stats.p50_us))
    });
    let (ly0, ly1) = (
        ymin.max(0.01).log10().floor(),
        ymax.max(0.02).log10().ceil(),
    );
    let x = |s: usize| ml + (s as f64).log2() / max_size.log2() * (w - ml - mr);
    let y = |v: f64| h - mb - (v.max(0.01).log10() - ly0) / (ly1 - ly0).max(1.0) * (h - mb - mt);
    let colors = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    ];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{ml}\" y=\"18\">copylat: p50 latency (us, log) against copy size (bytes, log2)</text>\n"
    );
    let mut d = ly0;
    while d <= ly1 {
        let v = 10f64.powf(d);
        s.push_str(&format!(
            "<line x1=\"{ml}\" x2=\"{}\" y1=\"{y0:.1}\" y2=\"{y0:.1}\" stroke=\"#ddd\"/><text x=\"5\" y=\"{y0:.1}\">{v} us</text>\n",
            w - mr,
            y0 = y(v)
        ));
        d += 1.0;
    }
    let mut size = 1usize;
    while (size as f64) <= max_size {
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{}\" font-size=\"9\">{}</text>\n",
            x(size) - 6.0,
            h - mb + 15.0,
            strata_core::format_size(size as u64)
        ));
        size *= 16;
    }
    for (i, m) in methods.iter().enumerate() {
        let color = colors[i % colors.len()];
        let pts: Vec<String> = lat
            .iter()
            .filter(|r| r.method == *m)
            .map(|r| format!("{:.1},{:.1}", x(r.size), y(r.stats.p50_us)))
            .collect();
        s.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n<text x=\"{}\" y=\"{}\" fill=\"{color}\">{m}</text>\n",
            pts.join(" "),
            w - mr + 10.0,
            mt + 20.0 + 18.0 * i as f64
        ));
    }
    s.push_str("</svg>\n");
    s
}
