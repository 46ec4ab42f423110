/* strata.h: Strata's C API (libstrata.so).
 *
 * GPU spaces: byte ranges larger than GPU memory, paged on demand by the GPU itself. Open a GPU
 * (strata_gpu_open), create a space on it (strata_space_create), fill it, pass its handle
 * (strata_space_handle_t, the same bytes as strata.cuh's StrataSpace) by value to kernels built
 * with nvcc that include strata.cuh, then read it back.
 *
 * Pager regions: CPU memory whose pages live in a store (memory, file, remote memory nodes,
 * optionally compressed) and come in on demand through userfaultfd (strata_region_open).
 *
 * Streams: the space calls run Strata's maintenance kernels on Strata's own (non-blocking) stream
 * and return when they are done; they do not wait for your kernels, so synchronize yours
 * (cudaDeviceSynchronize or cudaStreamSynchronize) before reading, filling or flushing a space.
 *
 * Errors: every int-returning call returns STRATA_OK (0) or a STRATA_E_* code and leaves a
 * message in a thread-local string, strata_last_error() ("" after a successful call; valid until
 * the next Strata call on the same thread).
 *
 * Link with -lstrata (pkg-config strata, or find_package(Strata) in CMake). The Umap-compatible
 * API (umap.h, libstrata_umap.so) is separate and unchanged.
 */
#ifndef STRATA_H
#define STRATA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------------------------- */
#define STRATA_OK 0
#define STRATA_E_INVALID 1             /* bad argument: NULL pointer, bad string or number */
#define STRATA_E_CONFIG 2              /* bad store/codec spec or pager configuration */
#define STRATA_E_STORE 3               /* the store could not be opened or filled from */
#define STRATA_E_REGION 4              /* a pager region failed (userfaultfd, write-back, range) */
#define STRATA_E_NO_DRIVER 5           /* no CUDA driver (libcuda.so) on this machine */
#define STRATA_E_CUDA 6                /* a CUDA driver call failed */
#define STRATA_E_COMPILE 7             /* Strata's kernels did not compile (NVRTC) */
#define STRATA_E_NO_MEMORY 8           /* the page cache does not fit in free GPU memory */
#define STRATA_E_RANGE 9               /* a host-side range outside the space */
#define STRATA_E_KERNEL_OUT_OF_RANGE 10 /* a kernel accessed an element or page outside the space */
#define STRATA_E_NO_FRAME 11           /* a kernel held more pages at once than the cache has frames */
#define STRATA_E_HANDLE 12             /* not a live unified allocation (freed already, or never allocated) */
#define STRATA_E_CONFLICT 13           /* the CPU and the GPU both wrote a page since the last sync */
#define STRATA_E_READ_MOSTLY 14        /* a kernel wrote a page advised read-mostly (its writes were dropped) */
#define STRATA_E_UNSUPPORTED 15        /* a use this version refuses (allocations larger than host memory) */

/* This thread's last error message ("" when the last call succeeded). */
const char* strata_last_error(void);
/* "STRATA_OK", "STRATA_E_NO_DRIVER", ... ("STRATA_E_UNKNOWN" for other values). */
const char* strata_status_name(int status);
/* The library version, e.g. "0.1.0". */
const char* strata_version(void);

/* ---- GPU spaces --------------------------------------------------------------------------- */

/* The handle kernels take by value: identical in layout to `StrataSpace` in strata.cuh (96
 * bytes). In a .cu file that includes both headers, copy it into a StrataSpace with memcpy
 * (see examples/gpu-space/scale.cu). */
typedef struct strata_space_handle_t {
    uint64_t page_table;
    uint64_t frames;
    uint64_t frame_data;
    uint64_t host;
    uint64_t counters;
    uint64_t size_bytes;
    uint64_t pages;
    uint32_t frame_count;
    uint32_t page_shift;
    uint32_t policy;
    uint32_t protected_quota;
    uint64_t ring;
    uint32_t tier;
    uint32_t migrate_after; /* element accesses before a page not resident migrates (0: always; bit 31: reads only) */
    uint64_t peer;
} strata_space_handle_t;

#define STRATA_ELEM_I32 0
#define STRATA_ELEM_U32 1
#define STRATA_ELEM_I64 2
#define STRATA_ELEM_U64 3
#define STRATA_ELEM_F32 4
#define STRATA_ELEM_F64 5

#define STRATA_POLICY_CLOCK 0u
#define STRATA_POLICY_SCAN_RESISTANT 1u

typedef struct strata_space_options_t {
    uint64_t page_size;        /* power of two, 4 KiB to 2 MiB */
    uint64_t cache_bytes;      /* GPU memory for the page cache */
    uint32_t element;          /* STRATA_ELEM_* */
    uint32_t policy;           /* STRATA_POLICY_* */
    double protected_fraction; /* scan-resistant: share of frames that may be protected (0..0.95) */
    uint32_t read_through;     /* non-zero: first reads of read-only pages bypass the cache */
} strata_space_options_t;

typedef struct strata_space_stats_t {
    uint64_t hits, faults, evictions, writebacks, prefetched;
    uint64_t bytes_in, bytes_out, fault_ns_total, fault_ns_max;
} strata_space_stats_t;

typedef struct strata_gpu_t strata_gpu_t;
typedef struct strata_space_t strata_space_t;

/* Defaults: 64 KiB pages, 1 GiB cache, STRATA_ELEM_U64, clock. */
void strata_space_options_default(strata_space_options_t* options);

/* Opens GPU `ordinal` (its primary context, shared with the CUDA runtime) and loads Strata's
 * kernels. STRATA_E_NO_DRIVER where no CUDA driver is installed. */
int strata_gpu_open(int ordinal, strata_gpu_t** out);
/* Releases the GPU; destroy its spaces first. NULL is ignored. */
void strata_gpu_close(strata_gpu_t* gpu);

/* A zero-filled space of `size_bytes`; `options` NULL means the defaults. */
int strata_space_create(const strata_gpu_t* gpu, uint64_t size_bytes,
                        const strata_space_options_t* options, strata_space_t** out);
void strata_space_destroy(strata_space_t* space);
int strata_space_handle(const strata_space_t* space, strata_space_handle_t* out);
/* Any out pointer may be NULL. */
int strata_space_info(const strata_space_t* space, uint64_t* size_bytes, uint64_t* page_size,
                      uint32_t* frames);
int strata_space_fill(strata_space_t* space, uint64_t offset, const void* data, uint64_t len);
/* Flushes dirty pages first. Synchronize your kernels (cudaDeviceSynchronize) before. */
int strata_space_read(const strata_space_t* space, uint64_t offset, void* out, uint64_t len);
int strata_space_prefetch(const strata_space_t* space, uint64_t offset, uint64_t len);
int strata_space_evict(const strata_space_t* space, uint64_t offset, uint64_t len);
int strata_space_flush(const strata_space_t* space);
/* STRATA_E_KERNEL_OUT_OF_RANGE if a kernel indexed outside the space; STRATA_E_NO_FRAME if its
 * warps gave up waiting for a frame (see strata.cuh: what a kernel may hold at once). */
int strata_space_check_errors(const strata_space_t* space);
int strata_space_stats(const strata_space_t* space, strata_space_stats_t* out);
int strata_space_reset_stats(const strata_space_t* space);

/* ---- pager regions ------------------------------------------------------------------------ */

typedef struct strata_region_options_t {
    const char* store;     /* "memory" (NULL), "file:PATH", "remote:HOST:PORT[,HOST:PORT...]" */
    const char* codec;     /* "none" (NULL), "lz4", "zfp:TOLERANCE" (doubles/floats only) */
    const char* token;     /* memory nodes' token (remote stores); NULL otherwise */
    int32_t grow;          /* non-zero: extend a file shorter than the region */
    uint64_t page_bytes;   /* multiple of 4 KiB up to 2 MiB; 0: 64 KiB */
    uint64_t buffer_bytes; /* resident-set budget, at least 4 pages; 0: 64 MiB capped at the region */
    uint32_t fillers;      /* filler threads; 0: default */
    uint32_t evictors;     /* evictor threads; 0: default */
} strata_region_options_t;

typedef struct strata_region_stats_t {
    uint64_t faults, evictions, writebacks, prefetched_pages, errors;
} strata_region_stats_t;

typedef struct strata_region_t strata_region_t;

/* Opens a region of `size` bytes; `options` NULL means a memory store with defaults. A store
 * read that fails on a fault delivers SIGBUS to the faulting thread. */
int strata_region_open(uint64_t size, const strata_region_options_t* options, strata_region_t** out);
void* strata_region_data(const strata_region_t* region); /* NULL for a NULL region */
uint64_t strata_region_len(const strata_region_t* region);
int strata_region_flush(const strata_region_t* region);
int strata_region_prefetch(const strata_region_t* region, uint64_t offset, uint64_t len);
int strata_region_evict(const strata_region_t* region, uint64_t offset, uint64_t len);
int strata_region_stats(const strata_region_t* region, strata_region_stats_t* out);
/* Flushes and unmaps. If the flush fails, the region stays open (no dirty page is lost), the
 * error is returned and `region` remains valid. NULL is ignored. */
int strata_region_close(strata_region_t* region);

/* ---- unified allocations: one copy of the data for CPU code and kernels -------------------
 * strata_alloc returns a handle and a CPU pointer to pinned host memory that C code reads and
 * writes directly; kernels built with nvcc take strata_unified_handle_t (StrataUnified in
 * strata/unified.cuh) and reach the same bytes through a GPU page cache, byte offsets equal on
 * both sides (strata::unified_offset translates CPU addresses stored in the data).
 * Rules: phases alternate. Call strata_sync(.., STRATA_SYNC_TO_GPU) before kernels and
 * strata_sync(.., STRATA_SYNC_TO_CPU) after them (after the kernels finished) before the CPU
 * touches the data; only pages that changed move. A page both sides wrote between two syncs is
 * STRATA_E_CONFLICT with nothing changed. Handles are checked: a freed or unknown handle is
 * STRATA_E_HANDLE, never a crash. Allocations must fit host memory (else STRATA_E_UNSUPPORTED). */
typedef uint64_t strata_unified_t; /* 0 is never a valid handle */

#define STRATA_TRACK_HASH 0u     /* CPU writes found by page hashes at each sync (any write) */
#define STRATA_TRACK_DECLARED 1u /* only ranges passed to strata_mark_written count */
/* The default: the pointer's memory is write-protected between syncs and the kernel lists the
 * written pages (Linux 6.7+, else page hashes). CPU stores and system calls (read(2) into the
 * pointer) are seen; DMA into it (cudaMemcpy to the pointer, RDMA) is not: pass such ranges to
 * strata_mark_written, or choose STRATA_TRACK_HASH. */
#define STRATA_TRACK_WRITE_PROTECT 2u

typedef struct strata_unified_options_t {
    uint64_t page_size;      /* coherence and paging unit: power of two, 4 KiB to 2 MiB */
    uint64_t cache_bytes;    /* GPU memory for the page cache (at least 2 pages) */
    uint32_t dirty_tracking; /* STRATA_TRACK_* */
    uint32_t flags;          /* STRATA_UNIFIED_* bits; 0 (the default) for none */
} strata_unified_options_t;

/* Kernels bring every page they miss into the GPU cache instead of reading it in place over
 * the bus until it has been read often enough to earn a frame (the default, without this
 * flag). In-place reads pay off for pages touched a few times before they would be evicted
 * (pointer chasing, sparse gathers, data larger than the cache); set this flag when kernels
 * sweep their pages many times each. Writes always bring their page in. Unknown bits are
 * refused (STRATA_E_INVALID, the message names them). */
#define STRATA_UNIFIED_NO_READS_IN_PLACE 1u

/* The value kernels take: the space's handle, the CPU address of byte 0 and the read-mostly
 * replica (a copy of bytes [replica_begin, replica_end) in GPU memory, 0 when none) that
 * strata/unified.cuh reads with plain loads (128 bytes). Take it again after each
 * STRATA_SYNC_TO_GPU: the replica may be built, moved or dropped there. */
typedef struct strata_unified_handle_t {
    strata_space_handle_t space;
    uint64_t cpu_base;
    uint64_t replica;
    uint64_t replica_begin;
    uint64_t replica_end;
} strata_unified_handle_t;

#define STRATA_LOCATION_NONE 0
#define STRATA_LOCATION_CPU 1
#define STRATA_LOCATION_GPU 2

#define STRATA_ADVISE_READ_MOSTLY 1        /* kernels only read: never written back */
#define STRATA_ADVISE_UNSET_READ_MOSTLY 2
#define STRATA_ADVISE_PREFERRED_LOCATION 3 /* location NONE, CPU or GPU */
#define STRATA_ADVISE_ACCESSED_BY 4        /* location CPU or GPU (recorded; both always reach it) */

#define STRATA_SYNC_TO_GPU 1
#define STRATA_SYNC_TO_CPU 2
#define STRATA_SYNC_TO_CPU_OVERWRITING 3 /* to the CPU, conflicts resolved with the GPU's bytes */

int strata_unified_options_default(strata_unified_options_t* out);
/* Size and options are checked before the GPU is needed; cpu may be NULL. */
int strata_alloc(const strata_gpu_t* gpu, uint64_t size, const strata_unified_options_t* options,
                 strata_unified_t* out, void** cpu);
int strata_free(strata_unified_t a);
int strata_unified_info(strata_unified_t a, void** cpu, uint64_t* size, uint64_t* page_size);
int strata_unified_handle(strata_unified_t a, strata_unified_handle_t* out);
int strata_advise(strata_unified_t a, uint64_t offset, uint64_t len, int advice, int location);
int strata_prefetch(strata_unified_t a, uint64_t offset, uint64_t len, int location);
/* Drops the GPU copies of the whole pages inside the range without write-back; pages may be NULL. */
int strata_discard(strata_unified_t a, uint64_t offset, uint64_t len, uint64_t* pages);
int strata_sync(strata_unified_t a, uint64_t offset, uint64_t len, int direction);
int strata_mark_written(strata_unified_t a, uint64_t offset, uint64_t len);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
static_assert(sizeof(strata_space_handle_t) == 96, "strata_space_handle_t must match StrataSpace");
static_assert(sizeof(strata_unified_handle_t) == 128, "strata_unified_handle_t must match StrataUnified");
#else
_Static_assert(sizeof(strata_space_handle_t) == 96, "strata_space_handle_t must match StrataSpace");
_Static_assert(sizeof(strata_unified_handle_t) == 128, "strata_unified_handle_t must match StrataUnified");
#endif

#endif /* STRATA_H */
