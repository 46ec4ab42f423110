//! The host-copy tier: the whole space in pinned host memory mapped into the GPU. Faulting
//! warps load from it and write dirty victims back to it directly; the host touches it only
//! when no kernel runs.

use std::ops::Range;

use crate::driver::MappedHostBuffer;

/// The pinned copy of a whole space.
#[derive(Debug)]
pub(crate) struct HostCopy {
    pub(crate) buffer: MappedHostBuffer,
}

fn span(offset: u64, len: usize) -> Range<usize> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    start..start.saturating_add(len)
}

impl HostCopy {
    /// Wraps a fresh buffer and zero-fills it (cuMemHostAlloc does not).
    pub(crate) fn new(mut buffer: MappedHostBuffer) -> Self {
        buffer.as_mut_slice().fill(0);
        HostCopy { buffer }
    }

    pub(crate) fn read(&self, offset: u64, out: &mut [u8]) {
        out.copy_from_slice(&self.buffer.as_slice()[span(offset, out.len())]);
    }

    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) {
        self.buffer.as_mut_slice()[span(offset, data.len())].copy_from_slice(data);
    }

    pub(crate) fn zero(&mut self, range: Range<u64>) {
        let len = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
        self.buffer.as_mut_slice()[span(range.start, len)].fill(0);
    }
}
