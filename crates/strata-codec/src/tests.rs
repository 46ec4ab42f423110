//! Codec round trips, raw fallback, corruption detection and the ZFP error bound.
#![allow(clippy::cast_possible_truncation)] // tests run on 64-bit hosts only

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use strata_core::config::CodecKind;
use strata_core::store::{MemoryStore, ReadRequest, Store, StoreError};

use super::*;

const PAGE: u64 = 16 << 10;

fn rng(test: &str) -> StdRng {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("{test}: seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn store(codec: CodecKind, size: u64) -> (Arc<MemoryStore>, CompressedStore) {
    let inner = Arc::new(MemoryStore::new(
        CompressedStore::inner_size(size, PAGE).unwrap(),
    ));
    let s = CompressedStore::new(inner.clone(), codec, PAGE, size).unwrap();
    (inner, s)
}

/// Pages of several kinds: random, runs, zeros, one byte set, text-like, alternating.
fn page_of_kind(kind: usize, rng: &mut StdRng) -> Vec<u8> {
    let n = PAGE as usize;
    let mut p = vec![0u8; n];
    match kind % 6 {
        0 => rng.fill_bytes(&mut p),
        1 => {
            let mut i = 0;
            while i < n {
                let run = rng.random_range(1..200).min(n - i);
                let v = rng.random::<u8>();
                p[i..i + run].fill(v);
                i += run;
            }
        }
        2 => {}
        3 => p[rng.random_range(0..n)] = 0xff,
        4 => {
            let words = [b"strata ".as_slice(), b"page ", b"memory ", b"remote "];
            let mut i = 0;
            while i < n {
                let w = words[rng.random_range(0..words.len())];
                let take = w.len().min(n - i);
                p[i..i + take].copy_from_slice(&w[..take]);
                i += take;
            }
        }
        _ => {
            for (i, b) in p.iter_mut().enumerate() {
                *b = if i % 2 == 0 { 0xaa } else { 0x55 };
            }
        }
    }
    p
}

#[test]
fn lz4_round_trips_every_kind_of_page_against_a_reference() {
    let mut rng = rng("lz4_round_trips");
    let pages = 48u64;
    let size = pages * PAGE - 1000; // a short last page
    let (_, s) = store(CodecKind::Lz4, size);
    let mut reference = vec![0u8; size as usize];
    // Never-written pages read as zero.
    let mut buf = vec![1u8; PAGE as usize];
    s.read_at(0, &mut buf).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    for round in 0..300 {
        let page = rng.random_range(0..pages);
        let start = page * PAGE;
        let page_len = (size - start).min(PAGE) as usize;
        if round % 3 == 0 {
            // An unaligned write across page boundaries.
            let offset = rng.random_range(0..size - 1);
            let len = rng.random_range(1..=(3 * PAGE).min(size - offset)) as usize;
            let mut data = vec![0u8; len];
            rng.fill_bytes(&mut data);
            s.write_at(offset, &data).unwrap();
            reference[offset as usize..offset as usize + len].copy_from_slice(&data);
        } else {
            let mut data = page_of_kind(rng.random_range(0..6), &mut rng);
            data.truncate(page_len);
            s.write_at(start, &data).unwrap();
            reference[start as usize..start as usize + page_len].copy_from_slice(&data);
        }
        if round % 10 == 0 {
            let offset = rng.random_range(0..size);
            let len = rng.random_range(1..=(4 * PAGE).min(size - offset)) as usize;
            let mut out = vec![0u8; len];
            s.read_at(offset, &mut out).unwrap();
            assert_eq!(
                out,
                reference[offset as usize..offset as usize + len],
                "round {round}"
            );
        }
    }
    let mut all = vec![0u8; size as usize];
    s.read_at(0, &mut all).unwrap();
    assert!(
        all == reference,
        "whole-store read differs from the reference"
    );
    // Batched reads of scattered whole pages.
    let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; PAGE as usize]).collect();
    let idx: Vec<u64> = (0..8).map(|_| rng.random_range(0..pages - 1)).collect();
    let mut requests: Vec<ReadRequest<'_>> = bufs
        .iter_mut()
        .zip(&idx)
        .map(|(b, i)| ReadRequest {
            offset: i * PAGE,
            buf: b.as_mut_slice(),
        })
        .collect();
    s.read_batch(&mut requests).unwrap();
    for (b, i) in bufs.iter().zip(&idx) {
        let at = (i * PAGE) as usize;
        assert_eq!(b.as_slice(), &reference[at..at + PAGE as usize]);
    }
    let c = s.counters();
    assert!(
        c.pages_raw.load(Ordering::Relaxed) > 0,
        "random pages must be stored raw"
    );
    assert!(c.pages_compressed.load(Ordering::Relaxed) > 0);
}

#[test]
fn incompressible_pages_are_raw_and_compressible_ones_move_fewer_bytes() {
    let mut rng = rng("raw_flag");
    let (_, s) = store(CodecKind::Lz4, 8 * PAGE);
    let mut random = vec![0u8; PAGE as usize];
    rng.fill_bytes(&mut random);
    s.write_at(0, &random).unwrap();
    assert_eq!(s.counters().pages_raw.load(Ordering::Relaxed), 1);
    assert_eq!(
        s.counters().stored_bytes_written.load(Ordering::Relaxed),
        PAGE + HEADER_BYTES as u64
    );
    let text = page_of_kind(4, &mut rng);
    s.write_at(PAGE, &text).unwrap();
    assert_eq!(s.counters().pages_compressed.load(Ordering::Relaxed), 1);
    let written = s.counters().stored_bytes_written.load(Ordering::Relaxed) - PAGE - 24;
    assert!(written < PAGE / 2, "text page stored in {written} bytes");
    let before = s.counters().stored_bytes_read.load(Ordering::Relaxed);
    let mut out = vec![0u8; PAGE as usize];
    s.read_at(PAGE, &mut out).unwrap();
    assert_eq!(out, text);
    let read = s.counters().stored_bytes_read.load(Ordering::Relaxed) - before;
    assert_eq!(read, written, "a read fetches only the stored bytes");
    s.read_at(0, &mut out).unwrap();
    assert_eq!(out, random);
}

#[test]
fn corrupted_pages_are_errors_not_data() {
    let mut rng = rng("corruption");
    for codec in [CodecKind::Lz4, CodecKind::None] {
        let (inner, s) = store(codec, 4 * PAGE);
        let page = page_of_kind(4, &mut rng);
        s.write_at(0, &page).unwrap();
        let slot = CompressedStore::slot_bytes(PAGE);
        // Flip one byte of the stored data.
        let at = HEADER_BYTES as u64 + rng.random_range(0..16);
        let mut byte = [0u8];
        inner.read_at(at, &mut byte).unwrap();
        inner.write_at(at, &[byte[0] ^ 0x10]).unwrap();
        let mut out = vec![0u8; PAGE as usize];
        let e = s.read_at(0, &mut out).unwrap_err();
        assert!(
            matches!(e, StoreError::Corrupt { offset: 0, .. }),
            "{codec:?}: {e}"
        );
        assert!(e.to_string().contains("checksum"), "{e}");
        // Damage a header (its length field) of another page.
        s.write_at(PAGE, &page).unwrap();
        inner.write_at(slot + 5, &[0x7f]).unwrap();
        let e = s.read_at(PAGE, &mut out).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        // A header with garbage where a never-written slot would be zero.
        inner.write_at(2 * slot + 3, &[1]).unwrap();
        let e = s.read_at(2 * PAGE, &mut out).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        // The untouched page still reads.
        out.fill(9);
        s.read_at(3 * PAGE, &mut out).unwrap();
        assert!(out.iter().all(|b| *b == 0));
    }
}

#[test]
fn bad_configuration_is_refused() {
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new(PAGE));
    let e = CompressedStore::new(inner.clone(), CodecKind::Lz4, PAGE, PAGE).unwrap_err();
    assert!(matches!(e, CodecError::InnerTooSmall { .. }), "{e}");
    let e = CompressedStore::new(inner.clone(), CodecKind::Lz4, 12, PAGE).unwrap_err();
    assert!(matches!(e, CodecError::PageSize(12)));
    let e =
        CompressedStore::new(inner.clone(), CodecKind::Zfp { tolerance: -1.0 }, 8, 8).unwrap_err();
    assert!(matches!(e, CodecError::Tolerance(_)), "{e}");
    // Sizes whose slots overflow 64 bits, and pages whose length a header cannot record.
    for (size, page) in [(u64::MAX, 8), (u64::MAX - 7, 1 << 20), (1 << 62, 8)] {
        let e = CompressedStore::inner_size(size, page).unwrap_err();
        assert!(
            matches!(e, CodecError::TooLarge(s) if s == size),
            "{size} {page}: {e}"
        );
        let e = CompressedStore::new(inner.clone(), CodecKind::Lz4, page, size).unwrap_err();
        assert!(matches!(e, CodecError::TooLarge(_)), "{e}");
    }
    for page in [(1 << 30) + 8, 1 << 32, u64::MAX - 7] {
        let e = CompressedStore::inner_size(page, page).unwrap_err();
        assert!(
            matches!(e, CodecError::PageSize(p) if p == page),
            "{page}: {e}"
        );
    }
}

fn f64_page(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn zfp_honours_the_error_bound_on_random_floats() {
    let mut rng = rng("zfp_bound");
    let n = (PAGE / 8) as usize;
    for tolerance in [1e-2, 1e-6, 1e-10] {
        let (_, s) = store(CodecKind::Zfp { tolerance }, 6 * PAGE);
        let mut originals = Vec::new();
        for page in 0..6u64 {
            // Smooth fields compress; white noise of varying magnitude tests the bound.
            let scale = 10f64.powi(rng.random_range(-3..6));
            let phase = rng.random::<f64>();
            let values: Vec<f64> = (0..n)
                .map(|i| match page % 3 {
                    0 => scale * ((i as f64) * 0.01 + phase).sin(),
                    1 => scale * (rng.random::<f64>() - 0.5),
                    _ => scale * (i as f64 / n as f64) + rng.random::<f64>() * 1e-3,
                })
                .collect();
            s.write_at(page * PAGE, &f64_page(&values)).unwrap();
            originals.push(values);
        }
        for (page, values) in originals.iter().enumerate() {
            let mut out = vec![0u8; PAGE as usize];
            s.read_at(page as u64 * PAGE, &mut out).unwrap();
            let worst = f64s(&out)
                .iter()
                .zip(values)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                worst <= tolerance,
                "page {page}: error {worst} > {tolerance}"
            );
        }
        assert!(
            s.counters().pages_compressed.load(Ordering::Relaxed) >= 2,
            "smooth pages should compress at tolerance {tolerance}"
        );
    }
}

#[test]
fn zfp_stores_non_finite_pages_exactly() {
    let mut rng = rng("zfp_nan");
    let n = (PAGE / 8) as usize;
    let (_, s) = store(CodecKind::Zfp { tolerance: 1e-3 }, 2 * PAGE);
    let mut values: Vec<f64> = (0..n).map(|i| i as f64).collect();
    values[rng.random_range(0..n)] = f64::NAN;
    values[rng.random_range(0..n)] = f64::INFINITY;
    let bytes = f64_page(&values);
    s.write_at(0, &bytes).unwrap();
    let mut out = vec![0u8; PAGE as usize];
    s.read_at(0, &mut out).unwrap();
    assert_eq!(out, bytes, "a page with NaN/inf must come back bit for bit");
    assert_eq!(s.counters().pages_raw.load(Ordering::Relaxed), 1);
}

/// Pointers and small integers read as doubles are subnormal: a smooth page of doubles with
/// one such word (a pointer in a struct of doubles, a length before an array) comes back bit
/// for bit, while the same page without it is compressed (so the rule, not chance, kept it).
#[test]
fn zfp_stores_pages_with_pointers_or_small_integers_exactly() {
    let mut rng = rng("zfp_subnormal");
    let n = (PAGE / 8) as usize;
    let (_, s) = store(CodecKind::Zfp { tolerance: 1e-3 }, 4 * PAGE);
    let smooth: Vec<f64> = (0..n).map(|i| (i as f64 * 0.01).sin() + 2.0).collect();
    let pointer = 0x7f00_0000_0000u64 + (rng.next_u64() & 0xff_ffff_fff8);
    let small = rng.random_range(1..1u64 << 52);
    for (page, word) in [(0u64, pointer), (1, small)] {
        let mut bytes = f64_page(&smooth);
        let at = rng.random_range(0..n) * 8;
        bytes[at..at + 8].copy_from_slice(&word.to_le_bytes());
        s.write_at(page * PAGE, &bytes).unwrap();
        let mut out = vec![0u8; PAGE as usize];
        s.read_at(page * PAGE, &mut out).unwrap();
        assert_eq!(
            out, bytes,
            "page {page}: word {word:#x} at {at} must survive exactly"
        );
    }
    assert_eq!(s.counters().pages_raw.load(Ordering::Relaxed), 2);
    s.write_at(2 * PAGE, &f64_page(&smooth)).unwrap();
    assert_eq!(s.counters().pages_compressed.load(Ordering::Relaxed), 1);
    // The same for f32 pages: an i32 below 2^23 is a subnormal float.
    let inner = Arc::new(MemoryStore::new(2 * PAGE));
    let s = CompressedStore::new(inner, CodecKind::Zfp { tolerance: 1e-3 }, PAGE, PAGE)
        .unwrap()
        .with_zfp_element(ZfpElement::F32);
    let mut bytes: Vec<u8> = (0..PAGE / 4)
        .flat_map(|i| ((i as f32 * 0.01).sin() + 2.0).to_le_bytes())
        .collect();
    let at = rng.random_range(0..(PAGE / 4) as usize) * 4;
    let int = rng.random_range(1..1u32 << 23);
    bytes[at..at + 4].copy_from_slice(&int.to_le_bytes());
    s.write_at(0, &bytes).unwrap();
    let mut out = vec![0u8; PAGE as usize];
    s.read_at(0, &mut out).unwrap();
    assert_eq!(
        out, bytes,
        "f32 page: integer {int} at {at} must survive exactly"
    );
}

#[test]
fn zfp_f32_pages_honour_the_bound() {
    let mut rng = rng("zfp_f32");
    let n = (PAGE / 4) as usize;
    let tolerance = 1e-3;
    let inner = Arc::new(MemoryStore::new(
        CompressedStore::inner_size(PAGE, PAGE).unwrap(),
    ));
    let s = CompressedStore::new(inner, CodecKind::Zfp { tolerance }, PAGE, PAGE)
        .unwrap()
        .with_zfp_element(ZfpElement::F32);
    let values: Vec<f32> = (0..n)
        .map(|i| ((i as f32) * 0.003).cos() * 50.0 + rng.random::<f32>() * 1e-4)
        .collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    s.write_at(0, &bytes).unwrap();
    let mut out = vec![0u8; PAGE as usize];
    s.read_at(0, &mut out).unwrap();
    for (c, v) in out.chunks_exact(4).zip(&values) {
        let got = f32::from_le_bytes(c.try_into().unwrap());
        assert!((f64::from(got) - f64::from(*v)).abs() <= tolerance);
    }
    assert_eq!(s.counters().pages_compressed.load(Ordering::Relaxed), 1);
}

/// A smooth page of `f64` that ZFP compresses well.
fn smooth_f64_page(rng: &mut StdRng) -> Vec<u8> {
    let n = (PAGE / 8) as usize;
    let phase = rng.random::<f64>();
    let values: Vec<f64> = (0..n)
        .map(|i| 100.0 * ((i as f64) * 0.002 + phase).sin())
        .collect();
    f64_page(&values)
}

/// Writes a slot image (header made by this crate, so every CRC is valid) into page `index`.
fn plant_slot(inner: &MemoryStore, index: u64, format: Format, stored: &[u8], tolerance: f64) {
    let mut image = encode_header(format, stored, tolerance).to_vec();
    image.extend_from_slice(stored);
    inner
        .write_at(index * CompressedStore::slot_bytes(PAGE), &image)
        .unwrap();
}

/// The stored bytes of page `index` as the store wrote them: (format byte, bytes, tolerance).
fn stored_bytes(inner: &MemoryStore, index: u64) -> (u8, Vec<u8>, f64) {
    let mut image = vec![0u8; CompressedStore::slot_bytes(PAGE) as usize];
    inner
        .read_at(index * CompressedStore::slot_bytes(PAGE), &mut image)
        .unwrap();
    let (_, length, _, tolerance) = decode_header(&image[..HEADER_BYTES]).unwrap();
    (
        image[2],
        image[HEADER_BYTES..HEADER_BYTES + length].to_vec(),
        tolerance,
    )
}

#[test]
fn a_truncated_zfp_stream_with_valid_checksums_is_corrupt() {
    let mut rng = rng("zfp_truncated");
    let tolerance = 1e-6;
    let (inner, s) = store(CodecKind::Zfp { tolerance }, 2 * PAGE);
    s.write_at(0, &smooth_f64_page(&mut rng)).unwrap();
    let (format, stream, _) = stored_bytes(&inner, 0);
    assert_eq!(
        format,
        Format::ZfpF64 as u8,
        "the smooth page must compress"
    );
    assert!(stream.len() > 64, "stream of {} bytes", stream.len());
    // Cut at word boundaries and at odd places, down to nothing; and one with a word appended.
    let mut lengths = vec![
        0,
        1,
        8,
        stream.len() / 2,
        stream.len() - 8,
        stream.len() - 1,
    ];
    lengths.push(rng.random_range(1..stream.len()));
    for length in lengths {
        plant_slot(&inner, 0, Format::ZfpF64, &stream[..length], tolerance);
        // A fresh store too, which knows nothing of the page's length.
        let fresh =
            CompressedStore::new(inner.clone(), CodecKind::Zfp { tolerance }, PAGE, 2 * PAGE)
                .unwrap();
        for reader in [&s, &fresh] {
            let mut out = vec![0u8; PAGE as usize];
            let e = reader.read_at(0, &mut out).unwrap_err();
            assert!(
                matches!(e, StoreError::Corrupt { offset: 0, .. }),
                "{length} of {} bytes: {e}",
                stream.len()
            );
        }
    }
    let mut longer = stream.clone();
    longer.extend_from_slice(&[0u8; 8]);
    plant_slot(&inner, 0, Format::ZfpF64, &longer, tolerance);
    let mut out = vec![0u8; PAGE as usize];
    let e = s.read_at(0, &mut out).unwrap_err();
    assert!(e.to_string().contains("ZFP"), "{e}");
}

#[test]
fn a_zfp_header_tolerance_out_of_bounds_is_corrupt() {
    let mut rng = rng("zfp_tolerance");
    let tolerance = 1e-6;
    let (inner, s) = store(CodecKind::Zfp { tolerance }, PAGE);
    s.write_at(0, &smooth_f64_page(&mut rng)).unwrap();
    let (_, stream, stored_tolerance) = stored_bytes(&inner, 0);
    assert_eq!(stored_tolerance, tolerance);
    let lz4: Arc<dyn Store> = inner.clone();
    let lz4 = CompressedStore::new(lz4, CodecKind::Lz4, PAGE, PAGE).unwrap();
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e-6, 0.0, -0.0] {
        plant_slot(&inner, 0, Format::ZfpF64, &stream, bad);
        let mut out = vec![0u8; PAGE as usize];
        for reader in [&s, &lz4] {
            let e = reader.read_at(0, &mut out).unwrap_err();
            assert!(
                matches!(e, StoreError::Corrupt { .. }),
                "tolerance {bad:e}: {e}"
            );
            assert!(e.to_string().contains("tolerance"), "{e}");
        }
    }
    // A page stored with a looser bound than this store promises is refused, not served.
    plant_slot(&inner, 0, Format::ZfpF64, &stream, 1e-3);
    let mut out = vec![0u8; PAGE as usize];
    let e = s.read_at(0, &mut out).unwrap_err();
    assert!(e.to_string().contains("looser"), "{e}");
    // The original header reads back within the bound.
    plant_slot(&inner, 0, Format::ZfpF64, &stream, tolerance);
    s.read_at(0, &mut out).unwrap();
}

#[test]
fn a_zeroed_header_over_written_bytes_is_corrupt_not_a_zero_page() {
    let mut rng = rng("zeroed_header");
    for codec in [CodecKind::Lz4, CodecKind::None] {
        let (inner, s) = store(codec, 3 * PAGE);
        let slot = CompressedStore::slot_bytes(PAGE);
        for index in 0..2u64 {
            let page = page_of_kind(if index == 0 { 4 } else { 0 }, &mut rng);
            s.write_at(index * PAGE, &page).unwrap();
            inner.write_at(index * slot, &[0u8; HEADER_BYTES]).unwrap();
        }
        let fresh: Arc<dyn Store> = inner.clone();
        let fresh = CompressedStore::new(fresh, codec, PAGE, 3 * PAGE).unwrap();
        for reader in [&s, &fresh] {
            for index in 0..2u64 {
                let mut out = vec![0u8; PAGE as usize];
                let e = reader.read_at(index * PAGE, &mut out).unwrap_err();
                assert!(
                    matches!(e, StoreError::Corrupt { .. }),
                    "{codec:?} page {index}: {e}"
                );
                assert!(e.to_string().contains("zero"), "{e}");
            }
            // A slot never written still reads as a zero page.
            let mut out = vec![7u8; PAGE as usize];
            reader.read_at(2 * PAGE, &mut out).unwrap();
            assert!(out.iter().all(|b| *b == 0));
        }
    }
}

/// An inner store that counts batched writes and fails the one numbered `fail_at` (1-based;
/// 0: none).
#[derive(Debug)]
struct BatchCounting {
    inner: MemoryStore,
    batches: std::sync::Mutex<Vec<usize>>,
    fail_at: std::sync::atomic::AtomicUsize,
}

impl Store for BatchCounting {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.write_batch(&[(offset, buf)])
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn describe(&self) -> String {
        "batch-counting".into()
    }
    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let mut batches = self.batches.lock().unwrap();
        batches.push(requests.len());
        if batches.len() == self.fail_at.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable {
                store: self.describe(),
                reason: format!("injected failure of batch {}", batches.len()),
            });
        }
        for (offset, buf) in requests {
            self.inner.write_at(*offset, buf)?;
        }
        Ok(())
    }
}

/// A write-back of 40 pages goes to the inner store in batches of at most 256 KiB of pages;
/// when one batch fails the caller gets the error, the pages written before it read back,
/// and writing again once the store is well stores every page.
#[test]
fn long_write_backs_go_in_bounded_batches_and_a_failed_batch_is_reported() {
    let mut rng = rng("bounded_batches");
    let count = 40u64;
    let size = count * PAGE;
    let inner = Arc::new(BatchCounting {
        inner: MemoryStore::new(CompressedStore::inner_size(size, PAGE).unwrap()),
        batches: std::sync::Mutex::new(Vec::new()),
        fail_at: std::sync::atomic::AtomicUsize::new(2),
    });
    let s = CompressedStore::new(inner.clone(), CodecKind::Lz4, PAGE, size).unwrap();
    let pages: Vec<Vec<u8>> = (0..count as usize)
        .map(|i| page_of_kind(i % 6, &mut rng))
        .collect();
    let requests: Vec<(u64, &[u8])> = pages
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64 * PAGE, p.as_slice()))
        .collect();
    let per_batch = (256 << 10) / PAGE as usize;
    let e = s.write_batch(&requests).unwrap_err();
    assert!(e.to_string().contains("injected failure of batch 2"), "{e}");
    assert_eq!(*inner.batches.lock().unwrap(), [per_batch, per_batch]);
    let mut out = vec![0u8; PAGE as usize];
    for (i, page) in pages.iter().enumerate().take(per_batch) {
        s.read_at(i as u64 * PAGE, &mut out).unwrap();
        assert_eq!(&out, page, "page {i}, written before the failed batch");
    }
    inner.fail_at.store(0, Ordering::SeqCst);
    inner.batches.lock().unwrap().clear();
    s.write_batch(&requests).unwrap();
    let batches = inner.batches.lock().unwrap().clone();
    assert!(batches.iter().all(|&n| n <= per_batch), "{batches:?}");
    assert_eq!(batches.iter().sum::<usize>(), count as usize);
    for (i, page) in pages.iter().enumerate() {
        s.read_at(i as u64 * PAGE, &mut out).unwrap();
        assert_eq!(&out, page, "page {i}");
    }
}

/// The slot images are lent from one pool to every thread: eight threads writing and
/// reading batches of their own pages at once (batches of one to 20 pages, every kind,
/// including raw ones of a page plus header and tiny LZ4 ones) each read back exactly what
/// they wrote, so no image is lent to two batches at once or comes back with another's
/// bytes; and the pool stays bounded.
#[test]
fn threads_sharing_the_slot_image_pool_keep_their_own_pages() {
    let seed = rng("shared_pool").random::<u64>();
    let (threads, per_thread) = (8u64, 24u64);
    let (_, s) = store(CodecKind::Lz4, threads * per_thread * PAGE);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let s = &s;
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ t);
                let first = t * per_thread;
                let mut mine: Vec<Vec<u8>> = vec![vec![0u8; PAGE as usize]; per_thread as usize];
                for round in 0..30 {
                    let count = rng.random_range(1..=20u64).min(per_thread);
                    let at = rng.random_range(0..=per_thread - count);
                    let pages: Vec<Vec<u8>> = (0..count)
                        .map(|k| page_of_kind(rng.random_range(0..6) + k as usize, &mut rng))
                        .collect();
                    let requests: Vec<(u64, &[u8])> = pages
                        .iter()
                        .enumerate()
                        .map(|(k, p)| ((first + at + k as u64) * PAGE, p.as_slice()))
                        .collect();
                    s.write_batch(&requests).expect("write");
                    for (k, p) in pages.into_iter().enumerate() {
                        mine[(at as usize) + k] = p;
                    }
                    let mut back = vec![vec![0u8; PAGE as usize]; per_thread as usize];
                    let mut reads: Vec<ReadRequest<'_>> = back
                        .iter_mut()
                        .enumerate()
                        .map(|(k, buf)| ReadRequest {
                            offset: (first + k as u64) * PAGE,
                            buf: buf.as_mut_slice(),
                        })
                        .collect();
                    s.read_batch(&mut reads).expect("read");
                    for (k, (got, want)) in back.iter().zip(&mine).enumerate() {
                        assert!(got == want, "thread {t}, round {round}, page {k} differs");
                    }
                }
            });
        }
    });
    assert!(POOL.lock().unwrap().len() <= POOL_MOST);
}
