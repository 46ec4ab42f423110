//! Who owns each page of a unified allocation between two syncs: the coherence state machine.
//!
//! The data has one home, the pinned host copy the CPU reads and writes directly; kernels see
//! it through GPU frames (a cache). A page is in one of three states:
//!
//! ```text
//!              CpuWrote                         GpuWrote
//!   CpuOwned <────────── Shared (clean) ──────────────────> GpuOwned
//!   (host copy newer;     host copy = every GPU copy        (a GPU frame newer;
//!    GPU copy stale)                                          host copy stale)
//!      │  SyncToGpu: drop the GPU copy           SyncToCpu: write the frame down  │
//!      └──────────> Shared <──────────────────────────────────────────────────────┘
//! ```
//!
//! A page both sides wrote since the last sync ([`Violation::BothWrote`]) is an error, never a
//! silent choice: CpuOwned + GpuWrote and GpuOwned + CpuWrote. A GPU write to a read-mostly
//! page is an error too ([`Violation::ReadMostlyWritten`]): read-mostly pages are never
//! written back. `Discard` drops the GPU copy without writing it back from any state.
//!
//! Events arrive at sync points (the tracker compares page hashes, the GPU's page table has a
//! dirty bit), not at the writes themselves: this module only says what a sync must do.

/// The state of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageState {
    /// Both sides agree: the host copy is current and any GPU copy equals it.
    #[default]
    Shared,
    /// The CPU wrote the host copy since the last sync; a GPU copy, if any, is stale.
    CpuOwned,
    /// A GPU frame holds writes the host copy lacks.
    GpuOwned,
}

/// Something a sync observed or asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The CPU wrote the page (its hash changed, or the caller declared the write).
    CpuWrote,
    /// The page sits dirty in a GPU frame.
    GpuWrote,
    /// A kernel is about to run: the GPU must see the CPU's writes.
    SyncToGpu,
    /// The CPU is about to read: it must see the GPU's writes.
    SyncToCpu,
    /// The page's contents are no longer wanted: drop the GPU copy, write nothing back.
    Discard,
}

/// What the sync must do to the page's copies for a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing moves.
    None,
    /// Free the page's GPU frame without writing it back (the host copy is newer, or the
    /// contents were discarded).
    DropGpuCopy,
    /// Write the page's GPU frame down into the host copy (the frame stays, clean).
    WriteDown,
}

/// A transition the rules forbid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// The CPU and the GPU both wrote the page since the last sync.
    BothWrote,
    /// A kernel wrote a page advised read-mostly.
    ReadMostlyWritten,
}

/// One transition: the next state and the action, or the violation (the state is then
/// unchanged, so nothing is lost: both copies stay as they are).
pub fn step(
    state: PageState,
    event: Event,
    read_mostly: bool,
) -> Result<(PageState, Action), Violation> {
    use PageState::{CpuOwned, GpuOwned, Shared};
    Ok(match (state, event) {
        (_, Event::GpuWrote) if read_mostly => return Err(Violation::ReadMostlyWritten),
        (GpuOwned, Event::CpuWrote) | (CpuOwned, Event::GpuWrote) => {
            return Err(Violation::BothWrote);
        }
        (Shared | CpuOwned, Event::CpuWrote) => (CpuOwned, Action::None),
        (Shared | GpuOwned, Event::GpuWrote) => (GpuOwned, Action::None),
        (CpuOwned, Event::SyncToGpu) => (Shared, Action::DropGpuCopy),
        (GpuOwned, Event::SyncToCpu) => (Shared, Action::WriteDown),
        (Shared, Event::SyncToGpu | Event::SyncToCpu)
        | (CpuOwned, Event::SyncToCpu)
        | (GpuOwned, Event::SyncToGpu) => (state, Action::None),
        (_, Event::Discard) => (Shared, Action::DropGpuCopy),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use PageState::{CpuOwned, GpuOwned, Shared};
    use proptest::prelude::*;

    #[test]
    fn the_table() {
        let ok = |s, e| step(s, e, false).unwrap();
        assert_eq!(ok(Shared, Event::CpuWrote), (CpuOwned, Action::None));
        assert_eq!(ok(Shared, Event::GpuWrote), (GpuOwned, Action::None));
        assert_eq!(
            ok(CpuOwned, Event::SyncToGpu),
            (Shared, Action::DropGpuCopy)
        );
        assert_eq!(ok(GpuOwned, Event::SyncToCpu), (Shared, Action::WriteDown));
        assert_eq!(ok(CpuOwned, Event::SyncToCpu), (CpuOwned, Action::None));
        assert_eq!(ok(GpuOwned, Event::SyncToGpu), (GpuOwned, Action::None));
        assert_eq!(ok(Shared, Event::SyncToGpu), (Shared, Action::None));
        assert_eq!(ok(Shared, Event::SyncToCpu), (Shared, Action::None));
        for s in [Shared, CpuOwned, GpuOwned] {
            assert_eq!(ok(s, Event::Discard), (Shared, Action::DropGpuCopy));
        }
        assert_eq!(
            step(CpuOwned, Event::GpuWrote, false),
            Err(Violation::BothWrote)
        );
        assert_eq!(
            step(GpuOwned, Event::CpuWrote, false),
            Err(Violation::BothWrote)
        );
        for s in [Shared, CpuOwned, GpuOwned] {
            assert_eq!(
                step(s, Event::GpuWrote, true),
                Err(Violation::ReadMostlyWritten)
            );
        }
        // Read-mostly pages still take CPU writes (the GPU's replica is dropped at the sync).
        assert_eq!(
            step(Shared, Event::CpuWrote, true).unwrap(),
            (CpuOwned, Action::None)
        );
        assert_eq!(
            step(CpuOwned, Event::SyncToGpu, true).unwrap(),
            (Shared, Action::DropGpuCopy)
        );
    }

    /// One page's two copies in a model: the host copy's value, the GPU frame's value (if
    /// cached) with its dirty bit, and the value the last writer left.
    #[derive(Debug, Clone)]
    struct Model {
        host: u64,
        frame: Option<(u64, bool)>,
        latest: u64,
        state: PageState,
    }

    impl Model {
        fn gpu_view(&self) -> u64 {
            self.frame.map_or(self.host, |(v, _)| v)
        }
        fn apply(&mut self, action: Action) {
            match action {
                Action::None => {}
                Action::DropGpuCopy => self.frame = None,
                Action::WriteDown => {
                    if let Some((v, _)) = self.frame {
                        self.host = v;
                        self.frame = Some((v, false));
                    }
                }
            }
        }
    }

    /// Phases of a legal program: the CPU writes, then syncs to the GPU; the GPU loads,
    /// writes or evicts (a dirty eviction writes down on its own), then the CPU syncs back.
    #[derive(Debug, Clone)]
    enum Op {
        CpuWrite(u64),
        GpuLoad,
        GpuWrite(u64),
        GpuEvict,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u64>().prop_map(Op::CpuWrite),
            Just(Op::GpuLoad),
            any::<u64>().prop_map(Op::GpuWrite),
            Just(Op::GpuEvict),
        ]
    }

    proptest! {
        /// Alternating phases with syncs between them: after every sync the side about to
        /// run sees the latest value, whatever the writes, loads and evictions were.
        #[test]
        fn syncs_between_phases_never_lose_a_write(phases in proptest::collection::vec(
            (any::<bool>(), proptest::collection::vec(op(), 0..6)), 1..12)) {
            let mut m = Model { host: 0, frame: None, latest: 0, state: Shared };
            for (cpu_phase, ops) in phases {
                let mut wrote = false;
                for o in ops {
                    match (cpu_phase, o) {
                        (true, Op::CpuWrite(v)) => { m.host = v; m.latest = v; wrote = true; }
                        (false, Op::GpuLoad) if m.frame.is_none() => m.frame = Some((m.host, false)),
                        (false, Op::GpuWrite(v)) => { m.frame = Some((v, true)); m.latest = v; }
                        (false, Op::GpuEvict) => {
                            if let Some((v, dirty)) = m.frame.take() && dirty { m.host = v; }
                        }
                        _ => {}
                    }
                }
                if cpu_phase {
                    // The sync observes the CPU write (hash changed) and hands over to the GPU.
                    if wrote { m.state = step(m.state, Event::CpuWrote, false).unwrap().0; }
                    let (s, a) = step(m.state, Event::SyncToGpu, false).unwrap();
                    m.state = s;
                    m.apply(a);
                    prop_assert_eq!(m.gpu_view(), m.latest);
                } else {
                    if matches!(m.frame, Some((_, true))) {
                        m.state = step(m.state, Event::GpuWrote, false).unwrap().0;
                    }
                    let (s, a) = step(m.state, Event::SyncToCpu, false).unwrap();
                    m.state = s;
                    m.apply(a);
                    prop_assert_eq!(m.host, m.latest);
                    prop_assert_eq!(m.state, Shared);
                }
            }
        }

        /// Any event sequence: a violation never changes the state, and a discard always
        /// ends in Shared with the GPU copy dropped.
        #[test]
        fn violations_leave_the_state_alone(events in proptest::collection::vec(0u8..5, 1..40), rm: bool) {
            let mut s = Shared;
            for e in events {
                let e = [Event::CpuWrote, Event::GpuWrote, Event::SyncToGpu, Event::SyncToCpu, Event::Discard][e as usize];
                match step(s, e, rm) {
                    Ok((next, action)) => {
                        if e == Event::Discard { prop_assert_eq!((next, action), (Shared, Action::DropGpuCopy)); }
                        s = next;
                    }
                    Err(v) => {
                        prop_assert!(e == Event::GpuWrote || e == Event::CpuWrote);
                        if v == Violation::ReadMostlyWritten { prop_assert!(rm && e == Event::GpuWrote); }
                    }
                }
            }
        }
    }
}
