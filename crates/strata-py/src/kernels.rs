//! `strata._strata.KernelModule`: user kernels that include `strata.cuh`, compiled with NVRTC
//! (through Strata's disk cache) and launched with arguments from Python on any stream of the
//! GPU's primary context: Strata's own by default, or the caller's (PyTorch's current stream),
//! so a kernel is ordered with the caller's work without a synchronisation. Launches go through
//! `strata_gpu`'s launcher, so spaces among the arguments get their background write-back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use strata_gpu::driver::{Args, ForeignStream, Function, Grid, KernelParam};
use strata_gpu::{KernelModule, SpaceError, Strata};

use crate::errors::{InvalidArgumentError, py_err};
use crate::space::PySpace;

/// Compiled user kernels.
#[derive(Debug)]
#[pyclass(module = "strata._strata", name = "KernelModule", frozen)]
pub struct PyKernelModule {
    module: KernelModule,
    /// Kernels looked up so far, with the block count that fills the GPU by block size.
    functions: Mutex<HashMap<String, Kernel>>,
    runtime: Arc<Strata>,
}

/// A kernel looked up in the module, with the grid that fills the GPU by block size.
#[derive(Debug)]
struct Kernel {
    f: Function,
    full_blocks: HashMap<u32, u32>,
}

/// Where a launch goes: Strata's own stream, or the caller's.
#[derive(Debug, Clone, Copy)]
enum LaunchStream {
    Strata,
    Foreign(ForeignStream),
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
            .detach(|| runtime.compile_with(source, name, options))
            .map_err(py_err)?;
        Ok(PyKernelModule {
            module,
            functions: Mutex::new(HashMap::new()),
            runtime: Arc::clone(runtime),
        })
    }

    /// The kernel `name` and the block count that fills the GPU with blocks of `threads`.
    fn function(&self, name: &str, threads: u32) -> PyResult<(Function, u32)> {
        let mut map = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(name) {
            let f = self.module.function(name).map_err(py_err)?;
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
        let blocks = match kernel.full_blocks.get(&threads) {
            Some(&b) => b,
            None => {
                let b = kernel
                    .f
                    .full_grid(threads)
                    .map_err(|e| py_err(SpaceError::from(e)))?
                    .blocks;
                kernel.full_blocks.insert(threads, b);
                b
            }
        };
        Ok((kernel.f.clone(), blocks))
    }

    /// What a launch of `name` needs: the kernel, the block count that fills the GPU, the
    /// arguments laid out, and the stream (Strata's when `None`).
    fn prepare(
        &self,
        name: &str,
        args: &[Bound<'_, PyAny>],
        threads: u32,
        stream: Option<u64>,
    ) -> PyResult<(Function, u32, Args, LaunchStream)> {
        check_threads(threads)?;
        let (f, full) = self.function(name, threads)?;
        let mut params = Args::new();
        for arg in args {
            push_arg(&mut params, arg)?;
        }
        let stream = match stream {
            None => LaunchStream::Strata,
            // SAFETY: the Python API documents that `stream` is a live stream handle of this
            // GPU's primary context (PyTorch's and CuPy's are), or 0 for the legacy default
            // stream, kept alive by the caller while the kernel runs.
            Some(h) => LaunchStream::Foreign(unsafe { ForeignStream::from_raw(h) }),
        };
        Ok((f, full, params, stream))
    }

    fn launch_args(
        f: &Function,
        blocks: u32,
        threads: u32,
        args: &Args,
        stream: LaunchStream,
    ) -> Result<(), SpaceError> {
        let grid = Grid { blocks, threads };
        match stream {
            LaunchStream::Strata => f.launch(grid, args)?,
            LaunchStream::Foreign(s) => f.launch_on_foreign(grid, args, s)?,
        }
        Ok(())
    }

    fn synchronize(&self, stream: LaunchStream) -> Result<(), SpaceError> {
        let gpu = self.runtime.gpu();
        match stream {
            LaunchStream::Strata => gpu.synchronize()?,
            LaunchStream::Foreign(s) => s.synchronize(gpu)?,
        }
        Ok(())
    }
}

/// Appends one Python kernel argument: a `Space` (its handle), a `(type, value)` tuple with
/// type `i32`/`u32`/`i64`/`u64`/`ptr`/`f32`/`f64`, an `int` (as `u64`, or `i64` when
/// negative), a `float` (as `f64`), or a device array with `__cuda_array_interface__` (its
/// device pointer).
fn push_arg(params: &mut Args, arg: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(space) = arg.cast::<PySpace>() {
        push(params, space.get().lock().handle());
        return Ok(());
    }
    if let Ok(t) = arg.cast::<PyTuple>() {
        let (ty, v): (String, Bound<'_, PyAny>) = t.extract()?;
        match ty.as_str() {
            "i32" => push(params, v.extract::<i32>()?),
            "u32" => push(params, v.extract::<u32>()?),
            "i64" => push(params, v.extract::<i64>()?),
            "u64" | "ptr" => push(params, v.extract::<u64>()?),
            "f32" => push(params, v.extract::<f32>()?),
            "f64" => push(params, v.extract::<f64>()?),
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
        push(params, v);
    } else if let Ok(v) = arg.extract::<i64>() {
        push(params, v);
    } else if let Ok(v) = arg.extract::<f64>() {
        push(params, v);
    } else if let Ok(cai) = arg.getattr("__cuda_array_interface__") {
        // A device array (PyTorch CUDA tensor, CuPy array, Numba array): its device pointer.
        let (address, _read_only): (u64, bool) = cai.get_item("data")?.extract()?;
        push(params, address);
    } else {
        return Err(PyTypeError::new_err(format!(
            "cannot pass {} to a kernel: use a Space, an int, a float, a (type, value) tuple or a \
             device array (__cuda_array_interface__)",
            arg.get_type().name()?
        )));
    }
    Ok(())
}

/// Appends one argument to `params` (Args is a by-value builder).
fn push<T: KernelParam>(params: &mut Args, value: T) {
    *params = std::mem::take(params).arg(value);
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
            return Self::launch_args(&f, blocks, threads, &params, stream).map_err(py_err);
        }
        py.detach(|| -> Result<(), SpaceError> {
            Self::launch_args(&f, blocks, threads, &params, stream)?;
            self.synchronize(stream)
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
                let params = template.clone();
                Self::launch_args(&f, blocks, threads, &params, stream)?;
            }
            let ns = start.elapsed().as_secs_f64() * 1e9 / f64::from(count.max(1));
            self.synchronize(stream)?;
            Ok(ns)
        })
        .map_err(py_err)
    }
}
