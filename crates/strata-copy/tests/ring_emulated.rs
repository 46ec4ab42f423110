//! The doorbell ring's layout and protocol against an emulated device made of threads (no GPU):
//! the emulator follows `cuda/copy_service.cu` (poll a mirror of the slot, accept it only when
//! every word it needs carries the request's tag, serve it, answer small reads with tagged
//! words, publish `done`), reading and writing words in a random order while the producer
//! works, so torn slots and half-written answers are exercised.

#![allow(clippy::cast_possible_truncation)] // Sizes and offsets here are small by construction.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use strata_copy::CopyError;
use strata_copy::ring::{self, Engine, Op, Producer, RingMemory, SLOT_WORDS};

const DEV_BASE: u64 = 0x7f00_0000_0000;
const DEV_SIZE: usize = 1 << 20;

/// 64-byte aligned, zeroed shared memory.
struct Shared {
    words: Vec<AtomicU64>,
}

impl Shared {
    fn new(bytes: usize) -> Arc<Shared> {
        Arc::new(Shared {
            words: (0..bytes.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
        })
    }
    fn ptr(&self) -> *mut u64 {
        self.words.as_ptr().cast_mut().cast()
    }
}

struct Memory {
    ring: Arc<Shared>,
    h2d: Arc<Shared>,
    d2h: Arc<Shared>,
    status: Arc<Shared>,
    device: Arc<Mutex<Vec<u8>>>,
    nslots: u32,
    mirrors: u32,
    stage: usize,
}

#[derive(Clone)]
struct Emulator {
    mem: Arc<Memory>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    launches: Arc<Mutex<Vec<(u64, u64)>>>,
    seed: u64,
    dead: Arc<AtomicBool>,
}

fn byte_at(s: &Shared, i: usize) -> u8 {
    let w = s.words[i / 8].load(Ordering::Acquire);
    w.to_le_bytes()[i % 8]
}

fn set_byte(s: &Shared, i: usize, b: u8) {
    let w = &s.words[i / 8];
    let mut bytes = w.load(Ordering::Relaxed).to_le_bytes();
    bytes[i % 8] = b;
    w.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
}

fn shuffled(n: usize, rng: &mut StdRng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    order
}

fn serve(mem: &Memory, start: u64, epoch: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ epoch);
    let mut seq = start;
    let mut inline = [0u8; ring::INLINE_MAX];
    let stride = ring::stage_stride(mem.stage);
    loop {
        let slot = ring::slot_of(seq, mem.nslots);
        let mut words = [0u64; SLOT_WORDS];
        // Read the slot of any mirror word by word in a random order, as parallel lanes would.
        let req = loop {
            let mirror = rng.random_range(0..mem.mirrors) as usize;
            let base = (mirror * mem.nslots as usize + slot) * SLOT_WORDS;
            for i in shuffled(SLOT_WORDS, &mut rng) {
                words[i] = mem.ring.words[base + i].load(Ordering::Acquire);
                if rng.random_ratio(1, 64) {
                    std::thread::yield_now();
                }
            }
            if let Some(r) = ring::decode(seq, &words, &mut inline) {
                break r;
            }
            std::thread::yield_now();
        };
        let in_device =
            |len: usize| req.dev >= DEV_BASE && req.dev - DEV_BASE + len as u64 <= DEV_SIZE as u64;
        let off = usize::try_from(req.dev.wrapping_sub(DEV_BASE)).unwrap_or(usize::MAX);
        let stage_at = slot * stride + ring::stage_skew(req.dev);
        let ok = match req.op {
            Op::H2dInline if in_device(req.len) => {
                mem.device.lock().unwrap()[off..off + req.len].copy_from_slice(&inline[..req.len]);
                true
            }
            Op::H2dStaged if in_device(req.len) && req.len <= mem.stage => {
                let mut d = mem.device.lock().unwrap();
                for i in 0..req.len {
                    d[off + i] = byte_at(&mem.h2d, stage_at + i);
                }
                true
            }
            Op::D2h if in_device(req.len) && req.len <= mem.stage => {
                let d = mem.device.lock().unwrap();
                for i in 0..req.len {
                    set_byte(&mem.d2h, stage_at + i, d[off + i]);
                }
                true
            }
            Op::D2hTagged if in_device(req.len) && 2 * req.len <= stride => {
                // Answer words land in any order, some late: the host must wait for all.
                let d = mem.device.lock().unwrap();
                let n = ring::answer_words(req.len);
                for i in shuffled(n, &mut rng) {
                    let bytes = &d[off + 4 * i..off + (4 * i + 4).min(req.len)];
                    mem.d2h.words[slot * stride / 8 + i]
                        .store(ring::answer_word(req.seq, bytes), Ordering::Release);
                    if rng.random_ratio(1, 16) {
                        std::thread::yield_now();
                    }
                }
                true
            }
            Op::Stop => true,
            _ => false,
        };
        std::sync::atomic::fence(Ordering::SeqCst);
        if !ok {
            mem.status.words[ring::STATUS_FAULT].store(seq, Ordering::Release);
            mem.status.words[ring::STATUS_EXITED].store(epoch, Ordering::Release);
            return;
        }
        mem.status.words[ring::STATUS_DONE].store(seq, Ordering::Release);
        if req.op == Op::Stop {
            mem.status.words[ring::STATUS_EXITED].store(epoch, Ordering::Release);
            return;
        }
        seq += 1;
    }
}

impl Engine for Emulator {
    fn launch(&self, start_seq: u64, epoch: u64) -> Result<(), CopyError> {
        if self.dead.load(Ordering::Acquire) {
            return Ok(());
        }
        self.launches.lock().unwrap().push((start_seq, epoch));
        let (mem, seed) = (self.mem.clone(), self.seed);
        let h = std::thread::spawn(move || serve(&mem, start_seq, epoch, seed));
        self.threads.lock().unwrap().push(h);
        Ok(())
    }
    fn health(&self) -> Result<(), CopyError> {
        Ok(())
    }
}

fn setup(nslots: u32, stage: usize, seed: u64) -> (Emulator, Producer) {
    let mirrors = 1 + (seed % 3) as u32;
    let stride = ring::stage_stride(stage);
    let mem = Arc::new(Memory {
        ring: Shared::new(nslots as usize * mirrors as usize * ring::SLOT_BYTES),
        h2d: Shared::new(nslots as usize * stride),
        d2h: Shared::new(nslots as usize * stride),
        status: Shared::new(ring::STATUS_WORDS * 8),
        device: Arc::new(Mutex::new(vec![0u8; DEV_SIZE])),
        nslots,
        mirrors,
        stage,
    });
    let rm = RingMemory {
        ring: mem.ring.ptr(),
        h2d_stage: mem.h2d.ptr().cast(),
        d2h_stage: mem.d2h.ptr().cast(),
        status: mem.status.ptr(),
        nslots,
        mirrors,
        stage_slot: stage,
    };
    // SAFETY: the memory is zeroed, sized as documented and kept alive by the emulator.
    let mut p = unsafe { Producer::new(rm) };
    p.timeout = Duration::from_secs(20);
    p.d2h_tagged_max = stage / 4;
    let emu = Emulator {
        mem,
        threads: Arc::default(),
        launches: Arc::default(),
        seed,
        dead: Arc::default(),
    };
    (emu, p)
}

fn seed() -> u64 {
    let s = rand::rng().random();
    eprintln!("seed {s}");
    s
}

#[test]
fn random_copies_match_a_model_across_slot_reuse_and_restarts() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let stage = 4096;
    let (emu, mut p) = setup(8, stage, seed);
    let mut model = vec![0u8; DEV_SIZE];
    for round in 0..600 {
        let len = match rng.random_range(0..4) {
            0 => rng.random_range(0..=16),
            1 => rng.random_range(0..=ring::INLINE_MAX),
            2 => rng.random_range(ring::INLINE_MAX - 3..=ring::INLINE_MAX + 5),
            _ => rng.random_range(1..=stage),
        };
        let off = rng.random_range(0..DEV_SIZE - len);
        let dev = DEV_BASE + off as u64;
        if rng.random_bool(0.6) {
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let seq = p.post_h2d(&emu, dev, &data).unwrap();
            model[off..off + len].copy_from_slice(&data);
            if rng.random_bool(0.3) {
                p.wait(&emu, seq).unwrap();
            }
        } else {
            let t = p.post_d2h(&emu, dev, len).unwrap();
            assert_eq!(t.tagged, len <= stage / 4);
            let mut out = vec![0u8; len];
            p.finish_d2h(&emu, &t, &mut out).unwrap();
            assert_eq!(
                out,
                model[off..off + len],
                "round {round}: read of {len} at {off}"
            );
        }
        if round % 150 == 149 {
            p.stop(&emu).unwrap();
            assert!(!p.running());
        }
    }
    p.flush(&emu).unwrap();
    assert_eq!(*emu.mem.device.lock().unwrap(), model);
    p.stop(&emu).unwrap();
    for h in emu.threads.lock().unwrap().drain(..) {
        h.join().unwrap();
    }
    // Every relaunch starts where the previous instance stopped, with a new epoch.
    let launches = emu.launches.lock().unwrap();
    assert_eq!(launches.len(), 4, "{launches:?}");
    for w in launches.windows(2) {
        assert_eq!(w[1].1, w[0].1 + 1);
        assert!(w[1].0 > w[0].0);
    }
}

#[test]
fn a_partly_written_slot_is_never_accepted() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut inline = [0u8; ring::INLINE_MAX];
    for _ in 0..2000 {
        let nslots = 4u64;
        let new_seq = rng.random_range(nslots + 1..1 << 40);
        let len = rng.random_range(0..=ring::INLINE_MAX);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let old_data: Vec<u8> = (0..ring::INLINE_MAX).map(|_| rng.random()).collect();
        let mut old = [0u64; SLOT_WORDS];
        ring::encode(
            new_seq - nslots,
            Op::H2dInline,
            ring::INLINE_MAX,
            0x1000,
            &old_data,
            &mut old,
        );
        let mut new = [0u64; SLOT_WORDS];
        let used = ring::encode(
            new_seq,
            Op::H2dInline,
            len,
            0xdead_beef_0000 + len as u64,
            &data,
            &mut new,
        );
        // Any mixture of old and new words.
        let mut mixed = old;
        let mut all_new = true;
        for i in 0..used {
            if rng.random_bool(0.9) {
                mixed[i] = new[i];
            } else {
                all_new = false;
            }
        }
        match ring::decode(new_seq, &mixed, &mut inline) {
            Some(r) => {
                assert!(all_new, "accepted a torn slot");
                assert_eq!(
                    (r.op, r.len, r.dev),
                    (Op::H2dInline, len, 0xdead_beef_0000 + len as u64)
                );
                assert_eq!(&inline[..len], &data[..]);
            }
            None => assert!(!all_new, "refused a complete slot"),
        }
        // The old request is never mistaken for the new one.
        assert!(ring::decode(new_seq, &old, &mut inline).is_none());
    }
}

#[test]
fn header_layout_is_the_documented_one() {
    let mut w = [0u64; SLOT_WORDS];
    let used = ring::encode(
        0x1_0000_0007,
        Op::H2dInline,
        5,
        0x1234_5678_9abc,
        &[1, 2, 3, 4, 5],
        &mut w,
    );
    assert_eq!(used, ring::HEADER_WORDS + 2);
    assert_eq!(w[0], (8u64 << 32) | (1 << 24) | 5);
    assert_eq!(w[1], (8u64 << 32) | 0x5678_9abc);
    assert_eq!(w[2], (8u64 << 32) | 0x1234);
    assert_eq!(w[4], (8u64 << 32) | 0x0403_0201);
    assert_eq!(w[5], (8u64 << 32) | 0x05);
    assert_eq!(ring::INLINE_MAX, 240);
    // Tags run 1..=2^32-1 and wrap past 0: zeroed memory never carries a valid tag.
    assert_eq!(ring::tag_of(1), 1);
    assert_eq!(ring::tag_of(0xFFFF_FFFF), 0xFFFF_FFFF);
    assert_eq!(ring::tag_of(0x1_0000_0000), 1);
    assert_eq!(ring::tag_of(0x1_0000_0007), 8);
    assert!((1..5000u64).all(|k| ring::tag_of(k * 0xFFFF_FFFF + 1) == 1));
    // Tagged answers: tag high, bytes low, short tails zero-padded.
    assert_eq!(ring::answer_word(2, &[1, 2, 3]), (2u64 << 32) | 0x03_0201);
    assert_eq!(ring::answer_words(5), 2);
    assert_eq!(ring::stage_skew(0x1003), 3);
    assert_eq!(ring::stage_stride(4096) % 64, 0);
    assert_eq!(ring::slot_of(1, 8), 0);
    assert_eq!(ring::slot_of(9, 8), 0);
    assert_eq!(ring::slot_of(8, 8), 7);
    // The device side agrees on the constants.
    let cu = strata_copy::service::SERVICE_CU;
    for (name, v) in [
        ("SLOT_WORDS", SLOT_WORDS),
        ("HEADER_WORDS", ring::HEADER_WORDS),
        ("INLINE_MAX", ring::INLINE_MAX),
        ("OP_H2D_INLINE", Op::H2dInline as usize),
        ("OP_H2D_STAGED", Op::H2dStaged as usize),
        ("OP_D2H", Op::D2h as usize),
        ("OP_STOP", Op::Stop as usize),
        ("OP_D2H_TAGGED", Op::D2hTagged as usize),
        ("STATUS_DONE", ring::STATUS_DONE),
        ("STATUS_EXITED", ring::STATUS_EXITED),
        ("STATUS_FAULT", ring::STATUS_FAULT),
    ] {
        assert!(
            cu.contains(&format!("#define {name} {v}\n")),
            "{name} differs from the .cu"
        );
    }
}

#[test]
fn bad_requests_are_refused_and_a_dead_device_times_out() {
    let seed = seed();
    let (emu, mut p) = setup(4, 1024, seed);
    // Larger than a staging slot: refused up front, nothing posted.
    let big = vec![0u8; 1025];
    assert!(matches!(
        p.post_h2d(&emu, DEV_BASE, &big),
        Err(CopyError::Protocol(_))
    ));
    assert!(matches!(p.wait(&emu, 1), Err(CopyError::Protocol(_))));
    // Outside the emulated device: the device reports a fault, the waiter gets an error.
    let seq = p.post_h2d(&emu, 16, &[1, 2, 3]).unwrap();
    let err = p.wait(&emu, seq).unwrap_err();
    assert!(err.to_string().contains("refused request"), "{err}");
    // A device that never serves: the wait ends with a timeout, not a hang.
    let (emu, mut p) = setup(4, 1024, seed);
    emu.dead.store(true, Ordering::Release);
    p.timeout = Duration::from_millis(200);
    let seq = p.post_h2d(&emu, DEV_BASE, &[9]).unwrap();
    let start = std::time::Instant::now();
    assert!(matches!(
        p.wait(&emu, seq),
        Err(CopyError::ServiceTimeout { .. })
    ));
    assert!(start.elapsed() < Duration::from_secs(5));
}
