//! BFS, connected components and PageRank on the GPU over a CSR whose neighbour array lives in
//! a Strata space or in one of the baselines' memories; vertex arrays live in GPU memory.

use std::sync::Arc;
use std::time::Instant;

use strata_gpu::driver::{Args, DeviceBuffer, Function, Gpu, Grid};
use strata_gpu::{KernelModule, Strata};

use super::device::{GpuWorkloadError, context_sync, ensure_fits};
use super::kernels::GRAPH_CU;
use super::placed::Placed;
use crate::csr::Csr;
use crate::reference::UNREACHED;

/// Threads per block of every graph kernel (whole warps, as the kernels require).
const THREADS: u32 = 256;
/// Most PageRank iterations one call may run (one dangling-sum slot each).
pub const MAX_PAGERANK_ITERATIONS: u32 = 1000;
/// Beamer's direction-switch parameters (top-down -> bottom-up when the frontier's edges exceed
/// the unexplored edges / ALPHA; back when the frontier holds fewer than n / BETA vertices).
const ALPHA: u64 = 15;
const BETA: u64 = 18;
/// Top-down BFS reads a chunk's frontier rows in place, without moving their page, when they
/// hold fewer ids than this fraction of a page (see `bfs_top_down` in graph.cu). In top-down
/// BFS every row is read once per search, so a page moves for its bandwidth only: one bulk
/// copy of the page against the frontier rows' small reads over the bus.
pub const DEFAULT_BFS_DENSE_FRACTION: f64 = 0.5;

/// A kernel in both of its variants.
#[derive(Debug)]
struct Variants {
    space: (Function, Grid),
    ptr: (Function, Grid),
}

impl Variants {
    fn load(module: &KernelModule, name: &str) -> Result<Self, GpuWorkloadError> {
        let load = |suffix: &str| -> Result<(Function, Grid), GpuWorkloadError> {
            let f = module.function(&format!("{name}_{suffix}"))?;
            let grid = f.full_grid(THREADS)?;
            Ok((f, grid))
        };
        Ok(Self {
            space: load("space")?,
            ptr: load("ptr")?,
        })
    }

    fn pick(&self, edges: &Placed) -> &(Function, Grid) {
        if edges.is_space() {
            &self.space
        } else {
            &self.ptr
        }
    }
}

/// One BFS step's direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Direction {
    /// Frontier vertices push to their neighbours.
    TopDown,
    /// Unvisited vertices look for a parent in the frontier.
    BottomUp,
}

/// BFS variant to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum BfsMode {
    /// Every step top-down: each reached vertex's row is read exactly once.
    TopDown,
    /// Beamer's direction-optimising BFS (bottom-up steps while the frontier is large).
    DirectionOptimising,
}

/// A GPU BFS result.
#[derive(Debug, Clone)]
pub struct GpuBfs {
    /// Levels per vertex.
    pub levels: Vec<u32>,
    /// Parents per vertex.
    pub parents: Vec<u32>,
    /// Direction of each step.
    pub steps: Vec<Direction>,
    /// Wall time of the search in milliseconds (kernels and the per-step host checks).
    pub ms: f64,
}

/// The graph's vertex-side state on the GPU and the compiled kernels.
#[derive(Debug)]
pub struct GraphGpu {
    gpu: Arc<Gpu>,
    n: u64,
    arcs: u64,
    chunks: u64,
    bounds: DeviceBuffer,
    offsets: DeviceBuffer,
    levels: DeviceBuffer,
    parents: DeviceBuffer,
    labels: DeviceBuffer,
    rank: DeviceBuffer,
    next_rank: DeviceBuffer,
    contribution: DeviceBuffer,
    dangling: DeviceBuffer,
    counters: DeviceBuffer,
    changed: DeviceBuffer,
    /// Ids per work chunk (one page of the neighbour array).
    chunk_ids: u64,
    /// Frontier ids per chunk from which top-down BFS lets the chunk's page move.
    dense_ids: u64,
    top_down: Variants,
    bottom_up: Variants,
    hook: Variants,
    pull: Variants,
    small: (Function, Function, Function, Grid),
    cc_init: Function,
    compress: Function,
    pr_init: Function,
    contribute: Function,
    vertex_grid: Grid,
    _module: KernelModule,
}

/// Frontier ids from which a chunk of `chunk_ids` ids is dense (`fraction` of it, rounded up;
/// `u64::MAX` for fractions above 1: never dense).
fn dense_ids(chunk_ids: u64, fraction: f64) -> u64 {
    if fraction > 1.0 {
        return u64::MAX;
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let ids = (chunk_ids as f64 * fraction).ceil() as u64;
    ids
}

fn elapsed_ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

impl GraphGpu {
    /// Compiles the kernels, uploads the offsets and the work chunks (one per `chunk_bytes` of
    /// the neighbour array: pass the Strata page size), allocates the vertex arrays.
    ///
    /// # Errors
    /// Compile, allocation or copy failures; vertex arrays that do not fit.
    pub fn new(strata: &Strata, graph: &Csr, chunk_bytes: u64) -> Result<Self, GpuWorkloadError> {
        let gpu = strata.gpu().clone();
        let n = graph.vertices() as u64;
        let vertex_bytes = (n + 1) * 8 + n * 4 * 6 + u64::from(MAX_PAGERANK_ITERATIONS) * 8;
        ensure_fits(
            &gpu,
            vertex_bytes,
            "the vertex arrays",
            "use a smaller graph",
        )?;
        let module = strata.compile(GRAPH_CU, "graph.cu")?;
        let offsets = DeviceBuffer::zeroed(&gpu, graph.offsets.len() * 8)?;
        let chunk_ids = (chunk_bytes / 4).max(1);
        let bounds = graph.chunk_bounds(chunk_ids);
        let bounds_buffer = DeviceBuffer::zeroed(&gpu, bounds.len() * 4)?;
        context_sync(&gpu)?; // the zero fills run on the legacy stream: finish them before the copies
        offsets.upload(0, &graph.offsets)?;
        bounds_buffer.upload(0, &bounds)?;
        let vertex_array = || DeviceBuffer::zeroed(&gpu, graph.vertices().max(1) * 4);
        let fill_u32 = module.function("fill_u32")?;
        let vertex_grid = Grid {
            blocks: gpu.multiprocessors * 8,
            threads: THREADS,
        };
        let runner = Self {
            n,
            arcs: graph.arcs(),
            chunks: bounds.len() as u64 - 1,
            bounds: bounds_buffer,
            levels: vertex_array()?,
            parents: vertex_array()?,
            labels: vertex_array()?,
            rank: vertex_array()?,
            next_rank: vertex_array()?,
            contribution: vertex_array()?,
            dangling: DeviceBuffer::zeroed(&gpu, MAX_PAGERANK_ITERATIONS as usize * 8)?,
            counters: DeviceBuffer::zeroed(&gpu, 16)?,
            changed: DeviceBuffer::zeroed(&gpu, 4)?,
            chunk_ids,
            dense_ids: dense_ids(chunk_ids, DEFAULT_BFS_DENSE_FRACTION),
            offsets,
            top_down: Variants::load(&module, "bfs_top_down")?,
            bottom_up: Variants::load(&module, "bfs_bottom_up")?,
            hook: Variants::load(&module, "cc_hook")?,
            pull: Variants::load(&module, "pr_pull")?,
            small: (
                fill_u32,
                module.function("fill_u64")?,
                module.function("set_u32")?,
                vertex_grid,
            ),
            cc_init: module.function("cc_init")?,
            compress: module.function("cc_compress")?,
            pr_init: module.function("pr_init")?,
            contribute: module.function("pr_contribution")?,
            vertex_grid,
            gpu,
            _module: module,
        };
        // Allocation zero-fills on the driver's legacy stream, which Strata's stream does not
        // wait for: let those fills (and the offsets copy) finish before any kernel runs.
        context_sync(&runner.gpu)?;
        Ok(runner)
    }

    /// Sets the fraction of a page's ids below which top-down BFS reads a chunk's frontier
    /// rows in place rather than moving the page ([`DEFAULT_BFS_DENSE_FRACTION`]); 0 moves the
    /// page of every chunk with a frontier, above 1 reads every chunk in place.
    ///
    /// # Errors
    /// A fraction that is negative or not a number.
    pub fn set_bfs_dense_fraction(&mut self, fraction: f64) -> Result<(), GpuWorkloadError> {
        if fraction.is_nan() || fraction < 0.0 {
            return Err(GpuWorkloadError::Invalid(format!(
                "BFS dense fraction {fraction} must be a number >= 0 (0: the page of every chunk with a frontier moves; above 1: every chunk is read in place)"
            )));
        }
        self.dense_ids = dense_ids(self.chunk_ids, fraction);
        Ok(())
    }

    fn fill_u32(
        &self,
        buffer: &DeviceBuffer,
        count: u64,
        value: u32,
    ) -> Result<(), GpuWorkloadError> {
        let (f, _, _, grid) = &self.small;
        f.launch(*grid, &Args::new().arg(buffer.ptr()).arg(count).arg(value))?;
        Ok(())
    }

    fn zero_u64(&self, buffer: &DeviceBuffer, count: u64) -> Result<(), GpuWorkloadError> {
        let (_, f, _, grid) = &self.small;
        f.launch(*grid, &Args::new().arg(buffer.ptr()).arg(count).arg(0u64))?;
        Ok(())
    }

    fn set_u32(
        &self,
        buffer: &DeviceBuffer,
        index: u64,
        value: u32,
    ) -> Result<(), GpuWorkloadError> {
        let (_, _, f, _) = &self.small;
        f.launch(
            Grid {
                blocks: 1,
                threads: 32,
            },
            &Args::new().arg(buffer.ptr()).arg(index).arg(value),
        )?;
        Ok(())
    }

    fn download_u32(&self, buffer: &DeviceBuffer) -> Result<Vec<u32>, GpuWorkloadError> {
        self.gpu.synchronize()?;
        let mut out = vec![0u32; usize::try_from(self.n).expect("vertex count fits")];
        buffer.download(0, &mut out)?;
        Ok(out)
    }

    fn read_counters(&self) -> Result<[u64; 2], GpuWorkloadError> {
        self.gpu.synchronize()?;
        let mut out = [0u64; 2];
        self.counters.download(0, &mut out)?;
        Ok(out)
    }

    /// Breadth-first search from `source`; `degree(source)` seeds the direction heuristic.
    ///
    /// # Errors
    /// Launch failures, or an out-of-range access into the space.
    pub fn bfs(
        &self,
        edges: &Placed,
        source: u32,
        source_degree: u64,
        mode: BfsMode,
    ) -> Result<GpuBfs, GpuWorkloadError> {
        if u64::from(source) >= self.n {
            return Err(GpuWorkloadError::Invalid(format!(
                "BFS source {source} is not a vertex (graph has {})",
                self.n
            )));
        }
        self.fill_u32(&self.levels, self.n, UNREACHED)?;
        self.fill_u32(&self.parents, self.n, UNREACHED)?;
        self.set_u32(&self.levels, u64::from(source), 0)?;
        self.set_u32(&self.parents, u64::from(source), source)?;
        self.gpu.synchronize()?;
        let start = Instant::now();
        let mut steps = Vec::new();
        let (mut frontier, mut frontier_edges, mut explored_edges) =
            (1u64, source_degree, source_degree);
        let mut direction = Direction::TopDown;
        for level in 0u32.. {
            if mode == BfsMode::DirectionOptimising {
                let unexplored = self.arcs.saturating_sub(explored_edges);
                direction = match direction {
                    Direction::TopDown if frontier_edges > unexplored / ALPHA => {
                        Direction::BottomUp
                    }
                    Direction::BottomUp if frontier < self.n / BETA => Direction::TopDown,
                    d => d,
                };
            }
            let kernel = match direction {
                Direction::TopDown => self.top_down.pick(edges),
                Direction::BottomUp => self.bottom_up.pick(edges),
            };
            self.zero_u64(&self.counters, 2)?;
            let mut args = edges
                .first_arg()
                .arg(self.bounds.ptr())
                .arg(self.chunks)
                .arg(self.offsets.ptr())
                .arg(self.n)
                .arg(self.levels.ptr())
                .arg(self.parents.ptr())
                .arg(level)
                .arg(self.counters.ptr());
            if direction == Direction::TopDown {
                args = args.arg(self.dense_ids);
            }
            kernel.0.launch(kernel.1, &args)?;
            steps.push(direction);
            let [found, found_edges] = self.read_counters()?;
            if found == 0 {
                break;
            }
            frontier = found;
            frontier_edges = found_edges;
            explored_edges += found_edges;
        }
        let ms = elapsed_ms(start);
        edges.check()?;
        Ok(GpuBfs {
            levels: self.download_u32(&self.levels)?,
            parents: self.download_u32(&self.parents)?,
            steps,
            ms,
        })
    }

    /// Connected components (labels = smallest vertex id per component); returns the labels,
    /// the number of hook passes and the milliseconds taken.
    ///
    /// # Errors
    /// Launch failures, an out-of-range access, or no convergence within n passes.
    pub fn connected_components(
        &self,
        edges: &Placed,
    ) -> Result<(Vec<u32>, u32, f64), GpuWorkloadError> {
        self.cc_init.launch(
            self.vertex_grid,
            &Args::new().arg(self.labels.ptr()).arg(self.n),
        )?;
        self.gpu.synchronize()?;
        let start = Instant::now();
        let mut passes = 0u32;
        loop {
            passes += 1;
            self.fill_u32(&self.changed, 1, 0)?;
            let kernel = self.hook.pick(edges);
            let args = edges
                .first_arg()
                .arg(self.bounds.ptr())
                .arg(self.chunks)
                .arg(self.offsets.ptr())
                .arg(self.n)
                .arg(self.labels.ptr())
                .arg(self.changed.ptr());
            kernel.0.launch(kernel.1, &args)?;
            self.compress.launch(
                self.vertex_grid,
                &Args::new().arg(self.labels.ptr()).arg(self.n),
            )?;
            self.gpu.synchronize()?;
            let mut changed = [0u32];
            self.changed.download(0, &mut changed)?;
            if changed[0] == 0 {
                break;
            }
            if u64::from(passes) > self.n + 1 {
                return Err(GpuWorkloadError::Validation(format!(
                    "components did not converge in {passes} passes"
                )));
            }
        }
        let ms = elapsed_ms(start);
        edges.check()?;
        Ok((self.download_u32(&self.labels)?, passes, ms))
    }

    /// PageRank (pull, single precision, dangling mass spread uniformly as in
    /// [`crate::reference::pagerank`]); returns the ranks and the milliseconds taken.
    ///
    /// # Errors
    /// Launch failures, an out-of-range access, or too many iterations.
    pub fn pagerank(
        &self,
        edges: &Placed,
        iterations: u32,
        damping: f32,
    ) -> Result<(Vec<f32>, f64), GpuWorkloadError> {
        if iterations == 0 || iterations > MAX_PAGERANK_ITERATIONS {
            return Err(GpuWorkloadError::Invalid(format!(
                "{iterations} PageRank iterations: use 1 to {MAX_PAGERANK_ITERATIONS}"
            )));
        }
        self.pr_init.launch(
            self.vertex_grid,
            &Args::new().arg(self.rank.ptr()).arg(self.n),
        )?;
        self.zero_u64(&self.dangling, u64::from(MAX_PAGERANK_ITERATIONS))?;
        self.gpu.synchronize()?;
        let start = Instant::now();
        let (mut current, mut next) = (&self.rank, &self.next_rank);
        for i in 0..u64::from(iterations) {
            let dangling = self.dangling.ptr() + 8 * i;
            let args = Args::new()
                .arg(self.offsets.ptr())
                .arg(self.n)
                .arg(current.ptr())
                .arg(self.contribution.ptr())
                .arg(dangling);
            self.contribute.launch(self.vertex_grid, &args)?;
            let kernel = self.pull.pick(edges);
            let args = edges
                .first_arg()
                .arg(self.bounds.ptr())
                .arg(self.chunks)
                .arg(self.offsets.ptr())
                .arg(self.n)
                .arg(self.contribution.ptr())
                .arg(dangling)
                .arg(damping)
                .arg(next.ptr());
            kernel.0.launch(kernel.1, &args)?;
            std::mem::swap(&mut current, &mut next);
        }
        self.gpu.synchronize()?;
        let ms = elapsed_ms(start);
        edges.check()?;
        self.gpu.synchronize()?;
        let mut ranks = vec![0f32; usize::try_from(self.n).expect("vertex count fits")];
        current.download(0, &mut ranks)?;
        Ok((ranks, ms))
    }
}

#[cfg(test)]
mod tests {
    use super::dense_ids;

    #[test]
    fn dense_threshold_scales_with_the_chunk_and_saturates_above_one() {
        assert_eq!(
            dense_ids(16384, 0.0),
            0,
            "0: every chunk with a frontier moves"
        );
        assert_eq!(dense_ids(16384, 0.5), 8192);
        assert_eq!(dense_ids(1024, 0.001), 2, "rounded up");
        assert_eq!(dense_ids(16384, 1.0), 16384);
        assert_eq!(dense_ids(16384, 1.5), u64::MAX, "above 1: never dense");
    }
}
