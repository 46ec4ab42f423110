//! Lease accounting under random operation sequences (proptest): the books stay consistent,
//! nothing is lent beyond an offer, refused operations change nothing, and every chunk comes
//! back exactly once.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use strata_broker::ledger::{Ledger, LedgerError};

const CHUNK: u64 = 2 << 20;

#[derive(Debug, Clone)]
enum Op {
    Offer {
        lender: u64,
        chunks: u64,
    },
    Borrow {
        borrower: u64,
        gpu: u32,
        bytes: u64,
        only: Option<u32>,
    },
    Deliver {
        pick: usize,
        fraction: u8,
        duplicate: bool,
    },
    Release {
        pick: usize,
        as_other: bool,
        stray: bool,
    },
    Reclaim {
        lender: u64,
        chunks: u64,
    },
    BorrowerGone {
        borrower: u64,
    },
    LenderGone {
        lender: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1..4u64, 0..10u64).prop_map(|(lender, chunks)| Op::Offer { lender, chunks }),
        (
            10..13u64,
            0..4u32,
            0..8 * CHUNK,
            proptest::option::of(0..4u32)
        )
            .prop_map(|(borrower, gpu, bytes, only)| Op::Borrow {
                borrower,
                gpu,
                bytes,
                only
            }),
        (any::<usize>(), any::<u8>(), any::<bool>()).prop_map(|(pick, fraction, duplicate)| {
            Op::Deliver {
                pick,
                fraction,
                duplicate,
            }
        }),
        (any::<usize>(), any::<bool>(), any::<bool>()).prop_map(|(pick, as_other, stray)| {
            Op::Release {
                pick,
                as_other,
                stray,
            }
        }),
        (1..4u64, 0..6u64).prop_map(|(lender, chunks)| Op::Reclaim { lender, chunks }),
        (10..13u64).prop_map(|borrower| Op::BorrowerGone { borrower }),
        (1..4u64).prop_map(|lender| Op::LenderGone { lender }),
    ]
}

fn snapshot(l: &Ledger) -> String {
    format!("{:?} {:?}", l.gpus(), l.leases().collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn books_stay_consistent(ops in proptest::collection::vec(op(), 1..60)) {
        let mut ledger = Ledger::default();
        // Lender `l` is on GPU `l`; chunk ids are counted per lender.
        let mut next_chunk: BTreeMap<u64, u64> = BTreeMap::new();
        let mut gone_lenders = BTreeSet::new();
        // Chunks lent and not yet back, per lender: each must come back exactly once.
        let mut out: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Offer { lender, chunks } => {
                    // A lender whose connection ended cannot offer again until its leases ran down.
                    let refused = ledger.lender(lender).is_some_and(|b| b.gone);
                    let r = ledger.offer(lender, u32::try_from(lender).unwrap(), CHUNK, chunks * CHUNK);
                    prop_assert_eq!(r.is_ok(), !refused);
                    if r.is_ok() {
                        gone_lenders.remove(&lender);
                    }
                }
                Op::Borrow { borrower, gpu, bytes, only } => {
                    let from: Vec<u32> = only.into_iter().collect();
                    let available = ledger.available_bytes(gpu, &from);
                    let before = snapshot(&ledger);
                    match ledger.plan_borrow(borrower, gpu, bytes, &from) {
                        Ok(portions) => {
                            prop_assert!(bytes > 0 && bytes <= available);
                            let total: u64 = portions.iter().map(|p| p.chunks * CHUNK).sum();
                            prop_assert!(total >= bytes && total < bytes + CHUNK, "whole chunks, no more than needed");
                            for p in &portions {
                                let book = ledger.lender(p.lender).unwrap();
                                prop_assert_ne!(book.gpu, gpu, "never the borrower's own GPU");
                                prop_assert!(book.lent() + book.reserved <= book.max_chunks, "nothing beyond the offer");
                            }
                        }
                        Err(e) => {
                            prop_assert!(bytes == 0 || bytes > available, "{e}");
                            prop_assert_eq!(snapshot(&ledger), before, "a refused borrow reserves nothing");
                        }
                    }
                }
                Op::Deliver { pick, fraction, duplicate } => {
                    let open: Vec<_> = ledger.leases().filter(|l| l.reserved > 0).map(|l| (l.id, l.lender, l.reserved)).collect();
                    if open.is_empty() { continue; }
                    let (lease, lender, reserved) = open[pick % open.len()];
                    let n = (reserved * u64::from(fraction) / 255).max(1);
                    let next = next_chunk.entry(lender).or_insert(0);
                    let mut ids: Vec<u64> = (*next..*next + n).collect();
                    *next += n;
                    let before = snapshot(&ledger);
                    if duplicate {
                        // A hostile lender repeating an id (or re-lending a lent one).
                        let again = out.get(&lender).and_then(|s| s.iter().next().copied()).unwrap_or(ids[0]);
                        ids.push(again);
                        let r = ledger.grant(lease, &ids);
                        prop_assert!(matches!(r, Err(LedgerError::UnexpectedChunk(_))), "{:?}", r);
                        prop_assert_eq!(snapshot(&ledger), before);
                        ledger.unreserve(lease, n);
                    } else {
                        ledger.grant(lease, &ids).unwrap();
                        out.entry(lender).or_default().extend(ids);
                    }
                }
                Op::Release { pick, as_other, stray } => {
                    let held: Vec<_> = ledger.leases().filter(|l| !l.chunks.is_empty()).map(|l| (l.id, l.borrower, l.lender, l.chunks.clone())).collect();
                    if held.is_empty() { continue; }
                    let (lease, borrower, lender, chunks) = held[pick % held.len()].clone();
                    let mut ids: Vec<u64> = chunks.iter().copied().take(1 + pick % chunks.len()).collect();
                    let before = snapshot(&ledger);
                    if as_other || stray {
                        if stray { ids.push(u64::MAX); }
                        let who = if as_other { borrower + 100 } else { borrower };
                        prop_assert!(ledger.release(who, lease, &ids).is_err());
                        prop_assert_eq!(snapshot(&ledger), before, "a refused release changes nothing");
                    } else {
                        prop_assert_eq!(ledger.release(borrower, lease, &ids).unwrap(), lender);
                        for c in ids {
                            prop_assert!(out.get_mut(&lender).unwrap().remove(&c), "chunk back twice");
                        }
                    }
                }
                Op::Reclaim { lender, chunks } => {
                    let before: BTreeSet<(u64, u64)> = ledger.leases().flat_map(|l| l.revoking.iter().map(move |&c| (l.id, c))).collect();
                    if let Ok(picks) = ledger.reclaim(lender, chunks * CHUNK) {
                        let picked: usize = picks.iter().map(|(_, c)| c.len()).sum();
                        prop_assert!(picked as u64 <= chunks);
                        for (lease, cs) in picks {
                            let l = ledger.lease(lease).unwrap();
                            prop_assert_eq!(l.lender, lender);
                            for c in cs {
                                prop_assert!(l.chunks.contains(&c));
                                prop_assert!(!before.contains(&(lease, c)), "a chunk revoked twice");
                            }
                        }
                    }
                }
                Op::BorrowerGone { borrower } => {
                    for (lender, chunks) in ledger.borrower_gone(borrower) {
                        for c in chunks {
                            prop_assert!(out.get_mut(&lender).unwrap().remove(&c), "chunk back twice");
                        }
                    }
                    prop_assert!(ledger.leases().all(|l| l.borrower != borrower));
                }
                Op::LenderGone { lender } => {
                    ledger.lender_gone(lender);
                    gone_lenders.insert(lender);
                    prop_assert_eq!(ledger.available_bytes(99, &[u32::try_from(lender).unwrap()]), 0);
                }
            }
            prop_assert_eq!(ledger.check(), Ok(()));
        }
        // Everything still out is on some lease, and everything on a lease is out.
        let on_leases: BTreeSet<(u64, u64)> = ledger.leases().flat_map(|l| l.chunks.iter().map(move |&c| (l.lender, c))).collect();
        let outstanding: BTreeSet<(u64, u64)> = out.iter().flat_map(|(&l, cs)| cs.iter().map(move |&c| (l, c))).collect();
        prop_assert_eq!(on_leases, outstanding);
    }
}
