//! A small, fast, seedable pseudo-random generator whose output is fixed by this crate.
//!
//! Generated graphs and lookup batches must be identical on every machine and across Strata
//! versions (a graph file made once is reused; a GPU result is checked against a CPU
//! reference built on another host). An external generator's stream may change between crate
//! versions, so Strata keeps its own: xoshiro256** seeded through SplitMix64. Parallel work
//! derives one independent stream per *chunk index* (never per thread), so results do not
//! depend on how many threads ran.

/// One SplitMix64 step: used to expand seeds and as a stateless 64-bit mixer.
#[must_use]
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    mix64(*state)
}

/// The SplitMix64 finaliser: a bijective 64-bit mix with good avalanche.
#[must_use]
pub fn mix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256**: 256 bits of state, period 2^256 - 1, passes BigCrush.
#[derive(Debug, Clone)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let state = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        // SplitMix64 never yields four zero words from one seed, but guard the invariant
        // (an all-zero state would emit zeros forever).
        if state == [0; 4] {
            return Self {
                state: [1, 2, 3, 4],
            };
        }
        Self { state }
    }

    /// An independent stream for work item `index` under `seed` (e.g. one chunk of edges).
    #[must_use]
    pub fn for_chunk(seed: u64, index: u64) -> Self {
        Self::new(mix64(
            seed ^ mix64(index.wrapping_add(0x6a09_e667_f3bc_c909)),
        ))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform double in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        // 2^-53: the top 53 bits fill a double's mantissa exactly.
        #[allow(clippy::cast_precision_loss)] // < 2^53, exact
        let top = (self.next_u64() >> 11) as f64;
        top * (1.0 / 9_007_199_254_740_992.0)
    }

    /// A uniform integer in `0..bound` (Lemire's multiply-shift with rejection: unbiased).
    ///
    /// # Panics
    /// If `bound` is zero.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "Rng::below needs a positive bound");
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let product = u128::from(self.next_u64()) * u128::from(bound);
            // Low 64 bits of the 128-bit product decide rejection; the high 64 are the answer.
            #[allow(clippy::cast_possible_truncation)] // intentional: low word
            let low = product as u64;
            if low >= threshold {
                #[allow(clippy::cast_possible_truncation)] // high word of a 128-bit product
                return (product >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_chunks_differ() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let x: Vec<u64> = (0..8).map(|_| Rng::for_chunk(7, 0).next_u64()).collect();
        assert!(x.iter().all(|v| *v == x[0]));
        assert_ne!(
            Rng::for_chunk(7, 0).next_u64(),
            Rng::for_chunk(7, 1).next_u64()
        );
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let seed = crate::test_seed();
        let mut rng = Rng::new(seed);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            let v = rng.below(10);
            counts[usize::try_from(v).unwrap()] += 1;
        }
        for c in counts {
            assert!(
                (9_000..11_000).contains(&c),
                "seed {seed}: bucket count {c}"
            );
        }
        for _ in 0..1000 {
            assert!(rng.next_f64() < 1.0);
        }
    }
}
