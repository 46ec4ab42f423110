//! The store a GPU benchmark backs its spaces with: `--store memory|file:PATH|remote:HOST:PORT`,
//! `--codec none|lz4`, `--file-io direct|buffered` and `--host-cache SIZE`, parsed once here
//! for `strata bench gpu-micro`, `graph`, `embed` and `gpu-store`, and opened per space (each
//! space gets a store of its own size, with codec pages of its page size).
//!
//! A remote store's token comes from `STRATA_REMOTE_TOKEN`, as for the other benchmarks'
//! memory nodes; no new command-line secret.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_core::config::{CodecKind, EnvVars, StoreConfig, StoreKind};
use strata_core::{Store, format_size, parse_size};

/// Why a store specification was refused or its store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreSpecError {
    /// The kind before the first `:` is not one we know.
    #[error(
        "--store {given:?}: unknown store kind {kind:?}; write memory, file:PATH or remote:HOST:PORT[,HOST:PORT...]"
    )]
    UnknownKind {
        /// The whole argument.
        given: String,
        /// Its kind part.
        kind: String,
    },
    /// `file` without a path.
    #[error("--store {given:?} needs a path: write file:PATH (e.g. file:/data/strata-space.bin)")]
    MissingPath {
        /// The whole argument.
        given: String,
    },
    /// `remote:` without valid `HOST:PORT` pairs.
    #[error(
        "--store {given:?}: write remote:HOST:PORT[,HOST:PORT...] with a port number (e.g. remote:127.0.0.1:7000)"
    )]
    BadRemote {
        /// The whole argument.
        given: String,
    },
    /// A remote store without `STRATA_REMOTE_TOKEN`.
    #[error(
        "--store {given} is a memory node, which needs its token: set STRATA_REMOTE_TOKEN (`strata serve` prints the token when it starts)"
    )]
    MissingToken {
        /// The whole argument.
        given: String,
    },
    /// A codec the GPU benchmarks cannot use.
    #[error("--codec {given:?}: {why}")]
    BadCodec {
        /// The argument.
        given: String,
        /// What to write instead.
        why: String,
    },
    /// `--file-io` is neither `direct` nor `buffered`.
    #[error(
        "--file-io {given:?}: use direct (O_DIRECT, reads come from the disk) or buffered (through the OS page cache)"
    )]
    BadFileIo {
        /// The argument.
        given: String,
    },
    /// A size that does not parse.
    #[error("{flag} {given:?}: {reason}; write a size such as 512MiB or 4GiB")]
    BadSize {
        /// The flag.
        flag: String,
        /// The argument.
        given: String,
        /// Why.
        reason: String,
    },
    /// A flag that only applies to spaces over a store, given without `--store`.
    #[error("{flag} applies to spaces over a store: add --store memory|file:PATH|remote:HOST:PORT")]
    NeedsStore {
        /// The flag.
        flag: &'static str,
    },
    /// `O_DIRECT` asked for on a file system that has none.
    #[error(
        "--store file:{path}: {dir} is tmpfs, which has no O_DIRECT (and keeps the file in memory, so it measures no disk); put the file on a disk, or pass --file-io buffered"
    )]
    DirectOnTmpfs {
        /// The file.
        path: String,
        /// Its directory.
        dir: String,
    },
    /// The `STRATA_*` environment is malformed.
    #[error(transparent)]
    Env(Box<strata_core::ConfigError>),
    /// Opening the store failed.
    #[error("cannot open the {label} store of {size}: {source}")]
    Open {
        /// [`StoreSpec::label`].
        label: String,
        /// Its size.
        size: String,
        /// Why.
        #[source]
        source: Box<strata_net::OpenStoreError>,
    },
}

impl From<strata_core::ConfigError> for StoreSpecError {
    fn from(e: strata_core::ConfigError) -> Self {
        StoreSpecError::Env(Box::new(e))
    }
}

/// Parses a size argument with the workspace's size parser (`512MiB`, `4GiB`, `1.5GiB`).
///
/// # Errors
/// [`StoreSpecError::BadSize`] naming `flag`.
pub fn parse_size_arg(flag: &str, given: &str) -> Result<u64, StoreSpecError> {
    parse_size(given).map_err(|e| StoreSpecError::BadSize {
        flag: flag.into(),
        given: given.into(),
        reason: e.to_string(),
    })
}

/// A parsed `--store` with its codec and file I/O mode.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSpec {
    config: StoreConfig,
    given: String,
}

impl StoreSpec {
    /// Parses `store` (`memory`, `file:PATH`, `remote:HOST:PORT[,...]`), `codec` (`none`,
    /// `lz4`) and `file_io` (`direct`, `buffered`); a remote store takes its token from
    /// `STRATA_REMOTE_TOKEN` in `env`.
    ///
    /// # Errors
    /// A [`StoreSpecError`] that says what to write instead.
    pub fn parse(
        store: &str,
        codec: &str,
        file_io: &str,
        env: &EnvVars,
    ) -> Result<Self, StoreSpecError> {
        let given = store.trim().to_string();
        let (kind_part, rest) = match given.split_once(':') {
            Some((k, r)) => (k, Some(r)),
            None => (given.as_str(), None),
        };
        let kind = match (kind_part, rest) {
            ("memory", None) => StoreKind::Memory,
            ("memory", Some(_)) => {
                return Err(StoreSpecError::UnknownKind {
                    kind: given.clone(),
                    given,
                });
            }
            ("file", None | Some("")) => return Err(StoreSpecError::MissingPath { given }),
            ("file", Some(path)) => StoreKind::File {
                path: PathBuf::from(path),
            },
            ("remote", _) => match given.parse::<StoreKind>() {
                Ok(k @ StoreKind::Remote { .. }) => k,
                _ => return Err(StoreSpecError::BadRemote { given }),
            },
            (other, _) => {
                return Err(StoreSpecError::UnknownKind {
                    kind: other.to_string(),
                    given,
                });
            }
        };
        let codec = match codec.trim() {
            "none" => CodecKind::None,
            "lz4" => CodecKind::Lz4,
            z if z.starts_with("zfp") => {
                return Err(StoreSpecError::BadCodec {
                    given: codec.into(),
                    why: "zfp is lossy, and the GPU benchmarks check their data bit for bit; use none or lz4".into(),
                });
            }
            _ => {
                return Err(StoreSpecError::BadCodec {
                    given: codec.into(),
                    why: "use none or lz4".into(),
                });
            }
        };
        let direct = match file_io.trim() {
            "direct" => true,
            "buffered" => false,
            _ => {
                return Err(StoreSpecError::BadFileIo {
                    given: file_io.into(),
                });
            }
        };
        // The environment first (the token, the remote timeout), then the flags, which win.
        let builder = StoreConfig::builder()
            .with_env_vars(env)?
            .kind(kind.clone())
            .codec(codec)
            .direct(direct && matches!(kind, StoreKind::File { .. }))
            .grow(true);
        let config = match builder.build() {
            Err(strata_core::ConfigError::Missing(_))
                if matches!(kind, StoreKind::Remote { .. }) =>
            {
                return Err(StoreSpecError::MissingToken { given });
            }
            other => other?,
        };
        Ok(Self { config, given })
    }

    /// The configuration it opens.
    #[must_use]
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The file of a file store.
    #[must_use]
    pub fn file_path(&self) -> Option<&Path> {
        match &self.config.kind {
            StoreKind::File { path } => Some(path),
            _ => None,
        }
    }

    /// Whether this is a memory store (its bytes take host memory).
    #[must_use]
    pub fn is_memory(&self) -> bool {
        matches!(self.config.kind, StoreKind::Memory)
    }

    /// A short name for tables: `memory`, `file(direct)+lz4`, `remote`, ...
    #[must_use]
    pub fn label(&self) -> String {
        let kind = match &self.config.kind {
            StoreKind::Memory => "memory".to_string(),
            StoreKind::File { .. } if self.config.direct => "file(direct)".into(),
            StoreKind::File { .. } => "file(buffered)".into(),
            StoreKind::Remote { .. } => "remote".into(),
        };
        match self.config.codec {
            CodecKind::None => kind,
            CodecKind::Lz4 => format!("{kind}+lz4"),
            CodecKind::Zfp { tolerance } => format!("{kind}+zfp:{tolerance}"),
        }
    }

    /// The `--store` argument as given.
    #[must_use]
    pub fn given(&self) -> &str {
        &self.given
    }

    /// Opens a store of `size` bytes with codec pages of `page_size` (a space's page size, so
    /// each fault reads one compressed page). A file is created or grown to `size`.
    ///
    /// # Errors
    /// `O_DIRECT` on tmpfs, or the store could not be opened.
    pub fn open(&self, size: u64, page_size: u64) -> Result<Arc<dyn Store>, StoreSpecError> {
        if let (Some(path), true) = (self.file_path(), self.config.direct) {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if crate::sys::on_tmpfs(&dir) {
                return Err(StoreSpecError::DirectOnTmpfs {
                    path: path.display().to_string(),
                    dir: dir.display().to_string(),
                });
            }
        }
        strata_net::open_store_with_page(&self.config, size, page_size).map_err(|source| {
            StoreSpecError::Open {
                label: self.label(),
                size: format_size(size),
                source: Box::new(source),
            }
        })
    }
}

/// `--store`, `--codec`, `--file-io`, `--host-cache` of `strata bench gpu-micro`, `graph` and
/// `embed`: without `--store` their spaces keep a pinned host copy, as before.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SpaceStoreArgs {
    /// Back every Strata space with a store instead of a pinned host copy: memory, file:PATH
    /// (created or grown; each space rewrites it) or remote:HOST:PORT[,HOST:PORT...] (a memory
    /// node, `strata serve`; its token from STRATA_REMOTE_TOKEN). Each space's data is written
    /// into its store before the space is made.
    #[arg(long)]
    pub store: Option<String>,
    /// Page codec between the host cache and the store: none or lz4 (with --store).
    #[arg(long, default_value = "none")]
    pub codec: String,
    /// File stores: direct (O_DIRECT: reads come from the disk) or buffered (the OS page
    /// cache may serve them).
    #[arg(long, default_value = "direct")]
    pub file_io: String,
    /// Pinned host cache between the GPU cache and the store, e.g. 4GiB (with --store;
    /// default: a quarter of the host's available memory, at most the space).
    #[arg(long)]
    pub host_cache: Option<String>,
}

/// What [`SpaceStoreArgs`] resolve to: a store and host cache size for every space.
#[derive(Debug, Clone, PartialEq)]
pub struct SpaceBacking {
    /// The store each space opens.
    pub spec: StoreSpec,
    /// `SpaceOptions::host_cache_bytes`.
    pub host_cache: Option<u64>,
}

impl SpaceStoreArgs {
    /// `None` without `--store` (spaces keep their pinned host copy); refuses store-only
    /// flags without `--store`.
    ///
    /// # Errors
    /// A [`StoreSpecError`] that says what to write instead.
    pub fn backing(&self, env: &EnvVars) -> Result<Option<SpaceBacking>, StoreSpecError> {
        let host_cache = self
            .host_cache
            .as_deref()
            .map(|s| parse_size_arg("--host-cache", s))
            .transpose()?;
        let Some(store) = &self.store else {
            if host_cache.is_some() {
                return Err(StoreSpecError::NeedsStore {
                    flag: "--host-cache",
                });
            }
            if self.codec.trim() != "none" {
                return Err(StoreSpecError::NeedsStore { flag: "--codec" });
            }
            return Ok(None);
        };
        if host_cache == Some(0) {
            return Err(StoreSpecError::BadSize {
                flag: "--host-cache".into(),
                given: "0".into(),
                reason: "a host cache holds at least 2 pages".into(),
            });
        }
        Ok(Some(SpaceBacking {
            spec: StoreSpec::parse(store, &self.codec, &self.file_io, env)?,
            host_cache,
        }))
    }
}

/// A 4 KiB-aligned window of `len` zeroed bytes inside a vector (`O_DIRECT` needs aligned
/// buffers, or a file store bounces every write through a read-modify-write), without
/// unsafe code.
pub(crate) struct AlignedBuf {
    backing: Vec<u8>,
    skew: usize,
    len: usize,
}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> Self {
        let backing = vec![0u8; len + 4096];
        let skew = backing.as_ptr().align_offset(4096).min(4096);
        Self { backing, skew, len }
    }
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        &mut self.backing[self.skew..self.skew + self.len]
    }
}

/// Writes `bytes` into `store` from offset 0 in 8 MiB pieces from several threads (a store
/// is `Sync`; pieces never overlap), then makes it durable. Returns the seconds it took.
///
/// # Errors
/// The store's first write or flush error.
pub fn write_all(store: &dyn Store, bytes: &[u8]) -> Result<f64, strata_core::StoreError> {
    const PIECE: usize = 8 << 20;
    let started = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(4, usize::from);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let pieces = bytes.len().div_ceil(PIECE);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.min(pieces.max(1)))
            .map(|_| {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= pieces {
                            return Ok(());
                        }
                        let at = i * PIECE;
                        let end = (at + PIECE).min(bytes.len());
                        store.write_at(at as u64, &bytes[at..end])?;
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a store writer panicked"))
    })?;
    store.flush()?;
    Ok(started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(token: Option<&str>) -> EnvVars {
        token
            .map(|t| vec![("STRATA_REMOTE_TOKEN".to_string(), t.to_string())])
            .unwrap_or_default()
    }

    fn parse(store: &str) -> Result<StoreSpec, StoreSpecError> {
        StoreSpec::parse(store, "none", "direct", &env(None))
    }

    #[test]
    fn store_kinds_parse() {
        assert!(parse("memory").unwrap().is_memory());
        let f = parse("file:/data/x.bin").unwrap();
        assert_eq!(f.file_path(), Some(Path::new("/data/x.bin")));
        assert!(f.config().direct, "file stores default to O_DIRECT");
        assert_eq!(f.label(), "file(direct)");
        let b = StoreSpec::parse("file:rel.bin", "lz4", "buffered", &env(None)).unwrap();
        assert!(!b.config().direct);
        assert_eq!(b.label(), "file(buffered)+lz4");
        let r = StoreSpec::parse(
            "remote:127.0.0.1:7000,[::1]:7001",
            "none",
            "direct",
            &env(Some("t")),
        )
        .unwrap();
        assert_eq!(r.label(), "remote");
        assert!(!r.config().direct, "O_DIRECT is a file-store setting");
        assert_eq!(r.config().token.as_deref(), Some("t"));
        assert_eq!(r.given(), "remote:127.0.0.1:7000,[::1]:7001");
    }

    #[test]
    fn bad_stores_are_refused_with_what_to_write() {
        let e = parse("disk:/x").unwrap_err();
        assert!(
            matches!(&e, StoreSpecError::UnknownKind { kind, .. } if kind == "disk"),
            "{e}"
        );
        assert!(e.to_string().contains("file:PATH"), "{e}");
        for missing in ["file", "file:"] {
            let e = parse(missing).unwrap_err();
            assert!(
                matches!(e, StoreSpecError::MissingPath { .. }),
                "{missing}: {e}"
            );
            assert!(e.to_string().contains("file:PATH"));
        }
        assert!(matches!(
            parse("memory:4GiB"),
            Err(StoreSpecError::UnknownKind { .. })
        ));
        assert!(matches!(parse(""), Err(StoreSpecError::UnknownKind { .. })));
        for bad in ["remote:", "remote:host", "remote:host:port", "remote::7000"] {
            let e = StoreSpec::parse(bad, "none", "direct", &env(Some("t"))).unwrap_err();
            assert!(matches!(e, StoreSpecError::BadRemote { .. }), "{bad}: {e}");
        }
        let e = parse("remote:127.0.0.1:7000").unwrap_err();
        assert!(matches!(e, StoreSpecError::MissingToken { .. }), "{e}");
        assert!(e.to_string().contains("STRATA_REMOTE_TOKEN"));
    }

    #[test]
    fn codecs_and_file_io_are_checked() {
        let e = StoreSpec::parse("memory", "zfp:1e-3", "direct", &env(None)).unwrap_err();
        assert!(e.to_string().contains("lossy"), "{e}");
        let e = StoreSpec::parse("memory", "gzip", "direct", &env(None)).unwrap_err();
        assert!(matches!(e, StoreSpecError::BadCodec { .. }), "{e}");
        let e = StoreSpec::parse("memory", "none", "mmap", &env(None)).unwrap_err();
        assert!(matches!(e, StoreSpecError::BadFileIo { .. }), "{e}");
        let e = StoreSpec::parse(
            "memory",
            "none",
            "direct",
            &vec![("STRATA_REMOTE_TIMEOUT".into(), "0".into())],
        )
        .unwrap_err();
        assert!(matches!(e, StoreSpecError::Env(_)), "{e}");
    }

    #[test]
    fn space_store_args_resolve_or_refuse() {
        let none = SpaceStoreArgs {
            codec: "none".into(),
            file_io: "direct".into(),
            ..Default::default()
        };
        assert_eq!(none.backing(&env(None)).unwrap(), None);
        let cache_alone = SpaceStoreArgs {
            host_cache: Some("1GiB".into()),
            ..none.clone()
        };
        assert!(matches!(
            cache_alone.backing(&env(None)),
            Err(StoreSpecError::NeedsStore {
                flag: "--host-cache"
            })
        ));
        let codec_alone = SpaceStoreArgs {
            codec: "lz4".into(),
            ..none.clone()
        };
        assert!(matches!(
            codec_alone.backing(&env(None)),
            Err(StoreSpecError::NeedsStore { flag: "--codec" })
        ));
        let full = SpaceStoreArgs {
            store: Some("memory".into()),
            codec: "lz4".into(),
            host_cache: Some("512MiB".into()),
            ..none.clone()
        };
        let b = full.backing(&env(None)).unwrap().unwrap();
        assert_eq!(b.host_cache, Some(512 << 20));
        assert_eq!(b.spec.label(), "memory+lz4");
        for bad in ["lots", "12XB", "0"] {
            let args = SpaceStoreArgs {
                host_cache: Some(bad.into()),
                ..full.clone()
            };
            let e = args.backing(&env(None)).unwrap_err();
            assert!(matches!(e, StoreSpecError::BadSize { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("--host-cache"), "{e}");
        }
    }

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        for len in [1, 4096, 65536 + 8, 3 << 20] {
            let mut b = AlignedBuf::new(len);
            let s = b.as_mut();
            assert_eq!(s.len(), len);
            assert_eq!(s.as_ptr().align_offset(4096), 0);
            assert!(s.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn direct_io_on_tmpfs_is_refused_and_stores_open() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("strata-store-spec-{}.bin", std::process::id()));
        let spec = parse(&format!("file:{}", path.display())).unwrap();
        match spec.open(1 << 20, 64 << 10) {
            Err(StoreSpecError::DirectOnTmpfs { .. }) => assert!(crate::sys::on_tmpfs(&dir)),
            Ok(store) => {
                assert!(!crate::sys::on_tmpfs(&dir));
                assert_eq!(store.size(), 1 << 20);
            }
            Err(e) => panic!("{e}"),
        }
        let buffered = StoreSpec::parse(
            &format!("file:{}", path.display()),
            "lz4",
            "buffered",
            &env(None),
        )
        .unwrap();
        let store = buffered.open(1 << 20, 64 << 10).unwrap();
        let seed = crate::workloads::test_seed();
        let data: Vec<u8> = (0..1u64 << 20)
            .map(|i| (i.wrapping_mul(seed | 1) >> 7).to_le_bytes()[0])
            .collect();
        write_all(store.as_ref(), &data).unwrap();
        let mut back = vec![0u8; data.len()];
        store.read_at(0, &mut back).unwrap();
        assert!(
            back == data,
            "the store read back differs from what was written"
        );
        drop(store);
        std::fs::remove_file(&path).unwrap();
        let mem = parse("memory").unwrap().open(4 << 20, 4096).unwrap();
        assert_eq!(mem.size(), 4 << 20);
    }
}
