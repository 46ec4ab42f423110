//! Embedding gathers with sum pooling on the GPU, over a table placed in a Strata space or in
//! one of the baselines' memories; lookup ids and the pooled output live in GPU memory.

use std::sync::Arc;
use std::time::Instant;

use strata_gpu::driver::{DeviceBuffer, Function, Gpu, Grid};
use strata_gpu::{KernelModule, Strata};

use super::device::{GpuWorkloadError, context_sync, ensure_fits};
use super::kernels::{EMBED_CU, embed_options};
use super::placed::Placed;

/// Threads per block (whole warps: one bag per warp).
const THREADS: u32 = 256;

/// Lookup ids, the pooled output and the compiled gather kernels.
#[derive(Debug)]
pub struct EmbedGpu {
    gpu: Arc<Gpu>,
    space_kernel: (Function, Grid),
    ptr_kernel: (Function, Grid),
    ids: DeviceBuffer,
    out: DeviceBuffer,
    bags: u64,
    bag: u32,
    dim: u32,
    _module: KernelModule,
}

impl EmbedGpu {
    /// Compiles the gather for rows of `dim` floats and uploads `ids` (bags of `bag` ids).
    ///
    /// # Errors
    /// A bad shape, compile or allocation failures.
    pub fn new(strata: &Strata, dim: u32, ids: &[u32], bag: u32) -> Result<Self, GpuWorkloadError> {
        if dim == 0 || !dim.is_multiple_of(32) || dim > 1024 {
            return Err(GpuWorkloadError::Invalid(format!(
                "row width {dim}: use a multiple of 32 up to 1024 floats"
            )));
        }
        if bag == 0 || ids.is_empty() || !ids.len().is_multiple_of(bag as usize) {
            return Err(GpuWorkloadError::Invalid(format!(
                "{} lookups do not split into bags of {bag}: make the count a multiple of the bag size",
                ids.len()
            )));
        }
        let gpu = strata.gpu().clone();
        let bags = (ids.len() / bag as usize) as u64;
        let out_bytes = bags * u64::from(dim) * 4;
        ensure_fits(
            &gpu,
            ids.len() as u64 * 4 + out_bytes,
            "lookup ids and pooled output",
            "use fewer lookups",
        )?;
        let module = strata.compile_with(EMBED_CU, "embed.cu", &embed_options(dim))?;
        let load = |name: &str| -> Result<(Function, Grid), GpuWorkloadError> {
            let f = module.function(name)?;
            let grid = f.full_grid(THREADS)?;
            Ok((f, grid))
        };
        let ids_buffer = DeviceBuffer::zeroed(&gpu, ids.len() * 4)?;
        ids_buffer.upload(0, ids)?;
        let out = DeviceBuffer::zeroed(
            &gpu,
            usize::try_from(out_bytes)
                .map_err(|_| GpuWorkloadError::Invalid("output too large".into()))?,
        )?;
        context_sync(&gpu)?;
        Ok(Self {
            space_kernel: load("gather_space")?,
            ptr_kernel: load("gather_ptr")?,
            ids: ids_buffer,
            out,
            bags,
            bag,
            dim,
            gpu,
            _module: module,
        })
    }

    /// Number of lookups per run.
    #[must_use]
    pub fn lookups(&self) -> u64 {
        self.bags * u64::from(self.bag)
    }

    /// Runs every bag once over `table`; returns milliseconds.
    ///
    /// # Errors
    /// Launch failures or an out-of-range row.
    pub fn run(&self, table: &Placed) -> Result<f64, GpuWorkloadError> {
        let (f, grid) = if table.is_space() {
            &self.space_kernel
        } else {
            &self.ptr_kernel
        };
        let args = table
            .first_arg()
            .arg(self.ids.ptr())
            .arg(self.bags)
            .arg(self.bag)
            .arg(self.out.ptr());
        self.gpu.synchronize()?;
        let start = Instant::now();
        f.launch(*grid, &args)?;
        self.gpu.synchronize()?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        table.check()?;
        Ok(ms)
    }

    /// The pooled output of the last run (bags x dim floats).
    ///
    /// # Errors
    /// The copy failed.
    pub fn output(&self) -> Result<Vec<f32>, GpuWorkloadError> {
        self.gpu.synchronize()?;
        let mut out =
            vec![0f32; usize::try_from(self.bags * u64::from(self.dim)).expect("allocated above")];
        self.out.download(0, &mut out)?;
        Ok(out)
    }

    /// Zeroes the output (so a run that writes nothing cannot pass validation).
    ///
    /// # Errors
    /// The copy failed.
    pub fn clear_output(&self) -> Result<(), GpuWorkloadError> {
        self.gpu.synchronize()?;
        self.out.fill_bytes(0xFF)?;
        context_sync(&self.gpu)
    }
}
