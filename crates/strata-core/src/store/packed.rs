//! `PackedMemoryStore`: host memory that keeps each slot only up to its last non-zero byte.
//!
//! A codec stores each page in a fixed slot (a header, the compressed bytes, zeros after).
//! In a [`super::MemoryStore`] every slot costs its whole size, at least one 4 KiB page of
//! host memory, so LZ4 in memory saved nothing: a program paged at 4 KiB held its whole data
//! in RAM. Here a slot costs what precedes its zero tail, as a compressing swap device's
//! pages cost their compressed size.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Store, StoreError, check_range};
use crate::units::format_size;

/// Lock shards: threads filling and evicting different pages rarely meet on one.
const SHARDS: usize = 64;

type Shard = Mutex<HashMap<u64, Box<[u8]>>>;

/// A sparse store in host memory whose slots take only their bytes before a zero tail. Safe
/// for concurrent use (slots sit in 64 locked shards).
#[derive(Debug)]
pub struct PackedMemoryStore {
    size: u64,
    slot: u64,
    shards: Box<[Shard]>,
    held: AtomicU64,
}

impl PackedMemoryStore {
    /// A zero-filled store of `size` bytes in slots of `slot_bytes` (a codec's slot: its
    /// writes then start at slot boundaries and each slot is stored on its own).
    ///
    /// # Panics
    /// If `slot_bytes` is 0.
    pub fn new(size: u64, slot_bytes: u64) -> Self {
        assert!(
            slot_bytes > 0,
            "a packed store needs slots of at least one byte"
        );
        Self {
            size,
            slot: slot_bytes,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            held: AtomicU64::new(0),
        }
    }

    /// Bytes of slot contents held now (without the table's own overhead, about 40 bytes a
    /// held slot).
    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    fn shard(&self, slot: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Box<[u8]>>> {
        // The modulo is below SHARDS, so it fits in usize.
        let i = usize::try_from(slot % SHARDS as u64).unwrap_or(0);
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Splits `[offset, offset+len)` into (slot, offset in slot, length) pieces.
    fn pieces(&self, offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
        let slot = self.slot;
        let mut pos = offset;
        let end = offset + len as u64;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let within = pos % slot;
            let take = (slot - within).min(end - pos);
            let piece = (
                pos / slot,
                usize::try_from(within).ok()?,
                usize::try_from(take).ok()?,
            );
            pos += take;
            Some(piece)
        })
    }
}

/// Length of `bytes` without its zero tail (compared eight bytes at a time).
fn used_len(bytes: &[u8]) -> usize {
    let mut end = bytes.len();
    while end >= 8 && bytes[end - 8..end] == [0u8; 8] {
        end -= 8;
    }
    while end > 0 && bytes[end - 1] == 0 {
        end -= 1;
    }
    end
}

impl Store for PackedMemoryStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        let mut done = 0;
        for (slot, within, take) in self.pieces(offset, buf.len()) {
            let out = &mut buf[done..done + take];
            let shard = self.shard(slot);
            let stored = shard.get(&slot).map_or(&[][..], |b| &b[..]);
            let have = stored.len().saturating_sub(within).min(take);
            if have > 0 {
                out[..have].copy_from_slice(&stored[within..within + have]);
            }
            out[have..].fill(0);
            done += take;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_range(self, offset, buf.len())?;
        let mut done = 0;
        for (slot, within, take) in self.pieces(offset, buf.len()) {
            let piece = &buf[done..done + take];
            done += take;
            let mut shard = self.shard(slot);
            let old = shard.remove(&slot);
            let old_len = old.as_ref().map_or(0, |b| b.len());
            // The slot's new contents up to its last non-zero byte: the old bytes around the
            // piece (none when the piece covers them), then the piece.
            let mut new = Vec::with_capacity(old_len.max(within + take));
            if let Some(old) = &old {
                new.extend_from_slice(&old[..within.min(old_len)]);
            }
            new.resize(within, 0);
            new.extend_from_slice(piece);
            if let Some(old) = &old
                && old_len > within + take
            {
                new.extend_from_slice(&old[within + take..]);
            }
            new.truncate(used_len(&new));
            let new_len = new.len();
            if new_len > 0 {
                shard.insert(slot, new.into_boxed_slice());
            }
            drop(shard);
            self.held.fetch_add(new_len as u64, Ordering::Relaxed);
            self.held.fetch_sub(old_len as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "packed memory({}, slots of {})",
            format_size(self.size),
            format_size(self.slot)
        )
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // test sizes are small
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn reads_back_what_a_flat_buffer_holds_under_random_writes() {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64);
        println!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        for slot in [1u64, 7, 24, 4120] {
            let size = slot * 37 + 5;
            let store = PackedMemoryStore::new(size, slot);
            let mut flat = vec![0u8; size as usize];
            for _ in 0..400 {
                let offset = rng.random_range(0..size);
                let len = rng.random_range(0..(size - offset).min(3 * slot + 9)) as usize;
                if rng.random_range(0..3) == 0 {
                    // Runs of zeros, so slots shrink and vanish as well as grow.
                    let bytes = vec![0u8; len];
                    store.write_at(offset, &bytes).unwrap();
                    flat[offset as usize..offset as usize + len].copy_from_slice(&bytes);
                } else {
                    let bytes: Vec<u8> = (0..len).map(|_| rng.random::<u8>()).collect();
                    store.write_at(offset, &bytes).unwrap();
                    flat[offset as usize..offset as usize + len].copy_from_slice(&bytes);
                }
                let offset = rng.random_range(0..size);
                let len = rng.random_range(0..size - offset + 1) as usize;
                let mut got = vec![0xAAu8; len];
                store.read_at(offset, &mut got).unwrap();
                assert_eq!(
                    got,
                    flat[offset as usize..offset as usize + len],
                    "slot {slot}, read of {len} at {offset}"
                );
            }
            let mut all = vec![0u8; size as usize];
            store.read_at(0, &mut all).unwrap();
            assert_eq!(all, flat, "slot {slot}: whole store");
            // What is held is exactly each slot up to its last non-zero byte.
            let want: u64 = flat.chunks(slot as usize).map(|c| used_len(c) as u64).sum();
            assert_eq!(store.held_bytes(), want, "slot {slot}: held bytes");
        }
    }

    #[test]
    fn a_slot_costs_its_bytes_before_the_zero_tail() {
        let slot = 4096 + 24;
        let store = PackedMemoryStore::new(slot * 100, slot);
        for i in 0..100 {
            // A codec's slot: 24 bytes of header and 1000 of payload, zeros after.
            let mut image = vec![0u8; 1024];
            image.iter_mut().for_each(|b| *b = 0x5A);
            store.write_at(i * slot, &image).unwrap();
        }
        assert_eq!(store.held_bytes(), 100 * 1024);
        // Rewriting smaller shrinks; writing zeros frees.
        store.write_at(0, &vec![0u8; slot as usize]).unwrap();
        store.write_at(slot, &[1u8; 10]).unwrap();
        assert_eq!(store.held_bytes(), 98 * 1024 + 1024);
        let mut b = [9u8; 16];
        store.read_at(0, &mut b).unwrap();
        assert_eq!(b, [0u8; 16]);
    }

    #[test]
    fn out_of_range_is_an_error() {
        let store = PackedMemoryStore::new(100, 10);
        assert!(store.write_at(95, &[1u8; 10]).is_err());
        assert!(store.read_at(101, &mut [0u8; 1]).is_err());
        assert!(store.read_at(100, &mut []).is_ok());
    }
}
