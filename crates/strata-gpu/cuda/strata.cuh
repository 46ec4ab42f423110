// strata.cuh: the device side of Strata's GPU-driven demand paging.
//
// A kernel that includes this header reads and writes a *space* (a byte range larger than the
// GPU's memory) through a page cache in GPU memory. Every page fault is served by the warp that
// takes it, from the tier below (tiers.cuh): a pinned host copy of the whole space, or a pinned
// host cache over any store, which host threads fill through a request ring the warp posts to.
// No kernel launch, driver call or OS is on the path.
//
//   #include "strata.cuh"
//   extern "C" __global__ void sum(StrataSpace space, unsigned long long n, double* out) {
//       strata::Array<double> a(space);
//       for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
//            i += gridDim.x * blockDim.x)
//           atomicAdd(out, a.read(i));
//   }
//
// Element access: `read(i)`, `write(i, v)`, `atomic_add(i, v)`. A read or write of a page that
// is not resident goes over the bus in place (no frame taken) until the page has been accessed
// often enough to earn a frame (remote.cuh; SpaceOptions::remote_access); atomics and page
// access always migrate. Bulk loops over whole pages:
// `strata::acquire(space, page, write)` returns a pointer to the page's frame, valid until
// `strata::release(space, ref)`; both are warp-collective over the calling lanes (lanes that pass
// the same space and page share one pin). A warp's lanes may differ in everything: space, page,
// read or write, trip count, whether they call at all. What a kernel may hold at once, and what
// happens beyond that (a bounded wait, then an error), is said above acquire_page.
//
// Self-contained on purpose: it includes no toolkit header, so NVRTC compiles it with no CUDA
// toolkit installed (CI does exactly that). Needs sm_70 or newer (__match_any_sync, __nanosleep).
//
// The header is a few files, one concept each, under strata/ (nvcc users: keep strata.cuh and
// the strata/ directory side by side, or write them out with strata_gpu::nvrtc::write_headers):
//   layout.cuh             words and structs shared with Rust (checked on both sides)
//   primitives.cuh         ordered loads, fences, pins, error reports, bounded waits
//   policy_clock.cuh       clock with reference bits
//   policy_scan_resistant.cuh  clock with a protected segment
//   evict.cuh              the eviction sweep that asks the policy
//   copy.cuh               warp-cooperative page copies
//   tier_host_copy.cuh     tier: the whole space in pinned host memory
//   tier_ring.cuh          tier: a pinned host cache over any store, via a request ring
//   tier_peer.cuh          tier: a victim cache in neighbour GPUs' memory, above the host copy
//   tiers.cuh              the tier chain the fault path asks
//   fault.cuh              pin or claim, serve a fault
//   remote.cuh             per-page access mode: in place over the bus, or migrate
//   write_back.cuh         background write-back: dirty pages down before the hand needs them
//   access.cuh             acquire/release, Array, view_page/view_valid
#pragma once
// The parts, in dependency order (each relies on those before it; include strata.cuh, not a part).
#include "strata/layout.cuh"
#include "strata/primitives.cuh"
#include "strata/policy_clock.cuh"
#include "strata/policy_scan_resistant.cuh"
#include "strata/evict.cuh"
#include "strata/copy.cuh"
#include "strata/sectors.cuh"
#include "strata/tier_host_copy.cuh"
#include "strata/tier_ring.cuh"
#include "strata/tier_peer.cuh"
#include "strata/tiers.cuh"
#include "strata/fault.cuh"
#include "strata/remote.cuh"
#include "strata/write_back.cuh"
#include "strata/access.cuh"
