//! The host runtime: one GPU with Strata's kernels loaded ([`Strata`]), which makes spaces and
//! compiles users' kernels against `strata.cuh`.

use std::sync::Arc;

use strata_core::store::Store;

use crate::driver::{Args, DeviceBuffer, Function, Gpu, Grid, Module};
use crate::nvrtc;
use crate::space::{Space, SpaceError, SpaceOptions};

/// One GPU with Strata's kernels loaded: creates spaces and compiles users' kernels.
#[derive(Debug)]
pub struct Strata {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) _kernels: Module,
    pub(crate) flush: Function,
    pub(crate) evict: Function,
    pub(crate) prefetch: Function,
    pub(crate) write_back: Function,
    pub(crate) write_back_stop: Function,
    layout_probe: Function,
}

/// A user kernel module compiled against `strata.cuh`.
#[derive(Debug)]
pub struct KernelModule {
    module: Module,
    /// Whether the CUBIN came from the disk cache.
    pub cache: nvrtc::CacheOutcome,
}

impl KernelModule {
    /// A kernel by its `extern "C"` name.
    pub fn function(&self, name: &str) -> Result<Function, SpaceError> {
        Ok(self.module.function(name)?)
    }
}

impl Strata {
    /// Opens GPU `ordinal` and loads Strata's kernels (compiled through NVRTC, or from the disk
    /// cache).
    pub fn new(ordinal: usize) -> Result<Self, SpaceError> {
        let gpu = Gpu::open(ordinal)?;
        let (cubin, _) = nvrtc::compile_cached(
            nvrtc::STRATA_KERNELS_CU,
            "strata_kernels.cu",
            &gpu.arch(),
            &[],
        )?;
        let kernels = Module::load(&gpu, &cubin)?;
        Ok(Strata {
            flush: kernels.function("strata_flush")?,
            evict: kernels.function("strata_evict")?,
            prefetch: kernels.function("strata_prefetch")?,
            write_back: kernels.function("strata_write_back")?,
            write_back_stop: kernels.function("strata_write_back_stop")?,
            layout_probe: kernels.function("strata_layout_probe")?,
            _kernels: kernels,
            gpu,
        })
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Compiles a user kernel source that may `#include "strata.cuh"`, for this GPU, through the
    /// disk cache. A compile error carries NVRTC's log.
    pub fn compile(&self, source: &str, name: &str) -> Result<KernelModule, SpaceError> {
        self.compile_with(source, name, &[])
    }

    /// [`Strata::compile`] with extra NVRTC options (e.g. `-DN=4`, `--use_fast_math`).
    pub fn compile_with(
        &self,
        source: &str,
        name: &str,
        options: &[String],
    ) -> Result<KernelModule, SpaceError> {
        let (cubin, cache) = nvrtc::compile_cached(source, name, &self.gpu.arch(), options)?;
        Ok(KernelModule {
            module: Module::load(&self.gpu, &cubin)?,
            cache,
        })
    }

    /// Runs the layout probe kernel and returns what the device compiler laid out, in the order
    /// of [`crate::layout::host_layout`].
    pub fn device_layout(&self) -> Result<Vec<u64>, SpaceError> {
        let n = crate::layout::host_layout().len();
        let buf = DeviceBuffer::zeroed(&self.gpu, n * 8)?;
        self.layout_probe.launch(
            Grid {
                blocks: 1,
                threads: 32,
            },
            &Args::new().arg(buf.ptr()),
        )?;
        self.gpu.synchronize()?;
        let mut out = vec![0u64; n];
        buf.download(0, &mut out)?;
        Ok(out)
    }

    /// Creates a space of `size_bytes`, zero-filled, with an empty cache.
    pub fn space(&self, size_bytes: u64, options: &SpaceOptions) -> Result<Space, SpaceError> {
        Space::new(self, size_bytes, options)
    }

    /// Creates a space of `size_bytes` whose bytes live in `store` (from its offset 0; the
    /// store must hold at least `size_bytes`): memory, file, a memory node, a compressed store.
    /// Pages move store -> host cache (pinned, `options.host_cache_bytes`) -> GPU cache on
    /// demand, through a request ring that host threads serve; dirty pages go back down the
    /// same chain. [`Space::flush`] makes the store current; [`Space::close`] flushes and
    /// hands back what it could not write.
    pub fn space_over_store(
        &self,
        store: Arc<dyn Store>,
        size_bytes: u64,
        options: &SpaceOptions,
    ) -> Result<Space, SpaceError> {
        Space::over_store(self, store, size_bytes, options)
    }

    pub(crate) fn maintenance_grid(&self) -> Grid {
        Grid {
            blocks: self.gpu.multiprocessors * 8,
            threads: 256,
        }
    }
}
