//! Graph500 BFS validation, plus result comparisons for connected components and PageRank.
//!
//! A BFS result (parents, and levels if the kernel produced them) is accepted when:
//! 1. the source is its own parent and has level 0; no other vertex has level 0;
//! 2. the parent array forms a tree rooted at the source: following parents from any reached
//!    vertex ends at the source without a cycle (levels are derived this way, so a cycle or a
//!    parent chain that leaves the tree is caught);
//! 3. every tree edge `(parent[v], v)` is an edge of the graph, and `level[v] = level[parent] + 1`;
//! 4. for every graph edge (u, v), u and v are both reached or both unreached, and their
//!    levels differ by at most one;
//! 5. a vertex is reached (has a parent) exactly when it is in the source's component, which
//!    follows from 4 (the component is connected) and is checked against the given levels.
//!
//! If the kernel also returned levels, they must equal the levels derived from the parents.

use crate::csr::Csr;
use crate::par;
use crate::reference::UNREACHED;

/// Vertices per parallel work item.
const BLOCK: usize = 1 << 14;

/// Why a result was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValidationError {
    /// Array lengths disagree with the graph.
    #[error("result has {got} entries but the graph has {want} vertices")]
    Length {
        /// Entries given.
        got: usize,
        /// Vertices in the graph.
        want: usize,
    },
    /// Root rule broken.
    #[error("the source {root} is not the root: parent {parent}, level {level}")]
    Root {
        /// BFS source.
        root: u32,
        /// Its parent entry.
        parent: u32,
        /// Its level entry.
        level: u32,
    },
    /// Parent chain has a cycle or leaves the graph.
    #[error("vertex {vertex}: following parents does not reach the source ({why})")]
    NotATree {
        /// Vertex whose chain failed.
        vertex: u32,
        /// What went wrong.
        why: String,
    },
    /// Tree edge missing from the graph.
    #[error("tree edge {parent}->{vertex} is not an edge of the graph")]
    TreeEdgeMissing {
        /// Parent.
        parent: u32,
        /// Child.
        vertex: u32,
    },
    /// Graph edge spans more than one level, or joins reached and unreached vertices.
    #[error("graph edge {u}-{v} joins levels {level_u} and {level_v} (must differ by at most one; {unreached} means unreached)", unreached = UNREACHED)]
    EdgeLevels {
        /// One end.
        u: u32,
        /// Other end.
        v: u32,
        /// Level of u.
        level_u: u32,
        /// Level of v.
        level_v: u32,
    },
    /// Given levels disagree with the parent tree.
    #[error("vertex {vertex}: kernel level {given} differs from its tree depth {derived}")]
    LevelMismatch {
        /// Vertex.
        vertex: u32,
        /// Level the kernel wrote.
        given: u32,
        /// Depth in the parent tree.
        derived: u32,
    },
    /// Component labels wrong.
    #[error(
        "vertex {vertex}: component label {got}, expected {want} (smallest id in its component)"
    )]
    Component {
        /// Vertex.
        vertex: u32,
        /// Label given.
        got: u32,
        /// Label expected.
        want: u32,
    },
    /// PageRank too far from the reference.
    #[error("PageRank differs from the CPU reference: {detail}")]
    PageRank {
        /// Which bound failed, with numbers.
        detail: String,
    },
}

/// Depth of every vertex in the parent tree rooted at `source`, or why it is not a tree.
fn depths_from_parents(parents: &[u32], source: u32) -> Result<Vec<u32>, ValidationError> {
    let n = parents.len();
    let mut depth = vec![UNREACHED; n];
    depth[source as usize] = 0;
    // States: UNREACHED = not yet known; VISITING = on the current walk (cycle detection).
    const VISITING: u32 = UNREACHED - 1;
    let mut path = Vec::new();
    for start in 0..n {
        if parents[start] == UNREACHED || depth[start] != UNREACHED {
            continue;
        }
        let mut v = u32::try_from(start).expect("n <= 2^31");
        path.clear();
        let base = loop {
            match depth[v as usize] {
                VISITING => {
                    return Err(ValidationError::NotATree {
                        vertex: v,
                        why: "parent chain has a cycle".into(),
                    });
                }
                UNREACHED => {}
                d => break d,
            }
            let p = parents[v as usize];
            if p == UNREACHED {
                return Err(ValidationError::NotATree {
                    vertex: v,
                    why: "an ancestor has no parent".into(),
                });
            }
            if p as usize >= n {
                return Err(ValidationError::NotATree {
                    vertex: v,
                    why: format!("parent {p} is not a vertex"),
                });
            }
            depth[v as usize] = VISITING;
            path.push(v);
            v = p;
        };
        for (i, w) in path.iter().rev().enumerate() {
            let d = base + u32::try_from(i).expect("path < 2^31") + 1;
            depth[*w as usize] = d;
        }
    }
    Ok(depth)
}

/// Checks a BFS result by the Graph500 rules (module docs). `levels` is optional.
///
/// # Errors
/// The first rule found broken.
pub fn bfs(
    graph: &Csr,
    source: u32,
    parents: &[u32],
    levels: Option<&[u32]>,
) -> Result<(), ValidationError> {
    let n = graph.vertices();
    for len in std::iter::once(parents.len()).chain(levels.map(<[u32]>::len)) {
        if len != n {
            return Err(ValidationError::Length { got: len, want: n });
        }
    }
    let s = source as usize;
    if s >= n || parents[s] != source || levels.is_some_and(|l| l[s] != 0) {
        return Err(ValidationError::Root {
            root: source,
            parent: parents.get(s).copied().unwrap_or(UNREACHED),
            level: levels.and_then(|l| l.get(s).copied()).unwrap_or(UNREACHED),
        });
    }
    let depth = depths_from_parents(parents, source)?;
    if let Some(given) = levels
        && let Some(v) = (0..n).find(|v| given[*v] != depth[*v])
    {
        return Err(ValidationError::LevelMismatch {
            vertex: u32::try_from(v).expect("n <= 2^31"),
            given: given[v],
            derived: depth[v],
        });
    }
    let failures: Vec<Option<ValidationError>> = par::map_indices(n.div_ceil(BLOCK), |block| {
        for v in block * BLOCK..n.min((block + 1) * BLOCK) {
            let v_id = u32::try_from(v).expect("n <= 2^31");
            let p = parents[v];
            if v != s && p != UNREACHED && !graph.has_arc(p as usize, v_id) {
                return Some(ValidationError::TreeEdgeMissing {
                    parent: p,
                    vertex: v_id,
                });
            }
            for &u in graph.row(v) {
                let (dv, du) = (depth[v], depth[u as usize]);
                let both_unreached = dv == UNREACHED && du == UNREACHED;
                let close = dv != UNREACHED && du != UNREACHED && dv.abs_diff(du) <= 1;
                if !(both_unreached || close) {
                    return Some(ValidationError::EdgeLevels {
                        u: v_id,
                        v: u,
                        level_u: dv,
                        level_v: du,
                    });
                }
            }
        }
        None
    });
    failures.into_iter().flatten().next().map_or(Ok(()), Err)
}

/// Checks component labels against the reference labelling (smallest id per component).
///
/// # Errors
/// The first vertex whose label differs.
pub fn components(got: &[u32], want: &[u32]) -> Result<(), ValidationError> {
    if got.len() != want.len() {
        return Err(ValidationError::Length {
            got: got.len(),
            want: want.len(),
        });
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(v) => Err(ValidationError::Component {
            vertex: u32::try_from(v).expect("n <= 2^31"),
            got: got[v],
            want: want[v],
        }),
    }
}

/// Checks single-precision GPU ranks against the double-precision reference: the L1 distance
/// must stay below `l1_bound` (ranks sum to one) and each rank within `relative` of the
/// reference (plus an absolute slack of 1e-3 / n for tiny ranks).
///
/// # Errors
/// Which bound failed, with the worst vertex.
pub fn pagerank(
    got: &[f32],
    want: &[f64],
    l1_bound: f64,
    relative: f64,
) -> Result<(), ValidationError> {
    if got.len() != want.len() {
        return Err(ValidationError::Length {
            got: got.len(),
            want: want.len(),
        });
    }
    #[allow(clippy::cast_precision_loss)]
    let slack = 1e-3 / want.len().max(1) as f64;
    let mut l1 = 0.0;
    let mut worst: Option<(usize, f64)> = None;
    for (v, (g, w)) in got.iter().zip(want).enumerate() {
        let diff = (f64::from(*g) - w).abs();
        l1 += diff;
        let excess = diff - (relative * w.abs() + slack);
        if excess > 0.0 && worst.is_none_or(|(_, e)| excess > e) {
            worst = Some((v, excess));
        }
    }
    if l1.is_nan() || l1 > l1_bound {
        return Err(ValidationError::PageRank {
            detail: format!("L1 distance {l1:.3e} exceeds {l1_bound:.1e}"),
        });
    }
    if let Some((v, _)) = worst {
        return Err(ValidationError::PageRank {
            detail: format!(
                "vertex {v}: {} vs reference {:.6e} (relative bound {relative})",
                got[v], want[v]
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{KroneckerParams, kronecker};
    use crate::reference;
    use crate::rng::Rng;
    use indicatif::ProgressBar;

    fn kron(seed: u64) -> Csr {
        let list = kronecker(
            &KroneckerParams::graph500(12, 8, seed),
            &ProgressBar::hidden(),
        )
        .unwrap();
        Csr::from_edges(&list, &ProgressBar::hidden()).unwrap()
    }

    fn source_of(g: &Csr) -> u32 {
        u32::try_from((0..g.vertices()).max_by_key(|v| g.degree(*v)).unwrap()).unwrap()
    }

    #[test]
    fn reference_bfs_passes() {
        let seed = crate::test_seed();
        let g = kron(seed);
        let s = source_of(&g);
        let r = reference::bfs(&g, s);
        bfs(&g, s, &r.parents, Some(&r.levels)).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        bfs(&g, s, &r.parents, None).unwrap();
    }

    #[test]
    fn corrupted_parent_arrays_are_rejected() {
        let seed = crate::test_seed();
        let g = kron(seed);
        let s = source_of(&g);
        let r = reference::bfs(&g, s);
        let mut rng = Rng::new(seed);
        let reached: Vec<usize> = (0..g.vertices())
            .filter(|v| r.levels[*v] != UNREACHED && *v != s as usize)
            .collect();
        let unreached: Vec<usize> = (0..g.vertices())
            .filter(|v| r.levels[*v] == UNREACHED)
            .collect();
        let pick = |rng: &mut Rng, from: &[usize]| {
            from[usize::try_from(rng.below(from.len() as u64)).unwrap()]
        };
        for trial in 0..20 {
            let mut parents = r.parents.clone();
            let v = pick(&mut rng, &reached);
            match trial % 5 {
                0 => parents[v] = UNREACHED, // a reachable vertex without a parent
                1 => parents[v] = u32::try_from(v).unwrap(), // self parent: a cycle
                2 => {
                    // a parent that is not a neighbour
                    let w = u32::try_from(pick(&mut rng, &reached)).unwrap();
                    if g.has_arc(v, w) {
                        continue;
                    }
                    parents[v] = w;
                }
                3 => parents[s as usize] = u32::try_from(v).unwrap(), // root not its own parent
                _ => parents[pick(&mut rng, &unreached)] = s, // unreached vertex given a parent
            }
            assert!(
                bfs(&g, s, &parents, None).is_err(),
                "seed {seed}, trial {trial}: corruption accepted"
            );
        }
        let mut levels = r.levels.clone();
        levels[pick(&mut rng, &reached)] += 1;
        assert!(matches!(
            bfs(&g, s, &r.parents, Some(&levels)),
            Err(ValidationError::LevelMismatch { .. })
        ));
        assert!(matches!(
            bfs(&g, s, &r.parents[1..], None),
            Err(ValidationError::Length { .. })
        ));
    }

    #[test]
    fn a_tree_that_skips_levels_is_rejected() {
        // Path 0-1-2 with chord 0-2: a parent tree 0->1->2 puts 2 at depth 2 while the edge
        // 0-2 spans two levels; it is a tree, but not a BFS tree.
        let g = Csr::from_pairs(3, &[(0, 1), (1, 2), (0, 2)]).unwrap();
        let err = bfs(&g, 0, &[0, 0, 1], None).unwrap_err();
        assert!(matches!(err, ValidationError::EdgeLevels { .. }), "{err}");
        bfs(&g, 0, &[0, 0, 0], Some(&[0, 1, 1])).unwrap();
        // A two-vertex cycle away from the root.
        let err = bfs(&g, 0, &[0, 2, 1], None).unwrap_err();
        assert!(matches!(err, ValidationError::NotATree { .. }), "{err}");
    }

    #[test]
    fn component_and_pagerank_checks() {
        components(&[0, 0, 2], &[0, 0, 2]).unwrap();
        assert!(components(&[0, 1, 2], &[0, 0, 2]).is_err());
        pagerank(&[0.25, 0.75], &[0.25, 0.75], 1e-4, 1e-3).unwrap();
        assert!(pagerank(&[0.3, 0.7], &[0.25, 0.75], 1e-4, 1e-3).is_err());
        assert!(pagerank(&[f32::NAN, 0.75], &[0.25, 0.75], 1e-4, 1e-3).is_err());
    }
}
