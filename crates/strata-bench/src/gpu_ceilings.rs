//! The GPU probes of [`crate::ceilings`]: plain kernels (no Strata) timed with CUDA events,
//! median of three runs after a warm-up.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_gpu::driver::{
    Args, DeviceBuffer, DriverError, Event, Function, Gpu, MappedHostBuffer, Module,
};

use crate::ceilings::{CEILING_KERNELS_CU, Probe};

/// Why a GPU probe failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuProbeError {
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The probe kernels did not compile.
    #[error(transparent)]
    Compile(#[from] strata_gpu::nvrtc::CompileError),
}

/// Bytes streamed by the bandwidth probes.
const STREAM_BYTES: usize = 1 << 30;
/// Pinned bytes the page gathers pick from.
const GATHER_SOURCE: usize = 1 << 30;
/// Device frames the page gathers copy into.
const GATHER_FRAMES_BYTES: usize = 256 << 20;
/// Random 8-byte reads per gather run.
const GATHERS: u64 = 1 << 24;

fn median_ms(
    gpu: &Arc<Gpu>,
    mut run: impl FnMut() -> Result<(), DriverError>,
) -> Result<f64, DriverError> {
    let (a, b) = (Event::new(gpu)?, Event::new(gpu)?);
    run()?;
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(3);
    for _ in 0..3 {
        a.record(None)?;
        run()?;
        b.record(None)?;
        times.push(f64::from(a.elapsed_ms(&b)?));
    }
    times.sort_by(f64::total_cmp);
    Ok(times[1])
}

fn launch_full(f: &Function, args: &Args) -> Result<(), DriverError> {
    f.launch(f.full_grid(256)?, args)
}

/// Runs every GPU probe on GPU `ordinal`.
pub fn measure(ordinal: usize) -> Result<BTreeMap<String, Probe>, GpuProbeError> {
    let gpu = Gpu::open(ordinal)?;
    let cubin =
        strata_gpu::nvrtc::compile(CEILING_KERNELS_CU, "ceiling_kernels.cu", &gpu.arch(), &[])?;
    let module = Module::load(&gpu, &cubin)?;
    let stream_read = module.function("ceiling_stream_read")?;
    let page_gather = module.function("ceiling_page_gather")?;
    let random_gather = module.function("ceiling_random_gather")?;
    let sink = DeviceBuffer::zeroed(&gpu, 8)?;
    let mut out = BTreeMap::new();
    let gbs = |bytes: usize, ms: f64| bytes as f64 / (ms / 1e3) / 1e9;
    let mps = |units: u64, ms: f64| units as f64 / (ms / 1e3) / 1e6;

    let mut host = MappedHostBuffer::new(&gpu, STREAM_BYTES.max(GATHER_SOURCE))?;
    for (i, b) in host.as_mut_slice().iter_mut().enumerate() {
        *b = u8::try_from(i % 251).unwrap_or(0);
    }
    let ms = median_ms(&gpu, || {
        let args = Args::new()
            .arg(host.device_ptr())
            .arg(STREAM_BYTES as u64)
            .arg(sink.ptr());
        launch_full(&stream_read, &args)
    })?;
    out.insert(
        "pcie-read-sm".into(),
        Probe {
            value: Some(gbs(STREAM_BYTES, ms)),
            unit: "GB/s".into(),
            note: "SMs stream 1 GiB of pinned host memory (zero-copy)".into(),
        },
    );

    let device = DeviceBuffer::zeroed(&gpu, STREAM_BYTES)?;
    let ms = median_ms(&gpu, || {
        device.upload(0, &host.as_slice()[..STREAM_BYTES])?;
        Ok(())
    })?;
    out.insert(
        "pcie-read-copy-engine".into(),
        Probe {
            value: Some(gbs(STREAM_BYTES, ms)),
            unit: "GB/s".into(),
            note: "cuMemcpyHtoD of 1 GiB from pinned memory".into(),
        },
    );

    let frames = DeviceBuffer::zeroed(&gpu, GATHER_FRAMES_BYTES)?;
    for (name, page) in [("page-gather-4k", 4096u64), ("page-gather-64k", 64 << 10)] {
        let count: u64 = if page == 4096 { 1 << 20 } else { 1 << 16 };
        let ms = median_ms(&gpu, || {
            let args = Args::new()
                .arg(host.device_ptr())
                .arg(GATHER_SOURCE as u64 / page)
                .arg(frames.ptr())
                .arg(GATHER_FRAMES_BYTES as u64 / page)
                .arg(page)
                .arg(count)
                .arg(0x5eed_u64);
            launch_full(&page_gather, &args)
        })?;
        out.insert(
            name.into(),
            Probe {
                value: Some(mps(count, ms)),
                unit: "Mpages/s".into(),
                note: format!(
                    "one warp per random {} KiB page, pinned host -> device",
                    page >> 10
                ),
            },
        );
    }

    let ms = median_ms(&gpu, || {
        let args = Args::new()
            .arg(device.ptr())
            .arg(STREAM_BYTES as u64)
            .arg(sink.ptr());
        launch_full(&stream_read, &args)
    })?;
    out.insert(
        "hbm-read".into(),
        Probe {
            value: Some(gbs(STREAM_BYTES, ms)),
            unit: "GB/s".into(),
            note: "SMs stream 1 GiB of device memory".into(),
        },
    );
    for (name, ptr, what) in [
        ("hbm-random-gather", device.ptr(), "device memory"),
        (
            "zero-copy-random-gather",
            host.device_ptr(),
            "pinned host memory",
        ),
    ] {
        let ms = median_ms(&gpu, || {
            let args = Args::new()
                .arg(ptr)
                .arg(STREAM_BYTES as u64 / 8)
                .arg(GATHERS)
                .arg(0x5eed_u64)
                .arg(sink.ptr());
            launch_full(&random_gather, &args)
        })?;
        out.insert(
            name.into(),
            Probe {
                value: Some(mps(GATHERS, ms)),
                unit: "Mgathers/s".into(),
                note: format!("random 8-byte reads of 1 GiB of {what}"),
            },
        );
    }
    let peers = strata_gpu::probe::gpus()
        .ok()
        .and_then(|g| g.into_iter().find(|g| g.ordinal == ordinal))
        .map(|g| g.peers)
        .unwrap_or_default();
    match peers.first() {
        None => {
            for name in ["peer-read", "peer-page-gather-4k"] {
                out.insert(
                    name.into(),
                    Probe {
                        value: None,
                        unit: if name == "peer-read" {
                            "GB/s"
                        } else {
                            "Mpages/s"
                        }
                        .into(),
                        note: "skipped: no peer GPU".into(),
                    },
                );
            }
        }
        Some(&peer_ordinal) => {
            // The peer's memory, read by this GPU's SMs through the peer mapping.
            let peer = Gpu::open(peer_ordinal)?;
            let remote = DeviceBuffer::zeroed(&peer, STREAM_BYTES)?;
            gpu.enable_peer_access(&peer)?;
            gpu.bind()?;
            let ms = median_ms(&gpu, || {
                let args = Args::new()
                    .arg(remote.ptr())
                    .arg(STREAM_BYTES as u64)
                    .arg(sink.ptr());
                launch_full(&stream_read, &args)
            })?;
            out.insert(
                "peer-read".into(),
                Probe {
                    value: Some(gbs(STREAM_BYTES, ms)),
                    unit: "GB/s".into(),
                    note: format!("SMs stream 1 GiB of GPU {peer_ordinal}'s memory (peer access)"),
                },
            );
            let count: u64 = 1 << 21;
            let ms = median_ms(&gpu, || {
                let args = Args::new()
                    .arg(remote.ptr())
                    .arg(STREAM_BYTES as u64 / 4096)
                    .arg(frames.ptr())
                    .arg(GATHER_FRAMES_BYTES as u64 / 4096)
                    .arg(4096u64)
                    .arg(count)
                    .arg(0x5eed_u64);
                launch_full(&page_gather, &args)
            })?;
            out.insert(
                "peer-page-gather-4k".into(),
                Probe {
                    value: Some(mps(count, ms)),
                    unit: "Mpages/s".into(),
                    note: format!("one warp per random 4 KiB page, GPU {peer_ordinal} -> this GPU"),
                },
            );
        }
    }
    Ok(out)
}
