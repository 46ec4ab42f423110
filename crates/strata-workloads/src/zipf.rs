//! Zipf-distributed sampling by rejection-inversion (W. Hörmann and G. Derflinger, "Rejection-
//! inversion to generate variates from monotone discrete distributions", 1996).
//!
//! Draws ranks `k` in `0..n` with probability proportional to `(k + 1)^-s`, in O(1) memory and
//! expected O(1) time for any `n` (embedding tables of billions of rows need no CDF table).
//! The idea: invert the integral `H` of the continuous density `x^-s` to sample a real `x`,
//! round it to the nearest integer `k`, and accept when the sample fell inside the part of
//! the area under `H` that belongs to `k`'s probability mass; a cheap squeeze test accepts
//! most samples without evaluating `H` again.

use crate::rng::Rng;

/// Errors constructing a sampler.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ZipfError {
    /// Empty domain.
    #[error("a Zipf distribution needs at least one item")]
    Empty,
    /// Skew out of the supported range.
    #[error("Zipf skew {0} is out of range: use 0 < s <= 5 (embedding workloads use 0.8 to 1.2)")]
    Skew(f64),
}

/// A Zipf(s) sampler over ranks `0..n` (rank 0 is the most frequent).
#[derive(Debug, Clone, Copy)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    squeeze: f64,
}

/// `ln(1 + x) / x`, accurate near 0.
fn log1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, accurate near 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

impl Zipf {
    /// A sampler over `n` items with skew `s`.
    ///
    /// # Errors
    /// `n == 0` or `s` outside (0, 5].
    pub fn new(n: u64, s: f64) -> Result<Self, ZipfError> {
        if n == 0 {
            return Err(ZipfError::Empty);
        }
        if !(s > 0.0 && s <= 5.0) {
            return Err(ZipfError::Skew(s));
        }
        #[allow(clippy::cast_precision_loss)] // n up to 2^53 is exact; beyond, rounding is harmless
        let n = n as f64;
        let mut z = Self {
            n,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            squeeze: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n + 0.5);
        z.squeeze = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    /// The unnormalised mass at rank-plus-one `x`: `x^-s`.
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// `H(x) = (x^(1-s) - 1) / (1 - s)`, or `ln x` at s = 1: an antiderivative of `x^-s`.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        expm1_over_x((1.0 - self.s) * log_x) * log_x
    }

    /// The inverse of [`Self::h_integral`].
    fn h_integral_inverse(&self, y: f64) -> f64 {
        let t = (y * (1.0 - self.s)).max(-1.0); // rounding can push t just below -1
        (log1p_over_x(t) * y).exp()
    }

    /// Draws one rank in `0..n`.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.squeeze || u >= self.h_integral(k + 0.5) - self.h(k) {
                // k is an integer in [1, n] held exactly in f64.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                return k as u64 - 1;
            }
        }
    }

    /// Exact probability of rank `k` (for tests and hit-rate estimates; O(n)).
    #[must_use]
    pub fn probability(&self, k: u64) -> f64 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = self.n as u64;
        #[allow(clippy::cast_precision_loss)]
        let norm: f64 = (1..=n).map(|i| (i as f64).powf(-self.s)).sum();
        #[allow(clippy::cast_precision_loss)]
        let mass = ((k + 1) as f64).powf(-self.s);
        mass / norm
    }
}

/// A keyed bijection of `0..n`, so Zipf ranks land on scattered rows (frequent items of a real
/// embedding table are not stored next to each other). Round functions on the enclosing
/// power of two are each invertible (odd multiply, xor-shift, add), and values at or beyond
/// `n` are walked through the permutation again until they fall inside ("cycle walking").
#[derive(Debug, Clone, Copy)]
pub struct Scatter {
    n: u64,
    bits: u32,
    keys: [u64; 3],
}

impl Scatter {
    /// A scatter over `0..n` keyed by `seed`.
    ///
    /// # Panics
    /// If `n == 0`.
    #[must_use]
    pub fn new(n: u64, seed: u64) -> Self {
        assert!(n > 0, "Scatter needs a non-empty domain");
        let bits = (64 - (n - 1).leading_zeros()).max(2);
        let mut sm = seed;
        let keys = std::array::from_fn(|_| crate::rng::splitmix64(&mut sm));
        Self { n, bits, keys }
    }

    fn round(&self, mut x: u64) -> u64 {
        let mask = if self.bits == 64 {
            u64::MAX
        } else {
            (1u64 << self.bits) - 1
        };
        let half = self.bits / 2;
        for key in self.keys {
            x = x.wrapping_mul(key | 1) & mask;
            x ^= x >> half;
            x = x.wrapping_add(key >> 7) & mask;
        }
        x
    }

    /// The image of `x` (which must be below `n`).
    #[must_use]
    pub fn apply(&self, x: u64) -> u64 {
        let mut y = self.round(x);
        while y >= self.n {
            y = self.round(y);
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequencies_match_theory() {
        let seed = crate::test_seed();
        for s in [0.8, 0.99, 1.0, 1.2] {
            let n = 200u64;
            let zipf = Zipf::new(n, s).unwrap();
            let mut rng = Rng::new(seed);
            let draws = 400_000u32;
            let mut counts = vec![0u32; 200];
            for _ in 0..draws {
                counts[usize::try_from(zipf.sample(&mut rng)).unwrap()] += 1;
            }
            // Chi-square with 199 degrees of freedom: mean 199, sd ~20; 330 is ~6.5 sd.
            let mut chi2 = 0.0;
            for (k, c) in counts.iter().enumerate() {
                let expected = f64::from(draws) * zipf.probability(k as u64);
                chi2 += (f64::from(*c) - expected).powi(2) / expected;
            }
            assert!(chi2 < 330.0, "seed {seed}, s {s}: chi-square {chi2}");
            // Rank 0 within 5 binomial sigma.
            let p0 = zipf.probability(0);
            let sigma = (f64::from(draws) * p0 * (1.0 - p0)).sqrt();
            assert!(
                (f64::from(counts[0]) - f64::from(draws) * p0).abs() < 5.0 * sigma,
                "s {s}"
            );
        }
    }

    #[test]
    fn large_domains_and_edges() {
        let seed = crate::test_seed();
        let mut rng = Rng::new(seed);
        let big = Zipf::new(1 << 40, 0.99).unwrap();
        let mut top = 0;
        for _ in 0..10_000 {
            let k = big.sample(&mut rng);
            assert!(k < 1 << 40);
            top += u32::from(k < 1000);
        }
        assert!(top > 1000, "seed {seed}: {top}");
        let one = Zipf::new(1, 1.0).unwrap();
        assert_eq!(one.sample(&mut rng), 0);
        assert_eq!(Zipf::new(0, 1.0).unwrap_err(), ZipfError::Empty);
        assert!(matches!(Zipf::new(5, 0.0), Err(ZipfError::Skew(_))));
        assert!(matches!(Zipf::new(5, f64::NAN), Err(ZipfError::Skew(_))));
    }

    #[test]
    fn scatter_is_a_permutation() {
        let seed = crate::test_seed();
        for n in [1u64, 2, 3, 1000, 4096, 5001] {
            let scatter = Scatter::new(n, seed);
            let mut image: Vec<u64> = (0..n).map(|x| scatter.apply(x)).collect();
            image.sort_unstable();
            assert_eq!(image, (0..n).collect::<Vec<_>>(), "seed {seed}, n {n}");
        }
        let scatter = Scatter::new(1 << 20, seed);
        let moved = (0..1000).filter(|x| scatter.apply(*x) != *x).count();
        assert!(moved > 990);
    }
}
