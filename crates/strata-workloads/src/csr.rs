//! Compressed sparse row graphs built from edge lists.
//!
//! Strata's graphs are undirected and simple: every input edge (u, v) with u != v becomes the
//! two arcs u->v and v->u; self loops are dropped; **duplicate arcs are removed** (each row
//! is sorted and deduplicated). Removing duplicates matches the GAP benchmark graphs
//! (GAP-kron, GAP-urand) that DREAM, BaM and EMOGI report on, makes PageRank and connected
//! components independent of how often the generator repeated an edge, and leaves every row
//! sorted, which lets the BFS validator test "is (u, v) an edge" by binary search.
//!
//! Layout: `offsets` has `vertices + 1` entries (u64, so more than 2^32 arcs work);
//! `neighbours[offsets[v]..offsets[v+1]]` are v's neighbours (u32 ids). This is the layout
//! the GPU kernels read: the `neighbours` array is the large one that lives in a Strata space.

use crate::generate::EdgeList;
use crate::par;
use indicatif::ProgressBar;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Vertices per parallel work item when sorting rows.
const VERTICES_PER_BLOCK: usize = 1 << 14;
/// Edges per parallel work item when counting and scattering.
const EDGES_PER_BLOCK: usize = 1 << 16;

/// Errors from building or checking a CSR graph.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CsrError {
    /// An edge names a vertex outside the graph.
    #[error(
        "edge {index} ({u}, {v}) names a vertex outside 0..{vertices}: the edge list is corrupt or was built for a larger graph"
    )]
    VertexOutOfRange {
        /// Position of the edge in the list.
        index: usize,
        /// Source.
        u: u32,
        /// Destination.
        v: u32,
        /// Vertex count.
        vertices: u64,
    },
    /// The vertex count does not fit 32-bit ids.
    #[error("{0} vertices do not fit 32-bit vertex ids: use at most 2^31")]
    TooManyVertices(u64),
    /// The arrays are inconsistent.
    #[error("malformed CSR: {0}")]
    Malformed(String),
}

/// An undirected simple graph in compressed sparse row form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Csr {
    /// Row starts, `vertices + 1` entries, non-decreasing, last = `neighbours.len()`.
    pub offsets: Vec<u64>,
    /// Concatenated sorted rows of neighbour ids.
    pub neighbours: Vec<u32>,
}

impl Csr {
    /// Number of vertices.
    #[must_use]
    pub fn vertices(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Number of stored arcs (twice the number of undirected edges).
    #[must_use]
    pub fn arcs(&self) -> u64 {
        self.neighbours.len() as u64
    }

    /// The neighbours of `v`.
    #[must_use]
    pub fn row(&self, v: usize) -> &[u32] {
        &self.neighbours[self.range(v)]
    }

    /// The index range of `v`'s row in `neighbours`.
    #[must_use]
    pub fn range(&self, v: usize) -> std::ops::Range<usize> {
        let start = usize::try_from(self.offsets[v]).expect("checked at build");
        let end = usize::try_from(self.offsets[v + 1]).expect("checked at build");
        start..end
    }

    /// Degree of `v`.
    #[must_use]
    pub fn degree(&self, v: usize) -> u64 {
        self.offsets[v + 1] - self.offsets[v]
    }

    /// Whether the arc u->v exists (rows are sorted: binary search).
    #[must_use]
    pub fn has_arc(&self, u: usize, v: u32) -> bool {
        self.row(u).binary_search(&v).is_ok()
    }

    /// Bytes of the neighbour array (the part that is paged on the GPU).
    #[must_use]
    pub fn neighbour_bytes(&self) -> u64 {
        self.arcs() * 4
    }

    /// Cuts the vertices into chunks by where their rows start: chunk `c` holds the vertices
    /// `bounds[c]..bounds[c + 1]` whose rows start in neighbour positions
    /// `c * ids_per_chunk .. (c + 1) * ids_per_chunk` (the last chunk also takes trailing
    /// empty rows). GPU kernels hand whole chunks to one warp, so with chunks of one page a
    /// page is read by one warp per pass.
    ///
    /// # Panics
    /// If `ids_per_chunk` is zero.
    #[must_use]
    pub fn chunk_bounds(&self, ids_per_chunk: u64) -> Vec<u32> {
        assert!(ids_per_chunk > 0, "chunks need at least one id");
        let n = self.vertices();
        let chunks = self.arcs().div_ceil(ids_per_chunk).max(1);
        let starts = &self.offsets[..n];
        let mut bounds: Vec<u32> = (0..chunks)
            .map(|c| {
                let first = starts.partition_point(|o| *o < c * ids_per_chunk);
                u32::try_from(first).expect("n <= 2^31")
            })
            .collect();
        bounds.push(u32::try_from(n).expect("n <= 2^31"));
        bounds
    }

    /// Checks the invariants every consumer relies on: offsets start at 0, never decrease and
    /// end at the arc count; ids are in range; rows are sorted and free of duplicates and
    /// self loops; every arc has its reverse.
    ///
    /// # Errors
    /// [`CsrError::Malformed`] naming the first violation.
    pub fn check(&self) -> Result<(), CsrError> {
        let bad = |msg: String| Err(CsrError::Malformed(msg));
        if self.offsets.is_empty() {
            return bad("offsets is empty (needs vertices + 1 entries)".into());
        }
        if self.offsets[0] != 0 {
            return bad(format!("offsets[0] is {}, not 0", self.offsets[0]));
        }
        if *self.offsets.last().expect("non-empty") != self.arcs() {
            return bad(format!(
                "last offset {} differs from the neighbour count {}",
                self.offsets.last().expect("non-empty"),
                self.arcs()
            ));
        }
        if let Some(v) = self.offsets.windows(2).position(|w| w[0] > w[1]) {
            return bad(format!("offsets decrease at vertex {v}"));
        }
        let n = self.vertices();
        let errors: Vec<Option<String>> =
            par::map_indices(n.div_ceil(VERTICES_PER_BLOCK), |block| {
                let lo = block * VERTICES_PER_BLOCK;
                for u in lo..n.min(lo + VERTICES_PER_BLOCK) {
                    let row = self.row(u);
                    for (i, &v) in row.iter().enumerate() {
                        if v as usize >= n {
                            return Some(format!("vertex {u} has neighbour {v} outside 0..{n}"));
                        }
                        if v as usize == u {
                            return Some(format!("vertex {u} has a self loop"));
                        }
                        if i > 0 && row[i - 1] >= v {
                            return Some(format!(
                                "row {u} is not strictly increasing at position {i}"
                            ));
                        }
                        let reverse = u32::try_from(u).expect("n <= 2^31");
                        if !self.has_arc(v as usize, reverse) {
                            return Some(format!("arc {u}->{v} has no reverse arc"));
                        }
                    }
                }
                None
            });
        match errors.into_iter().flatten().next() {
            Some(msg) => bad(msg),
            None => Ok(()),
        }
    }

    /// Builds a small graph from a slice of edges (tests, examples; no progress bar).
    ///
    /// # Errors
    /// As [`Csr::from_edges`].
    pub fn from_pairs(vertices: u64, edges: &[(u32, u32)]) -> Result<Self, CsrError> {
        let list = EdgeList {
            vertices,
            edges: edges.to_vec(),
        };
        Self::from_edges(&list, &ProgressBar::hidden())
    }

    /// Builds the undirected simple graph of an edge list (see the module docs).
    ///
    /// # Errors
    /// An edge outside the vertex range, or more than 2^31 vertices.
    pub fn from_edges(list: &EdgeList, progress: &ProgressBar) -> Result<Self, CsrError> {
        let n = usize::try_from(list.vertices)
            .ok()
            .filter(|n| *n <= 1 << crate::generate::MAX_SCALE)
            .ok_or(CsrError::TooManyVertices(list.vertices))?;
        if let Some((index, &(u, v))) = list
            .edges
            .iter()
            .enumerate()
            .find(|(_, (u, v))| *u as usize >= n || *v as usize >= n)
        {
            return Err(CsrError::VertexOutOfRange {
                index,
                u,
                v,
                vertices: list.vertices,
            });
        }
        let edges = &list.edges;
        let blocks = edges.len().div_ceil(EDGES_PER_BLOCK);
        progress.set_length(3 * edges.len() as u64);

        // Pass 1: degrees (both directions, self loops skipped).
        let degree: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
        par::for_each_index(blocks, |block| {
            let part =
                &edges[block * EDGES_PER_BLOCK..edges.len().min((block + 1) * EDGES_PER_BLOCK)];
            for &(u, v) in part {
                if u != v {
                    degree[u as usize].fetch_add(1, Ordering::Relaxed);
                    degree[v as usize].fetch_add(1, Ordering::Relaxed);
                }
            }
            progress.inc(part.len() as u64);
        });
        let mut offsets = Vec::with_capacity(n + 1);
        let mut total = 0u64;
        offsets.push(0);
        for d in &degree {
            total += u64::from(d.load(Ordering::Relaxed));
            offsets.push(total);
        }
        drop(degree);

        // Pass 2: scatter arcs into their rows (order within a row is fixed by the sort below).
        let arcs = usize::try_from(total)
            .map_err(|_| CsrError::Malformed(format!("{total} arcs do not fit memory")))?;
        let cursor: Vec<AtomicU64> = offsets[..n].iter().map(|o| AtomicU64::new(*o)).collect();
        let slots: Vec<AtomicU32> = (0..arcs).map(|_| AtomicU32::new(0)).collect();
        par::for_each_index(blocks, |block| {
            let part =
                &edges[block * EDGES_PER_BLOCK..edges.len().min((block + 1) * EDGES_PER_BLOCK)];
            for &(u, v) in part {
                if u != v {
                    let at = cursor[u as usize].fetch_add(1, Ordering::Relaxed);
                    slots[usize::try_from(at).expect("< arcs")].store(v, Ordering::Relaxed);
                    let at = cursor[v as usize].fetch_add(1, Ordering::Relaxed);
                    slots[usize::try_from(at).expect("< arcs")].store(u, Ordering::Relaxed);
                }
            }
            progress.inc(part.len() as u64);
        });
        drop(cursor);
        // Same size and alignment: the standard library reuses the allocation in place.
        let mut neighbours: Vec<u32> = slots.into_iter().map(AtomicU32::into_inner).collect();

        // Pass 3: sort and deduplicate each row, then compact.
        let kept = sort_rows(&offsets, &mut neighbours);
        let mut write = 0usize;
        let mut new_offsets = Vec::with_capacity(n + 1);
        new_offsets.push(0u64);
        for v in 0..n {
            let start = usize::try_from(offsets[v]).expect("fits");
            let len = kept[v] as usize;
            neighbours.copy_within(start..start + len, write);
            write += len;
            new_offsets.push(write as u64);
        }
        neighbours.truncate(write);
        neighbours.shrink_to_fit();
        progress.inc(edges.len() as u64);
        Ok(Self {
            offsets: new_offsets,
            neighbours,
        })
    }
}

/// Sorts and deduplicates every row in place; returns each row's kept length.
fn sort_rows(offsets: &[u64], neighbours: &mut [u32]) -> Vec<u32> {
    let n = offsets.len() - 1;
    let blocks = n.div_ceil(VERTICES_PER_BLOCK);
    // Cut `neighbours` into the disjoint slices of each block of rows.
    let mut pieces = Vec::with_capacity(blocks);
    let mut rest = neighbours;
    for block in 0..blocks {
        let lo = block * VERTICES_PER_BLOCK;
        let hi = n.min(lo + VERTICES_PER_BLOCK);
        let len = usize::try_from(offsets[hi] - offsets[lo]).expect("fits");
        let (piece, tail) = rest.split_at_mut(len);
        pieces.push((lo, hi, piece));
        rest = tail;
    }
    let mut kept = vec![0u32; n];
    let mut kept_pieces: Vec<(usize, &mut [u32])> = Vec::with_capacity(blocks);
    let mut kept_rest = kept.as_mut_slice();
    for (lo, hi, _) in &pieces {
        let (piece, tail) = kept_rest.split_at_mut(hi - lo);
        kept_pieces.push((*lo, piece));
        kept_rest = tail;
    }
    let mut work: Vec<_> = pieces.into_iter().zip(kept_pieces).collect();
    par::for_each_chunk_mut(&mut work, 1, |_, item| {
        let ((lo, hi, piece), (_, kept)) = &mut item[0];
        let base = offsets[*lo];
        for v in *lo..*hi {
            let start = usize::try_from(offsets[v] - base).expect("fits");
            let end = usize::try_from(offsets[v + 1] - base).expect("fits");
            let row = &mut piece[start..end];
            row.sort_unstable();
            let mut len = 0usize;
            for i in 0..row.len() {
                if i == 0 || row[i] != row[len - 1] {
                    row[len] = row[i];
                    len += 1;
                }
            }
            kept[v - *lo] = u32::try_from(len).expect("a row never exceeds 2^32 arcs");
        }
    });
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{KroneckerParams, kronecker, uniform};

    fn graph(vertices: u64, edges: &[(u32, u32)]) -> Csr {
        Csr::from_pairs(vertices, edges).unwrap()
    }

    #[test]
    fn hand_checked_small_graph() {
        // Triangle 0-1-2, a duplicate 1-0, a self loop on 3, an edge 3-4, vertex 5 isolated.
        let csr = graph(6, &[(0, 1), (1, 2), (2, 0), (1, 0), (3, 3), (3, 4)]);
        assert_eq!(csr.offsets, vec![0, 2, 4, 6, 7, 8, 8]);
        assert_eq!(csr.neighbours, vec![1, 2, 0, 2, 0, 1, 4, 3]);
        assert_eq!(csr.degree(5), 0);
        assert!(csr.has_arc(4, 3) && !csr.has_arc(4, 5));
        csr.check().unwrap();
    }

    #[test]
    fn degree_sums_and_invariants_on_generated_graphs() {
        let seed = crate::test_seed();
        for list in [
            kronecker(
                &KroneckerParams::graph500(13, 16, seed),
                &ProgressBar::hidden(),
            )
            .unwrap(),
            uniform(5000, 40_000, seed, &ProgressBar::hidden()).unwrap(),
        ] {
            let csr = Csr::from_edges(&list, &ProgressBar::hidden()).unwrap();
            csr.check().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            // Degree sum = arcs = 2 * distinct non-loop undirected edges.
            let mut distinct: Vec<(u32, u32)> = list
                .edges
                .iter()
                .filter(|(u, v)| u != v)
                .map(|&(u, v)| (u.min(v), u.max(v)))
                .collect();
            distinct.sort_unstable();
            distinct.dedup();
            let degree_sum: u64 = (0..csr.vertices()).map(|v| csr.degree(v)).sum();
            assert_eq!(degree_sum, csr.arcs());
            assert_eq!(csr.arcs(), 2 * distinct.len() as u64, "seed {seed}");
            for &(u, v) in distinct.iter().step_by(97) {
                assert!(csr.has_arc(u as usize, v) && csr.has_arc(v as usize, u));
            }
            assert_eq!(csr, Csr::from_edges(&list, &ProgressBar::hidden()).unwrap());
        }
    }

    #[test]
    fn chunk_bounds_cover_every_vertex_once_by_row_start() {
        let seed = crate::test_seed();
        let list = kronecker(
            &KroneckerParams::graph500(12, 8, seed),
            &ProgressBar::hidden(),
        )
        .unwrap();
        let csr = Csr::from_edges(&list, &ProgressBar::hidden()).unwrap();
        for per in [1u64, 7, 1024, 16_384, 1 << 30] {
            let bounds = csr.chunk_bounds(per);
            assert_eq!(bounds.len() as u64, csr.arcs().div_ceil(per).max(1) + 1);
            assert_eq!(bounds[0], 0);
            assert_eq!(*bounds.last().unwrap() as usize, csr.vertices());
            assert!(
                bounds.windows(2).all(|w| w[0] <= w[1]),
                "seed {seed}, per {per}"
            );
            let chunks = bounds.len() - 1;
            for c in 0..chunks {
                for v in bounds[c] as usize..bounds[c + 1] as usize {
                    let start = csr.offsets[v];
                    assert!(
                        start >= c as u64 * per,
                        "seed {seed}: vertex {v} before chunk {c}"
                    );
                    if c + 1 < chunks {
                        assert!(
                            start < (c as u64 + 1) * per,
                            "seed {seed}: vertex {v} after chunk {c}"
                        );
                    }
                }
            }
        }
        // A graph without arcs is one chunk holding every vertex.
        let empty = Csr::from_pairs(5, &[(1, 1)]).unwrap();
        assert_eq!(empty.chunk_bounds(64), vec![0, 5]);
    }

    #[test]
    fn out_of_range_edges_and_corrupt_arrays_are_rejected() {
        let err = Csr::from_pairs(3, &[(0, 1), (1, 3)]).unwrap_err();
        assert_eq!(
            err,
            CsrError::VertexOutOfRange {
                index: 1,
                u: 1,
                v: 3,
                vertices: 3
            }
        );
        let good = graph(4, &[(0, 1), (1, 2), (2, 3)]);
        let mut bad = good.clone();
        bad.neighbours[0] = 9;
        assert!(bad.check().is_err());
        let mut bad = good.clone();
        bad.offsets[2] = 1;
        assert!(bad.check().is_err());
        let mut bad = good.clone();
        bad.neighbours[1] = 3; // row of vertex 1 becomes [3, 2]: unsorted, and 1->3 lacks a reverse
        assert!(bad.check().is_err());
        let mut bad = good;
        bad.offsets[0] = 1;
        assert!(bad.check().is_err());
    }
}
