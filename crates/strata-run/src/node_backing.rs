//! The arena's store over memory nodes when `STRATA_RUN_ARENA` does not set the arena's size:
//! it borrows from the nodes as the arena grows, never more than they have free.
//!
//! Why not borrow the whole arena at once: the arena is 64 GiB of address space by default,
//! far beyond what a node started with defaults lends (1 GiB); and borrowing all that a node
//! has free would leave nothing for the next process (`stress-ng --vm 2`'s two workers, a
//! shell's pipeline). So each process borrows what it hands out: a first chunk, twice the
//! larger of its first large request and its budget ([`first_chunk`]), opened in the
//! background as before; then, when the arena's high mark passes what is borrowed, a further
//! chunk, doubling what it holds ([`next_chunk`]), after asking the nodes what they have free
//! (one authenticated TCP conversation each, about 1 ms; the new chunk's connection takes
//! 20-40 ms, and doubling keeps those few). When the nodes have no room left, the arena
//! refuses the request and the program gets its memory from the C library, unpaged, as when
//! any arena is full (`interpose::big`); so does a request whose chunk does not come within
//! [`GROWTH_WAIT`].

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use strata_core::StoreConfig;

use crate::growing_store::GrowingStore;
use crate::options::OptionsError;

/// Smallest first chunk: small programs borrow this much once and never grow. It also
/// covers what libraries allocate while they are loaded, when no chunk can be borrowed (see
/// [`START_WAIT`]): NumPy's import makes OpenBLAS's 32 MiB buffer there, with 72 MiB of the
/// arena in use (64 MiB left it to the C library).
pub const FIRST_CHUNK_MIN: u64 = 128 << 20;

/// How long after the nodes had no room a growth is not tried again (each try asks every
/// node), so a program that keeps asking for more than the nodes hold is not slowed much.
pub const REFUSAL_MEMORY: Duration = Duration::from_secs(1);

/// The first chunk a process borrows, in whole pages of `page`: twice the larger of its first
/// large request and its budget, at least [`FIRST_CHUNK_MIN`], at most `room` (the largest
/// store the nodes hold now: [`strata_net::largest_store_within`]) and `arena`. Less than one
/// page of room is refused, naming each node's free capacity (`nodes`, in the order of
/// `names`).
pub fn first_chunk(
    arena: u64,
    page: u64,
    first_request: u64,
    budget: u64,
    room: u64,
    names: &[String],
    nodes: &[strata_net::NodeCapacity],
) -> Result<u64, OptionsError> {
    let want = first_request
        .max(budget)
        .saturating_mul(2)
        .max(FIRST_CHUNK_MIN);
    let chunk = want.min(room).min(arena) / page * page;
    if chunk == 0 {
        return Err(OptionsError::Bad(strata_net::no_room(names, nodes, page)));
    }
    Ok(chunk)
}

/// The next chunk for an arena whose store backs `backed` bytes and must now back `end`:
/// as much again as it holds (doubling) or what `end` needs if more, in whole pages of
/// `page`, no more than `room` nor than `arena` allows. `None` when the room cannot back
/// `end`.
pub fn next_chunk(backed: u64, end: u64, room: u64, arena: u64, page: u64) -> Option<u64> {
    let need = end.checked_sub(backed).filter(|&n| n > 0)?;
    let want = need.max(backed).div_ceil(page).saturating_mul(page);
    let chunk = want
        .min(room / page * page)
        .min(arena.saturating_sub(backed));
    (chunk >= need).then_some(chunk)
}

/// What the backing holds and what it is asked for, shared with its grower thread.
#[derive(Debug)]
struct Held {
    /// Bytes of the arena (before any codec) backed by borrowed chunks.
    backed: u64,
    /// The most bytes any caller needs backed now (the grower works towards it).
    wanted: u64,
    /// Until when a growth is not tried again after the nodes had no room.
    refused_until: Option<Instant>,
    /// Why the last growth failed, for the report.
    last_refusal: Option<String>,
    /// Growths that failed so far: a waiter whose growth failed stops waiting.
    refusals: u64,
    /// Whether the grower thread runs (a new thread cannot start while the dynamic loader's
    /// lock is held, as it is when a library's constructor allocates during `dlopen`).
    grower_running: bool,
    /// Requests that did not get their chunk in time ([`GROWTH_WAIT`], [`START_WAIT`]).
    late: u64,
    /// A request did not get its chunk in time, and that chunk has not come yet: later
    /// requests do not wait for it.
    overdue: bool,
}

/// The backing's state and the condition its grower and waiters wait on.
#[derive(Debug)]
struct Shared {
    held: Mutex<Held>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a change, at most `timeout`.
    fn wait<'a>(&self, held: MutexGuard<'a, Held>, timeout: Duration) -> MutexGuard<'a, Held> {
        self.changed
            .wait_timeout(held, timeout)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }
}

/// How long an allocation waits for a chunk being borrowed before it is served by the C
/// library instead (the chunk still arrives for later ones). Borrowing takes 20-40 ms on
/// loopback; the bound matters when the program allocates while holding a lock the
/// borrowing needs, such as the dynamic loader's (a library's constructor allocating during
/// `dlopen`: UCX takes that lock too), where waiting longer would only delay the program.
/// After one such wait, allocations do not wait again until that chunk has come.
pub const GROWTH_WAIT: Duration = Duration::from_secs(2);

/// How long an allocation waits for the grower thread to start at all, before it is served
/// by the C library: a thread that has not started in this long waits for a lock the
/// allocating thread holds (the dynamic loader's), so waiting longer cannot help.
pub const START_WAIT: Duration = Duration::from_millis(200);

/// How long the grower sleeps between checks when nothing is asked of it (it is woken when
/// something is).
const IDLE_WAIT: Duration = Duration::from_secs(3600);

/// The arena's store over memory nodes and how it grows. See the module docs.
///
/// Chunks are borrowed by a thread of its own (`strata-grow`), started with the backing, so
/// an allocating thread never joins a new thread nor opens a connection itself: it asks and
/// waits, boundedly, for the answer ([`NodeBacking::ensure`]).
#[derive(Debug)]
pub struct NodeBacking {
    shared: Arc<Shared>,
}

/// Waits for the first chunk's opening (in the background, see `pending_store.rs`) to end;
/// whether it opened.
pub type FirstOpened = Box<dyn FnOnce() -> bool + Send>;

/// What the grower needs to borrow chunks.
struct Grower {
    first_opened: Option<FirstOpened>,
    store: Arc<GrowingStore>,
    config: StoreConfig,
    page: u64,
    arena: u64,
    shared: Arc<Shared>,
}

impl NodeBacking {
    /// The backing of an arena of `arena` bytes in pages of `page` over `store`, whose first
    /// `first` bytes of arena (before the codec) are being borrowed (`first_opened` waits for
    /// that); starts its grower thread. The grower borrows nothing before the first chunk is
    /// in: the nodes count a chunk only once it is opened, and a growth asked for meanwhile
    /// would take the room the first chunk was sized to.
    pub fn new(
        first_opened: FirstOpened,
        store: Arc<GrowingStore>,
        config: StoreConfig,
        page: u64,
        arena: u64,
        first: u64,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            held: Mutex::new(Held {
                backed: first,
                wanted: first,
                refused_until: None,
                last_refusal: None,
                refusals: 0,
                grower_running: false,
                late: 0,
                overdue: false,
            }),
            changed: Condvar::new(),
        });
        let grower = Grower {
            first_opened: Some(first_opened),
            store,
            config,
            page,
            arena,
            shared: Arc::clone(&shared),
        };
        std::thread::Builder::new()
            .name("strata-grow".into())
            .spawn(move || grower.run())?;
        Ok(Self { shared })
    }

    /// Bytes of the arena backed by the nodes now.
    pub fn backed(&self) -> u64 {
        self.shared.lock().backed
    }

    /// Requests that did not get their chunk in time.
    pub fn late(&self) -> u64 {
        self.shared.lock().late
    }

    /// Why the nodes last had no room, if they ever had none.
    pub fn last_refusal(&self) -> Option<String> {
        self.shared.lock().last_refusal.clone()
    }

    /// Makes sure the first `end` bytes of the arena are backed, asking the grower for
    /// another chunk if needed and waiting for it at most [`GROWTH_WAIT`]. False when the
    /// nodes have no room for it (or had none within the last [`REFUSAL_MEMORY`]), or it did
    /// not come in time: the caller then refuses the request that needed it.
    pub fn ensure(&self, end: u64) -> bool {
        let mut held = self.shared.lock();
        let refused = held.refused_until.is_some_and(|t| Instant::now() < t);
        // A chunk is borrowed only when an allocation needs it, never ahead: each chunk is a
        // connection and a UCX context in the program, charged to its memory limit (sort at
        // 1x over a node on this host: 8.1 MiB beside the budget with a second chunk borrowed
        // ahead when its merge buffers reached 75 % of the first, 6.2 MiB with one; the
        // second was never used). The allocation that needs one waits for it, 20-40 ms.
        if end <= held.backed {
            return true;
        }
        if refused {
            return false;
        }
        held.wanted = held.wanted.max(end);
        self.shared.changed.notify_all();
        if held.overdue {
            held.late += 1;
            return false;
        }
        let refusals = held.refusals;
        let now = Instant::now();
        let (deadline, start_deadline) = (now + GROWTH_WAIT, now + START_WAIT);
        while held.backed < end && held.refusals == refusals {
            let now = Instant::now();
            let limit = if held.grower_running {
                deadline
            } else {
                start_deadline
            };
            let Some(left) = limit.checked_duration_since(now) else {
                held.late += 1;
                held.overdue = true;
                return false;
            };
            held = self.shared.wait(held, left);
        }
        held.backed >= end
    }
}

impl Grower {
    /// Borrows chunks while callers want more than is backed; sleeps otherwise. Ends with
    /// the process.
    fn run(mut self) {
        let mut held = self.shared.lock();
        held.grower_running = true;
        self.shared.changed.notify_all();
        drop(held);
        if let Some(first_opened) = self.first_opened.take()
            && !first_opened()
        {
            // The process ends with the reason (see `runtime::over_nodes`); waiters give up
            // at their deadline.
            return;
        }
        held = self.shared.lock();
        loop {
            // Callers ask (raise `wanted`) only outside a refusal's memory, and a refusal
            // drops what was wanted: with nothing wanted there is nothing to do but wait to
            // be asked.
            if held.wanted <= held.backed {
                held = self.shared.wait(held, IDLE_WAIT);
                continue;
            }
            let (backed, wanted) = (held.backed, held.wanted);
            drop(held);
            let grown = self.grow(backed, wanted);
            held = self.shared.lock();
            held.overdue = false;
            match grown {
                Ok(chunk) => held.backed += chunk,
                Err(why) => {
                    held.refused_until = Some(Instant::now() + REFUSAL_MEMORY);
                    held.last_refusal = Some(why);
                    held.refusals += 1;
                    // What was wanted is refused; later requests ask again.
                    held.wanted = held.backed;
                }
            }
            self.shared.changed.notify_all();
        }
    }

    /// Borrows the chunk after `backed` that backs at least `end`; returns its length in
    /// arena bytes.
    fn grow(&self, backed: u64, end: u64) -> Result<u64, String> {
        let config = &self.config;
        let page = self.page;
        let nodes = strata_net::node_capacities(config).map_err(|e| e.to_string())?;
        let room = strata_net::largest_store_within(config, page, &nodes);
        let Some(chunk) = next_chunk(backed, end, room, self.arena, page) else {
            let names = match &config.kind {
                strata_core::config::StoreKind::Remote { nodes } => nodes.clone(),
                _ => Vec::new(),
            };
            return Err(format!(
                "the memory nodes have no room for {} more ({})",
                strata_core::format_size(end - backed),
                strata_net::describe_free(&names, &nodes)
            ));
        };
        let inner = |bytes: u64| strata_net::inner_size(config, bytes, page);
        let start = inner(backed).map_err(|e| e.to_string())?;
        let len = inner(backed + chunk).map_err(|e| e.to_string())? - start;
        let opened = strata_net::open_inner_store(config, len, page).map_err(|e| e.to_string())?;
        self.store.extend(opened, len)?;
        Ok(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn node(free: u64) -> strata_net::NodeCapacity {
        strata_net::NodeCapacity {
            free,
            capacity: GIB,
        }
    }

    #[test]
    fn the_first_chunk_is_twice_the_need_within_the_room() {
        let names = ["127.0.0.1:7400".to_string(), "127.0.0.1:7401".to_string()];
        let nodes = [node(GIB), node(GIB)];
        let arena = 64 * GIB;
        // sort -S 48M with a 16 MiB budget: the minimum, 128 MiB.
        assert_eq!(
            first_chunk(arena, 4096, 48 * MIB, 16 * MIB, GIB, &names, &nodes).unwrap(),
            128 * MIB
        );
        // Small programs borrow the minimum; big budgets twice the budget.
        assert_eq!(
            first_chunk(arena, 65536, MIB, MIB, GIB, &names, &nodes).unwrap(),
            FIRST_CHUNK_MIN
        );
        assert_eq!(
            first_chunk(arena, 65536, 100 * MIB, MIB, GIB, &names, &nodes).unwrap(),
            200 * MIB
        );
        assert_eq!(
            first_chunk(arena, 65536, MIB, 256 * MIB, GIB, &names, &nodes).unwrap(),
            512 * MIB
        );
        // No more than the room (whole pages) nor the arena.
        assert_eq!(
            first_chunk(
                arena,
                65536,
                48 * MIB,
                16 * MIB,
                24 * MIB + 5,
                &names,
                &nodes
            )
            .unwrap(),
            24 * MIB
        );
        assert_eq!(
            first_chunk(32 * MIB, 65536, 48 * MIB, 16 * MIB, GIB, &names, &nodes).unwrap(),
            32 * MIB
        );
        // No room for a page: refused, naming each node's free capacity.
        let full = [node(0), node(32 << 10)];
        let e = first_chunk(arena, 65536, MIB, MIB, 0, &names, &full)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("127.0.0.1:7400 has 0 B of 1 GiB free")
                && e.contains("127.0.0.1:7401 has 32 KiB of 1 GiB free")
                && e.contains("--capacity"),
            "{e}"
        );
    }

    #[test]
    fn chunks_double_within_the_room_and_never_fall_short() {
        let page = 65536;
        // Doubling: 96 MiB backed, 1 page more needed: another 96 MiB.
        assert_eq!(
            next_chunk(96 * MIB, 96 * MIB + 1, GIB, 64 * GIB, page),
            Some(96 * MIB)
        );
        // A large request beyond: what it needs, in whole pages.
        assert_eq!(
            next_chunk(96 * MIB, 512 * MIB + 1, GIB, 64 * GIB, page),
            Some(416 * MIB + page)
        );
        // Less room than doubling but enough for the need: the room.
        assert_eq!(
            next_chunk(96 * MIB, 100 * MIB, 50 * MIB + 7, 64 * GIB, page),
            Some(50 * MIB)
        );
        // Not enough room for the need, or past the arena: none.
        assert_eq!(
            next_chunk(96 * MIB, 200 * MIB, 50 * MIB, 64 * GIB, page),
            None
        );
        assert_eq!(next_chunk(96 * MIB, 200 * MIB, GIB, 128 * MIB, page), None);
        assert_eq!(
            next_chunk(96 * MIB, 128 * MIB, GIB, 128 * MIB, page),
            Some(32 * MIB)
        );
        // Nothing needed: none (the caller checks first).
        assert_eq!(next_chunk(96 * MIB, 96 * MIB, GIB, 64 * GIB, page), None);
        // Random cases: whatever comes back backs `end`, fits the room and the arena.
        let seed: u64 = rand::rng().random();
        println!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..10_000 {
            let mut draw = |n: u64| rng.random_range(0..n);
            let page = 4096 << draw(5);
            let arena = (1 + draw(1 << 10)) * page * 64;
            let backed = draw(arena / page) * page;
            let end = backed + 1 + draw(arena);
            let room = draw(arena * 2);
            if let Some(chunk) = next_chunk(backed, end, room, arena, page) {
                assert!(backed + chunk >= end, "falls short");
                assert!(chunk <= room && backed + chunk <= arena, "too much");
                assert_eq!(chunk % page, 0);
            } else {
                assert!(
                    end > arena || (end - backed).div_ceil(page) * page > room / page * page,
                    "refused though it fits: backed {backed} end {end} room {room} arena {arena}"
                );
            }
        }
    }
}
