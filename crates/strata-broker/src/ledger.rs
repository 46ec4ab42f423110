//! Lease accounting: what each lender offers, which chunks are lent to whom, which are being
//! revoked. Pure bookkeeping (no sockets, no clocks), so it is tested exhaustively on its own;
//! the broker drives it.
//!
//! Rules it keeps:
//! - a chunk belongs to at most one lease, and a lease to exactly one borrower and one lender;
//! - a lender's lent + reserved chunks never exceed what it offers when a borrow is planned
//!   (a reclaim may lower the offer below what is lent; the difference is being revoked);
//! - a client can release only chunks of its own leases, and a release is all or nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::message::GpuLending;

/// A connection's id at the broker.
pub type ClientId = u64;
/// A lease's id.
pub type LeaseId = u64;
/// A chunk's id (chosen by its lender, unique per lender).
pub type ChunkId = u64;

/// A refused ledger operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// Not enough lendable memory.
    #[error(
        "{wanted} bytes asked but only {available} bytes are lendable to this GPU now: ask for less, or start a lender (`strata lend`)"
    )]
    NotEnough {
        /// Bytes asked.
        wanted: u64,
        /// Bytes available.
        available: u64,
    },
    /// The client names a lease that is not its own (or does not exist).
    #[error("lease {0} is not held by this client")]
    LeaseNotHeld(LeaseId),
    /// The client names a chunk its lease does not hold.
    #[error("chunk {chunk} is not part of lease {lease}")]
    ChunkNotHeld {
        /// Lease.
        lease: LeaseId,
        /// Chunk.
        chunk: ChunkId,
    },
    /// A lender sent more chunks than were asked for, or a chunk id twice.
    #[error("lender sent chunk {0} that was not asked for or is already lent")]
    UnexpectedChunk(ChunkId),
    /// Not a lender (or an unknown one).
    #[error("client {0} has not offered memory (send `offer` first)")]
    NotLender(ClientId),
    /// Bad value.
    #[error("{0}")]
    Invalid(String),
}

/// One lender's books.
#[derive(Debug, Clone)]
pub struct LenderBook {
    /// GPU ordinal.
    pub gpu: u32,
    /// Chunk size.
    pub chunk_bytes: u64,
    /// Most chunks lent at once.
    pub max_chunks: u64,
    /// Chunks asked for but not yet delivered.
    pub reserved: u64,
    /// The lender's connection has ended: nothing new is lent, leases run down.
    pub gone: bool,
    /// Lent chunks and their lease.
    chunks: BTreeMap<ChunkId, LeaseId>,
}

impl LenderBook {
    /// Chunks lent now.
    pub fn lent(&self) -> u64 {
        self.chunks.len() as u64
    }

    /// Chunks a new borrow may take.
    pub fn available(&self) -> u64 {
        if self.gone {
            return 0;
        }
        self.max_chunks.saturating_sub(self.lent() + self.reserved)
    }
}

/// One lease: chunks of one lender held by one borrower.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Id.
    pub id: LeaseId,
    /// Borrower.
    pub borrower: ClientId,
    /// Borrower's GPU.
    pub borrower_gpu: u32,
    /// Lender.
    pub lender: ClientId,
    /// Chunks held.
    pub chunks: BTreeSet<ChunkId>,
    /// Chunks asked of the lender for this lease, not yet delivered.
    pub reserved: u64,
    /// Chunks the borrower has been asked to give back.
    pub revoking: BTreeSet<ChunkId>,
}

/// Chunks to take from one lender for a borrow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Portion {
    /// The lease created for them.
    pub lease: LeaseId,
    /// The lender.
    pub lender: ClientId,
    /// Chunks.
    pub chunks: u64,
}

/// The books of one broker.
#[derive(Debug, Default)]
pub struct Ledger {
    lenders: BTreeMap<ClientId, LenderBook>,
    leases: BTreeMap<LeaseId, Lease>,
    next_lease: LeaseId,
    cursor: usize,
}

impl Ledger {
    /// Records or updates `lender`'s offer.
    ///
    /// # Errors
    /// A zero chunk size, or a new chunk size while chunks are lent.
    pub fn offer(
        &mut self,
        lender: ClientId,
        gpu: u32,
        chunk_bytes: u64,
        max_bytes: u64,
    ) -> Result<(), LedgerError> {
        if chunk_bytes == 0 {
            return Err(LedgerError::Invalid(
                "chunk_bytes must be positive (2 MiB on current GPUs)".into(),
            ));
        }
        let max_chunks = max_bytes / chunk_bytes;
        match self.lenders.get_mut(&lender) {
            Some(book) if book.gone => Err(LedgerError::NotLender(lender)),
            Some(book) => {
                if book.chunk_bytes != chunk_bytes && book.lent() + book.reserved > 0 {
                    return Err(LedgerError::Invalid(format!(
                        "chunk size {chunk_bytes} differs from the {} bytes of chunks already lent",
                        book.chunk_bytes
                    )));
                }
                book.chunk_bytes = chunk_bytes;
                book.max_chunks = max_chunks;
                book.gpu = gpu;
                Ok(())
            }
            None => {
                self.lenders.insert(
                    lender,
                    LenderBook {
                        gpu,
                        chunk_bytes,
                        max_chunks,
                        reserved: 0,
                        gone: false,
                        chunks: BTreeMap::new(),
                    },
                );
                Ok(())
            }
        }
    }

    /// A lender's books.
    pub fn lender(&self, lender: ClientId) -> Option<&LenderBook> {
        self.lenders.get(&lender)
    }

    /// A lease.
    pub fn lease(&self, lease: LeaseId) -> Option<&Lease> {
        self.leases.get(&lease)
    }

    /// Every lease.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    fn candidates(&self, borrower_gpu: u32, from: &[u32]) -> Vec<ClientId> {
        self.lenders
            .iter()
            .filter(|(_, b)| {
                b.gpu != borrower_gpu
                    && (from.is_empty() || from.contains(&b.gpu))
                    && b.available() > 0
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// Bytes a borrower on `borrower_gpu` could get now from `from` (empty: any other GPU).
    pub fn available_bytes(&self, borrower_gpu: u32, from: &[u32]) -> u64 {
        self.candidates(borrower_gpu, from)
            .iter()
            .map(|id| self.lenders[id].available() * self.lenders[id].chunk_bytes)
            .sum()
    }

    /// Plans a borrow of `bytes` (whole chunks, lenders taking turns chunk by chunk) and
    /// reserves the chunks: one lease per lender involved.
    ///
    /// # Errors
    /// Zero bytes, or more than is lendable (nothing is reserved then).
    pub fn plan_borrow(
        &mut self,
        borrower: ClientId,
        borrower_gpu: u32,
        bytes: u64,
        from: &[u32],
    ) -> Result<Vec<Portion>, LedgerError> {
        if bytes == 0 {
            return Err(LedgerError::Invalid(
                "a borrow must ask for at least one byte".into(),
            ));
        }
        let available = self.available_bytes(borrower_gpu, from);
        if bytes > available {
            return Err(LedgerError::NotEnough {
                wanted: bytes,
                available,
            });
        }
        let ids = self.candidates(borrower_gpu, from);
        let mut take: BTreeMap<ClientId, u64> = BTreeMap::new();
        let mut covered = 0u64;
        let mut turn = self.cursor;
        while covered < bytes {
            // Some lender still has a chunk: covered < bytes <= available.
            let id = ids[turn % ids.len()];
            turn += 1;
            let book = &self.lenders[&id];
            let taken = take.entry(id).or_insert(0);
            if *taken < book.available() {
                *taken += 1;
                covered += book.chunk_bytes;
            }
        }
        self.cursor = turn;
        let mut portions = Vec::new();
        for (lender, chunks) in take {
            let lease = self.next_lease;
            self.next_lease += 1;
            if let Some(book) = self.lenders.get_mut(&lender) {
                book.reserved += chunks;
            }
            self.leases.insert(
                lease,
                Lease {
                    id: lease,
                    borrower,
                    borrower_gpu,
                    lender,
                    chunks: BTreeSet::new(),
                    reserved: chunks,
                    revoking: BTreeSet::new(),
                },
            );
            portions.push(Portion {
                lease,
                lender,
                chunks,
            });
        }
        Ok(portions)
    }

    fn drop_if_empty(&mut self, lease: LeaseId) {
        if let Some(l) = self.leases.get(&lease)
            && l.chunks.is_empty()
            && l.reserved == 0
        {
            let lender = l.lender;
            self.leases.remove(&lease);
            self.forget_lender_if_done(lender);
        }
    }

    fn forget_lender_if_done(&mut self, lender: ClientId) {
        if self
            .lenders
            .get(&lender)
            .is_some_and(|b| b.gone && b.lent() == 0 && b.reserved == 0)
        {
            self.lenders.remove(&lender);
        }
    }

    /// Records chunks a lender delivered for `lease` (from its reservation).
    ///
    /// # Errors
    /// An unknown lease, more chunks than reserved, or a chunk id already lent or repeated
    /// (nothing is recorded then).
    pub fn grant(&mut self, lease: LeaseId, chunks: &[ChunkId]) -> Result<(), LedgerError> {
        let l = self
            .leases
            .get(&lease)
            .ok_or(LedgerError::LeaseNotHeld(lease))?;
        let book = self
            .lenders
            .get(&l.lender)
            .ok_or(LedgerError::NotLender(l.lender))?;
        if chunks.len() as u64 > l.reserved {
            let first_extra = usize::try_from(l.reserved).unwrap_or(usize::MAX);
            return Err(LedgerError::UnexpectedChunk(chunks[first_extra]));
        }
        let mut seen = BTreeSet::new();
        for &c in chunks {
            if book.chunks.contains_key(&c) || !seen.insert(c) {
                return Err(LedgerError::UnexpectedChunk(c));
            }
        }
        let lender = l.lender;
        let n = chunks.len() as u64;
        if let Some(book) = self.lenders.get_mut(&lender) {
            book.reserved -= n;
            for &c in chunks {
                book.chunks.insert(c, lease);
            }
        }
        if let Some(l) = self.leases.get_mut(&lease) {
            l.reserved -= n;
            l.chunks.extend(chunks.iter().copied());
        }
        Ok(())
    }

    /// Gives up `n` reserved chunks of `lease` that will not be delivered.
    pub fn unreserve(&mut self, lease: LeaseId, n: u64) {
        let Some(l) = self.leases.get_mut(&lease) else {
            return;
        };
        let n = n.min(l.reserved);
        l.reserved -= n;
        let lender = l.lender;
        if let Some(book) = self.lenders.get_mut(&lender) {
            book.reserved -= n;
        }
        self.drop_if_empty(lease);
    }

    /// `borrower` gives back `chunks` of `lease`; returns the lender.
    ///
    /// # Errors
    /// A lease not the borrower's or a chunk not in it (nothing changes then).
    pub fn release(
        &mut self,
        borrower: ClientId,
        lease: LeaseId,
        chunks: &[ChunkId],
    ) -> Result<ClientId, LedgerError> {
        let l = self
            .leases
            .get(&lease)
            .filter(|l| l.borrower == borrower)
            .ok_or(LedgerError::LeaseNotHeld(lease))?;
        let mut seen = BTreeSet::new();
        for &c in chunks {
            if !l.chunks.contains(&c) || !seen.insert(c) {
                return Err(LedgerError::ChunkNotHeld { lease, chunk: c });
            }
        }
        let lender = l.lender;
        if let Some(l) = self.leases.get_mut(&lease) {
            for c in chunks {
                l.chunks.remove(c);
                l.revoking.remove(c);
            }
        }
        if let Some(book) = self.lenders.get_mut(&lender) {
            for c in chunks {
                book.chunks.remove(c);
            }
        }
        self.drop_if_empty(lease);
        Ok(lender)
    }

    /// A lender wants `bytes` back: its offer drops by that much, and chunks (most recent
    /// leases first, none already being revoked) are picked for revocation.
    ///
    /// # Errors
    /// Not a lender.
    pub fn reclaim(
        &mut self,
        lender: ClientId,
        bytes: u64,
    ) -> Result<Vec<(LeaseId, Vec<ChunkId>)>, LedgerError> {
        let book = self
            .lenders
            .get_mut(&lender)
            .filter(|b| !b.gone)
            .ok_or(LedgerError::NotLender(lender))?;
        let want = bytes.div_ceil(book.chunk_bytes);
        book.max_chunks = book.max_chunks.saturating_sub(want);
        let mut left = want;
        let mut picks = Vec::new();
        for l in self.leases.values_mut().rev() {
            if left == 0 {
                break;
            }
            if l.lender != lender {
                continue;
            }
            let mut chosen = Vec::new();
            for &c in l.chunks.iter().rev() {
                if left == 0 {
                    break;
                }
                if l.revoking.insert(c) {
                    chosen.push(c);
                    left -= 1;
                }
            }
            if !chosen.is_empty() {
                picks.push((l.id, chosen));
            }
        }
        Ok(picks)
    }

    /// The borrower's connection ended: its leases end; returns, per lender, the chunks that
    /// are free again.
    pub fn borrower_gone(&mut self, borrower: ClientId) -> Vec<(ClientId, Vec<ChunkId>)> {
        let ids: Vec<LeaseId> = self
            .leases
            .values()
            .filter(|l| l.borrower == borrower)
            .map(|l| l.id)
            .collect();
        let mut freed: BTreeMap<ClientId, Vec<ChunkId>> = BTreeMap::new();
        for id in ids {
            let Some(l) = self.leases.remove(&id) else {
                continue;
            };
            if let Some(book) = self.lenders.get_mut(&l.lender) {
                book.reserved -= l.reserved;
                for c in &l.chunks {
                    book.chunks.remove(c);
                }
            }
            if !l.chunks.is_empty() {
                freed
                    .entry(l.lender)
                    .or_default()
                    .extend(l.chunks.iter().copied());
            }
            self.forget_lender_if_done(l.lender);
        }
        freed.into_iter().collect()
    }

    /// The lender's connection ended: nothing more is lent from it; returns every lease of it
    /// with the chunks not yet being revoked, for the broker to revoke.
    pub fn lender_gone(&mut self, lender: ClientId) -> Vec<(LeaseId, ClientId, Vec<ChunkId>)> {
        let Some(book) = self.lenders.get_mut(&lender) else {
            return Vec::new();
        };
        book.gone = true;
        book.max_chunks = 0;
        let mut out = Vec::new();
        for l in self.leases.values_mut().filter(|l| l.lender == lender) {
            let fresh: Vec<ChunkId> = l
                .chunks
                .iter()
                .copied()
                .filter(|c| !l.revoking.contains(c))
                .collect();
            l.revoking.extend(fresh.iter().copied());
            if !fresh.is_empty() {
                out.push((l.id, l.borrower, fresh));
            }
        }
        self.forget_lender_if_done(lender);
        out
    }

    /// Per GPU lending, for `Status`.
    pub fn gpus(&self) -> Vec<GpuLending> {
        let mut by_gpu: BTreeMap<u32, GpuLending> = BTreeMap::new();
        for b in self.lenders.values().filter(|b| !b.gone) {
            let g = by_gpu.entry(b.gpu).or_insert(GpuLending {
                gpu: b.gpu,
                lenders: 0,
                offered_bytes: 0,
                lent_bytes: 0,
                available_bytes: 0,
                chunk_bytes: b.chunk_bytes,
            });
            g.lenders += 1;
            g.offered_bytes += b.max_chunks * b.chunk_bytes;
            g.lent_bytes += b.lent() * b.chunk_bytes;
            g.available_bytes += b.available() * b.chunk_bytes;
        }
        by_gpu.into_values().collect()
    }

    /// Checks the books against each other (tests); describes the first inconsistency.
    ///
    /// # Errors
    /// The inconsistency found.
    pub fn check(&self) -> Result<(), String> {
        for (&id, b) in &self.lenders {
            let leases: Vec<&Lease> = self.leases.values().filter(|l| l.lender == id).collect();
            let lent: u64 = leases.iter().map(|l| l.chunks.len() as u64).sum();
            let reserved: u64 = leases.iter().map(|l| l.reserved).sum();
            if lent != b.lent() || reserved != b.reserved {
                return Err(format!(
                    "lender {id}: book says {}+{} chunks, leases {lent}+{reserved}",
                    b.lent(),
                    b.reserved
                ));
            }
            for (c, lease) in &b.chunks {
                if !self.leases.get(lease).is_some_and(|l| l.chunks.contains(c)) {
                    return Err(format!(
                        "lender {id}: chunk {c} points at lease {lease} that lacks it"
                    ));
                }
            }
        }
        for l in self.leases.values() {
            if !self.lenders.contains_key(&l.lender) {
                return Err(format!("lease {} of unknown lender {}", l.id, l.lender));
            }
            if !l.revoking.is_subset(&l.chunks) {
                return Err(format!("lease {} revokes chunks it does not hold", l.id));
            }
            if l.chunks.is_empty() && l.reserved == 0 {
                return Err(format!("lease {} is empty but kept", l.id));
            }
        }
        Ok(())
    }
}
