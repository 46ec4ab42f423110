//! Synthetic graph generators: the Graph500 Kronecker (R-MAT) generator and uniform random
//! (Erdős–Rényi style) graphs, deterministic from a seed and parallel over fixed-size chunks.
//!
//! Kronecker: each edge descends `scale` levels of the 2x2 probability matrix
//! `[[A, B], [C, D]]` (Graph500: A=0.57, B=0.19, C=0.19, D=1-A-B-C=0.05), choosing one
//! quadrant per level. Raw R-MAT concentrates the hubs on low vertex ids, which would hand a
//! page cache an unrealistically ordered graph, so the vertex labels are then permuted by a
//! seeded random permutation (as Graph500's reference does). Optional per-level noise
//! (Seshadhri, Pinar, Kolda: "noisy SKG") smooths the degree distribution's oscillations.

use crate::par;
use crate::rng::Rng;
use indicatif::ProgressBar;

/// Edges generated per chunk: each chunk has its own random stream (see [`Rng::for_chunk`]).
const EDGES_PER_CHUNK: usize = 1 << 16;

/// One directed edge of a generated edge list, as (source, destination) vertex ids.
pub type Edge = (u32, u32);

/// Largest supported scale: vertex ids are 32-bit.
pub const MAX_SCALE: u32 = 31;

/// A generated edge list and the vertex count it is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeList {
    /// Number of vertices; every id is below it.
    pub vertices: u64,
    /// The edges in generation order.
    pub edges: Vec<Edge>,
}

/// Errors from graph generation.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// Scale out of range.
    #[error("scale {0} is out of range: use 1..={MAX_SCALE} (vertex ids are 32-bit)")]
    Scale(u32),
    /// Bad Kronecker probabilities.
    #[error(
        "Kronecker probabilities A={a}, B={b}, C={c} are invalid: each must be in (0, 1) and A+B+C < 1 (Graph500 uses 0.57, 0.19, 0.19)"
    )]
    Probabilities {
        /// A.
        a: f64,
        /// B.
        b: f64,
        /// C.
        c: f64,
    },
    /// Noise out of range.
    #[error("noise {0} is out of range: use 0 <= noise < 1 (0.1 is typical, 0 is plain Graph500)")]
    Noise(f64),
    /// Zero-sized graph.
    #[error(
        "a graph needs at least one vertex and one edge (got {vertices} vertices, {edges} edges)"
    )]
    Empty {
        /// Vertices asked for.
        vertices: u64,
        /// Edges asked for.
        edges: u64,
    },
    /// Too many vertices for 32-bit ids.
    #[error("{0} vertices do not fit 32-bit vertex ids: use at most 2^31")]
    TooManyVertices(u64),
    /// The edge list would not fit this machine's address space.
    #[error("{0} edges do not fit in memory on this machine: lower the scale or edge factor")]
    TooManyEdges(u64),
}

/// Parameters of the Graph500 Kronecker generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KroneckerParams {
    /// log2 of the vertex count.
    pub scale: u32,
    /// Edges generated per vertex (Graph500: 16).
    pub edge_factor: u32,
    /// Probability of the top-left quadrant.
    pub a: f64,
    /// Probability of the top-right quadrant.
    pub b: f64,
    /// Probability of the bottom-left quadrant.
    pub c: f64,
    /// Per-level noise amplitude (0 = none).
    pub noise: f64,
    /// Seed for edges and the vertex permutation.
    pub seed: u64,
}

impl KroneckerParams {
    /// Graph500's parameters (A=0.57, B=0.19, C=0.19, no noise) at the given scale.
    #[must_use]
    pub fn graph500(scale: u32, edge_factor: u32, seed: u64) -> Self {
        Self {
            scale,
            edge_factor,
            a: 0.57,
            b: 0.19,
            c: 0.19,
            noise: 0.0,
            seed,
        }
    }

    fn validate(&self) -> Result<(), GenerateError> {
        if self.scale == 0 || self.scale > MAX_SCALE {
            return Err(GenerateError::Scale(self.scale));
        }
        let (a, b, c) = (self.a, self.b, self.c);
        let in_unit = |p: f64| p > 0.0 && p < 1.0;
        if !(in_unit(a) && in_unit(b) && in_unit(c) && a + b + c < 1.0) {
            return Err(GenerateError::Probabilities { a, b, c });
        }
        if !(0.0..1.0).contains(&self.noise) {
            return Err(GenerateError::Noise(self.noise));
        }
        if self.edge_factor == 0 {
            return Err(GenerateError::Empty {
                vertices: 1 << self.scale,
                edges: 0,
            });
        }
        Ok(())
    }

    /// Number of vertices, 2^scale.
    #[must_use]
    pub fn vertices(&self) -> u64 {
        1u64 << self.scale
    }

    /// Number of generated edges, edge_factor * 2^scale.
    #[must_use]
    pub fn edges(&self) -> u64 {
        u64::from(self.edge_factor) << self.scale
    }
}

/// Integer thresholds for the three quadrant cut points of one level (in units of 2^-32).
#[derive(Debug, Clone, Copy)]
struct LevelThresholds {
    ab: u64,
    abc: u64,
    a: u64,
}

fn level_thresholds(params: &KroneckerParams) -> Vec<LevelThresholds> {
    let mut rng = Rng::for_chunk(params.seed, u64::MAX);
    let d = 1.0 - params.a - params.b - params.c;
    (0..params.scale)
        .map(|_| {
            let (mut a, mut b, mut c, mut dd) = (params.a, params.b, params.c, d);
            if params.noise > 0.0 {
                // Noisy SKG: mu in [-noise, noise] moves mass between the diagonal and the
                // off-diagonal quadrants of this level while keeping the sum at one.
                let mu = params.noise * (2.0 * rng.next_f64() - 1.0);
                let diagonal = a + dd;
                a -= 2.0 * mu * a / diagonal;
                b += mu;
                c += mu;
                dd -= 2.0 * mu * dd / diagonal;
            }
            let total = a + b + c + dd;
            let scale = 4_294_967_296.0 / total;
            // Probabilities are in (0, 1), so each product is below 2^32 + rounding slack.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let cut = |p: f64| (p * scale).round().clamp(0.0, 4_294_967_296.0) as u64;
            LevelThresholds {
                a: cut(a),
                ab: cut(a + b),
                abc: cut(a + b + c),
            }
        })
        .collect()
}

fn check_edge_count(edges: u64) -> Result<usize, GenerateError> {
    let count = usize::try_from(edges).map_err(|_| GenerateError::TooManyEdges(edges))?;
    count
        .checked_mul(std::mem::size_of::<Edge>())
        .filter(|bytes| isize::try_from(*bytes).is_ok())
        .ok_or(GenerateError::TooManyEdges(edges))?;
    Ok(count)
}

/// A seeded uniformly random permutation of `0..n` (Fisher–Yates).
#[must_use]
pub fn permutation(n: u32, seed: u64) -> Vec<u32> {
    let mut perm: Vec<u32> = (0..n).collect();
    let mut rng = Rng::for_chunk(seed, u64::MAX - 1);
    for i in (1..perm.len()).rev() {
        let bound = u64::try_from(i).expect("usize fits u64") + 1;
        let j = usize::try_from(rng.below(bound)).expect("below bound <= len");
        perm.swap(i, j);
    }
    perm
}

/// Generates a Graph500 Kronecker edge list (directed; undirect it with [`crate::csr`]).
///
/// # Errors
/// Invalid parameters, or an edge list too large for this machine.
pub fn kronecker(
    params: &KroneckerParams,
    progress: &ProgressBar,
) -> Result<EdgeList, GenerateError> {
    params.validate()?;
    let count = check_edge_count(params.edges())?;
    let levels = level_thresholds(params);
    let n = u32::try_from(params.vertices() - 1).expect("scale <= 31") + 1;
    let perm = permutation(n, params.seed);
    progress.set_length(params.edges());
    let mut edges: Vec<Edge> = vec![(0, 0); count];
    par::for_each_chunk_mut(&mut edges, EDGES_PER_CHUNK, |chunk, out| {
        let mut rng = Rng::for_chunk(params.seed, u64::try_from(chunk).expect("fits"));
        for edge in out.iter_mut() {
            let (mut u, mut v) = (0u32, 0u32);
            let mut bits = 0u64;
            for (level, t) in levels.iter().enumerate() {
                // Two levels per 64-bit draw: 32 bits of resolution per choice.
                if level % 2 == 0 {
                    bits = rng.next_u64();
                } else {
                    bits >>= 32;
                }
                let r = bits & 0xffff_ffff;
                // Quadrants by cut points: [0, a) top-left, [a, ab) top-right, [ab, abc)
                // bottom-left, [abc, 1) bottom-right. Branch-free: the choice is random, so
                // branches would mispredict about half the time.
                let row = u32::from(r >= t.ab);
                let col = u32::from(r >= t.a) & u32::from(r < t.ab) | u32::from(r >= t.abc);
                u = (u << 1) | row;
                v = (v << 1) | col;
            }
            *edge = (perm[u as usize], perm[v as usize]);
        }
        progress.inc(u64::try_from(out.len()).expect("fits"));
    });
    Ok(EdgeList {
        vertices: params.vertices(),
        edges,
    })
}

/// Generates `edges` directed edges whose endpoints are uniform over `0..vertices`.
///
/// # Errors
/// Zero sizes, more than 2^31 vertices, or an edge list too large for this machine.
pub fn uniform(
    vertices: u64,
    edges: u64,
    seed: u64,
    progress: &ProgressBar,
) -> Result<EdgeList, GenerateError> {
    if vertices == 0 || edges == 0 {
        return Err(GenerateError::Empty { vertices, edges });
    }
    if vertices > 1 << MAX_SCALE {
        return Err(GenerateError::TooManyVertices(vertices));
    }
    let count = check_edge_count(edges)?;
    progress.set_length(edges);
    let mut list: Vec<Edge> = vec![(0, 0); count];
    par::for_each_chunk_mut(&mut list, EDGES_PER_CHUNK, |chunk, out| {
        let mut rng = Rng::for_chunk(seed, u64::try_from(chunk).expect("fits"));
        for edge in out.iter_mut() {
            let u = u32::try_from(rng.below(vertices)).expect("vertices <= 2^31");
            let v = u32::try_from(rng.below(vertices)).expect("vertices <= 2^31");
            *edge = (u, v);
        }
        progress.inc(u64::try_from(out.len()).expect("fits"));
    });
    Ok(EdgeList {
        vertices,
        edges: list,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kronecker_is_deterministic_and_in_range() {
        let seed = crate::test_seed();
        let params = KroneckerParams::graph500(12, 8, seed);
        let a = kronecker(&params, &ProgressBar::hidden()).unwrap();
        let b = kronecker(&params, &ProgressBar::hidden()).unwrap();
        assert_eq!(a, b, "seed {seed}");
        assert_eq!(a.edges.len(), 8 << 12);
        assert!(a.edges.iter().all(|&(u, v)| u < 4096 && v < 4096));
        let other = kronecker(
            &KroneckerParams {
                seed: seed ^ 1,
                ..params
            },
            &ProgressBar::hidden(),
        )
        .unwrap();
        assert_ne!(a.edges, other.edges);
    }

    #[test]
    fn kronecker_is_skewed_and_permuted() {
        let seed = crate::test_seed();
        let params = KroneckerParams::graph500(14, 16, seed);
        let list = kronecker(&params, &ProgressBar::hidden()).unwrap();
        let mut degree = vec![0u32; 1 << 14];
        for &(u, v) in &list.edges {
            degree[u as usize] += 1;
            degree[v as usize] += 1;
        }
        let max = *degree.iter().max().unwrap();
        let isolated = degree.iter().filter(|d| **d == 0).count();
        // R-MAT with A=0.57: a heavy hub (mean degree 32) and many isolated vertices.
        assert!(max > 1000, "seed {seed}: max degree {max}");
        assert!(isolated > 1000, "seed {seed}: isolated {isolated}");
        // The permutation moves the hub away from vertex 0 almost surely.
        let hub = degree.iter().position(|d| *d == max).unwrap();
        assert!(degree[0] < max || hub != 0, "seed {seed}");
        // Source bits: P(top bit of u before permutation = 0) = A + B = 0.76. After the
        // permutation, low and high halves carry about equal edge mass.
        let low: u64 = degree[..1 << 13].iter().map(|d| u64::from(*d)).sum();
        let total: u64 = degree.iter().map(|d| u64::from(*d)).sum();
        #[allow(clippy::cast_precision_loss)]
        let share = low as f64 / total as f64;
        assert!((0.2..0.8).contains(&share), "seed {seed}: share {share}");
    }

    #[test]
    fn unpermuted_quadrant_frequencies_match_parameters() {
        // One level: the quadrant frequencies must match A, B, C, D.
        let seed = crate::test_seed();
        let params = KroneckerParams::graph500(1, 50_000, seed);
        let list = kronecker(&params, &ProgressBar::hidden()).unwrap();
        let perm = permutation(2, seed);
        let inverse = |x: u32| u32::try_from(perm.iter().position(|p| *p == x).unwrap()).unwrap();
        let mut counts = [0f64; 4];
        for &(u, v) in &list.edges {
            counts[usize::try_from(inverse(u) * 2 + inverse(v)).unwrap()] += 1.0;
        }
        let total = 100_000.0;
        for (got, want) in counts.iter().zip([0.57, 0.19, 0.19, 0.05]) {
            assert!((got / total - want).abs() < 0.01, "seed {seed}: {counts:?}");
        }
    }

    #[test]
    fn noise_keeps_probabilities_valid() {
        let params = KroneckerParams {
            noise: 0.1,
            ..KroneckerParams::graph500(10, 4, 3)
        };
        let list = kronecker(&params, &ProgressBar::hidden()).unwrap();
        assert_eq!(list.edges.len(), 4 << 10);
        let plain =
            kronecker(&KroneckerParams::graph500(10, 4, 3), &ProgressBar::hidden()).unwrap();
        assert_ne!(list.edges, plain.edges);
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let ok = KroneckerParams::graph500(10, 16, 1);
        let bar = ProgressBar::hidden();
        assert!(matches!(
            kronecker(&KroneckerParams { scale: 0, ..ok }, &bar),
            Err(GenerateError::Scale(0))
        ));
        assert!(matches!(
            kronecker(&KroneckerParams { scale: 32, ..ok }, &bar),
            Err(GenerateError::Scale(32))
        ));
        assert!(matches!(
            kronecker(&KroneckerParams { a: 0.9, ..ok }, &bar),
            Err(GenerateError::Probabilities { .. })
        ));
        assert!(matches!(
            kronecker(&KroneckerParams { noise: 1.5, ..ok }, &bar),
            Err(GenerateError::Noise(_))
        ));
        assert!(matches!(
            kronecker(
                &KroneckerParams {
                    edge_factor: 0,
                    ..ok
                },
                &bar
            ),
            Err(GenerateError::Empty { .. })
        ));
        assert!(matches!(
            uniform(0, 5, 1, &bar),
            Err(GenerateError::Empty { .. })
        ));
        assert!(matches!(
            uniform(1 << 32, 5, 1, &bar),
            Err(GenerateError::TooManyVertices(_))
        ));
        let err = kronecker(&KroneckerParams { a: 0.9, ..ok }, &bar)
            .unwrap_err()
            .to_string();
        assert!(err.contains("0.57"), "{err}");
    }

    #[test]
    fn uniform_is_deterministic_and_roughly_flat() {
        let seed = crate::test_seed();
        let a = uniform(1000, 200_000, seed, &ProgressBar::hidden()).unwrap();
        assert_eq!(
            a,
            uniform(1000, 200_000, seed, &ProgressBar::hidden()).unwrap()
        );
        let mut degree = vec![0u32; 1000];
        for &(u, v) in &a.edges {
            degree[u as usize] += 1;
            degree[v as usize] += 1;
        }
        // Mean 400, binomial sd 20: 6 sd bounds.
        assert!(degree.iter().all(|d| (280..520).contains(d)), "seed {seed}");
        let p = permutation(1000, seed);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(p, sorted);
    }
}
