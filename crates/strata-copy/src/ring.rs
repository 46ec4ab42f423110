//! The doorbell ring shared by the CPU and the GPU copy service: its byte layout and the
//! producer side of its protocol. Pure host code over raw memory, so the same producer drives
//! the real service kernel (`cuda/copy_service.cu`) and the thread-emulated device of the tests.
//!
//! # Layout
//! The ring is `nslots` slots of [`SLOT_BYTES`] (512 B, eight 64 B cache lines), in
//! write-combined pinned host memory, written `mirrors` times over (mirror `m` starts at slot
//! `m * nslots`), so that each polling warp of the device can read its own copy. Slot
//! `(seq - 1) % nslots` carries request `seq` (from 1). A slot is 64 little-endian 8-byte words;
//! each word holds 4 bytes of data in its low half and the tag [`tag_of`]`(seq)` (never 0) in
//! its high half. Words 0..4 are the header (op and length, device address low and high halves,
//! reserved); words 4..64 carry up to [`INLINE_MAX`] bytes of payload inline.
//!
//! # Why every word is tagged
//! An aligned 8-byte store reaches memory whole, but write-combined stores of one slot may reach
//! memory in any order. With a tag in every word the device accepts a slot only when every word
//! it needs carries the current tag, so the host writes a slot with plain WC stores and one
//! `sfence` at the end, and the device can read the whole slot (header and inline payload) in
//! one parallel round trip over PCIe instead of polling a flag and then reading the payload.
//!
//! # Staging
//! Each slot owns `stage_stride` ([`stage_stride`]) bytes of host-to-device staging (cached or
//! write-combined, as the service is configured) and as many of device-to-host staging
//! (cached). Payloads above
//! [`INLINE_MAX`] go through host-to-device staging at offset `dev % 16` of the slot's area (so
//! source and destination share their alignment and the device copies 16 bytes at a time): the
//! host writes the staging bytes, fences, then writes the ring slot and fences again.
//! Device-to-host copies ([`Op::D2h`]) land at offset `dev % 16` of the slot's device-to-host
//! area; the device fences (system scope) before it publishes `done`.
//!
//! # Tagged answers
//! A small device-to-host copy ([`Op::D2hTagged`], up to half a staging area) answers with
//! tagged words instead: word `i` of the slot's device-to-host area is `tag << 32` | bytes
//! `4i..4i + 4`. The host takes the bytes as soon as every word carries the tag, without waiting
//! for the device's system-scope fence, and zeroes the words it read (tags are never 0, so a
//! stale word can never pass for a new one).
//!
//! # Status block
//! Cached pinned memory of [`STATUS_WORDS`] words: word [`STATUS_DONE`] is the last completed
//! `seq` (the service completes requests strictly in order), word [`STATUS_EXITED`] is the epoch
//! of the last service instance that stopped, word [`STATUS_FAULT`] is the `seq` of a request the
//! device refused (bad op or length): a protocol bug, reported, never acted on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::CopyError;

/// Bytes per ring slot.
pub const SLOT_BYTES: usize = 512;
/// 8-byte words per ring slot.
pub const SLOT_WORDS: usize = SLOT_BYTES / 8;
/// Header words at the start of a slot.
pub const HEADER_WORDS: usize = 4;
/// Largest payload carried inline in the slot.
pub const INLINE_MAX: usize = (SLOT_WORDS - HEADER_WORDS) * 4;
/// Largest length a request can carry (24 bits in the header).
pub const MAX_REQUEST_LEN: usize = (1 << 24) - 1;
/// Words in the status block (three cache lines: done, exited, fault).
pub const STATUS_WORDS: usize = 24;
/// Index of the `done` word.
pub const STATUS_DONE: usize = 0;
/// Index of the `exited` word.
pub const STATUS_EXITED: usize = 8;
/// Index of the `fault` word.
pub const STATUS_FAULT: usize = 16;
/// Room after each slot's staging bytes for the `dev % 16` offset (a cache line, so every
/// slot's area stays 64-byte aligned).
pub const STAGE_PAD: usize = 64;

/// Bytes between two slots' staging areas for staging slots of `stage_slot` bytes.
pub fn stage_stride(stage_slot: usize) -> usize {
    stage_slot + STAGE_PAD
}

/// Where a staged copy of device address `dev` starts within its slot's staging area.
pub fn stage_skew(dev: u64) -> usize {
    usize::try_from(dev & 15).unwrap_or(0)
}

/// What a request asks the device to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Host to device, payload inline in the slot.
    H2dInline = 1,
    /// Host to device, payload in the slot's host-to-device staging area.
    H2dStaged = 2,
    /// Device to host, into the slot's device-to-host staging area.
    D2h = 3,
    /// Stop the service; it writes its epoch into the `exited` word and returns.
    Stop = 4,
    /// Device to host, answered with tagged words in the slot's device-to-host area.
    D2hTagged = 5,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::H2dInline,
            2 => Op::H2dStaged,
            3 => Op::D2h,
            4 => Op::Stop,
            5 => Op::D2hTagged,
            _ => return None,
        })
    }
}

/// A decoded request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Sequence number (from 1).
    pub seq: u64,
    /// Operation.
    pub op: Op,
    /// Payload length in bytes.
    pub len: usize,
    /// Device address.
    pub dev: u64,
}

/// The slot index that carries `seq`.
pub fn slot_of(seq: u64, nslots: u32) -> usize {
    // The remainder is below nslots, a u32, so it fits a usize.
    usize::try_from((seq - 1) % u64::from(nslots)).unwrap_or(0)
}

/// The 32-bit tag of request `seq` (from 1): `(seq - 1) % (2^32 - 1) + 1`, never 0, so zeroed
/// memory never carries a valid tag.
pub fn tag_of(seq: u64) -> u32 {
    u32::try_from(seq.wrapping_sub(1) % 0xFFFF_FFFF + 1).unwrap_or(1)
}

fn word(tag: u32, data: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(data)
}

fn low(w: u64) -> u32 {
    u32::try_from(w & 0xFFFF_FFFF).unwrap_or(0)
}

/// Encodes request `seq` into `out`; returns how many words are meaningful (the device ignores
/// the rest). `inline` must be empty unless `op` is [`Op::H2dInline`].
///
/// # Panics
/// If `len` exceeds [`MAX_REQUEST_LEN`] or `inline` exceeds [`INLINE_MAX`] (callers check).
pub fn encode(
    seq: u64,
    op: Op,
    len: usize,
    dev: u64,
    inline: &[u8],
    out: &mut [u64; SLOT_WORDS],
) -> usize {
    assert!(len <= MAX_REQUEST_LEN && inline.len() <= INLINE_MAX);
    let tag = tag_of(seq);
    let len24 = u32::try_from(len).unwrap_or(0);
    out[0] = word(tag, (u32::from(op as u8) << 24) | len24);
    out[1] = word(tag, low(dev));
    out[2] = word(tag, low(dev >> 32));
    out[3] = word(tag, 0);
    let mut n = HEADER_WORDS;
    for chunk in inline.chunks(4) {
        let mut b = [0u8; 4];
        b[..chunk.len()].copy_from_slice(chunk);
        out[n] = word(tag, u32::from_le_bytes(b));
        n += 1;
    }
    n
}

/// How many slot words a request of this op and length occupies.
pub fn words_for(op: Op, len: usize) -> usize {
    if op == Op::H2dInline {
        HEADER_WORDS + len.div_ceil(4)
    } else {
        HEADER_WORDS
    }
}

/// Decodes a slot as the device does: `None` unless every word the request needs carries the
/// tag of `seq` (the slot is not fully written yet, or holds an older request). On success the
/// inline payload (if any) is copied into `inline` and the request returned.
pub fn decode(seq: u64, words: &[u64; SLOT_WORDS], inline: &mut [u8]) -> Option<Request> {
    let tag = tag_of(seq);
    let tagged = |w: u64| (w >> 32) as u32 == tag;
    if !words[..HEADER_WORDS].iter().all(|&w| tagged(w)) {
        return None;
    }
    let head = low(words[0]);
    let op = Op::from_u8(u8::try_from(head >> 24).unwrap_or(0))?;
    let len = usize::try_from(head & 0x00FF_FFFF).unwrap_or(0);
    let dev = u64::from(low(words[1])) | (u64::from(low(words[2])) << 32);
    let need = words_for(op, len);
    if op == Op::H2dInline {
        if len > INLINE_MAX || !words[HEADER_WORDS..need].iter().all(|&w| tagged(w)) {
            return None;
        }
        for (i, &w) in words[HEADER_WORDS..need].iter().enumerate() {
            let bytes = low(w).to_le_bytes();
            let start = i * 4;
            let n = (len - start).min(4);
            inline[start..start + n].copy_from_slice(&bytes[..n]);
        }
    }
    Some(Request { seq, op, len, dev })
}

/// Words of a tagged device-to-host answer of `len` bytes.
pub fn answer_words(len: usize) -> usize {
    len.div_ceil(4)
}

/// The tagged answer word `i` of request `seq` carrying `data` (up to 4 bytes), as the device
/// writes it.
pub fn answer_word(seq: u64, data: &[u8]) -> u64 {
    let mut b = [0u8; 4];
    b[..data.len()].copy_from_slice(data);
    word(tag_of(seq), u32::from_le_bytes(b))
}

/// Raw addresses of the shared memory: the ring (write-combined), the two staging areas and the
/// status block (cached). Host virtual addresses; the device sees the same addresses (UVA).
#[derive(Debug, Clone, Copy)]
pub struct RingMemory {
    /// `nslots * mirrors * SLOT_BYTES` bytes, 512-byte aligned.
    pub ring: *mut u64,
    /// `nslots * stage_stride(stage_slot)` bytes, host to device, 64-byte aligned.
    pub h2d_stage: *mut u8,
    /// `nslots * stage_stride(stage_slot)` bytes, device to host, 64-byte aligned.
    pub d2h_stage: *mut u8,
    /// [`STATUS_WORDS`] words.
    pub status: *mut u64,
    /// Slots in the ring.
    pub nslots: u32,
    /// Copies of the ring (at least 1): one per polling warp of the device.
    pub mirrors: u32,
    /// Largest staged request in bytes (a multiple of 16).
    pub stage_slot: usize,
}

/// What the producer needs from whoever runs the device side.
pub trait Engine {
    /// Starts a service instance that serves requests from `start_seq` on under `epoch`.
    fn launch(&self, start_seq: u64, epoch: u64) -> Result<(), CopyError>;
    /// Reports a device-side failure (the service died) so a waiter can give up with a reason.
    fn health(&self) -> Result<(), CopyError>;
}

/// A posted device-to-host copy: what [`Producer::finish_d2h`] needs to collect it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct D2hTicket {
    /// Its request.
    pub seq: u64,
    /// Bytes asked for.
    pub len: usize,
    /// The device address (its `% 16` places fenced answers in staging).
    pub dev: u64,
    /// Answered with tagged words ([`Op::D2hTagged`]) rather than after a fence ([`Op::D2h`]).
    pub tagged: bool,
}

/// The host side of the protocol. Not thread-safe by itself: callers hold it behind a mutex.
#[derive(Debug)]
pub struct Producer {
    mem: RingMemory,
    next_seq: u64,
    epoch: u64,
    running: bool,
    /// How long a wait may take before it fails with [`CopyError::ServiceTimeout`].
    pub timeout: Duration,
    /// When the last request was posted (for the idle reaper).
    pub last_use: Instant,
    /// Device-to-host copies of `d2h_tagged_min..=d2h_tagged_max` bytes are answered with
    /// tagged words (the rest after a fence); the maximum is capped at half a staging area.
    pub d2h_tagged_max: usize,
    /// See `d2h_tagged_max`.
    pub d2h_tagged_min: usize,
}

// SAFETY: the raw pointers are to pinned memory owned by whoever owns the Producer (the service
// or the test), which outlives it; all access goes through &mut self behind a mutex.
unsafe impl Send for Producer {}

fn status_word(mem: &RingMemory, i: usize) -> &AtomicU64 {
    // SAFETY: `status` points to STATUS_WORDS aligned u64 words alive as long as `mem`; the
    // device writes them concurrently, hence atomic access.
    unsafe { AtomicU64::from_ptr(mem.status.add(i)) }
}

#[inline]
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions; it orders (and drains) earlier write-combined stores.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// What a spinning wait looks for.
enum Until<'a> {
    /// `done >= seq`.
    Done(u64),
    /// Every word of a tagged answer carries the tag.
    Answer(&'a [AtomicU64], u32),
}

impl Producer {
    /// A producer over zeroed shared memory. Nothing runs until the first request.
    ///
    /// # Safety
    /// `mem` must describe live, zero-initialised memory of the documented sizes that stays
    /// alive and is not written by anyone but this producer and the device side.
    pub unsafe fn new(mem: RingMemory) -> Producer {
        Producer {
            mem,
            next_seq: 1,
            epoch: 0,
            running: false,
            timeout: Duration::from_secs(10),
            last_use: Instant::now(),
            d2h_tagged_max: 0,
            d2h_tagged_min: 0,
        }
    }

    /// The shared memory.
    pub fn memory(&self) -> &RingMemory {
        &self.mem
    }

    /// Whether a service instance is running.
    pub fn running(&self) -> bool {
        self.running
    }

    /// The last completed request.
    pub fn done(&self) -> u64 {
        status_word(&self.mem, STATUS_DONE).load(Ordering::Acquire)
    }

    /// The next sequence number to be posted.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn stride(&self) -> usize {
        stage_stride(self.mem.stage_slot)
    }

    fn ensure_running(&mut self, engine: &dyn Engine) -> Result<(), CopyError> {
        if !self.running {
            self.epoch += 1;
            engine.launch(self.next_seq, self.epoch)?;
            self.running = true;
        }
        Ok(())
    }

    /// Waits until slot reuse is safe for `seq` (request `seq - nslots` completed).
    fn wait_slot_free(&mut self, engine: &dyn Engine, seq: u64) -> Result<(), CopyError> {
        let n = u64::from(self.mem.nslots);
        if seq > n {
            self.wait(engine, seq - n)?;
        }
        Ok(())
    }

    fn write_slot(&mut self, seq: u64, words: &[u64; SLOT_WORDS], used: usize) {
        let slot = slot_of(seq, self.mem.nslots);
        let nslots = usize::try_from(self.mem.nslots).unwrap_or(0);
        for m in 0..usize::try_from(self.mem.mirrors.max(1)).unwrap_or(1) {
            let base = (m * nslots + slot) * SLOT_WORDS;
            for (i, &w) in words[..used].iter().enumerate() {
                // SAFETY: base + i < nslots * mirrors * SLOT_WORDS; the slot is free (its
                // previous request completed), so only we write it; volatile because the
                // device reads it.
                unsafe { self.mem.ring.add(base + i).write_volatile(w) };
            }
        }
        store_fence();
    }

    /// Posts a host-to-device copy of `data` to device address `dev` and returns its `seq`
    /// without waiting. `data.len()` must not exceed `stage_slot` (callers split).
    pub fn post_h2d(
        &mut self,
        engine: &dyn Engine,
        dev: u64,
        data: &[u8],
    ) -> Result<u64, CopyError> {
        self.check_len(data.len())?;
        self.ensure_running(engine)?;
        let seq = self.next_seq;
        self.wait_slot_free(engine, seq)?;
        let mut words = [0u64; SLOT_WORDS];
        let used = if data.len() <= INLINE_MAX {
            encode(seq, Op::H2dInline, data.len(), dev, data, &mut words)
        } else {
            let off = slot_of(seq, self.mem.nslots) * self.stride() + stage_skew(dev);
            // SAFETY: the staging area of a free ring slot has stage_stride bytes that only we
            // write now; skew + data.len() <= 15 + stage_slot < stage_stride was checked.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.mem.h2d_stage.add(off),
                    data.len(),
                );
            }
            // The staged bytes carry no tags: they must be in memory before the slot is.
            store_fence();
            encode(seq, Op::H2dStaged, data.len(), dev, &[], &mut words)
        };
        self.write_slot(seq, &words, used);
        self.next_seq += 1;
        self.last_use = Instant::now();
        Ok(seq)
    }

    /// Posts a device-to-host copy of `len` bytes from `dev`; collect it with
    /// [`Self::finish_d2h`].
    pub fn post_d2h(
        &mut self,
        engine: &dyn Engine,
        dev: u64,
        len: usize,
    ) -> Result<D2hTicket, CopyError> {
        self.check_len(len)?;
        self.ensure_running(engine)?;
        let seq = self.next_seq;
        self.wait_slot_free(engine, seq)?;
        let tagged =
            len >= self.d2h_tagged_min && len <= self.d2h_tagged_max.min(self.stride() / 8 * 4);
        let op = if tagged { Op::D2hTagged } else { Op::D2h };
        let mut words = [0u64; SLOT_WORDS];
        let used = encode(seq, op, len, dev, &[], &mut words);
        self.write_slot(seq, &words, used);
        self.next_seq += 1;
        self.last_use = Instant::now();
        Ok(D2hTicket {
            seq,
            len,
            dev,
            tagged,
        })
    }

    fn check_len(&self, len: usize) -> Result<(), CopyError> {
        if len > self.mem.stage_slot || len > MAX_REQUEST_LEN {
            return Err(CopyError::Protocol(format!(
                "request of {len} bytes exceeds the {} byte staging slot: split it",
                self.mem.stage_slot
            )));
        }
        Ok(())
    }

    /// The tagged answer words of slot `slot`.
    fn answer(&self, slot: usize, words: usize) -> &[AtomicU64] {
        // SAFETY: the slot's device-to-host area has stage_stride bytes, 64-byte aligned, and
        // a tagged answer is at most half of it (post_d2h checks); the device writes these
        // words concurrently, hence atomics. The slice lives no longer than &self, and the
        // slot is not reused before the request is collected (that needs &mut self).
        unsafe {
            std::slice::from_raw_parts(
                self.mem
                    .d2h_stage
                    .add(slot * self.stride())
                    .cast::<AtomicU64>(),
                words,
            )
        }
    }

    /// Waits for the device-to-host copy `t` and fills `out` (`t.len` bytes) with its bytes.
    pub fn finish_d2h(
        &mut self,
        engine: &dyn Engine,
        t: &D2hTicket,
        out: &mut [u8],
    ) -> Result<(), CopyError> {
        if out.len() != t.len || t.seq >= self.next_seq {
            return Err(CopyError::Protocol(format!(
                "collecting request {} of {} bytes into {} bytes",
                t.seq,
                t.len,
                out.len()
            )));
        }
        let slot = slot_of(t.seq, self.mem.nslots);
        if !t.tagged {
            self.wait(engine, t.seq)?;
            let off = slot * self.stride() + stage_skew(t.dev);
            // SAFETY: the request completed (the device fenced before publishing `done`) and
            // its slot is not reused until we post `nslots` more requests, which needs &mut
            // self; skew + len < stage_stride.
            unsafe {
                std::ptr::copy_nonoverlapping(self.mem.d2h_stage.add(off), out.as_mut_ptr(), t.len);
            }
            return Ok(());
        }
        let n = answer_words(t.len);
        let tag = tag_of(t.seq);
        // Reborrow the words through a raw pointer so `spin` can take &mut self.
        let words: *const [AtomicU64] = self.answer(slot, n);
        // SAFETY: see `answer`; the memory outlives this call.
        let words = unsafe { &*words };
        self.spin(engine, t.seq, &Until::Answer(words, tag))?;
        for (chunk, w) in out.chunks_mut(4).zip(words) {
            let v = low(w.load(Ordering::Relaxed)).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
            // Read: zero it, so a later request of this slot never sees a valid stale word.
            w.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Waits until request `seq` (and so every earlier one) completed. Spins, then yields;
    /// checks the engine's health every few milliseconds and gives up after `timeout`.
    pub fn wait(&mut self, engine: &dyn Engine, seq: u64) -> Result<(), CopyError> {
        if seq >= self.next_seq {
            return Err(CopyError::Protocol(format!(
                "waiting for request {seq}, which was never posted"
            )));
        }
        self.spin(engine, seq, &Until::Done(seq))
    }

    fn reached(&self, until: &Until<'_>) -> bool {
        match *until {
            Until::Done(seq) => status_word(&self.mem, STATUS_DONE).load(Ordering::Acquire) >= seq,
            Until::Answer(words, tag) => {
                // The last word first: it usually lands last.
                let ok = words
                    .iter()
                    .rev()
                    .all(|w| (w.load(Ordering::Relaxed) >> 32) as u32 == tag);
                std::sync::atomic::fence(Ordering::Acquire);
                ok
            }
        }
    }

    fn spin(&mut self, engine: &dyn Engine, seq: u64, until: &Until<'_>) -> Result<(), CopyError> {
        if self.reached(until) {
            return Ok(());
        }
        let start = Instant::now();
        let mut last_check = start;
        let mut spins: u64 = 0;
        loop {
            for _ in 0..64 {
                if self.reached(until) {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            spins += 64;
            if spins.is_multiple_of(1 << 12) {
                let now = Instant::now();
                let fault = status_word(&self.mem, STATUS_FAULT).load(Ordering::Acquire);
                if fault != 0 {
                    self.running = false;
                    return Err(CopyError::Protocol(format!(
                        "the copy service refused request {fault} as malformed"
                    )));
                }
                if now.duration_since(last_check) > Duration::from_millis(5) {
                    last_check = now;
                    if let Err(e) = engine.health() {
                        self.running = false;
                        return Err(e);
                    }
                }
                if now.duration_since(start) > self.timeout {
                    return Err(CopyError::ServiceTimeout {
                        seq,
                        done: self.done(),
                        waited: now.duration_since(start),
                    });
                }
                if now.duration_since(start) > Duration::from_millis(1) {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Waits for every posted request.
    pub fn flush(&mut self, engine: &dyn Engine) -> Result<(), CopyError> {
        if self.next_seq > 1 {
            self.wait(engine, self.next_seq - 1)?;
        }
        Ok(())
    }

    /// Stops the running service (if any) after it finished everything posted, and waits until
    /// it reported its exit. The next request starts a new instance.
    pub fn stop(&mut self, engine: &dyn Engine) -> Result<(), CopyError> {
        if !self.running {
            return Ok(());
        }
        let seq = self.next_seq;
        self.wait_slot_free(engine, seq)?;
        let mut words = [0u64; SLOT_WORDS];
        let used = encode(seq, Op::Stop, 0, 0, &[], &mut words);
        self.write_slot(seq, &words, used);
        self.next_seq += 1;
        self.wait(engine, seq)?;
        let exited = status_word(&self.mem, STATUS_EXITED);
        let start = Instant::now();
        while exited.load(Ordering::Acquire) != self.epoch {
            if start.elapsed() > self.timeout {
                return Err(CopyError::ServiceTimeout {
                    seq,
                    done: self.done(),
                    waited: start.elapsed(),
                });
            }
            std::hint::spin_loop();
        }
        self.running = false;
        Ok(())
    }
}
