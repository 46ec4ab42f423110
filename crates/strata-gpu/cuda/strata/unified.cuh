// strata/unified.cuh: kernels over a unified allocation (strata-unified's `Unified`, C's
// strata_alloc): one copy of the data that CPU code reads and writes through an ordinary
// pointer and kernels through this header, byte offsets equal on both sides.
//
//   #include "strata/unified.cuh"
//   struct Node { unsigned long long next; unsigned long long value; };  // next: a CPU address
//   extern "C" __global__ void sum_list(StrataUnified u, unsigned long long head, unsigned long long* out) {
//       strata::Unified<unsigned long long> a(u);
//       unsigned long long s = 0;
//       for (unsigned long long at = strata::unified_offset(u, head); at != STRATA_UNIFIED_NULL;
//            at = strata::unified_offset(u, a.read(at / 8)))
//           s += a.read(at / 8 + 1);
//       *out = s;
//   }
//
// Kernels run between a sync to the GPU and a sync to the CPU (the host's launch helper does
// both); the CPU does not touch the allocation meanwhile.
#pragma once
#include "strata.cuh"

// The value kernels take: the space's handle, the CPU address of byte 0 and the read-mostly
// replica (128 bytes; Rust's strata_unified::UnifiedHandle, C's strata_unified_handle_t).
// The replica is a copy in GPU memory of bytes [replica_begin, replica_end) that the host keeps
// equal to the host copy at each sync to the GPU (read-mostly data: never written back), so
// element reads there are plain loads with no page-table lookup.
struct StrataUnified {
    StrataSpace space;
    strata_u64 cpu_base;       // the CPU address of byte 0
    strata_u64 replica;        // device address of the replica, 0 when there is none
    strata_u64 replica_begin;  // first byte the replica holds
    strata_u64 replica_end;    // one past the last
};
static_assert(sizeof(StrataUnified) == 128, "StrataUnified must match the host's layout");

// A null or foreign CPU address translated: no offset.
#define STRATA_UNIFIED_NULL 0xFFFFFFFFFFFFFFFFull

namespace strata {

// The byte offset of a CPU address inside the allocation, or STRATA_UNIFIED_NULL when it is
// null or points outside (so a pointer chase ends at the structure's null).
__device__ __forceinline__ strata_u64 unified_offset(const StrataUnified& u, strata_u64 cpu_address) {
    const strata_u64 off = cpu_address - u.cpu_base;  // wraps for addresses below the base
    return (cpu_address == 0 || off >= u.space.size_bytes) ? STRATA_UNIFIED_NULL : off;
}

// The CPU address of a byte offset (to store pointers the CPU will follow).
__device__ __forceinline__ strata_u64 unified_address(const StrataUnified& u, strata_u64 offset) {
    return u.cpu_base + offset;
}

// Elements of type T over a unified allocation: Array<T> (read, write, atomic_add; same rules
// as strata.cuh) plus translation of CPU pointers to element indices. Reads of elements the
// read-mostly replica holds are plain (read-only cached) loads from it; writes always go
// through the page cache (a write to read-mostly data is an error the host reports at the
// next sync; the kernel's own later reads from the replica do not see it).
template <typename T> struct Unified : Array<T> {
    strata_u64 cpu_base;
    const unsigned char* replica;
    strata_u64 replica_begin;
    strata_u64 replica_len;
    __device__ explicit Unified(const StrataUnified& u)
        : Array<T>(u.space), cpu_base(u.cpu_base), replica((const unsigned char*)u.replica),
          replica_begin(u.replica_begin),
          replica_len(u.replica ? u.replica_end - u.replica_begin : 0) {}

    __device__ __forceinline__ T read(strata_u64 i) const {
        const strata_u64 rel = i * sizeof(T) - replica_begin;  // wraps below the replica
        if (i < this->size() && rel < replica_len && rel + sizeof(T) <= replica_len)
            return *(const T*)(replica + rel);
        return Array<T>::read(i);
    }

    // The element index of a CPU pointer into the allocation; an index past the end (reported
    // as an out-of-range access if used) for null or foreign pointers or misaligned ones.
    __device__ __forceinline__ strata_u64 index_of(const T* cpu_pointer) const {
        const strata_u64 a = (strata_u64)cpu_pointer;
        const strata_u64 off = a - cpu_base;
        if (a == 0 || off >= this->s.size_bytes || off % sizeof(T) != 0) return STRATA_UNIFIED_NULL;
        return off / sizeof(T);
    }
};

// Lean reads of data advised read-mostly (Advice::ReadMostly, STRATA_ADVISE_READ_MOSTLY): from
// the replica where it holds the element, otherwise straight from the pinned host copy over the
// bus, never through the page cache. Correct because read-mostly data is never written by
// kernels, so between syncs the host copy is its truth (CPU writes land there directly). A
// kernel that reads only through this type needs few registers (a random gather runs at full
// occupancy, as over a plain pointer); Unified<T>::read inlines the page-cache path and its
// registers. Reading pages not advised read-mostly through it may miss the GPU's own writes
// in the same phase. An allocation over a store has no host copy: there every read outside
// the replica is reported as out of range and returns 0.
template <typename T> struct ReadMostly {
    StrataSpace s;  // by value, as Array<T>: the fields a read uses stay in registers
    const unsigned char* replica;
    strata_u64 replica_begin;
    strata_u64 replica_len;
    __device__ explicit ReadMostly(const StrataUnified& u)
        : s(u.space), replica((const unsigned char*)u.replica), replica_begin(u.replica_begin),
          replica_len(u.replica ? u.replica_end - u.replica_begin : 0) {}

    __device__ __forceinline__ strata_u64 size() const { return s.size_bytes / sizeof(T); }

    __device__ __forceinline__ T read(strata_u64 i) const {
        if (i >= size()) {
            detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, i);
            return T(0);
        }
        const strata_u64 byte = i * sizeof(T);
        const strata_u64 rel = byte - replica_begin;  // wraps below the replica
        if (rel < replica_len && rel + sizeof(T) <= replica_len) return *(const T*)(replica + rel);
        if (s.tier == STRATA_TIER_HOST_COPY) return detail::load_cg((const T*)(s.host + byte));
        detail::report_error(s, STRATA_ERR_OUT_OF_RANGE, i);
        return T(0);
    }
};

}  // namespace strata
