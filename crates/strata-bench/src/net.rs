//! Measurements behind `strata bench remote` that need no pager: raw page throughput of a
//! store at a given batch depth, and the loopback TCP ceiling of this host. Not used on any
//! data path.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use strata_core::store::{ReadRequest, Store, StoreError};

/// Kinds of page contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PageData {
    /// Random bytes (incompressible).
    Random,
    /// Text-like words (LZ4 compresses these ~3-5x).
    Text,
    /// Smooth `f64` fields (what ZFP is for).
    Floats,
}

impl PageData {
    /// Fills `page` (page number `index`) with this kind of data; `seed` varies it per run.
    pub fn fill(self, page: &mut [u8], index: u64, seed: u64) {
        let mut state = seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            // xorshift64*: cheap, good enough to defeat compression.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        match self {
            PageData::Random => {
                for chunk in page.chunks_mut(8) {
                    let v = next().to_le_bytes();
                    chunk.copy_from_slice(&v[..chunk.len()]);
                }
            }
            PageData::Text => {
                const WORDS: [&[u8]; 8] = [
                    b"memory ", b"strata ", b"page ", b"remote ", b"node ", b"fault ", b"the ",
                    b"of ",
                ];
                let mut at = 0;
                while at < page.len() {
                    let word = WORDS[usize::try_from(next() % 8).unwrap_or(0)];
                    let take = word.len().min(page.len() - at);
                    page[at..at + take].copy_from_slice(&word[..take]);
                    at += take;
                }
            }
            PageData::Floats => {
                let phase = (next() % 1000) as f64 / 1000.0;
                for (i, chunk) in page.chunks_mut(8).enumerate() {
                    let x = ((index * 4096 + i as u64) as f64) * 1e-3 + phase;
                    let v = (x.sin() * 100.0).to_le_bytes();
                    chunk.copy_from_slice(&v[..chunk.len()]);
                }
            }
        }
    }
}

/// Page throughput of one store.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Throughput {
    /// Median bytes per second of writing every page, in batches of `depth`.
    pub write_bytes_per_sec: f64,
    /// Median bytes per second of reading every page in a shuffled order, in batches.
    pub read_bytes_per_sec: f64,
    /// Median microseconds per page read (batch time / batch size).
    pub read_us_per_page: f64,
    /// Every repeat's write rate, bytes per second (their spread is the run-to-run spread
    /// `strata bench compare` allows).
    pub write_samples: Vec<f64>,
    /// Every repeat's read rate, bytes per second.
    pub read_samples: Vec<f64>,
}

/// Writes then reads every page of `store` (`repeats` times, median), from `submitters`
/// threads that each issue batches of `depth` pages (so up to `submitters * depth` are in
/// flight, and one thread's checking overlaps another's waiting, as with a pager's fillers),
/// verifying every page read back: a fast store that returns wrong bytes is a bug, not a
/// result.
pub fn page_throughput(
    store: &dyn Store,
    page: usize,
    depth: usize,
    submitters: usize,
    repeats: usize,
    data: PageData,
    seed: u64,
) -> Result<Throughput, StoreError> {
    let pages = store.size() / page as u64;
    let depth = depth.max(1);
    let images: Vec<Vec<u8>> = (0..depth.min(64))
        .map(|i| {
            let mut p = vec![0u8; page];
            data.fill(&mut p, i as u64, seed);
            p
        })
        .collect();
    // Page `i` holds image `i % images.len()` with its index stamped in the first 8 bytes.
    let image_of = |i: u64| -> Vec<u8> {
        let mut p = images[usize::try_from(i).unwrap_or(0) % images.len()].clone();
        p[..8].copy_from_slice(&i.to_le_bytes());
        p
    };
    let mut order: Vec<u64> = (0..pages).collect();
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    let mut per_page = Vec::new();
    let mut state = seed | 1;
    for _ in 0..repeats.max(1) {
        let sequential: Vec<u64> = (0..pages).collect();
        let started = Instant::now();
        in_parallel(&sequential, depth, submitters, |chunk| {
            let bufs: Vec<Vec<u8>> = chunk.iter().map(|i| image_of(*i)).collect();
            let requests: Vec<(u64, &[u8])> = chunk
                .iter()
                .zip(&bufs)
                .map(|(i, b)| (i * page as u64, b.as_slice()))
                .collect();
            store.write_batch(&requests).map(|()| Vec::new())
        })?;
        writes.push((pages * page as u64) as f64 / started.elapsed().as_secs_f64());
        // Fisher-Yates with xorshift: a different random order each repeat.
        for i in (1..order.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, usize::try_from(state % (i as u64 + 1)).unwrap_or(0));
        }
        let started = Instant::now();
        let times = in_parallel(&order, depth, submitters, |chunk| {
            let mut bufs: Vec<Vec<u8>> = chunk.iter().map(|_| vec![0u8; page]).collect();
            let t = Instant::now();
            let mut requests: Vec<ReadRequest<'_>> = chunk
                .iter()
                .zip(bufs.iter_mut())
                .map(|(i, b)| ReadRequest {
                    offset: i * page as u64,
                    buf: b.as_mut_slice(),
                })
                .collect();
            store.read_batch(&mut requests)?;
            let us = t.elapsed().as_secs_f64() * 1e6 / chunk.len() as f64;
            for (i, b) in chunk.iter().zip(&bufs) {
                if b[..] != image_of(*i)[..] {
                    return Err(StoreError::Corrupt {
                        store: store.describe(),
                        offset: i * page as u64,
                        detail: "the page read back differs from the page written".into(),
                    });
                }
            }
            Ok(vec![us])
        })?;
        reads.push((pages * page as u64) as f64 / started.elapsed().as_secs_f64());
        per_page.extend(times);
    }
    Ok(Throughput {
        write_samples: writes.clone(),
        read_samples: reads.clone(),
        write_bytes_per_sec: median(&mut writes),
        read_bytes_per_sec: median(&mut reads),
        read_us_per_page: median(&mut per_page),
    })
}

/// Runs `work` on consecutive chunks of `items` (`depth` each) from `threads` threads that
/// take the next chunk as they finish one; collects what each call returns.
fn in_parallel<F>(
    items: &[u64],
    depth: usize,
    threads: usize,
    work: F,
) -> Result<Vec<f64>, StoreError>
where
    F: Fn(&[u64]) -> Result<Vec<f64>, StoreError> + Sync,
{
    let chunks: Vec<&[u64]> = items.chunks(depth.max(1)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(chunk) = chunks.get(k) else {
                            return Ok(out);
                        };
                        out.extend(work(chunk)?);
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            all.extend(h.join().expect("a benchmark thread panicked")?);
        }
        Ok(all)
    })
}

/// Median of a non-empty list (0 for an empty one).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Bytes per second one TCP connection moves over 127.0.0.1 on this host, in 64 KiB writes
/// for about `duration`: the ceiling any TCP transport here can reach.
pub fn loopback_tcp_ceiling(duration: Duration) -> std::io::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut socket, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match socket.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    });
    let mut socket = TcpStream::connect(address)?;
    socket.set_nodelay(true)?;
    let chunk = vec![0x5au8; 64 << 10];
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < duration {
        socket.write_all(&chunk)?;
        sent += chunk.len() as u64;
    }
    drop(socket);
    let received = reader
        .join()
        .map_err(|_| std::io::Error::other("reader thread panicked"))??;
    Ok(received.min(sent) as f64 / started.elapsed().as_secs_f64())
}
