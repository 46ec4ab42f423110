//! A large array placed in one of the memories a user could choose: a Strata space, GPU
//! memory, pinned host memory read in place (zero-copy), or CUDA managed memory (UVM). The
//! workload kernels take it as their first argument, a `StrataSpace` or a plain pointer.

use std::sync::Arc;

use strata_gpu::driver::{Args, DeviceBuffer, Gpu, ManagedBuffer, MappedHostBuffer};
use strata_gpu::space::PeerBorrow;
use strata_gpu::{ElementType, EvictionPolicy, GpuStats, Space, SpaceOptions, Strata};

use super::device::{GpuWorkloadError, HEADROOM, context_sync, ensure_fits};
use crate::par;

/// Plain 4-byte elements that can be copied into byte buffers (little-endian, as the GPU
/// reads them).
pub trait Element: Copy + Send + Sync + 'static {
    /// The Strata element type.
    const TYPE: ElementType;
    /// The element's bytes.
    fn bytes(self) -> [u8; 4];
}

impl Element for u32 {
    const TYPE: ElementType = ElementType::U32;
    fn bytes(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

impl Element for f32 {
    const TYPE: ElementType = ElementType::F32;
    fn bytes(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

/// Copies `src` into the front of `dst` as bytes, in parallel.
pub fn copy_into<T: Element>(dst: &mut [u8], src: &[T]) {
    const CHUNK: usize = 1 << 20;
    par::for_each_chunk_mut(&mut dst[..src.len() * 4], CHUNK * 4, |chunk, out| {
        for (bytes, value) in out.chunks_exact_mut(4).zip(&src[chunk * CHUNK..]) {
            bytes.copy_from_slice(&value.bytes());
        }
    });
}

/// Where an array lives (see the module docs).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a handful of values, each owning gigabytes elsewhere
pub enum Placed {
    /// A Strata space (paged into a GPU cache on demand).
    Space(Space),
    /// GPU memory: the upper bound, where it fits.
    Device(DeviceBuffer),
    /// Pinned host memory mapped into the GPU, read directly over PCIe (EMOGI's zero-copy).
    ZeroCopy(MappedHostBuffer),
    /// CUDA managed memory (UVM), only where it fits in free GPU memory.
    Managed(ManagedBuffer, Arc<Gpu>),
}

impl Placed {
    /// `data` in a Strata space with a cache of `cache_bytes`.
    ///
    /// # Errors
    /// Invalid options, or a cache that does not fit in free GPU memory.
    pub fn space<T: Element>(
        strata: &Strata,
        data: &[T],
        cache_bytes: u64,
        page_size: u64,
        policy: EvictionPolicy,
    ) -> Result<Self, GpuWorkloadError> {
        Self::space_with_peers(strata, data, cache_bytes, page_size, policy, &[])
    }

    /// `data` in a Strata space with a cache of `cache_bytes` and a peer tier in the
    /// neighbour GPUs' memory `peers` names ([`SpaceOptions::peers`]; empty: host only).
    ///
    /// # Errors
    /// Invalid options, a cache that does not fit in free GPU memory, or a lender that cannot
    /// lend (missing, the space's own GPU, unreachable, short of memory).
    pub fn space_with_peers<T: Element>(
        strata: &Strata,
        data: &[T],
        cache_bytes: u64,
        page_size: u64,
        policy: EvictionPolicy,
        peers: &[PeerBorrow],
    ) -> Result<Self, GpuWorkloadError> {
        let options = SpaceOptions {
            page_size,
            cache_bytes,
            element: T::TYPE,
            policy,
            // Opt-in (STRATA_GPU_READ_THROUGH=true): first touches read from the host copy.
            read_through: strata_gpu::space::read_through_from_env()?.unwrap_or(false),
            host_cache_bytes: None,
            background_write_back: strata_gpu::space::default_write_back(),
            peers: peers.to_vec(),
            // STRATA_GPU_REMOTE_ACCESS=off|auto|N; auto (the default) when unset.
            remote_access: strata_gpu::space::remote_access_from_env()?.unwrap_or_default(),
            // STRATA_GPU_SECTOR=SIZE: sub-page fetch for the kernels' element reads.
            sector_bytes: strata_gpu::space::sector_from_env()?.flatten(),
        };
        let mut space = strata.space((data.len() as u64 * 4).max(4), &options)?;
        space.with_host_mut(|bytes| copy_into(bytes, data))?;
        // The workloads' kernels only read their inputs (a graph's rows, an embedding table):
        // a read-only space reads pages in place without invalidating the SM's L1.
        space.set_read_only(true)?;
        Ok(Self::Space(space))
    }

    /// `data` in GPU memory.
    ///
    /// # Errors
    /// It does not fit, or the copy failed.
    pub fn device<T: Element>(gpu: &Arc<Gpu>, data: &[T]) -> Result<Self, GpuWorkloadError> {
        ensure_fits(
            gpu,
            data.len() as u64 * 4,
            "the array in GPU memory",
            "this baseline is skipped",
        )?;
        let buffer = DeviceBuffer::zeroed(gpu, data.len().max(1) * 4)?;
        buffer.upload(0, data)?;
        context_sync(gpu)?;
        Ok(Self::Device(buffer))
    }

    /// `data` in pinned host memory mapped into the GPU.
    ///
    /// # Errors
    /// Pinning failed.
    pub fn zero_copy<T: Element>(gpu: &Arc<Gpu>, data: &[T]) -> Result<Self, GpuWorkloadError> {
        let mut buffer = MappedHostBuffer::new(gpu, data.len().max(1) * 4)?;
        copy_into(buffer.as_mut_slice(), data);
        Ok(Self::ZeroCopy(buffer))
    }

    /// `data` in managed memory (refused unless it fits in free GPU memory).
    ///
    /// # Errors
    /// It does not fit, or the allocation failed.
    pub fn managed<T: Element>(gpu: &Arc<Gpu>, data: &[T]) -> Result<Self, GpuWorkloadError> {
        let bytes = data.len().max(1) * 4;
        let advice = "UVM is measured only with data that fits, never oversubscribed";
        ensure_fits(gpu, bytes as u64, "a managed (UVM) buffer", advice)?;
        let mut buffer = ManagedBuffer::new_if_fits(gpu, bytes, HEADROOM)?.ok_or_else(|| {
            GpuWorkloadError::Invalid(
                "free GPU memory shrank while allocating managed memory".into(),
            )
        })?;
        copy_into(buffer.as_mut_slice(), data);
        Ok(Self::Managed(buffer, gpu.clone()))
    }

    /// Whether the kernels' `_space` variant applies.
    #[must_use]
    pub fn is_space(&self) -> bool {
        matches!(self, Self::Space(_))
    }

    /// Kernel arguments starting with this array (a `StrataSpace` or a device pointer).
    #[must_use]
    pub fn first_arg(&self) -> Args {
        match self {
            Self::Space(space) => Args::new().arg(space.handle()),
            Self::Device(buffer) => Args::new().arg(buffer.ptr()),
            Self::ZeroCopy(buffer) => Args::new().arg(buffer.device_ptr()),
            Self::Managed(buffer, _) => Args::new().arg(buffer.ptr()),
        }
    }

    /// Puts the data back where a fresh run starts: a Strata space with an empty cache and
    /// zeroed statistics; managed memory migrated back to the host. Zero-copy and GPU memory
    /// have no such state.
    ///
    /// # Errors
    /// The eviction or migration failed.
    pub fn make_cold(&self) -> Result<(), GpuWorkloadError> {
        match self {
            Self::Space(space) => {
                space.evict(0..space.size())?;
                space.reset_stats()?;
            }
            Self::Managed(buffer, gpu) => {
                buffer.prefetch_to_host()?;
                gpu.synchronize()?;
            }
            Self::Device(_) | Self::ZeroCopy(_) => {}
        }
        Ok(())
    }

    /// Zeroes Strata's statistics, leaving the cache as it is (spaces only).
    ///
    /// # Errors
    /// Writing the device counters failed.
    pub fn reset_stats(&self) -> Result<(), GpuWorkloadError> {
        if let Self::Space(space) = self {
            space.reset_stats()?;
        }
        Ok(())
    }

    /// Strata's statistics (spaces only).
    ///
    /// # Errors
    /// Reading the device counters failed.
    pub fn stats(&self) -> Result<Option<GpuStats>, GpuWorkloadError> {
        match self {
            Self::Space(space) => Ok(Some(space.stats()?)),
            _ => Ok(None),
        }
    }

    /// Reports an out-of-range access a kernel made into the space.
    ///
    /// # Errors
    /// [`strata_gpu::SpaceError::OutOfRange`].
    pub fn check(&self) -> Result<(), GpuWorkloadError> {
        if let Self::Space(space) = self {
            space.check_errors()?;
        }
        Ok(())
    }
}
