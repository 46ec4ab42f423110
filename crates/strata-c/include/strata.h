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
    uint32_t migrate_after; /* element accesses before a page not resident migrates (0: always) */
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

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
static_assert(sizeof(strata_space_handle_t) == 96, "strata_space_handle_t must match StrataSpace");
#else
_Static_assert(sizeof(strata_space_handle_t) == 96, "strata_space_handle_t must match StrataSpace");
#endif

#endif /* STRATA_H */
