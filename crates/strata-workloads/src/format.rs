//! Strata's binary CSR graph file, so that a large graph is generated once and reused.
//!
//! Layout (all integers little-endian):
//! ```text
//! offset  size  field
//!      0     8  magic "STRATCSR"
//!      8     4  version (1)
//!     12     4  flags (bit 0: undirected, bit 1: duplicates removed; both set by Strata)
//!     16     8  vertices
//!     24     8  arcs (neighbour entries)
//!     32     4  generator (0 unknown, 1 Kronecker, 2 uniform)
//!     36     4  scale (log2 vertices; 0 if not a power of two)
//!     40     4  edge factor
//!     44     4  reserved (0)
//!     48     8  seed
//!     56     8  checksum of the offsets array
//!     64     8  checksum of the neighbours array
//!     72     8  checksum of bytes 0..72 of this header
//!     80        offsets: (vertices + 1) x u64, then neighbours: arcs x u32
//! ```
//! Checksums are [`checksum`] over the arrays' little-endian bytes: corruption and truncation
//! are reported, never silently loaded.

use crate::csr::Csr;
use crate::par;
use crate::rng::mix64;
use indicatif::ProgressBar;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// File magic.
pub const MAGIC: [u8; 8] = *b"STRATCSR";
/// Format version written by this code.
pub const VERSION: u32 = 1;
/// Header size in bytes.
pub const HEADER_BYTES: usize = 80;
const FLAG_UNDIRECTED: u32 = 1;
const FLAG_DEDUPLICATED: u32 = 2;
/// Elements converted per I/O block.
const IO_BLOCK: usize = 1 << 20;

/// How a stored graph was generated (recorded so a cached file can be matched to a request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphOrigin {
    /// 0 unknown, 1 Kronecker, 2 uniform.
    pub generator: u32,
    /// log2 of the vertex count (0 if not a power of two).
    pub scale: u32,
    /// Generated edges per vertex.
    pub edge_factor: u32,
    /// Generator seed.
    pub seed: u64,
}

/// Generator code for Kronecker graphs.
pub const GENERATOR_KRONECKER: u32 = 1;
/// Generator code for uniform random graphs.
pub const GENERATOR_UNIFORM: u32 = 2;

/// Errors reading or writing a graph file.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Underlying I/O failed.
    #[error("graph file {path}: {source}")]
    Io {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Not a Strata graph file.
    #[error(
        "{path} is not a Strata graph file (bad magic); regenerate it with `strata bench graph --graph-file`"
    )]
    Magic {
        /// File.
        path: String,
    },
    /// Unsupported version.
    #[error(
        "{path} has format version {version}; this Strata reads version {VERSION}: regenerate the file"
    )]
    Version {
        /// File.
        path: String,
        /// Version found.
        version: u32,
    },
    /// Checksum mismatch or bad sizes.
    #[error("{path} is corrupt ({what}); delete it and regenerate")]
    Corrupt {
        /// File.
        path: String,
        /// What failed.
        what: String,
    },
}

/// Bytes per independently hashed block of [`checksum`].
const CHECKSUM_BLOCK: usize = 1 << 20;

/// A 64-bit checksum of a byte string: a word-wise multiply-mix per 1 MiB block, blocks
/// combined in order (so it can be computed in parallel and is independent of thread count).
#[must_use]
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut sum = StreamingChecksum::new(bytes.len() as u64);
    sum.update(bytes);
    sum.finish()
}

fn block_hash(block: &[u8]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64 ^ block.len() as u64;
    let mut words = block.chunks_exact(8);
    for w in &mut words {
        let word = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ mix64(word))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    mix64(h ^ u64::from_le_bytes(tail))
}

/// [`checksum`] of a byte string that arrives in pieces (of any sizes), so a file's arrays
/// are checked as they stream past instead of from a second copy in memory.
struct StreamingChecksum {
    acc: u64,
    /// Bytes of a block not yet complete.
    carry: Vec<u8>,
}

impl StreamingChecksum {
    /// `total` is the length of the whole string, which the checksum covers.
    fn new(total: u64) -> Self {
        Self {
            acc: total,
            carry: Vec::new(),
        }
    }

    fn combine(&mut self, part: u64) {
        self.acc = mix64(self.acc ^ part).wrapping_add(0x632b_e59b_d9b4_e019);
    }

    fn update(&mut self, mut bytes: &[u8]) {
        if !self.carry.is_empty() {
            let take = (CHECKSUM_BLOCK - self.carry.len()).min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() == CHECKSUM_BLOCK {
                let part = block_hash(&self.carry);
                self.combine(part);
                self.carry.clear();
            }
        }
        let whole = bytes.len() / CHECKSUM_BLOCK;
        let block = |b: usize| block_hash(&bytes[b * CHECKSUM_BLOCK..(b + 1) * CHECKSUM_BLOCK]);
        let parts = if whole > 1 {
            par::map_indices(whole, block)
        } else {
            (0..whole).map(block).collect()
        };
        for part in parts {
            self.combine(part);
        }
        self.carry
            .extend_from_slice(&bytes[whole * CHECKSUM_BLOCK..]);
    }

    fn finish(mut self) -> u64 {
        if !self.carry.is_empty() {
            let part = block_hash(&self.carry);
            self.combine(part);
        }
        self.acc
    }
}

fn u64_bytes(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn u32_bytes(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> FormatError + '_ {
    move |source| FormatError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `graph` to `path` (through a temporary file renamed at the end, so a crash never
/// leaves a half-written file under the final name).
///
/// # Errors
/// I/O failures, named with the path.
pub fn write(
    path: &Path,
    graph: &Csr,
    origin: GraphOrigin,
    progress: &ProgressBar,
) -> Result<(), FormatError> {
    let err = io_err(path);
    // Checksums block by block, so writing never holds a second copy of the graph.
    let mut offsets_sum = StreamingChecksum::new(graph.offsets.len() as u64 * 8);
    for block in graph.offsets.chunks(IO_BLOCK) {
        offsets_sum.update(&u64_bytes(block));
    }
    let mut neighbours_sum = StreamingChecksum::new(graph.arcs() * 4);
    for block in graph.neighbours.chunks(IO_BLOCK) {
        neighbours_sum.update(&u32_bytes(block));
    }
    let (offsets_sum, neighbours_sum) = (offsets_sum.finish(), neighbours_sum.finish());
    let mut header = Vec::with_capacity(HEADER_BYTES);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&(FLAG_UNDIRECTED | FLAG_DEDUPLICATED).to_le_bytes());
    header.extend_from_slice(&(graph.vertices() as u64).to_le_bytes());
    header.extend_from_slice(&graph.arcs().to_le_bytes());
    for word in [origin.generator, origin.scale, origin.edge_factor, 0] {
        header.extend_from_slice(&word.to_le_bytes());
    }
    for word in [origin.seed, offsets_sum, neighbours_sum] {
        header.extend_from_slice(&word.to_le_bytes());
    }
    let header_sum = checksum(&header);
    header.extend_from_slice(&header_sum.to_le_bytes());
    debug_assert_eq!(header.len(), HEADER_BYTES);

    let tmp = path.with_extension("partial");
    let file = File::create(&tmp).map_err(&err)?;
    let mut out = BufWriter::with_capacity(8 << 20, file);
    out.write_all(&header).map_err(&err)?;
    progress.set_length(graph.offsets.len() as u64 + graph.arcs());
    for block in graph.offsets.chunks(IO_BLOCK) {
        out.write_all(&u64_bytes(block)).map_err(&err)?;
        progress.inc(block.len() as u64);
    }
    for block in graph.neighbours.chunks(IO_BLOCK) {
        out.write_all(&u32_bytes(block)).map_err(&err)?;
        progress.inc(block.len() as u64);
    }
    let file = out.into_inner().map_err(|e| err(e.into_error()))?;
    file.sync_all().map_err(&err)?;
    std::fs::rename(&tmp, path).map_err(&err)?;
    Ok(())
}

/// Reads the header only: (origin, vertices, arcs).
///
/// # Errors
/// I/O failures, a foreign file, another version, or a corrupt header.
pub fn read_header(path: &Path) -> Result<(GraphOrigin, u64, u64), FormatError> {
    let mut file = File::open(path).map_err(io_err(path))?;
    let (origin, vertices, arcs, _, _) = parse_header(path, &mut file)?;
    Ok((origin, vertices, arcs))
}

fn parse_header(
    path: &Path,
    input: &mut impl Read,
) -> Result<(GraphOrigin, u64, u64, u64, u64), FormatError> {
    let name = path.display().to_string();
    let mut header = [0u8; HEADER_BYTES];
    input.read_exact(&mut header).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FormatError::Corrupt {
                path: name.clone(),
                what: "shorter than its header".into(),
            }
        } else {
            FormatError::Io {
                path: name.clone(),
                source: e,
            }
        }
    })?;
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    if header[..8] != MAGIC {
        return Err(FormatError::Magic { path: name });
    }
    if u32_at(8) != VERSION {
        return Err(FormatError::Version {
            path: name,
            version: u32_at(8),
        });
    }
    if checksum(&header[..72]) != u64_at(72) {
        return Err(FormatError::Corrupt {
            path: name,
            what: "header checksum mismatch".into(),
        });
    }
    let origin = GraphOrigin {
        generator: u32_at(32),
        scale: u32_at(36),
        edge_factor: u32_at(40),
        seed: u64_at(48),
    };
    Ok((origin, u64_at(16), u64_at(24), u64_at(56), u64_at(64)))
}

/// Most vertices a graph file may hold: vertex ids are 32-bit and the workloads keep one
/// bit free (see [`crate::csr`]).
pub const MAX_VERTICES: u64 = 1 << 31;

/// Reads a graph written by [`fn@write`], verifying sizes, checksums and CSR invariants.
///
/// Nothing is allocated for the header's counts until the file's contents confirm them: the
/// counts are checked against the format's limits, the file's length and this machine's
/// memory; then the offsets are streamed once without being kept (checksum, first and last
/// value, order) and only then read into memory, which fixes the neighbour count. A header
/// claiming billions of vertices over a small sparse file is refused after one pass over its
/// holes, with a few MiB of buffers.
///
/// # Errors
/// I/O failures, a foreign file, another version, counts beyond the format or this machine,
/// truncation or checksum mismatch.
pub fn read(path: &Path, progress: &ProgressBar) -> Result<(Csr, GraphOrigin), FormatError> {
    let name = path.display().to_string();
    let corrupt = |what: String| FormatError::Corrupt {
        path: name.clone(),
        what,
    };
    let file = File::open(path).map_err(io_err(path))?;
    let file_len = file.metadata().map_err(io_err(path))?.len();
    let mut input = BufReader::with_capacity(IO_BLOCK * 8, file);
    let (origin, vertices, arcs, offsets_sum, neighbours_sum) = parse_header(path, &mut input)?;
    if vertices > MAX_VERTICES {
        return Err(corrupt(format!(
            "the header claims {vertices} vertices; the format holds at most 2^31"
        )));
    }
    // A simple graph has at most n(n-1) arcs; the bound also keeps the sizes below in range.
    if arcs > vertices * vertices.saturating_sub(1) {
        return Err(corrupt(format!(
            "the header claims {arcs} arcs, more arcs than {vertices} vertices can have"
        )));
    }
    // Both counts are bounded above, so only the sum can overflow.
    let offsets_bytes = (vertices + 1) * 8;
    let body = offsets_bytes.checked_add(arcs * 4);
    let expected = body.and_then(|b| b.checked_add(HEADER_BYTES as u64));
    let Some(body) = body.filter(|_| expected == Some(file_len)) else {
        return Err(corrupt(format!(
            "size {file_len} bytes, but the header's {vertices} vertices and {arcs} arcs need {}",
            expected.map_or_else(|| "more than 2^64".to_string(), |e| e.to_string())
        )));
    };
    if let Some(memory) = machine_memory()
        && body > memory
    {
        return Err(corrupt(format!(
            "the header's {vertices} vertices and {arcs} arcs need {body} bytes of memory, more than this machine's {memory} (RAM and swap)"
        )));
    }
    let n = usize::try_from(vertices).map_err(|_| corrupt("vertex count too large".into()))?;
    let m = usize::try_from(arcs).map_err(|_| corrupt("arc count too large".into()))?;
    progress.set_length(2 * (vertices + 1) + arcs);
    let mut buffer = vec![0u8; IO_BLOCK * 8];
    let read_err = io_err(path);

    // Pass 1: offsets streamed, checked, not kept.
    let mut sum = StreamingChecksum::new(offsets_bytes);
    let mut previous = 0u64;
    let mut done = 0;
    while done < n + 1 {
        let take = (n + 1 - done).min(IO_BLOCK);
        let bytes = &mut buffer[..take * 8];
        input.read_exact(bytes).map_err(&read_err)?;
        sum.update(bytes);
        for (i, c) in bytes.chunks_exact(8).enumerate() {
            let offset = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            if (done + i == 0 && offset != 0) || offset < previous || offset > arcs {
                return Err(corrupt(format!(
                    "offset {offset} of vertex {} is out of order or beyond the {arcs} arcs",
                    done + i
                )));
            }
            previous = offset;
        }
        done += take;
        progress.inc(take as u64);
    }
    if sum.finish() != offsets_sum {
        return Err(corrupt("offsets checksum mismatch".into()));
    }
    if previous != arcs {
        return Err(corrupt(format!(
            "last offset {previous} differs from the header's {arcs} arcs"
        )));
    }

    // Pass 2: the confirmed offsets into memory (checked again: the file may have changed).
    input
        .seek(SeekFrom::Start(HEADER_BYTES as u64))
        .map_err(&read_err)?;
    let mut sum = StreamingChecksum::new(offsets_bytes);
    let mut offsets = Vec::with_capacity(n + 1);
    while offsets.len() < n + 1 {
        let take = (n + 1 - offsets.len()).min(IO_BLOCK);
        let bytes = &mut buffer[..take * 8];
        input.read_exact(bytes).map_err(&read_err)?;
        sum.update(bytes);
        offsets.extend(
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
        );
        progress.inc(take as u64);
    }
    if sum.finish() != offsets_sum {
        return Err(corrupt(
            "offsets checksum mismatch on the second read (the file changed while read)".into(),
        ));
    }

    let mut sum = StreamingChecksum::new(arcs * 4);
    let mut neighbours = Vec::with_capacity(m);
    while neighbours.len() < m {
        let take = (m - neighbours.len()).min(IO_BLOCK);
        let bytes = &mut buffer[..take * 4];
        input.read_exact(bytes).map_err(&read_err)?;
        sum.update(bytes);
        neighbours.extend(
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))),
        );
        progress.inc(take as u64);
    }
    if sum.finish() != neighbours_sum {
        return Err(corrupt("neighbours checksum mismatch".into()));
    }
    let graph = Csr {
        offsets,
        neighbours,
    };
    // Checksums catch accidental damage; the structural check catches a file written by a
    // buggy producer with valid checksums (cheap next to reading the file).
    graph.check().map_err(|e| corrupt(e.to_string()))?;
    Ok((graph, origin))
}

/// RAM plus swap in bytes, from `/proc/meminfo`; `None` where that cannot be read. A graph
/// that needs more cannot be loaded whatever else runs, so its file is refused up front.
fn machine_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<u64> {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    };
    Some(
        kib("MemTotal")?
            .saturating_add(kib("SwapTotal").unwrap_or(0))
            .saturating_mul(1024),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{KroneckerParams, kronecker};

    fn temp_path(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "strata-graph-{tag}-{}-{}.csr",
            std::process::id(),
            crate::test_seed()
        ))
    }

    #[test]
    fn round_trip_and_corruption_detection() {
        let seed = crate::test_seed();
        let list = kronecker(
            &KroneckerParams::graph500(11, 8, seed),
            &ProgressBar::hidden(),
        )
        .unwrap();
        let graph = Csr::from_edges(&list, &ProgressBar::hidden()).unwrap();
        let origin = GraphOrigin {
            generator: GENERATOR_KRONECKER,
            scale: 11,
            edge_factor: 8,
            seed,
        };
        let path = temp_path("rt");
        write(&path, &graph, origin, &ProgressBar::hidden()).unwrap();
        let (back, back_origin) = read(&path, &ProgressBar::hidden()).unwrap();
        assert_eq!(back, graph);
        assert_eq!(back_origin, origin);
        assert_eq!(read_header(&path).unwrap(), (origin, 2048, graph.arcs()));

        let pristine = std::fs::read(&path).unwrap();
        // A flipped bit in the neighbours, in the offsets, and in the header.
        for at in [pristine.len() - 3, HEADER_BYTES + 16, 20] {
            let mut bytes = pristine.clone();
            bytes[at] ^= 0x10;
            std::fs::write(&path, &bytes).unwrap();
            let err = read(&path, &ProgressBar::hidden()).unwrap_err();
            assert!(
                matches!(err, FormatError::Corrupt { .. }),
                "byte {at}: {err}"
            );
        }
        // Truncated, wrong magic, future version.
        std::fs::write(&path, &pristine[..pristine.len() - 4]).unwrap();
        assert!(matches!(
            read(&path, &ProgressBar::hidden()),
            Err(FormatError::Corrupt { .. })
        ));
        let mut bytes = pristine.clone();
        bytes[0] = b'X';
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            read(&path, &ProgressBar::hidden()),
            Err(FormatError::Magic { .. })
        ));
        let mut bytes = pristine;
        bytes[8] = 9;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            read(&path, &ProgressBar::hidden()),
            Err(FormatError::Version { version: 9, .. })
        ));
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(
            read(&path, &ProgressBar::hidden()),
            Err(FormatError::Corrupt { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            read(&path, &ProgressBar::hidden()),
            Err(FormatError::Io { .. })
        ));
    }

    #[test]
    fn checksum_matches_files_written_before_it_streamed() {
        // Values of the whole-buffer checksum that files were written with before the
        // checksum could stream; a change here would make every existing file "corrupt".
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| u8::try_from((i * 7 + 3) % 251).unwrap())
            .collect();
        assert_eq!(checksum(&data), 0x1d3b_de29_c26c_1af3);
        assert_eq!(checksum(&data[..13]), 0x2c30_e9f1_ad17_efb6);
        assert_eq!(checksum(&[]), 0);
        assert_eq!(checksum(&data[..2 << 20]), 0x6b77_cbfd_102e_8f17);
        // Any split of the stream gives the same value.
        let mut rng = crate::rng::Rng::new(crate::test_seed());
        for _ in 0..20 {
            let mut sum = StreamingChecksum::new(data.len() as u64);
            let mut at = 0;
            while at < data.len() {
                let piece = usize::try_from(rng.below(3 << 20))
                    .unwrap()
                    .min(data.len() - at);
                sum.update(&data[at..at + piece]);
                at += piece;
            }
            assert_eq!(sum.finish(), checksum(&data));
        }
    }

    #[test]
    fn checksum_is_sensitive_and_stable() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let a = checksum(&data);
        assert_eq!(a, checksum(&data));
        let mut changed = data.clone();
        changed[2_500_000] ^= 1;
        assert_ne!(a, checksum(&changed));
        assert_ne!(checksum(&data[..10]), checksum(&data[..11]));
    }
}
