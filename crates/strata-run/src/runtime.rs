//! The process-wide runtime: one pager region (the arena) over the chosen store, whose
//! buffer is the process's whole resident budget, and the blocks handed out inside it.
//!
//! Started lazily by the first allocation at or above the threshold, so programs that never
//! make one (shells, small tools started by `system()`) pay nothing. Everything Strata does
//! runs with the thread's guard set, so allocations made meanwhile (by Rust's std, the
//! pager's threads, the C library on our behalf) go to the real allocator.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use strata_core::config::{CodecKind, StoreKind};
use strata_core::{Store, StoreConfig};
use strata_pager::{Region, WriteTracking};

use crate::arena::{Arena, Extent};
use crate::growing_store::GrowingStore;
use crate::node_backing::NodeBacking;
use crate::options::{Options, threshold_from_env};
use crate::pending_store::PendingStore;
use crate::sys;

thread_local! {
    /// Set while this thread runs Strata code: its allocations go to the real allocator.
    static GUARD: Cell<bool> = const { Cell::new(false) };
    /// 0 unknown, 1 a Strata thread (named `strata-*`), 2 a program thread.
    static THREAD_KIND: Cell<u8> = const { Cell::new(0) };
}

/// Marks the current thread as inside Strata for its lifetime.
#[derive(Debug)]
pub struct Guard(bool);

impl Guard {
    /// Enters (nesting is allowed).
    pub fn enter() -> Self {
        Self(GUARD.with(|g| g.replace(true)))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        GUARD.with(|g| g.set(self.0));
    }
}

fn guarded() -> bool {
    GUARD.with(Cell::get)
}

/// First and one-past-last address of the arena (0, 0 until started): checked without a
/// lock on every free, and valid in a forked child whose locks may be held.
static ARENA_START: AtomicUsize = AtomicUsize::new(0);
static ARENA_END: AtomicUsize = AtomicUsize::new(0);
/// Threshold in bytes (0 = not read yet).
static THRESHOLD: AtomicU64 = AtomicU64::new(0);
/// Set in a forked child: it has no pager, so everything goes to the real allocator.
static FORKED: AtomicBool = AtomicBool::new(false);
static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Whether this is a forked child (of a process whose arena was started).
pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// Whether `p` lies in the arena.
pub fn in_arena(p: usize) -> bool {
    let start = ARENA_START.load(Ordering::Acquire);
    start != 0 && p >= start && p < ARENA_END.load(Ordering::Relaxed)
}

/// Whether `[p, p+len)` touches the arena.
pub fn overlaps_arena(p: usize, len: usize) -> bool {
    let start = ARENA_START.load(Ordering::Acquire);
    start != 0 && p < ARENA_END.load(Ordering::Relaxed) && p.saturating_add(len) > start
}

/// Whether `[p, p+len)` lies wholly inside the arena.
pub fn inside_arena(p: usize, len: usize) -> bool {
    len > 0 && in_arena(p) && in_arena(p + len - 1)
}

/// Whether a request of `size` bytes should be served from the arena by this thread now.
pub fn wants_arena(size: usize) -> bool {
    let mut t = THRESHOLD.load(Ordering::Relaxed);
    if t == 0 {
        if guarded() {
            return false;
        }
        let _g = Guard::enter();
        t = threshold_from_env().max(1);
        THRESHOLD.store(t, Ordering::Relaxed);
    }
    if (size as u64) < t || FORKED.load(Ordering::Relaxed) {
        return false;
    }
    program_thread()
}

/// Whether the calling thread is the program's, running the program's code (not inside
/// Strata, and not one of the pager's `strata-*` threads, whose calls are Strata's own).
pub fn program_thread() -> bool {
    if guarded() {
        return false;
    }
    THREAD_KIND.with(|k| {
        if k.get() == 0 {
            k.set(if sys::thread_name_starts_with(b"strata-") {
                1
            } else {
                2
            });
        }
        k.get() == 2
    })
}

/// The runtime, started on first use by a request of `first_request` bytes (which chooses
/// the page size, see [`crate::options::page_for`]). A runtime that cannot start ends the
/// process with a message saying why (the program cannot get the memory it is about to ask
/// for).
pub fn runtime_for(first_request: usize) -> &'static Runtime {
    let rt = RUNTIME.get_or_init(|| {
        let _g = Guard::enter();
        match Runtime::start(first_request as u64) {
            Ok(rt) => rt,
            Err(msg) => {
                report_line(&serde_json::json!({"pid": sys::pid(), "error": msg}));
                sys::die(unreported(&format!("strata run: {msg}\n")))
            }
        }
    });
    // Here, not in `start`: the watcher needs the runtime's region for the process's life.
    static KEEP_ROOM: std::sync::Once = std::sync::Once::new();
    KEEP_ROOM.call_once(|| {
        if let Some(headroom) = rt.options.keep_room {
            let _g = Guard::enter();
            crate::group_room::start(&rt.region, headroom, Arc::clone(&rt.room));
        }
    });
    rt
}

/// The runtime if it was started (never starts it).
pub fn started() -> Option<&'static Runtime> {
    RUNTIME.get()
}

/// `msg` for standard error, or nothing when `strata run` reads the report: it prints the
/// report's errors itself (also when the program has closed or redirected its own stderr),
/// so each is said once.
fn unreported(msg: &str) -> &[u8] {
    if sys::getenv(c"STRATA_RUN_REPORT_FD").is_some() {
        b""
    } else {
        msg.as_bytes()
    }
}

/// Appends one JSON line to the report descriptor or stats file, if either is set.
fn report_line(v: &serde_json::Value) {
    let mut line = v.to_string();
    line.push('\n');
    if let Some(fd) = std::env::var("STRATA_RUN_REPORT_FD")
        .ok()
        .and_then(|v| v.trim().parse::<c_int>().ok())
    {
        sys::write_fd(fd, line.as_bytes());
    } else if let Some(path) = std::env::var_os("STRATA_RUN_STATS") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// How a block was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// malloc and friends.
    Heap,
    /// Anonymous mmap: `mapped` bytes (4 KiB multiple) of which `unmapped` were unmapped.
    Map { mapped: usize, unmapped: usize },
}

#[derive(Debug, Clone, Copy)]
struct Block {
    extent: Extent,
    kind: Kind,
}

#[derive(Debug)]
struct State {
    arena: Arena,
    /// Keyed by the address handed to the program.
    blocks: BTreeMap<usize, Block>,
    peak_pages: u64,
    arena_allocs: u64,
    /// Requests the arena had no room for (served by the C library instead, unpaged).
    fallbacks: u64,
    /// Bytes of those requests.
    fallback_bytes: u64,
}

/// The started runtime.
#[derive(Debug)]
pub struct Runtime {
    region: Region,
    base: usize,
    page: usize,
    state: Mutex<State>,
    description: String,
    options: Options,
    sized_by: ArenaSizedBy,
    /// Over memory nodes without `STRATA_RUN_ARENA`: what the store borrowed, and how it
    /// borrows more as the arena grows.
    backing: Option<NodeBacking>,
    /// What the memory group's watcher did ([`crate::group_room`]).
    room: Arc<crate::group_room::RoomStats>,
}

/// What chose the arena's size, and how much of it the store backs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArenaSizedBy {
    /// `STRATA_RUN_ARENA` (over memory nodes: borrowed whole at once).
    Given,
    /// The default ([`crate::options::default_arena`]), backed whole by a local store.
    Default,
    /// The default, backed by memory nodes as it grows, as far as they have room
    /// ([`crate::node_backing`]).
    MemoryNodes,
}

impl ArenaSizedBy {
    fn as_str(self) -> &'static str {
        match self {
            Self::Given => "STRATA_RUN_ARENA",
            Self::Default => "default",
            Self::MemoryNodes => "memory nodes",
        }
    }
}

/// What to do when a memory node refused this process's arena for want of room (appended to
/// that error; nothing for other errors).
fn no_room_hint(e: &strata_net::OpenStoreError, sized_by: ArenaSizedBy, arena: u64) -> String {
    use strata_net::{OpenStoreError, RemoteOpenError};
    if !matches!(
        e,
        OpenStoreError::Remote(RemoteOpenError::NoCapacity { .. })
    ) {
        return String::new();
    }
    let size = strata_core::format_size(arena);
    match sized_by {
        ArenaSizedBy::Given => format!(
            " (each process asks the memory nodes for its whole arena, STRATA_RUN_ARENA = {size}: unset STRATA_RUN_ARENA to borrow from the nodes as the arena grows, set it lower (at least the budget, as much as the program may page), or start the nodes with --capacity {} or more, with --overcommit beyond the node's memory: it commits memory only as pages arrive)",
            size.replace(' ', "")
        ),
        ArenaSizedBy::Default | ArenaSizedBy::MemoryNodes => format!(
            " (this process's first {size} fitted what the nodes had free when it started, and another client took part of that since; give the nodes more --capacity)"
        ),
    }
}

/// An arena's store, how it borrows more from memory nodes (if it does), and what chose the
/// arena's size.
type ArenaStore = (Arc<dyn Store>, Option<NodeBacking>, ArenaSizedBy);

/// The arena's store over memory nodes, opened in the background (see `pending_store.rs`).
/// With `STRATA_RUN_ARENA`, the whole arena is borrowed at once; without, the nodes are
/// asked what they have free, a first chunk is borrowed, and more as the arena grows
/// ([`crate::node_backing`]).
fn over_nodes(
    options: &Options,
    names: &[String],
    config: StoreConfig,
    arena: u64,
    first_request: u64,
    described: &str,
) -> Result<ArenaStore, String> {
    let page = options.pager.page_bytes;
    let (first, sized_by) = if options.arena_given {
        (arena, ArenaSizedBy::Given)
    } else {
        let nodes = strata_net::node_capacities(&config).map_err(|e| e.to_string())?;
        let room = strata_net::largest_store_within(&config, page, &nodes);
        let first = crate::node_backing::first_chunk(
            arena,
            page,
            first_request,
            options.pager.buffer_bytes,
            room,
            names,
            &nodes,
        )
        .map_err(|e| e.to_string())?;
        (first, ArenaSizedBy::MemoryNodes)
    };
    let inner =
        |bytes: u64| strata_net::inner_size(&config, bytes, page).map_err(|e| e.to_string());
    let first_inner = inner(first)?;
    // Connecting to memory nodes takes tens of milliseconds (UCX's start-up, the handshake,
    // the node setting up the region): do it while the program runs. The store is first
    // needed when the budget is full (see pending_store.rs).
    let open_config = config.clone();
    let fail_described = described.to_string();
    let pending = Arc::new(
        PendingStore::spawn(
            first_inner,
            described.to_string(),
            "strata-connect",
            move || {
                let _g = Guard::enter();
                strata_net::open_inner_store(&open_config, first_inner, page)
                    .map_err(|e| format!("{e}{}", no_room_hint(&e, sized_by, first)))
            },
            move |why| {
                let _g = Guard::enter();
                let msg = format!("cannot open the store {fail_described}: {why}");
                report_line(&serde_json::json!({"pid": sys::pid(), "error": msg}));
                // The arena's pages past the budget have nowhere to go: end the process as
                // a failed start-up does, saying why.
                sys::die(unreported(&format!("strata run: {msg}\n")))
            },
        )
        .map_err(|e| format!("cannot start connecting: {e}"))?,
    );
    let codec = |inner: Arc<dyn Store>| {
        strata_net::with_codec(&config, inner, page, arena).map_err(|e| e.to_string())
    };
    if options.arena_given {
        return Ok((codec(pending)?, None, sized_by));
    }
    let opened = Arc::clone(&pending);
    let growing = Arc::new(GrowingStore::new(
        inner(arena)?,
        described.to_string(),
        pending,
        first_inner,
    )?);
    let store = codec(Arc::clone(&growing) as Arc<dyn Store>)?;
    let first_opened = Box::new(move || opened.wait_opened());
    let backing = NodeBacking::new(first_opened, growing, config, page, arena, first)
        .map_err(|e| format!("cannot start the thread that borrows more: {e}"))?;
    Ok((store, Some(backing), sized_by))
}

/// Whether the arena's file store bypasses the page cache (`O_DIRECT`) without being asked:
/// yes unless `STRATA_FILE_DIRECT` says otherwise or a codec is used. Through the page cache,
/// every page written to the store would also stay in memory as cache, charged to the
/// program's memory group, beside the budget the store is there to keep; the kernel's swap
/// bypasses it too. A codec's slots are not block-aligned, so under `O_DIRECT` each write
/// would read and rewrite its blocks: codecs keep the page cache.
fn direct_by_default(store: &StoreConfig) -> bool {
    std::env::var_os("STRATA_FILE_DIRECT").is_none() && store.codec == CodecKind::None
}

impl Runtime {
    fn start(first_request: u64) -> Result<Self, String> {
        let mut options = Options::from_env().map_err(|e| e.to_string())?;
        options.pager.page_bytes = crate::options::page_for(
            options.page_size_given,
            options.pager.page_bytes,
            options.pager.buffer_bytes,
            first_request,
            crate::options::across_a_network(&options.store.kind),
        );
        let page = options.pager.page_bytes;
        let described = describe(&options.store);
        let arena_bytes = options.arena_bytes.div_ceil(page) * page;
        let mut store_config = options.store.clone();
        let mut created: Option<std::path::PathBuf> = None;
        if let StoreKind::File { path } = &options.store.kind {
            let file = path.join(format!(
                "strata-run-{}-{}.store",
                sys::pid(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ));
            store_config = StoreConfig {
                kind: StoreKind::File { path: file.clone() },
                grow: true,
                direct: store_config.direct || direct_by_default(&store_config),
                ..store_config
            };
            created = Some(file);
        }
        let (store, backing, sized_by) = if let StoreKind::Remote { nodes } = &options.store.kind {
            over_nodes(
                &options,
                nodes,
                store_config,
                arena_bytes,
                first_request,
                &described,
            )
            .map_err(|e| format!("cannot open the store {described}: {e}"))?
        } else {
            let mut store = strata_net::open_store_with_page(&store_config, arena_bytes, page);
            if store.is_err() && created.is_some() && direct_by_default(&options.store) {
                // A file system that refuses O_DIRECT (tmpfs): its page cache is then the
                // store's memory anyway, so read and write through it.
                store_config.direct = false;
                store = strata_net::open_store_with_page(&store_config, arena_bytes, page);
            }
            let store = store.map_err(|e| format!("cannot open the store {described}: {e}"));
            // The store file is only a name until now: remove it at once, so that it goes
            // away with the process however the process ends.
            if let Some(file) = &created {
                let _ = std::fs::remove_file(file);
            }
            let sized_by = if options.arena_given {
                ArenaSizedBy::Given
            } else {
                ArenaSizedBy::Default
            };
            (store?, None, sized_by)
        };
        let region = Region::builder(store, arena_bytes)
            .config(options.pager.clone())
            .predict_writes(options.predict_writes)
            .write_tracking(if options.writes_by_digest {
                WriteTracking::Digest
            } else {
                WriteTracking::Trap
            })
            .build()
            .map_err(|e| {
                format!(
                    "cannot map the arena ({}) over {described}: {e}; set STRATA_RUN_ARENA to a smaller virtual size (at least the budget)",
                    strata_core::format_size(arena_bytes)
                )
            })?;
        let base = region.as_ptr() as usize;
        let len = region.len();
        sys::dont_fork(region.as_ptr(), len)
            .map_err(|e| format!("madvise(MADV_DONTFORK) on the arena failed: {e}"))?;
        let pages = (len / usize::try_from(page).unwrap_or(usize::MAX)) as u64;
        let rt = Self {
            base,
            page: usize::try_from(page).unwrap_or(usize::MAX),
            state: Mutex::new(State {
                arena: Arena::new(pages),
                blocks: BTreeMap::new(),
                peak_pages: 0,
                arena_allocs: 0,
                fallbacks: 0,
                fallback_bytes: 0,
            }),
            description: described,
            options,
            region,
            sized_by,
            backing,
            room: Arc::default(),
        };
        ARENA_START.store(base, Ordering::Release);
        ARENA_END.store(base + len, Ordering::Release);
        sys::at_fork_child(after_fork_child);
        sys::at_exit(at_exit);
        if let Some(old) = sys::install_handler(libc::SIGBUS, on_sigbus) {
            let _ = OLD_SIGBUS.set(old);
        }
        Ok(rt)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the arena's first `pages` pages are backed by the store, borrowing more from
    /// the memory nodes if they are not yet (false when the nodes have no room). Local stores
    /// back the whole arena.
    fn backed_to(&self, pages: u64) -> bool {
        self.backing
            .as_ref()
            .is_none_or(|b| b.ensure(pages.saturating_mul(self.page as u64)))
    }

    fn addr(&self, e: &Extent) -> usize {
        self.base + usize::try_from(e.start).unwrap_or(0) * self.page
    }

    fn bytes(&self, e: &Extent) -> usize {
        usize::try_from(e.pages).unwrap_or(0) * self.page
    }

    /// Counts, for the report, a large request of `size` bytes that found no room in the
    /// arena and that the C library then served (unpaged). Requests the C library refuses too
    /// (a `malloc(SIZE_MAX)`) are the program's own failures, not memory beyond the budget.
    pub fn served_unpaged(&self, size: usize) {
        let _g = Guard::enter();
        let mut st = self.lock();
        st.fallbacks += 1;
        st.fallback_bytes = st.fallback_bytes.saturating_add(size as u64);
    }

    /// A block of at least `size` bytes aligned to `align` (a power of two); zeroed if
    /// asked. Null when the arena is full (the caller falls back to the real allocator).
    pub fn alloc(&self, size: usize, align: usize, zeroed: bool, map: bool) -> *mut u8 {
        let _g = Guard::enter();
        // The arena starts on a 4 KiB boundary and blocks on page boundaries; larger
        // alignments take a little more space and an aligned address inside it.
        let base_align = 4096.min(self.page);
        let extra = align.saturating_sub(base_align);
        let Some(need) = size.max(1).checked_add(extra) else {
            return std::ptr::null_mut();
        };
        let pages = need.div_ceil(self.page) as u64;
        let (extent, user) = {
            let mut st = self.lock();
            let extent = st.arena.alloc(pages, zeroed);
            // Space past what the memory nodes back needs more of them first.
            let extent = match extent {
                Some(e) if !self.backed_to(e.start + e.pages) => {
                    st.arena.release(e.start, e.pages);
                    None
                }
                other => other,
            };
            let Some(extent) = extent else {
                // No room: the caller asks the C library (unpaged), as before the arena
                // existed, and counts what it serves (`served_unpaged`).
                return std::ptr::null_mut();
            };
            let addr = self.addr(&extent);
            let user = addr.next_multiple_of(align.max(1));
            let kind = if map {
                Kind::Map {
                    mapped: size.next_multiple_of(4096),
                    unmapped: 0,
                }
            } else {
                Kind::Heap
            };
            st.blocks.insert(user, Block { extent, kind });
            st.arena_allocs += 1;
            st.peak_pages = st.peak_pages.max(st.arena.in_use());
            (extent, user)
        };
        if extent.fresh {
            // Never used: the store holds zeros there, but reading them would still cost a
            // store round trip per page (a disk read, a network request). Discarded pages
            // fill with zeros without reading the store.
            self.discard_quietly(&extent);
        } else if zeroed {
            self.zero(&extent);
        }
        user as *mut u8
    }

    /// Clears a reused extent by discarding its pages: they read as zeros from then on,
    /// filled without touching the store. (A freed extent was discarded already; this also
    /// covers space whose discard at free time was only partly done.) If the discard is
    /// refused, the zeros are written through memory instead.
    fn zero(&self, e: &Extent) {
        let offset = (self.addr(e) - self.base) as u64;
        let len = self.bytes(e);
        if self.region.discard(offset, len as u64).is_ok() {
            return;
        }
        // SAFETY: the extent was just handed out to this caller and lies inside the arena.
        unsafe { std::ptr::write_bytes(self.addr(e) as *mut u8, 0, len) };
    }

    /// Discards an extent whose contents are zeros already (never used, or discarded when
    /// freed), only so that its first faults skip the store read; a refusal changes nothing
    /// the program can see.
    fn discard_quietly(&self, e: &Extent) {
        let offset = (self.addr(e) - self.base) as u64;
        let _ = self.region.discard(offset, self.bytes(e) as u64);
    }

    /// The block holding `p`: (its address for the program, the block).
    fn find(st: &State, p: usize) -> Option<(usize, Block)> {
        st.blocks.range(..=p).next_back().map(|(&u, &b)| (u, b))
    }

    /// Usable bytes of the block starting at `p` (0 if `p` is no block of ours).
    pub fn usable(&self, p: usize) -> usize {
        let st = self.lock();
        match st.blocks.get(&p) {
            Some(b) => self.addr(&b.extent) + self.bytes(&b.extent) - p,
            None => 0,
        }
    }

    /// Frees the block at `p`: its pages are discarded (dropped without being written back;
    /// they read as zeros from then on), then its space is reused.
    pub fn free(&self, p: usize) {
        let _g = Guard::enter();
        let block = self.lock().blocks.remove(&p);
        match block {
            Some(b) => self.release(&b.extent),
            None => sys::write_stderr(
                b"strata run: free() of an address inside the arena that is not a live block (double free?); ignored\n",
            ),
        }
    }

    fn release(&self, e: &Extent) {
        let offset = (self.addr(e) - self.base) as u64;
        match self.region.discard(offset, self.bytes(e) as u64) {
            Ok(_) => self.lock().arena.release(e.start, e.pages),
            Err(err) => {
                // The pages may still be resident; keep the space out of use so that
                // nothing handed out later sees them.
                let msg = format!(
                    "strata run: dropping freed pages of {} failed: {err}; the space is kept out of use\n",
                    self.description
                );
                sys::write_stderr(msg.as_bytes());
            }
        }
    }

    /// Resizes the block at `p` to `size` bytes (at or above the threshold). Returns the
    /// block's new address, or null if the arena is full (the old block is kept).
    pub fn realloc(&self, p: usize, size: usize) -> *mut u8 {
        let _g = Guard::enter();
        let (old_cap, extent) = {
            let mut st = self.lock();
            let Some(&b) = st.blocks.get(&p) else {
                return std::ptr::null_mut();
            };
            let end = self.addr(&b.extent) + self.bytes(&b.extent);
            let cap = end - p;
            if size <= cap {
                drop(st);
                // Shrinking: the whole pages past the new size hold nothing the program may
                // read again (realloc keeps only `size` bytes), so drop them unwritten.
                let tail = (p + size).next_multiple_of(self.page);
                if tail < end {
                    let _ = self
                        .region
                        .discard((tail - self.base) as u64, (end - tail) as u64);
                }
                return p as *mut u8;
            }
            let more = (size - cap).div_ceil(self.page) as u64;
            let end = b.extent.start + b.extent.pages;
            let mut grown = st.arena.grow(b.extent.start, b.extent.pages, more);
            if grown && !self.backed_to(end + more) {
                st.arena.release(end, more);
                grown = false;
            }
            if grown {
                let grown = Extent {
                    pages: b.extent.pages + more,
                    ..b.extent
                };
                st.blocks.insert(p, Block { extent: grown, ..b });
                st.peak_pages = st.peak_pages.max(st.arena.in_use());
                drop(st);
                // The pages grown into were never used or were discarded when freed.
                self.discard_quietly(&Extent {
                    start: b.extent.start + b.extent.pages,
                    pages: more,
                    fresh: true,
                });
                return p as *mut u8;
            }
            (cap, b.extent)
        };
        let _ = extent;
        let new = self.alloc(size, 16, false, false);
        if new.is_null() {
            return new;
        }
        // SAFETY: both blocks are live, distinct, and at least `old_cap` bytes long.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, new, old_cap.min(size)) };
        self.free(p);
        new
    }

    /// Unmaps `[p, p+len)` of an anonymous mapping in the arena; the block goes when all
    /// of it is unmapped. Returns false if the range is no mapping of ours.
    pub fn munmap(&self, p: usize, len: usize) -> bool {
        let _g = Guard::enter();
        let done = {
            let mut st = self.lock();
            let Some((user, b)) = Self::find(&st, p) else {
                return false;
            };
            let Kind::Map { mapped, unmapped } = b.kind else {
                return false;
            };
            if p >= user + mapped {
                return false;
            }
            let cut = (p + len.next_multiple_of(4096)).min(user + mapped) - p;
            // Partial unmaps (allocators trimming an over-sized mapping) are counted; a
            // range unmapped twice is counted twice, so free on exact totals only.
            let unmapped = unmapped + cut;
            if unmapped >= mapped {
                st.blocks.remove(&user);
                Some(b.extent)
            } else {
                st.blocks.insert(
                    user,
                    Block {
                        kind: Kind::Map { mapped, unmapped },
                        ..b
                    },
                );
                None
            }
        };
        if let Some(e) = done {
            self.release(&e);
        }
        true
    }

    /// `mremap` of an arena mapping at `p`: shrinks in place, or moves (if allowed) to a
    /// larger zeroed block. Null with `errno` set when refused.
    pub fn mremap(&self, p: usize, old: usize, new: usize, may_move: bool) -> *mut u8 {
        let _g = Guard::enter();
        let mapped = {
            let st = self.lock();
            match st.blocks.get(&p) {
                Some(Block {
                    kind: Kind::Map { mapped, .. },
                    ..
                }) => *mapped,
                _ => return std::ptr::null_mut(),
            }
        };
        let new_mapped = new.next_multiple_of(4096);
        if new_mapped <= mapped {
            if new_mapped < mapped {
                self.munmap(p + new_mapped, mapped - new_mapped);
            }
            return p as *mut u8;
        }
        if !may_move {
            return std::ptr::null_mut();
        }
        let dst = self.alloc(new, 4096, true, true);
        if dst.is_null() {
            return dst;
        }
        // SAFETY: both mappings are live and distinct; `old` bytes of the source are mapped.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, dst, old.min(mapped)) };
        self.munmap(p, mapped);
        dst
    }

    fn report(&self) -> serde_json::Value {
        let stats = self.region.stats();
        let counters = self.region.counters();
        let st = self.lock();
        serde_json::json!({
            "pid": sys::pid(),
            "store": self.description,
            "budget_bytes": self.options.pager.buffer_bytes,
            "page_bytes": self.options.pager.page_bytes,
            "threshold_bytes": self.options.threshold,
            "arena_bytes": self.region.len() as u64,
            "arena_sized_by": self.sized_by.as_str(),
            "arena_store_bytes": self.backing.as_ref().map_or(self.region.len() as u64, NodeBacking::backed),
            "arena_store_refused": self.backing.as_ref().and_then(NodeBacking::last_refusal),
            "arena_store_late": self.backing.as_ref().map_or(0, NodeBacking::late),
            "arena_allocations": st.arena_allocs,
            "arena_peak_bytes": st.peak_pages * self.page as u64,
            "arena_fallbacks": st.fallbacks,
            "arena_fallback_bytes": st.fallback_bytes,
            "peak_rss_bytes": peak_rss_bytes(),
            "stats": stats,
            "counters": counters,
            "keep_room": self.options.keep_room.map(|h| self.room.to_json(h, self.page as u64)),
        })
    }
}

/// The process's peak resident size (`VmHWM`), so that a report shows what the budget
/// costs beyond itself (pager tables, an in-process store's contents); 0 if unknown.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

fn describe(c: &StoreConfig) -> String {
    let kind = match &c.kind {
        StoreKind::Memory => "memory".to_string(),
        StoreKind::File { path } => format!("file:{}", path.display()),
        StoreKind::Remote { nodes } => format!("remote:{}", nodes.join(",")),
    };
    format!("{kind} (codec {:?})", c.codec)
}

extern "C" fn at_exit() {
    report_at_exit();
}

static REPORTED: AtomicBool = AtomicBool::new(false);

/// Writes this process's report once (from `exit` or `_exit`).
pub fn report_at_exit() {
    let _g = Guard::enter();
    if FORKED.load(Ordering::Relaxed) || REPORTED.swap(true, Ordering::AcqRel) {
        return;
    }
    if let Some(rt) = started() {
        report_line(&rt.report());
    }
}

static OLD_SIGBUS: OnceLock<libc::sigaction> = OnceLock::new();
static OLD_SIGSEGV: OnceLock<libc::sigaction> = OnceLock::new();

/// A fault on an arena page that the store could not serve: say which store failed and
/// why, then let the default action (or the program's handler) take the signal.
extern "C" fn on_sigbus(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut std::ffi::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { sys::fault_address(info) };
    if in_arena(addr) {
        let _g = Guard::enter();
        if let Some(rt) = started() {
            let why = rt
                .region
                .take_error()
                .map_or_else(|| "no error recorded".to_string(), |e| e.to_string());
            let msg = format!(
                "strata run: the store {} failed to serve address {addr:#x}: {why}\n",
                rt.description
            );
            sys::write_stderr(unreported(&msg));
            report_line(&serde_json::json!({
                "pid": sys::pid(), "store_failed": rt.description, "error": why
            }));
        }
    }
    if let Some(old) = OLD_SIGBUS.get() {
        sys::restore_handler(sig, old);
    }
    // Returning re-runs the access, which faults again under the restored action.
}

/// In a forked child: there is no pager behind the arena (it is not even mapped, see
/// `MADV_DONTFORK`), so touching it is refused with a message instead of reading zeros.
extern "C" fn on_child_sigsegv(
    sig: c_int,
    info: *mut libc::siginfo_t,
    _ctx: *mut std::ffi::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { sys::fault_address(info) };
    if in_arena(addr) {
        sys::write_stderr(
            b"strata run: a forked child touched memory that Strata pages for its parent; a child must exec (or use only memory it allocates itself): such memory is not copied into children\n",
        );
    }
    if let Some(old) = OLD_SIGSEGV.get() {
        sys::restore_handler(sig, old);
    }
}

unsafe extern "C" fn after_fork_child() {
    FORKED.store(true, Ordering::Relaxed);
    if let Some(old) = sys::install_handler(libc::SIGSEGV, on_child_sigsegv) {
        let _ = OLD_SIGSEGV.set(old);
    }
}
