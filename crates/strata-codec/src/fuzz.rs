//! Bounded fuzzing of the page decoder (a few seconds per property in CI; set
//! `PROPTEST_CASES` for a longer run). Slots are damaged the two ways they can be:
//! accidentally (bit flips, lost headers, cut lengths, with the checksums left as they were)
//! and deliberately (header fields, truncations and stream bytes rewritten with every checksum
//! made valid again). Accidental damage must read as an error or as exactly the page written;
//! deliberate damage must never crash, never make libzfp read past its input, and never turn
//! a truncated or padded stream into data.
#![allow(clippy::cast_possible_truncation)] // tests run on 64-bit hosts only

use std::sync::Arc;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use strata_core::config::CodecKind;
use strata_core::store::{MemoryStore, Store, StoreError};

use super::*;

/// A small page keeps each case fast; the decoder does not care about the size.
const PAGE: u64 = 4 << 10;
const SLOT: usize = PAGE as usize + HEADER_BYTES;
const TOLERANCE: f64 = 1e-6;

/// A page of one of several kinds: random, runs, zero, text-like, smooth `f64`, noisy `f64`.
fn page(kind: u8, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = PAGE as usize;
    let mut p = vec![0u8; n];
    match kind % 6 {
        0 => rng.fill_bytes(&mut p),
        1 => {
            for chunk in p.chunks_mut(rng.random_range(1..300)) {
                chunk.fill(rng.random());
            }
        }
        2 => {}
        3 => {
            for (i, b) in p.iter_mut().enumerate() {
                *b = b"strata page "[i % 12];
            }
        }
        4 => {
            let phase = rng.random::<f64>();
            for (i, c) in p.chunks_exact_mut(8).enumerate() {
                c.copy_from_slice(&(50.0 * ((i as f64) * 0.003 + phase).sin()).to_le_bytes());
            }
        }
        _ => {
            for c in p.chunks_exact_mut(8) {
                c.copy_from_slice(&(rng.random::<f64>() * 1e3).to_le_bytes());
            }
        }
    }
    p
}

/// Damage to one slot image (header + stored bytes).
#[derive(Debug, Clone)]
enum Damage {
    /// Flip one bit in the header or stored bytes (checksums untouched).
    Flip(usize, u8),
    /// Zero the header (a lost header write).
    ZeroHeader,
    /// Set the length field (checksums untouched unless sealed).
    Length(u32),
    /// Set the format byte.
    Format(u8),
    /// Set the recorded ZFP tolerance.
    Tolerance(f64),
    /// Keep this many per mille of the stored bytes.
    Truncate(u16),
    /// Let the stored bytes run on by this many bytes of what follows in the slot.
    Extend(u16),
    /// Replace the stored bytes by random bytes from this seed.
    Scramble(u64),
}

fn tolerance() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1e-6),
        Just(0.0),
        Just(f64::MIN_POSITIVE / 8.0),
        Just(1e-300),
        Just(TOLERANCE / 2.0),
        Just(TOLERANCE * 1.5),
        Just(1e3),
        any::<f64>(),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0..SLOT, 0u8..8).prop_map(|(at, bit)| Damage::Flip(at, bit)),
        Just(Damage::ZeroHeader),
        prop_oneof![
            Just(0u32),
            Just(1),
            Just(PAGE as u32),
            Just(PAGE as u32 + 1),
            Just(u32::MAX),
            any::<u32>()
        ]
        .prop_map(Damage::Length),
        (0u8..8).prop_map(Damage::Format),
        tolerance().prop_map(Damage::Tolerance),
        (0u16..1000).prop_map(Damage::Truncate),
        (1u16..64).prop_map(Damage::Extend),
        any::<u64>().prop_map(Damage::Scramble),
    ]
}

fn length_of(image: &[u8]) -> usize {
    u32::from_le_bytes(image[4..8].try_into().expect("4 bytes")) as usize
}

/// Applies `damage` to `image`; with `seal`, recomputes both checksums so the damage is
/// indistinguishable from a slot written that way.
fn apply(damage: &Damage, image: &mut [u8], seal: bool) {
    let length = length_of(image);
    let set_length = |image: &mut [u8], l: usize| {
        image[4..8].copy_from_slice(&u32::try_from(l).expect("below 4 GiB").to_le_bytes());
    };
    match *damage {
        Damage::Flip(at, bit) => image[at] ^= 1 << bit,
        Damage::ZeroHeader => image[..HEADER_BYTES].fill(0),
        Damage::Length(l) => image[4..8].copy_from_slice(&l.to_le_bytes()),
        Damage::Format(f) => image[2] = f,
        Damage::Tolerance(t) => image[16..24].copy_from_slice(&t.to_le_bytes()),
        Damage::Truncate(per_mille) => set_length(image, length * usize::from(per_mille) / 1000),
        Damage::Extend(extra) => set_length(image, (length + usize::from(extra)).min(SLOT - 24)),
        Damage::Scramble(seed) => {
            StdRng::seed_from_u64(seed).fill_bytes(&mut image[HEADER_BYTES..HEADER_BYTES + length]);
        }
    }
    if seal && image[..HEADER_BYTES].iter().any(|b| *b != 0) {
        let stored = (HEADER_BYTES + length_of(image)).min(image.len());
        let crc = crc32fast::hash(&image[HEADER_BYTES..stored]);
        image[8..12].copy_from_slice(&crc.to_le_bytes());
        let header = header_checksum(image);
        image[12..16].copy_from_slice(&header.to_le_bytes());
    }
}

/// Writes `original` as page 0 of a store of `codec`, damages its slot, and reads it back
/// through the writing store and through a fresh one. Returns the page as read before the
/// damage and each damaged read.
fn damaged_reads(
    codec: CodecKind,
    original: &[u8],
    damage: &Damage,
    seal: bool,
) -> (Vec<u8>, Vec<Result<Vec<u8>, StoreError>>) {
    let inner = Arc::new(MemoryStore::new(
        CompressedStore::inner_size(PAGE, PAGE).expect("valid size"),
    ));
    let store = CompressedStore::new(inner.clone(), codec, PAGE, PAGE).expect("valid store");
    store.write_at(0, original).expect("write");
    let mut before = vec![0u8; PAGE as usize];
    store.read_at(0, &mut before).expect("undamaged read");
    let mut image = vec![0u8; SLOT];
    inner.read_at(0, &mut image).expect("inner read");
    apply(damage, &mut image, seal);
    inner.write_at(0, &image).expect("inner write");
    let fresh = CompressedStore::new(inner, codec, PAGE, PAGE).expect("valid store");
    let reads = [&store, &fresh]
        .into_iter()
        .map(|s| {
            let mut out = vec![0xa5u8; PAGE as usize];
            s.read_at(0, &mut out).map(|()| out)
        })
        .collect();
    (before, reads)
}

/// Whether `damage`, sealed, rewrites stored bytes (which no checksum can then reveal).
fn rewrites_stream(damage: &Damage) -> bool {
    match damage {
        Damage::Scramble(_) => true,
        Damage::Flip(at, _) => *at >= HEADER_BYTES,
        _ => false,
    }
}

fn f64s(bytes: &[u8]) -> impl Iterator<Item = f64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
}

proptest! {
    // 256 cases by default (a few seconds); PROPTEST_CASES asks for more. No regression
    // files: a failure prints its minimal input.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Lossless pages (LZ4 and raw): accidental damage is an error or the exact page; a
    /// header rewritten with valid checksums over unchanged bytes likewise; scrambled bytes
    /// with valid checksums may decode (nothing can tell), but never crash.
    #[test]
    fn lossless_slots_under_damage(
        kind in 0u8..6,
        seed in any::<u64>(),
        lz4 in any::<bool>(),
        damage in damage(),
        seal in any::<bool>(),
    ) {
        let codec = if lz4 { CodecKind::Lz4 } else { CodecKind::None };
        let original = page(kind, seed);
        let (before, reads) = damaged_reads(codec, &original, &damage, seal);
        prop_assert_eq!(&before, &original);
        for read in reads {
            match read {
                Err(e) => prop_assert!(matches!(e, StoreError::Corrupt { .. }), "{}", e),
                Ok(out) => {
                    if !(seal && rewrites_stream(&damage)) {
                        prop_assert!(out == original, "damage {:?} read as other data", damage);
                    }
                }
            }
        }
    }

    /// ZFP pages: accidental damage is an error or the page as read before; a truncated or
    /// padded stream with valid checksums is an error; any other rewrite never crashes and,
    /// if it reads, reads finite values within the store's bound of the page when the stream
    /// bytes are unchanged.
    #[test]
    fn zfp_slots_under_damage(
        kind in 4u8..6,
        seed in any::<u64>(),
        damage in damage(),
        seal in any::<bool>(),
    ) {
        let original = page(kind, seed);
        let codec = CodecKind::Zfp { tolerance: TOLERANCE };
        let (before, reads) = damaged_reads(codec, &original, &damage, seal);
        for read in reads {
            match (read, seal) {
                (Err(e), _) => prop_assert!(matches!(e, StoreError::Corrupt { .. }), "{}", e),
                (Ok(out), false) => prop_assert!(out == before, "damage {:?} read as other data", damage),
                (Ok(out), true) => match damage {
                    Damage::Truncate(_) | Damage::Extend(_) | Damage::Length(_) => {
                        // Only a no-op length change may read.
                        prop_assert!(out == before, "resized stream {:?} read as data", damage);
                    }
                    _ if rewrites_stream(&damage) => {}
                    Damage::Tolerance(_) | Damage::Format(_) | Damage::Flip(..) => {
                        let worst = f64s(&out)
                            .zip(f64s(&original))
                            .map(|(a, b)| (a - b).abs())
                            .fold(0.0, f64::max);
                        prop_assert!(worst <= TOLERANCE, "{:?}: error {}", damage, worst);
                    }
                    Damage::ZeroHeader | Damage::Scramble(_) => {}
                },
            }
        }
    }

    /// libzfp on arbitrary streams: never reads past the maximum stream size (the bytes it
    /// consumed say how far it read), and only a stream consumed to its last byte decodes.
    #[test]
    fn zfp_decoder_stays_inside_its_maximum(
        seed in any::<u64>(),
        f32_values in any::<bool>(),
        exponent in -40i32..10,
        per_mille in 0usize..=1000,
    ) {
        let Ok(zfp) = Zfp::load() else { return Ok(()) };
        let element = if f32_values { ZfpElement::F32 } else { ZfpElement::F64 };
        let tolerance = 10f64.powi(exponent);
        let mut out = vec![0u8; PAGE as usize];
        let count = out.len() / element.bytes();
        let maximum = zfp.maximum_size(element, count, tolerance);
        prop_assert!(maximum > 0);
        let mut stream = vec![0u8; maximum * per_mille / 1000];
        StdRng::seed_from_u64(seed).fill_bytes(&mut stream);
        match zfp.decompress(element, &stream, tolerance, &mut out) {
            Ok(()) => {}
            Err(ZfpDecodeError::Length { length, consumed }) => {
                prop_assert_eq!(length, stream.len());
                prop_assert!(consumed <= maximum, "read {} bytes, maximum {}", consumed, maximum);
            }
            Err(e) => prop_assert!(false, "unexpected {}", e),
        }
    }
}
