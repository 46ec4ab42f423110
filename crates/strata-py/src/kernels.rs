//! `strata._strata.KernelModule`: user kernels that include `strata.cuh`, compiled with NVRTC
//! (through Strata's disk cache) and launched with arguments from Python on any stream of the
//! GPU's primary context: Strata's own by default, or the caller's (PyTorch's current stream),
//! so a kernel is ordered with the caller's work without a synchronisation.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use strata_gpu::driver::KernelParam;
use strata_gpu::{SpaceError, Strata};

use crate::errors::{InvalidArgumentError, py_err};
use crate::space::PySpace;
use crate::sys::{RawFunction, RawModule, synchronize_stream};

/// Compiled user kernels.
#[derive(Debug)]
#[pyclass(module = "strata._strata", name = "KernelModule", frozen)]
pub struct PyKernelModule {
    module: Mutex<RawModule>,
    /// Kernels looked up so far.
    functions: Mutex<HashMap<String, Kernel>>,
    runtime: Arc<Strata>,
}

impl Drop for PyKernelModule {
    fn drop(&mut self) {
        // Kernels already queued from it (on any stream) must finish before it is unloaded.
        let gpu = self.runtime.gpu();
        if gpu.synchronize_context().is_ok() {
            self.module
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .unload();
        }
    }
}

impl PyKernelModule {
    pub(crate) fn compile(
        py: Python<'_>,
        runtime: &Arc<Strata>,
        source: &str,
        name: &str,
        options: &[String],
    ) -> PyResult<Self> {
        let module = py
            .detach(|| -> Result<RawModule, SpaceError> {
                let gpu = runtime.gpu();
                let (cubin, _) =
                    strata_gpu::nvrtc::compile_cached(source, name, &gpu.arch(), options)?;
                gpu.bind()?;
                Ok(RawModule::load(&cubin)?)
            })
            .map_err(py_err)?;
        Ok(PyKernelModule {
            module: Mutex::new(module),
            functions: Mutex::new(HashMap::new()),
            runtime: Arc::clone(runtime),
        })
    }

    /// The kernel `name` and the block count that fills the GPU with blocks of `threads`.
    fn function(&self, name: &str, threads: u32) -> PyResult<(RawFunction, u32)> {
        let mut map = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(name) {
            let module = self.module.lock().unwrap_or_else(|e| e.into_inner());
            let f = module
                .function(name)
                .map_err(|e| py_err(SpaceError::from(e)))?;
            map.insert(
                name.to_owned(),
                Kernel {
                    f,
                    full_blocks: HashMap::new(),
                },
            );
        }
        let Some(kernel) = map.get_mut(name) else {
            unreachable!("inserted above");
        };
        let f = kernel.f;
        let blocks = match kernel.full_blocks.get(&threads) {
            Some(&b) => b,
            None => {
                let per_sm = f
                    .blocks_per_sm(threads)
                    .map_err(|e| py_err(SpaceError::from(e)))?;
                let b = per_sm * self.runtime.gpu().multiprocessors;
                kernel.full_blocks.insert(threads, b);
                b
            }
        };
        Ok((f, blocks))
    }

    /// Launches with the parameters already laid out (the context made current by `prepare`
    /// on this thread).
    fn launch_params(
        &self,
        f: RawFunction,
        blocks: u32,
        threads: u32,
        params: &Params,
        stream: u64,
    ) -> Result<(), SpaceError> {
        let mut ptrs = params.pointers();
        // SAFETY: `ptrs` points at the live slots of `params` (one per argument, each laid out
        // as its KernelParam type, which the caller matched to the kernel's signature as the
        // Python API documents); `stream` is the caller's stream of this context, or Strata's.
        unsafe { f.launch(blocks, threads, &mut ptrs, stream) }?;
        Ok(())
    }

    /// What a launch of `name` needs: the kernel, the block count that fills the GPU, the
    /// arguments laid out, and the stream (Strata's when `None`).
    fn prepare(
        &self,
        name: &str,
        args: &[Bound<'_, PyAny>],
        threads: u32,
        stream: Option<u64>,
    ) -> PyResult<(RawFunction, u32, Params, u64)> {
        check_threads(threads)?;
        // The calling thread may have no context current (autograd runs backward on its own
        // threads): make the GPU's primary context current before any driver call.
        self.runtime
            .gpu()
            .bind()
            .map_err(|e| py_err(SpaceError::from(e)))?;
        let (f, full) = self.function(name, threads)?;
        let mut params = Params::default();
        for arg in args {
            push_arg(&mut params, arg)?;
        }
        let stream =
            stream.unwrap_or_else(|| self.runtime.gpu().stream().expose_provenance() as u64);
        Ok((f, full, params, stream))
    }
}

/// A kernel looked up in the module, with the grid that fills the GPU by block size.
#[derive(Debug)]
struct Kernel {
    f: RawFunction,
    full_blocks: HashMap<u32, u32>,
}

/// Kernel arguments laid out for `cuLaunchKernel`: one 8-byte-aligned slot per argument.
#[derive(Debug, Default)]
struct Params {
    slots: Vec<Box<[u64]>>,
}

impl Params {
    fn push<T: KernelParam>(&mut self, value: T) {
        let words = std::mem::size_of::<T>().div_ceil(8).max(1);
        let mut slot = vec![0u64; words].into_boxed_slice();
        // SAFETY: `slot` has at least size_of::<T>() bytes and u64 alignment (>= T's for all
        // KernelParam types, which are at most 8-aligned).
        unsafe { std::ptr::write_unaligned(slot.as_mut_ptr().cast::<T>(), value) };
        self.slots.push(slot);
    }

    fn pointers(&self) -> Vec<*mut c_void> {
        self.slots
            .iter()
            .map(|s| s.as_ptr().cast_mut().cast::<c_void>())
            .collect()
    }
}

/// Appends one Python kernel argument: a `Space` (its handle), a `(type, value)` tuple with
/// type `i32`/`u32`/`i64`/`u64`/`ptr`/`f32`/`f64`, an `int` (as `u64`, or `i64` when
/// negative), a `float` (as `f64`), or a device array with `__cuda_array_interface__` (its
/// device pointer).
fn push_arg(params: &mut Params, arg: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(space) = arg.cast::<PySpace>() {
        params.push(space.get().lock().handle());
        return Ok(());
    }
    if let Ok(t) = arg.cast::<PyTuple>() {
        let (ty, v): (String, Bound<'_, PyAny>) = t.extract()?;
        match ty.as_str() {
            "i32" => params.push(v.extract::<i32>()?),
            "u32" => params.push(v.extract::<u32>()?),
            "i64" => params.push(v.extract::<i64>()?),
            "u64" | "ptr" => params.push(v.extract::<u64>()?),
            "f32" => params.push(v.extract::<f32>()?),
            "f64" => params.push(v.extract::<f64>()?),
            other => {
                return Err(InvalidArgumentError::new_err(format!(
                    "argument type {other:?} is unknown: use i32, u32, i64, u64, ptr, f32 or f64"
                )));
            }
        }
        return Ok(());
    }
    if arg.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(
            "a bool kernel argument is ambiguous: pass (\"i32\", int(b))",
        ));
    }
    if let Ok(v) = arg.extract::<u64>() {
        params.push(v);
    } else if let Ok(v) = arg.extract::<i64>() {
        params.push(v);
    } else if let Ok(v) = arg.extract::<f64>() {
        params.push(v);
    } else if let Ok(cai) = arg.getattr("__cuda_array_interface__") {
        // A device array (PyTorch CUDA tensor, CuPy array, Numba array): its device pointer.
        let (address, _read_only): (u64, bool) = cai.get_item("data")?.extract()?;
        params.push(address);
    } else {
        return Err(PyTypeError::new_err(format!(
            "cannot pass {} to a kernel: use a Space, an int, a float, a (type, value) tuple or a \
             device array (__cuda_array_interface__)",
            arg.get_type().name()?
        )));
    }
    Ok(())
}

fn check_threads(threads: u32) -> PyResult<()> {
    if threads == 0 || threads > 1024 {
        return Err(InvalidArgumentError::new_err(format!(
            "threads={threads}: a block has 1 to 1024 threads"
        )));
    }
    Ok(())
}

#[pymethods]
impl PyKernelModule {
    /// Launches kernel `name` on `blocks` blocks of `threads` threads (`blocks=0`: enough
    /// resident blocks to fill the GPU) on `stream` (a raw `CUstream` of this GPU's primary
    /// context, e.g. `torch.cuda.current_stream().cuda_stream`; 0 is the legacy default
    /// stream; `None`: Strata's own stream) and, with `synchronize`, waits for that stream.
    #[pyo3(signature = (name, args, blocks = 0, threads = 256, synchronize = true, stream = None))]
    #[allow(clippy::too_many_arguments)] // mirrors the keyword arguments Python callers see
    fn launch(
        &self,
        py: Python<'_>,
        name: &str,
        args: Vec<Bound<'_, PyAny>>,
        blocks: u32,
        threads: u32,
        synchronize: bool,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let (f, full, params, stream) = self.prepare(name, &args, threads, stream)?;
        let blocks = if blocks == 0 { full } else { blocks };
        if !synchronize {
            // An enqueue is a few microseconds: releasing the GIL would cost more than it saves.
            return self
                .launch_params(f, blocks, threads, &params, stream)
                .map_err(py_err);
        }
        py.detach(|| -> Result<(), SpaceError> {
            self.launch_params(f, blocks, threads, &params, stream)?;
            synchronize_stream(stream)?;
            Ok(())
        })
        .map_err(py_err)
    }

    /// Host time (nanoseconds per launch) of `count` launches of `name` made from Rust with
    /// the arguments already converted: the cost under the Python layer, against which the
    /// Python `launch` call's own cost is measured. Waits for the launches before returning.
    #[pyo3(signature = (name, args, count, blocks = 1, threads = 32, stream = None))]
    #[allow(clippy::too_many_arguments)] // mirrors the keyword arguments Python callers see
    fn _rust_launch_ns(
        &self,
        py: Python<'_>,
        name: &str,
        args: Vec<Bound<'_, PyAny>>,
        count: u32,
        blocks: u32,
        threads: u32,
        stream: Option<u64>,
    ) -> PyResult<f64> {
        // The arguments as the Rust API takes them: values, laid out again for each launch.
        let (f, _, template, stream) = self.prepare(name, &args, threads, stream)?;
        py.detach(|| -> Result<f64, SpaceError> {
            let start = Instant::now();
            for _ in 0..count {
                let params = Params {
                    slots: template.slots.clone(),
                };
                self.launch_params(f, blocks, threads, &params, stream)?;
            }
            let ns = start.elapsed().as_secs_f64() * 1e9 / f64::from(count.max(1));
            synchronize_stream(stream)?;
            Ok(ns)
        })
        .map_err(py_err)
    }
}
