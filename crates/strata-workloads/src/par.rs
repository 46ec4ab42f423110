//! Minimal data parallelism on scoped standard threads (no extra dependency).
//!
//! Work is cut into numbered chunks handed out through an atomic counter, so any thread count
//! gives the same result as long as each chunk's output depends only on its index.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Worker threads to use: the machine's available parallelism (2 here, 16 on the GPU hosts).
#[must_use]
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Runs `work(chunk_index)` for every index in `0..chunks`, spread over all threads.
pub fn for_each_index(chunks: usize, work: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    let workers = threads().min(chunks.max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= chunks {
                        break;
                    }
                    work(index);
                }
            });
        }
    });
}

/// Runs `work(chunk_index, chunk)` over `data` cut into pieces of `chunk_len` items.
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk_len: usize,
    work: impl Fn(usize, &mut [T]) + Sync,
) {
    let pieces: Vec<(usize, &mut [T])> = data.chunks_mut(chunk_len.max(1)).enumerate().collect();
    let queue = Mutex::new(pieces.into_iter());
    let workers = threads();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    // A poisoned lock means another worker panicked; the scope re-raises that.
                    let item = match queue.lock() {
                        Ok(mut guard) => guard.next(),
                        Err(_) => None,
                    };
                    let Some((index, chunk)) = item else { break };
                    work(index, chunk);
                }
            });
        }
    });
}

/// Computes `map(chunk_index)` for every index in `0..chunks` and returns the results in
/// index order.
pub fn map_indices<R: Send>(chunks: usize, map: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let mut slots: Vec<Option<R>> = (0..chunks).map(|_| None).collect();
    for_each_chunk_mut(&mut slots, 1, |index, slot| slot[0] = Some(map(index)));
    slots
        .into_iter()
        .map(|slot| slot.expect("every chunk ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_exactly_once() {
        let sum = AtomicU64::new(0);
        for_each_index(1000, |i| {
            sum.fetch_add(u64::try_from(i).unwrap() + 1, Ordering::Relaxed);
        });
        assert_eq!(sum.into_inner(), 1000 * 1001 / 2);
        let squares = map_indices(50, |i| i * i);
        assert_eq!(squares, (0..50).map(|i| i * i).collect::<Vec<_>>());
        let mut data = vec![0usize; 1003];
        for_each_chunk_mut(&mut data, 10, |chunk, items| {
            for item in items {
                *item = chunk;
            }
        });
        assert!(data.iter().enumerate().all(|(i, c)| *c == i / 10));
        for_each_index(0, |_| panic!("no work expected"));
    }
}
