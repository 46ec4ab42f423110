//! Embedding-table lookups: a table generator, Zipf-distributed lookup batches and the CPU
//! sum-pooling reference.
//!
//! Table values are multiples of 1/1024 in [-1, 1): every partial sum of up to 2^13 of them is
//! exactly representable in `f32`, so a GPU's sum-pooling output must match the CPU reference
//! **bit for bit** whatever order its threads add in. A mismatch is a real error, never noise.

use crate::par;
use crate::rng::{Rng, mix64};
use crate::zipf::{Scatter, Zipf, ZipfError};
use indicatif::ProgressBar;

/// Rows per parallel work item when filling a table.
const ROWS_PER_BLOCK: usize = 1 << 12;
/// Lookups per random stream when drawing batches.
const LOOKUPS_PER_CHUNK: usize = 1 << 16;
/// Largest bag whose sums stay exact in `f32` (see the module docs).
pub const MAX_EXACT_BAG: u32 = 1 << 13;

/// Errors from the embedding workload.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EmbedError {
    /// Bad Zipf parameters.
    #[error(transparent)]
    Zipf(#[from] ZipfError),
    /// Bad shape.
    #[error("{0}")]
    Shape(String),
    /// GPU output differs from the reference.
    #[error(
        "bag {bag}, column {column}: got {got}, reference {want} (sums are exact, so any difference is an error)"
    )]
    Mismatch {
        /// Bag.
        bag: usize,
        /// Column.
        column: usize,
        /// GPU value.
        got: f32,
        /// CPU value.
        want: f32,
    },
}

/// The shape and seed of an embedding table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSpec {
    /// Number of rows.
    pub rows: u64,
    /// Floats per row.
    pub dim: u32,
    /// Seed of the values.
    pub seed: u64,
}

impl TableSpec {
    /// Table size in bytes.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.rows * u64::from(self.dim) * 4
    }

    /// Checks the shape: at least one row, rows addressable by 32-bit ids, dim in 1..=65536.
    ///
    /// # Errors
    /// [`EmbedError::Shape`] with what to change.
    pub fn validate(&self) -> Result<(), EmbedError> {
        if self.rows == 0 || self.rows > u64::from(u32::MAX) {
            return Err(EmbedError::Shape(format!(
                "{} rows: use 1 to 2^32 - 1 rows",
                self.rows
            )));
        }
        if self.dim == 0 || self.dim > 65_536 {
            return Err(EmbedError::Shape(format!(
                "dimension {}: use 1 to 65536 floats per row",
                self.dim
            )));
        }
        usize::try_from(self.bytes()).map_err(|_| {
            EmbedError::Shape("the table does not fit this machine's address space".into())
        })?;
        Ok(())
    }

    /// The value at (`row`, `column`): a multiple of 1/1024 in [-1, 1).
    #[must_use]
    pub fn value(&self, row: u64, column: u32) -> f32 {
        let h = mix64(self.seed ^ mix64((row << 16) | u64::from(column)));
        // 11 bits -> -1024..1023; exact in f32.
        let bits = u16::try_from(h >> 53).expect("11 bits");
        (f32::from(bits) - 1024.0) / 1024.0
    }

    /// Fills `table` (rows x dim, row-major) in parallel.
    ///
    /// # Errors
    /// Wrong slice length or an invalid shape.
    pub fn fill(&self, table: &mut [f32], progress: &ProgressBar) -> Result<(), EmbedError> {
        self.validate()?;
        let dim = self.dim as usize;
        if table.len() as u64 != self.rows * u64::from(self.dim) {
            return Err(EmbedError::Shape(format!(
                "table slice holds {} floats, the spec needs {}",
                table.len(),
                self.rows * u64::from(self.dim)
            )));
        }
        progress.set_length(self.rows);
        par::for_each_chunk_mut(table, ROWS_PER_BLOCK * dim, |block, out| {
            let first = (block * ROWS_PER_BLOCK) as u64;
            for (i, row) in out.chunks_exact_mut(dim).enumerate() {
                for (c, v) in row.iter_mut().enumerate() {
                    *v = self.value(first + i as u64, u32::try_from(c).expect("dim <= 65536"));
                }
            }
            progress.inc((out.len() / dim) as u64);
        });
        Ok(())
    }
}

/// How lookup row ids are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LookupSpec {
    /// Rows in the table.
    pub rows: u64,
    /// Zipf skew (0.8-1.2 typical; 0.99 is the target workload).
    pub skew: f64,
    /// Scatter ranks over the table (true: hot rows are spread, as in real tables).
    pub scatter: bool,
    /// Seed.
    pub seed: u64,
}

/// Draws `count` row ids (u32) by Zipf rank, scattered if asked, in parallel.
///
/// # Errors
/// Bad skew or row count.
pub fn lookups(spec: &LookupSpec, count: usize) -> Result<Vec<u32>, EmbedError> {
    if spec.rows == 0 || spec.rows > u64::from(u32::MAX) {
        return Err(EmbedError::Shape(format!(
            "{} rows: use 1 to 2^32 - 1 rows",
            spec.rows
        )));
    }
    let zipf = Zipf::new(spec.rows, spec.skew)?;
    let scatter = Scatter::new(spec.rows, spec.seed ^ 0x5ca7_7e55);
    let mut ids = vec![0u32; count];
    par::for_each_chunk_mut(&mut ids, LOOKUPS_PER_CHUNK, |chunk, out| {
        let mut rng = Rng::for_chunk(spec.seed, chunk as u64);
        for id in out {
            let rank = zipf.sample(&mut rng);
            let row = if spec.scatter {
                scatter.apply(rank)
            } else {
                rank
            };
            *id = u32::try_from(row).expect("rows < 2^32");
        }
    });
    Ok(ids)
}

/// CPU sum pooling: bag `b` sums the rows `ids[b * bag .. (b + 1) * bag]` of `table`.
///
/// # Errors
/// A bag size that does not divide the ids, exceeds [`MAX_EXACT_BAG`], or an id out of range.
pub fn sum_pool(table: &[f32], dim: u32, ids: &[u32], bag: u32) -> Result<Vec<f32>, EmbedError> {
    let dim = dim as usize;
    let bag = bag as usize;
    if bag == 0 || bag > MAX_EXACT_BAG as usize || !ids.len().is_multiple_of(bag) {
        return Err(EmbedError::Shape(format!(
            "bag size {bag} must be in 1..={MAX_EXACT_BAG} and divide the {} lookups",
            ids.len()
        )));
    }
    let rows = table.len() / dim.max(1);
    if let Some(bad) = ids.iter().find(|id| **id as usize >= rows) {
        return Err(EmbedError::Shape(format!(
            "lookup of row {bad}, but the table has {rows} rows"
        )));
    }
    let bags = ids.len() / bag;
    let mut out = vec![0f32; bags * dim];
    par::for_each_chunk_mut(&mut out, 256 * dim, |chunk, block| {
        for (i, pooled) in block.chunks_exact_mut(dim).enumerate() {
            let b = chunk * 256 + i;
            for id in &ids[b * bag..(b + 1) * bag] {
                let row = &table[*id as usize * dim..(*id as usize + 1) * dim];
                for (acc, v) in pooled.iter_mut().zip(row) {
                    *acc += v;
                }
            }
        }
    });
    Ok(out)
}

/// Checks GPU pooled output against the reference exactly.
///
/// # Errors
/// The first differing element, or a length mismatch.
pub fn check_pooled(got: &[f32], want: &[f32], dim: u32) -> Result<(), EmbedError> {
    if got.len() != want.len() {
        return Err(EmbedError::Shape(format!(
            "pooled output has {} floats, expected {}",
            got.len(),
            want.len()
        )));
    }
    let dim = dim as usize;
    match got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits())
    {
        None => Ok(()),
        Some(i) => Err(EmbedError::Mismatch {
            bag: i / dim,
            column: i % dim,
            got: got[i],
            want: want[i],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_values_are_deterministic_exact_and_spread() {
        let seed = crate::test_seed();
        let spec = TableSpec {
            rows: 1000,
            dim: 16,
            seed,
        };
        let mut a = vec![0f32; 16_000];
        spec.fill(&mut a, &ProgressBar::hidden()).unwrap();
        let mut b = vec![1f32; 16_000];
        spec.fill(&mut b, &ProgressBar::hidden()).unwrap();
        assert_eq!(a, b);
        assert!(
            a.iter()
                .all(|v| (-1.0..1.0).contains(v) && (v * 1024.0).fract() == 0.0)
        );
        let mean: f32 = a.iter().sum::<f32>() / 16_000.0;
        assert!(mean.abs() < 0.05, "seed {seed}: mean {mean}");
        assert_eq!(a[17], spec.value(1, 1));
        assert!(spec.fill(&mut a[1..], &ProgressBar::hidden()).is_err());
        assert!(
            TableSpec {
                rows: 0,
                dim: 4,
                seed
            }
            .validate()
            .is_err()
        );
        assert!(
            TableSpec {
                rows: 4,
                dim: 0,
                seed
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn lookups_are_zipf_and_scattered() {
        let seed = crate::test_seed();
        let plain = LookupSpec {
            rows: 10_000,
            skew: 0.99,
            scatter: false,
            seed,
        };
        let ids = lookups(&plain, 200_000).unwrap();
        assert_eq!(ids, lookups(&plain, 200_000).unwrap());
        assert!(ids.iter().all(|id| *id < 10_000));
        let zipf = Zipf::new(10_000, 0.99).unwrap();
        let top10: f64 = (0..10).map(|k| zipf.probability(k)).sum();
        let got = ids.iter().filter(|id| **id < 10).count() as f64 / 200_000.0;
        assert!((got - top10).abs() < 0.01, "seed {seed}: {got} vs {top10}");
        let scattered = lookups(
            &LookupSpec {
                scatter: true,
                ..plain
            },
            200_000,
        )
        .unwrap();
        let hot = scattered.iter().filter(|id| **id < 10).count() as f64 / 200_000.0;
        assert!(
            hot < top10 / 3.0,
            "scattered hot rows should leave 0..10: {hot}"
        );
        // The same multiset of frequencies: the most frequent id carries rank 0's mass.
        let mut counts = std::collections::HashMap::new();
        for id in &scattered {
            *counts.entry(*id).or_insert(0u32) += 1;
        }
        let max = f64::from(*counts.values().max().unwrap()) / 200_000.0;
        assert!((max - zipf.probability(0)).abs() < 0.01);
        assert!(
            lookups(
                &LookupSpec {
                    skew: -1.0,
                    ..plain
                },
                10
            )
            .is_err()
        );
    }

    #[test]
    fn sum_pooling_by_hand_and_exactness() {
        let table = [1.0, 2.0, 10.0, 20.0, 100.0, 200.0]; // 3 rows, dim 2
        let out = sum_pool(&table, 2, &[0, 2, 1, 1], 2).unwrap();
        assert_eq!(out, vec![101.0, 202.0, 20.0, 40.0]);
        assert!(sum_pool(&table, 2, &[0, 3], 2).is_err());
        assert!(sum_pool(&table, 2, &[0, 1, 2], 2).is_err());
        check_pooled(&out, &out, 2).unwrap();
        let mut bad = out.clone();
        bad[3] = 40.5;
        assert_eq!(
            check_pooled(&bad, &out, 2).unwrap_err(),
            EmbedError::Mismatch {
                bag: 1,
                column: 1,
                got: 40.5,
                want: 40.0
            }
        );
        // Any summation order gives the same bits for table values.
        let seed = crate::test_seed();
        let spec = TableSpec {
            rows: 64,
            dim: 4,
            seed,
        };
        let mut t = vec![0f32; 256];
        spec.fill(&mut t, &ProgressBar::hidden()).unwrap();
        let ids: Vec<u32> = (0..64).collect();
        let forward = sum_pool(&t, 4, &ids, 64).unwrap();
        let reversed: Vec<u32> = ids.iter().rev().copied().collect();
        assert_eq!(forward, sum_pool(&t, 4, &reversed, 64).unwrap());
    }
}
