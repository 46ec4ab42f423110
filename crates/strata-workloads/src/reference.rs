//! CPU reference implementations that GPU results are checked against.
//!
//! - BFS: level-synchronous top-down; levels and parents, with [`UNREACHED`] for vertices
//!   outside the source's component. (Parents are not unique; GPU parents are checked by the
//!   Graph500 rules in [`crate::validate`], levels are unique and compared exactly.)
//! - Connected components: every vertex is labelled with the smallest vertex id in its
//!   component, a canonical labelling that any correct GPU algorithm can reproduce exactly.
//! - PageRank: 20 pull iterations (by default) with damping 0.85 over the undirected graph
//!   (each edge counts in both directions). **Dangling vertices** (degree 0: isolated after
//!   self-loop removal; Kronecker graphs have many) spread their rank uniformly over all
//!   vertices, so ranks always sum to one:
//!   `pr'[v] = (1 - d) / n + d * (sum_{u in N(v)} pr[u] / deg(u) + dangling / n)`,
//!   with `dangling = sum of pr[u] over degree-0 u` and `pr = 1/n` at the start.

use crate::csr::Csr;
use crate::par;
use std::sync::atomic::{AtomicU32, Ordering};

/// Marks a vertex that the BFS did not reach (level and parent).
pub const UNREACHED: u32 = u32::MAX;

/// Vertices per parallel work item.
const BLOCK: usize = 1 << 14;

/// BFS result: per vertex, its level (hops from the source) and its parent in the BFS tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BfsResult {
    /// Hops from the source, or [`UNREACHED`].
    pub levels: Vec<u32>,
    /// Parent in the tree (the source is its own parent), or [`UNREACHED`].
    pub parents: Vec<u32>,
}

impl BfsResult {
    /// Number of reached vertices.
    #[must_use]
    pub fn reached(&self) -> usize {
        self.levels.iter().filter(|l| **l != UNREACHED).count()
    }

    /// Arcs inside the reached component (Graph500 counts traversed edges from these: the
    /// undirected edge count is half of it).
    #[must_use]
    pub fn component_arcs(&self, graph: &Csr) -> u64 {
        (0..graph.vertices())
            .filter(|v| self.levels[*v] != UNREACHED)
            .map(|v| graph.degree(v))
            .sum()
    }
}

/// Breadth-first search from `source` (level-synchronous; frontier expansion in parallel).
///
/// # Panics
/// If `source` is not a vertex of `graph`.
#[must_use]
pub fn bfs(graph: &Csr, source: u32) -> BfsResult {
    let n = graph.vertices();
    assert!(
        (source as usize) < n,
        "BFS source {source} is not a vertex (graph has {n})"
    );
    let parents: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(UNREACHED)).collect();
    let mut levels = vec![UNREACHED; n];
    parents[source as usize].store(source, Ordering::Relaxed);
    levels[source as usize] = 0;
    let mut frontier = vec![source];
    let mut depth = 0u32;
    while !frontier.is_empty() {
        depth += 1;
        let chunks = frontier.len().div_ceil(1024);
        let next: Vec<Vec<u32>> = par::map_indices(chunks, |chunk| {
            let mut found = Vec::new();
            for &u in &frontier[chunk * 1024..frontier.len().min((chunk + 1) * 1024)] {
                for &v in graph.row(u as usize) {
                    let slot = &parents[v as usize];
                    if slot.load(Ordering::Relaxed) == UNREACHED
                        && slot
                            .compare_exchange(UNREACHED, u, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok()
                    {
                        found.push(v);
                    }
                }
            }
            found
        });
        frontier = next.concat();
        for &v in &frontier {
            levels[v as usize] = depth;
        }
    }
    BfsResult {
        levels,
        parents: parents.into_iter().map(AtomicU32::into_inner).collect(),
    }
}

/// Connected components: each vertex's label is the smallest vertex id in its component.
///
/// Concurrent union-find that always links the larger root under the smaller one (so a root
/// is its component's minimum), with path halving in `find`.
#[must_use]
pub fn connected_components(graph: &Csr) -> Vec<u32> {
    let n = graph.vertices();
    let parent: Vec<AtomicU32> = (0..n)
        .map(|v| AtomicU32::new(u32::try_from(v).expect("n <= 2^31")))
        .collect();
    let find = |mut x: u32| -> u32 {
        loop {
            let p = parent[x as usize].load(Ordering::Relaxed);
            if p == x {
                return x;
            }
            let grand = parent[p as usize].load(Ordering::Relaxed);
            if grand != p {
                // Path halving; a lost race only leaves a longer (still valid) path.
                let _ = parent[x as usize].compare_exchange(
                    p,
                    grand,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            x = grand;
        }
    };
    par::for_each_index(n.div_ceil(BLOCK), |block| {
        for u in block * BLOCK..n.min((block + 1) * BLOCK) {
            let u32_id = u32::try_from(u).expect("n <= 2^31");
            for &v in graph.row(u) {
                if v < u32_id {
                    continue; // every undirected edge appears twice; union it once
                }
                let (mut a, mut b) = (find(u32_id), find(v));
                while a != b {
                    let (low, high) = if a < b { (a, b) } else { (b, a) };
                    // Link only a current root: if `high` gained a parent meanwhile, retry.
                    if parent[high as usize]
                        .compare_exchange(high, low, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                    a = find(high);
                    b = find(low);
                }
            }
        }
    });
    let mut labels = vec![0u32; n];
    par::for_each_chunk_mut(&mut labels, BLOCK, |block, out| {
        for (i, label) in out.iter_mut().enumerate() {
            *label = find(u32::try_from(block * BLOCK + i).expect("n <= 2^31"));
        }
    });
    labels
}

/// PageRank with `iterations` pull steps and damping `damping` (see the module docs).
#[must_use]
pub fn pagerank(graph: &Csr, iterations: u32, damping: f64) -> Vec<f64> {
    let n = graph.vertices();
    #[allow(clippy::cast_precision_loss)] // n <= 2^31 is exact in f64
    let inv_n = 1.0 / n as f64;
    let mut rank = vec![inv_n; n];
    let mut contribution = vec![0.0f64; n];
    for _ in 0..iterations {
        let dangling: f64 = (0..n)
            .filter(|v| graph.degree(*v) == 0)
            .map(|v| rank[v])
            .sum();
        par::for_each_chunk_mut(&mut contribution, BLOCK, |block, out| {
            for (i, c) in out.iter_mut().enumerate() {
                let v = block * BLOCK + i;
                let degree = graph.degree(v);
                #[allow(clippy::cast_precision_loss)] // degrees are far below 2^53
                let share = if degree == 0 {
                    0.0
                } else {
                    rank[v] / degree as f64
                };
                *c = share;
            }
        });
        let base = (1.0 - damping) * inv_n + damping * dangling * inv_n;
        par::for_each_chunk_mut(&mut rank, BLOCK, |block, out| {
            for (i, r) in out.iter_mut().enumerate() {
                let v = block * BLOCK + i;
                let sum: f64 = graph.row(v).iter().map(|u| contribution[*u as usize]).sum();
                *r = base + damping * sum;
            }
        });
    }
    rank
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{KroneckerParams, kronecker};
    use indicatif::ProgressBar;

    fn graph(vertices: u64, edges: &[(u32, u32)]) -> Csr {
        Csr::from_pairs(vertices, edges).unwrap()
    }

    #[test]
    fn bfs_on_a_hand_checked_graph() {
        // Path 0-1-2-3, chord 0-2, separate edge 4-5, isolated 6.
        let g = graph(7, &[(0, 1), (1, 2), (2, 3), (0, 2), (4, 5)]);
        let r = bfs(&g, 0);
        assert_eq!(r.levels, vec![0, 1, 1, 2, UNREACHED, UNREACHED, UNREACHED]);
        assert_eq!(r.parents[..4], [0, 0, 0, 2]);
        assert_eq!(r.reached(), 4);
        assert_eq!(r.component_arcs(&g), 8);
        let r = bfs(&g, 5);
        assert_eq!(r.levels[4], 1);
        assert_eq!(r.parents[4], 5);
        assert_eq!(r.reached(), 2);
    }

    #[test]
    fn components_on_a_hand_checked_graph() {
        let g = graph(8, &[(5, 3), (3, 7), (1, 2), (6, 6)]);
        assert_eq!(connected_components(&g), vec![0, 1, 1, 3, 4, 3, 6, 3]);
    }

    #[test]
    fn components_agree_with_bfs_on_a_generated_graph() {
        let seed = crate::test_seed();
        let list = kronecker(
            &KroneckerParams::graph500(12, 4, seed),
            &ProgressBar::hidden(),
        )
        .unwrap();
        let g = Csr::from_edges(&list, &ProgressBar::hidden()).unwrap();
        let labels = connected_components(&g);
        // Every component is exactly the set a BFS from its minimum reaches.
        let mut checked = 0;
        for v in 0..g.vertices() {
            if labels[v] as usize == v && g.degree(v) > 0 && checked < 20 {
                let r = bfs(&g, labels[v]);
                for (w, level) in r.levels.iter().enumerate() {
                    assert_eq!(
                        *level != UNREACHED,
                        labels[w] == labels[v],
                        "seed {seed}, vertex {w}"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 1);
    }

    #[test]
    fn pagerank_on_a_hand_checked_graph() {
        // Star: centre 0 with leaves 1, 2, 3; vertex 4 dangling. n = 5, d = 0.85.
        let g = graph(5, &[(0, 1), (0, 2), (0, 3)]);
        let one = pagerank(&g, 1, 0.85);
        // After one step: base = 0.15/5 + 0.85*(0.2)/5 = 0.064.
        // centre: base + 0.85 * 3 * (0.2 / 1) = 0.574; leaf: base + 0.85 * 0.2/3.
        let base = 0.15 / 5.0 + 0.85 * 0.2 / 5.0;
        assert!((one[0] - (base + 0.85 * 0.6)).abs() < 1e-12);
        assert!((one[1] - (base + 0.85 * 0.2 / 3.0)).abs() < 1e-12);
        assert!((one[4] - base).abs() < 1e-12);
        let twenty = pagerank(&g, 20, 0.85);
        let total: f64 = twenty.iter().sum();
        assert!((total - 1.0).abs() < 1e-9, "ranks sum to one: {total}");
        assert!(twenty[0] > twenty[1] && twenty[1] > twenty[4]);
        assert!((twenty[1] - twenty[3]).abs() < 1e-15);
    }
}
