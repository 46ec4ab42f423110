//! The kernel-free backend: a persistent one-block GPU kernel on its own stream that serves the
//! doorbell ring ([`crate::ring`]). Started on first use, stopped cleanly on drop and, after an
//! idle period, by a reaper thread (so a long-lived idle service never holds up work such as
//! `cuMemFree` that may wait for running kernels).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::CopyError;
use crate::ring::{self, Engine, Producer, RingMemory};
use crate::sys::{self, Context, HostMem, Kernel, Stream};

/// The service kernel's source.
pub const SERVICE_CU: &str = include_str!("../cuda/copy_service.cu");
/// The service kernel's name.
pub const SERVICE_KERNEL: &str = "strata_copy_service";

/// Tuning of the service.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Ring slots (requests in flight at most).
    pub nslots: u32,
    /// Staging bytes per slot (largest single request; a multiple of 16).
    pub stage_slot: usize,
    /// Threads of the service block (a multiple of 32, up to 1024): `pollers` polling warps,
    /// the rest help with large requests.
    pub threads: u32,
    /// After a request, poll with no sleep for this long (ns).
    pub hot_ns: u64,
    /// Cap of the exponential polling back-off once cold (ns).
    pub max_backoff_ns: u32,
    /// Stop the kernel after this long without requests (`None`: keep it until drop).
    pub idle_stop: Option<Duration>,
    /// Warps polling the ring while hot, each with its own read in flight (1 to 8).
    pub pollers: u32,
    /// Delay between the polling warps' starts (ns), so their reads interleave.
    pub poll_stagger_ns: u32,
    /// Write one copy of the ring per polling warp, so each warp reads its own lines.
    pub mirror_ring: bool,
    /// Bytes of the slot read per hot poll (32 to 512): the header plus this much inline
    /// payload arrive in one round trip; longer inline payloads need a second.
    pub hot_poll_bytes: u32,
    /// Requests up to this many bytes are served by the warp that found them alone; larger ones
    /// are split over every warp of the block.
    pub warp_max: u32,
    /// Device-to-host copies of `d2h_tagged_min..=d2h_tagged_max` bytes come back as tagged
    /// words, taken by the host before the device's system-scope fence (max 0: never; at most
    /// `warp_max`). On our H100 they win from 128 to about 256 bytes and lose outside (see
    /// results/README.md).
    pub d2h_tagged_max: u32,
    /// See `d2h_tagged_max`.
    pub d2h_tagged_min: u32,
    /// After serving a request, the serving warp pauses a random 0 to this many ns before it
    /// polls again, so it does not stay in step with the host's loop (0: never).
    pub rephase_ns: u32,
    /// Poll with weak "fetch again" loads (`ld.global.cv`) instead of volatile ones.
    pub poll_cv: bool,
    /// Publish with release-acquire fences instead of sequentially consistent ones.
    pub acq_rel_fences: bool,
    /// The doorbell ring in write-combined memory (else cached).
    pub ring_write_combined: bool,
    /// Host-to-device staging in write-combined memory (fast for the CPU to write a few lines,
    /// slow for bulk memcpy) rather than cached memory.
    pub h2d_stage_write_combined: bool,
    /// Fence at system scope after host-to-device copies too (they need only GPU scope: what
    /// the host starts after seeing `done` reads device memory through the GPU's L2).
    pub sys_fence_h2d: bool,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            nslots: 64,
            stage_slot: 64 << 10,
            threads: 512,
            hot_ns: 2_000_000,
            max_backoff_ns: 2_000,
            idle_stop: Some(Duration::from_millis(100)),
            pollers: 4,
            poll_stagger_ns: 300,
            mirror_ring: true,
            hot_poll_bytes: 512,
            warp_max: 4096,
            d2h_tagged_max: 256,
            d2h_tagged_min: 128,
            rephase_ns: 1200,
            poll_cv: false,
            acq_rel_fences: false,
            ring_write_combined: true,
            h2d_stage_write_combined: false,
            sys_fence_h2d: false,
        }
    }
}

impl ServiceConfig {
    fn check(&self) -> Result<(), CopyError> {
        let bad = |why: &str| Err(CopyError::Invalid(format!("service config: {why}")));
        if self.nslots == 0 {
            return bad("need at least one slot");
        }
        if self.stage_slot < ring::INLINE_MAX
            || !self.stage_slot.is_multiple_of(16)
            || self.stage_slot > ring::MAX_REQUEST_LEN
        {
            return bad("the staging slot must be a multiple of 16 bytes from 240 bytes to 16 MiB");
        }
        if self.threads < 32 || self.threads > 1024 || !self.threads.is_multiple_of(32) {
            return bad("threads must be a multiple of 32 from 32 to 1024");
        }
        if !(1..=8).contains(&self.pollers) || self.pollers * 32 > self.threads {
            return bad("pollers must be 1 to 8 warps, within the block");
        }
        if !(32..=512).contains(&self.hot_poll_bytes) {
            return bad("hot_poll_bytes must be 32 to 512");
        }
        if self.d2h_tagged_max > self.warp_max
            || self.d2h_tagged_max as usize > ring::stage_stride(self.stage_slot) / 2
        {
            return bad("d2h_tagged_max must not exceed warp_max nor half a staging area");
        }
        Ok(())
    }

    fn mirrors(&self) -> u32 {
        if self.mirror_ring { self.pollers } else { 1 }
    }
}

/// The service kernel's one parameter (`StrataServiceParams` in `cuda/copy_service.cu`, which
/// checks the same 112-byte size).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ServiceParams {
    ring: u64,
    h2d: u64,
    d2h: u64,
    status: u64,
    stage_stride: u64,
    stage_max: u64,
    start_seq: u64,
    epoch: u64,
    hot_ns: u64,
    nslots: u32,
    mirrors: u32,
    pollers: u32,
    poll_stagger_ns: u32,
    max_backoff_ns: u32,
    flags: u32,
    warp_max: u32,
    hot_poll_lanes: u32,
    rephase_ns: u32,
    reserved: u32,
}

const _: () = assert!(std::mem::size_of::<ServiceParams>() == 112);

/// `flags` bit: system-scope fence after host-to-device copies.
const FLAG_SYS_FENCE_H2D: u32 = 1;
/// `flags` bit: poll with `ld.global.cv`.
const FLAG_POLL_CV: u32 = 2;
/// `flags` bit: release-acquire publishing fences.
const FLAG_ACQ_REL: u32 = 4;

/// Compiles (once per process and architecture) the service kernel.
pub fn service_cubin(arch: &str) -> Result<Vec<u8>, CopyError> {
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(c) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(arch) {
        return Ok(c.clone());
    }
    let cubin = sys::nvrtc_compile(SERVICE_CU, "copy_service.cu", arch)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(arch.to_string(), cubin.clone());
    Ok(cubin)
}

#[derive(Debug)]
struct Device {
    kernel: Kernel,
    stream: Stream,
    ring_dev: u64,
    h2d_dev: u64,
    d2h_dev: u64,
    status_dev: u64,
    cfg: ServiceConfig,
    // Owners of the shared memory; dropped after the kernel stopped.
    _ring: HostMem,
    _h2d: HostMem,
    _d2h: HostMem,
    _status: HostMem,
}

// SAFETY: all fields are handles or owned allocations usable from any thread.
unsafe impl Send for Device {}
// SAFETY: as above; mutation of the shared memory goes through the Producer mutex.
unsafe impl Sync for Device {}

impl Engine for Device {
    fn launch(&self, start_seq: u64, epoch: u64) -> Result<(), CopyError> {
        let cfg = &self.cfg;
        let mut p = ServiceParams {
            ring: self.ring_dev,
            h2d: self.h2d_dev,
            d2h: self.d2h_dev,
            status: self.status_dev,
            stage_stride: ring::stage_stride(cfg.stage_slot) as u64,
            stage_max: cfg.stage_slot as u64,
            start_seq,
            epoch,
            hot_ns: cfg.hot_ns,
            nslots: cfg.nslots,
            mirrors: cfg.mirrors(),
            pollers: cfg.pollers,
            poll_stagger_ns: cfg.poll_stagger_ns,
            max_backoff_ns: cfg.max_backoff_ns.max(64),
            flags: [
                (cfg.sys_fence_h2d, FLAG_SYS_FENCE_H2D),
                (cfg.poll_cv, FLAG_POLL_CV),
                (cfg.acq_rel_fences, FLAG_ACQ_REL),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .fold(0, |f, (_, bit)| f | bit),
            warp_max: cfg.warp_max,
            hot_poll_lanes: cfg.hot_poll_bytes.div_ceil(16),
            rephase_ns: cfg.rephase_ns,
            reserved: 0,
        };
        let mut params: [*mut c_void; 1] = [(&raw mut p).cast()];
        // SAFETY: the one parameter matches StrataServiceParams field by field (repr(C), size
        // checked on both sides); the memory it names is owned by `self` and outlives the
        // kernel, which is stopped (and has left host memory alone) before `self` drops.
        unsafe {
            self.kernel
                .launch(self.stream.raw(), 1, cfg.threads, &mut params)
        }
    }

    fn health(&self) -> Result<(), CopyError> {
        self.stream.query().map(|_| ())
    }
}

/// A running (or startable) copy service on one GPU.
#[derive(Debug)]
pub struct Service {
    dev: Arc<Device>,
    producer: Arc<Mutex<Producer>>,
    reaper_stop: Arc<AtomicBool>,
    reaper: Option<JoinHandle<()>>,
}

impl Service {
    /// Compiles the kernel, allocates the ring and staging memory. The kernel starts on the
    /// first request.
    pub fn new(ctx: &Context, cfg: ServiceConfig) -> Result<Service, CopyError> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        cfg.check()?;
        let arch = format!(
            "sm_{}{}",
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
        );
        let kernel = Kernel::load(ctx, &service_cubin(&arch)?, SERVICE_KERNEL)?;
        let stream = Stream::new(ctx)?;
        let n = usize::try_from(cfg.nslots).unwrap_or(usize::MAX);
        let mirrors = usize::try_from(cfg.mirrors()).unwrap_or(1);
        let stride = ring::stage_stride(cfg.stage_slot);
        let ring_mem = HostMem::new(ctx, n * mirrors * ring::SLOT_BYTES, cfg.ring_write_combined)?;
        let h2d = HostMem::new(ctx, n * stride, cfg.h2d_stage_write_combined)?;
        let d2h = HostMem::new(ctx, n * stride, false)?;
        let status = HostMem::new(ctx, ring::STATUS_WORDS * 8, false)?;
        let mem = RingMemory {
            ring: ring_mem.ptr().cast(),
            h2d_stage: h2d.ptr(),
            d2h_stage: d2h.ptr(),
            status: status.ptr().cast(),
            nslots: cfg.nslots,
            mirrors: cfg.mirrors(),
            stage_slot: cfg.stage_slot,
        };
        let dev = Arc::new(Device {
            ring_dev: ring_mem.device_ptr()?,
            h2d_dev: h2d.device_ptr()?,
            d2h_dev: d2h.device_ptr()?,
            status_dev: status.device_ptr()?,
            kernel,
            stream,
            cfg: cfg.clone(),
            _ring: ring_mem,
            _h2d: h2d,
            _d2h: d2h,
            _status: status,
        });
        // SAFETY: the memory was just allocated zeroed with the sizes RingMemory documents and
        // lives in `dev`, which the producer's users keep alive alongside it.
        let mut producer = unsafe { Producer::new(mem) };
        producer.d2h_tagged_max = cfg.d2h_tagged_max as usize;
        producer.d2h_tagged_min = cfg.d2h_tagged_min as usize;
        let producer = Arc::new(Mutex::new(producer));
        let reaper_stop = Arc::new(AtomicBool::new(false));
        let reaper = cfg.idle_stop.map(|idle| {
            let (dev, producer, stop) = (dev.clone(), producer.clone(), reaper_stop.clone());
            std::thread::Builder::new()
                .name("strata-copy-reaper".into())
                .spawn(move || reap(&dev, &producer, &stop, idle))
        });
        let reaper = match reaper {
            Some(r) => Some(r.map_err(|source| CopyError::Os {
                call: "spawning the copy service reaper thread",
                source,
            })?),
            None => None,
        };
        Ok(Service {
            dev,
            producer,
            reaper_stop,
            reaper,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Producer> {
        self.producer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Largest single request.
    pub fn stage_slot(&self) -> usize {
        self.dev.cfg.stage_slot
    }

    /// Copies `data` to device address `dev` and returns once it is in device memory, visible
    /// to any kernel launched afterwards.
    pub fn h2d(&self, dev: u64, data: &[u8]) -> Result<(), CopyError> {
        let mut p = self.lock();
        let mut last = None;
        for (i, chunk) in data.chunks(self.stage_slot()).enumerate() {
            last = Some(p.post_h2d(&*self.dev, dev + (i * self.stage_slot()) as u64, chunk)?);
        }
        match last {
            Some(seq) => p.wait(&*self.dev, seq),
            None => Ok(()),
        }
    }

    /// Posts `data` for device address `dev` and returns before it arrives; it arrives in ring
    /// order (before any later request of this service completes). [`Self::flush`] waits.
    pub fn post_h2d(&self, dev: u64, data: &[u8]) -> Result<u64, CopyError> {
        let mut p = self.lock();
        let mut last = 0;
        for (i, chunk) in data.chunks(self.stage_slot()).enumerate() {
            last = p.post_h2d(&*self.dev, dev + (i * self.stage_slot()) as u64, chunk)?;
        }
        Ok(last)
    }

    /// Copies `out.len()` bytes from device address `dev`, after every earlier request.
    pub fn d2h(&self, dev: u64, out: &mut [u8]) -> Result<(), CopyError> {
        let mut p = self.lock();
        let stage = self.stage_slot();
        if out.len() <= stage {
            let t = p.post_d2h(&*self.dev, dev, out.len())?;
            return p.finish_d2h(&*self.dev, &t, out);
        }
        let window = usize::try_from(self.dev.cfg.nslots).unwrap_or(1).max(1);
        let chunks: Vec<(usize, usize)> = (0..out.len())
            .step_by(stage)
            .map(|s| (s, (s + stage).min(out.len())))
            .collect();
        // Keep up to `nslots` reads in flight, collect them in order.
        for group in chunks.chunks(window) {
            let mut tickets = Vec::with_capacity(group.len());
            for &(s, e) in group {
                tickets.push(p.post_d2h(&*self.dev, dev + s as u64, e - s)?);
            }
            for (&(s, e), t) in group.iter().zip(&tickets) {
                p.finish_d2h(&*self.dev, t, &mut out[s..e])?;
            }
        }
        Ok(())
    }

    /// Waits for every posted request.
    pub fn flush(&self) -> Result<(), CopyError> {
        self.lock().flush(&*self.dev)
    }

    /// Stops the kernel now (the next request restarts it).
    pub fn stop(&self) -> Result<(), CopyError> {
        self.lock().stop(&*self.dev)
    }

    /// Whether the kernel is running.
    pub fn running(&self) -> bool {
        self.lock().running()
    }
}

fn reap(dev: &Arc<Device>, producer: &Mutex<Producer>, stop: &AtomicBool, idle: Duration) {
    let tick = (idle / 4).max(Duration::from_millis(1));
    while !stop.load(Ordering::Acquire) {
        std::thread::park_timeout(tick);
        let mut p = producer.lock().unwrap_or_else(|e| e.into_inner());
        if p.running() && p.last_use.elapsed() >= idle {
            // A failure here surfaces on the next request (health check); nothing to report to.
            let _ = p.stop(&**dev);
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.reaper_stop.store(true, Ordering::Release);
        if let Some(r) = self.reaper.take() {
            r.thread().unpark();
            let _ = r.join();
        }
        let mut p = self.lock();
        if p.stop(&*self.dev).is_err() && self.dev.stream.query().is_ok_and(|idle| !idle) {
            // The kernel is still running but did not answer: leak its memory rather than free
            // it under a live kernel, and rather than hang here waiting for it.
            std::mem::forget(self.dev.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_params_agree_with_the_kernel_source() {
        for (name, v) in [
            ("FLAG_SYS_FENCE_H2D", FLAG_SYS_FENCE_H2D),
            ("FLAG_POLL_CV", FLAG_POLL_CV),
            ("FLAG_ACQ_REL", FLAG_ACQ_REL),
        ] {
            assert!(
                SERVICE_CU.contains(&format!("#define {name} {v}\n")),
                "{name} differs from the .cu"
            );
        }
        assert!(SERVICE_CU.contains("sizeof(StrataServiceParams) == 112"));
        ServiceConfig::default().check().unwrap();
    }
}
