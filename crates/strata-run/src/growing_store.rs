//! A store made of chunks laid end to end, to which more chunks are added while it is in use:
//! the arena's store over memory nodes borrows what the arena hands out as it grows (see
//! [`crate::node_backing`]), so that several processes share the nodes by what they use,
//! rather than the first taking all that is free.
//!
//! The store has its full (virtual) size from the start; only the front part, up to
//! [`GrowingStore::backed`], is backed by chunks. The arena hands out only backed space, but
//! the pager may read past it: a sequential fault on the last page handed out reads a window
//! ahead. Nothing was ever written there, so such reads get zeros, as from any store's
//! never-written bytes. A write there could only come from a program writing past its
//! allocations into space never handed out; it fails ([`StoreError::Unavailable`]) rather
//! than being dropped, and the pager keeps that page resident and reports the error.
//! Requests that straddle chunks are cut at the boundaries, and a batch goes to each chunk
//! as one batch, so remote chunks keep their requests in flight.

use std::sync::{Arc, RwLock};

use strata_core::store::{ReadRequest, check_range};
use strata_core::{Store, StoreError};

/// One chunk: `[start, start + len)` of the whole store.
#[derive(Debug, Clone)]
struct Chunk {
    start: u64,
    len: u64,
    store: Arc<dyn Store>,
}

/// See the module docs.
#[derive(Debug)]
pub struct GrowingStore {
    size: u64,
    description: String,
    chunks: RwLock<Vec<Chunk>>,
}

impl GrowingStore {
    /// A store of `size` bytes whose first `first_len` bytes are `first` (refused as
    /// [`GrowingStore::extend`] refuses a chunk).
    pub fn new(
        size: u64,
        description: String,
        first: Arc<dyn Store>,
        first_len: u64,
    ) -> Result<Self, String> {
        let this = Self {
            size,
            description,
            chunks: RwLock::new(Vec::new()),
        };
        this.extend(first, first_len)?;
        Ok(this)
    }

    /// Bytes backed by chunks, from the start.
    pub fn backed(&self) -> u64 {
        self.snapshot().last().map_or(0, |c| c.start + c.len)
    }

    /// Appends `store` as the next `len` bytes (it must hold at least that many). Refused
    /// past the store's size or for a store too small.
    pub fn extend(&self, store: Arc<dyn Store>, len: u64) -> Result<(), String> {
        let mut chunks = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        let start = chunks.last().map_or(0, |c| c.start + c.len);
        if start.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(format!(
                "a chunk of {len} bytes at {start} reaches past the store's {} bytes",
                self.size
            ));
        }
        if store.size() < len {
            return Err(format!(
                "a chunk store of {} bytes cannot hold {len}",
                store.size()
            ));
        }
        chunks.push(Chunk { start, len, store });
        Ok(())
    }

    /// The chunks now (cloned, so no lock is held during I/O).
    fn snapshot(&self) -> Vec<Chunk> {
        self.chunks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Cuts `[offset, offset + len)` at chunk boundaries: for each piece, the chunk's index
    /// (`None` past the backed part), the offset in the chunk, and its bytes.
    fn cut(
        &self,
        chunks: &[Chunk],
        offset: u64,
        len: usize,
    ) -> Result<Vec<(Option<usize>, u64, usize)>, StoreError> {
        check_range(self, offset, len)?;
        let backed = chunks.last().map_or(0, |c| c.start + c.len);
        let mut pieces = Vec::new();
        let (mut at, mut left) = (offset, len);
        while left > 0 {
            if at >= backed {
                pieces.push((None, at, left));
                break;
            }
            // Chunks start at 0 and lie end to end, so one starts at or before `at`.
            let i = chunks.partition_point(|c| c.start <= at) - 1;
            let c = &chunks[i];
            let take = usize::try_from(c.start + c.len - at)
                .unwrap_or(usize::MAX)
                .min(left);
            pieces.push((Some(i), at - c.start, take));
            at += take as u64;
            left -= take;
        }
        Ok(pieces)
    }
}

impl Store for GrowingStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let mut request = [ReadRequest { offset, buf }];
        self.read_batch(&mut request)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.write_batch(&[(offset, buf)])
    }

    fn flush(&self) -> Result<(), StoreError> {
        for chunk in self.snapshot() {
            chunk.store.flush()?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        let chunks = self.snapshot();
        let mut per_chunk: Vec<Vec<ReadRequest<'_>>> = chunks.iter().map(|_| Vec::new()).collect();
        for request in requests.iter_mut() {
            let pieces = self.cut(&chunks, request.offset, request.buf.len())?;
            let mut rest: &mut [u8] = request.buf;
            for (chunk, offset, len) in pieces {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len);
                match chunk {
                    Some(chunk) => per_chunk[chunk].push(ReadRequest { offset, buf: piece }),
                    // Never written (see the module docs).
                    None => piece.fill(0),
                }
                rest = tail;
            }
        }
        for (chunk, batch) in chunks.iter().zip(&mut per_chunk) {
            if !batch.is_empty() {
                chunk.store.read_batch(batch)?;
            }
        }
        Ok(())
    }

    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let chunks = self.snapshot();
        let mut per_chunk: Vec<Vec<(u64, &[u8])>> = chunks.iter().map(|_| Vec::new()).collect();
        for &(offset, buf) in requests {
            let mut rest = buf;
            for (chunk, at, len) in self.cut(&chunks, offset, buf.len())? {
                let (piece, tail) = rest.split_at(len);
                let Some(chunk) = chunk else {
                    return Err(StoreError::Unavailable {
                        store: self.description.clone(),
                        reason: format!(
                            "a write at offset {at} lies past the {} bytes borrowed for the arena, in space never handed out (the program wrote past its allocations?); the page stays in memory",
                            chunks.last().map_or(0, |c| c.start + c.len)
                        ),
                    });
                };
                per_chunk[chunk].push((at, piece));
                rest = tail;
            }
        }
        for (chunk, batch) in chunks.iter().zip(&per_chunk) {
            if !batch.is_empty() {
                chunk.store.write_batch(batch)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // offsets inside a small test store
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use strata_core::MemoryStore;

    /// A seeded generator (the test prints its seed).
    struct Lcg(StdRng);
    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0.random_range(0..n.max(1))
        }
    }

    fn memory(len: u64) -> Arc<dyn Store> {
        Arc::new(MemoryStore::new(len))
    }

    /// Random reads and writes, single and batched, across chunks of random sizes added while
    /// the store is in use, must match a plain byte array; nothing past the backed part is
    /// served.
    #[test]
    fn chunks_added_in_use_serve_like_one_store() {
        let seed: u64 = rand::rng().random();
        println!("seed {seed}");
        let mut rng = Lcg(StdRng::seed_from_u64(seed));
        let size = 1u64 << 20;
        let first = 4096 + rng.below(64 << 10);
        let store = GrowingStore::new(size, "growing".into(), memory(first), first).unwrap();
        let mut want = vec![0u8; size as usize];
        for step in 0..3000 {
            let backed = store.backed();
            // Half the store at most is backed, so the part past it is tested too.
            if rng.below(40) == 0 && backed < size / 2 {
                let len = 1 + rng.below(64 << 10);
                // Chunk stores may be larger than the part they back.
                store.extend(memory(len + rng.below(3)), len).unwrap();
                assert_eq!(store.backed(), backed + len);
                continue;
            }
            let backed = store.backed();
            let len = 1 + rng.below(backed.min(20_000)) as usize;
            let offset = rng.below(backed - len as u64 + 1);
            let range = offset as usize..offset as usize + len;
            match rng.below(4) {
                0 => {
                    let data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                    store.write_at(offset, &data).unwrap();
                    want[range].copy_from_slice(&data);
                }
                1 => {
                    // A batch of two writes.
                    let a: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                    let other = rng.below(backed - len as u64 + 1);
                    let b: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                    store.write_batch(&[(offset, &a), (other, &b)]).unwrap();
                    want[range].copy_from_slice(&a);
                    want[other as usize..other as usize + len].copy_from_slice(&b);
                }
                2 => {
                    let mut got = vec![0u8; len];
                    store.read_at(offset, &mut got).unwrap();
                    assert!(got == want[range], "step {step}: read differs");
                }
                _ => {
                    let other = rng.below(backed - len as u64 + 1);
                    let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                    store
                        .read_batch(&mut [
                            ReadRequest {
                                offset,
                                buf: &mut a,
                            },
                            ReadRequest {
                                offset: other,
                                buf: &mut b,
                            },
                        ])
                        .unwrap();
                    assert!(a == want[range], "step {step}: batched read differs");
                    assert!(
                        b == want[other as usize..other as usize + len],
                        "step {step}: batched read differs"
                    );
                }
            }
        }
        store.flush().unwrap();
        // Past the backed part: reads get zeros (never written), also where a read starts
        // inside it; writes are refused, and nothing of them is written inside either
        // (checked before any chunk is touched); past the store: out of range.
        let backed = store.backed();
        assert!(backed < size);
        {
            let mut buf = [7u8; 8];
            store.read_at(backed, &mut buf).unwrap();
            assert_eq!(buf, [0; 8]);
            let mut buf = [7u8; 8];
            store.read_at(backed - 4, &mut buf).unwrap();
            assert_eq!(buf[..4], want[backed as usize - 4..backed as usize]);
            assert_eq!(buf[4..], [0; 4]);
            let e = store.write_at(backed - 4, &[9u8; 8]).unwrap_err();
            assert!(e.to_string().contains("borrowed"), "{e}");
            let mut inside = [0u8; 4];
            store.read_at(backed - 4, &mut inside).unwrap();
            assert_eq!(inside, want[backed as usize - 4..backed as usize]);
        }
        let e = store.read_at(size - 4, &mut [0u8; 8]).unwrap_err();
        assert!(matches!(e, StoreError::OutOfRange { .. }), "{e}");
    }

    #[test]
    fn chunks_past_the_end_or_larger_than_their_store_are_refused() {
        let store = GrowingStore::new(100, "growing".into(), memory(40), 40).unwrap();
        assert!(store.extend(memory(61), 61).is_err(), "past the end");
        assert!(store.extend(memory(10), 20).is_err(), "store too small");
        assert_eq!(store.backed(), 40);
        store.extend(memory(60), 60).unwrap();
        assert_eq!(store.backed(), 100);
        assert!(store.extend(memory(1), 1).is_err());
        assert!(GrowingStore::new(100, "growing".into(), memory(400), 400).is_err());
    }
}
