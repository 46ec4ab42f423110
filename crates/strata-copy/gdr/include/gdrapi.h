/*
 * gdrapi.h for libstrata_gdr.so: GDRCopy's C API (level 2.4) served by Strata with no kernel
 * module. Build a GDRCopy program against Strata by compiling with -I<this directory> and
 * linking with -lstrata_gdr instead of -lgdrapi.
 *
 * What differs from GDRCopy, and why:
 *  - Strata works on a stock NVIDIA driver. Where the system offers no CPU mapping of GPU
 *    memory (no gdrdrv device driven by Strata, and dma-buf mmap refused, as on driver 580
 *    with discrete GPUs), copies are carried out by a small persistent GPU kernel that serves
 *    a doorbell ring in pinned host memory.
 *  - In that case gdr_map() returns a PROT_NONE "shadow" mapping. Its addresses are valid
 *    arguments for gdr_copy_to_mapping()/gdr_copy_from_mapping() (offsets into the pinned
 *    range), but plain CPU loads and stores through it do NOT reach the GPU: they fault, and
 *    Strata prints why before the process ends. Data is never silently lost.
 *    info.mapping_type is GDR_MAPPING_TYPE_NONE and info.wc_mapping 0 for shadows; a true
 *    mapping reports GDR_MAPPING_TYPE_WC.
 *  - gdr_copy_to_mapping() returns once the bytes are in device memory: a kernel launched
 *    afterwards sees them. Neither copy is ordered against kernels already running.
 *  - P2P tokens are accepted and ignored. gdr_driver_get_version() reports the emulated
 *    interface level (2.4): there is no gdrdrv.
 *  - Every call returns 0 or a positive errno value and sets errno; stale or unknown handles
 *    get EINVAL, use after fork gets EPERM, copies after the device memory was freed get
 *    EFAULT. None of them crash.
 */
#ifndef STRATA_GDRAPI_H
#define STRATA_GDRAPI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDR_API_MAJOR_VERSION 2
#define GDR_API_MINOR_VERSION 4
#define GDR_API_VERSION ((GDR_API_MAJOR_VERSION << 16) | GDR_API_MINOR_VERSION)

#define STRATA_GDR 1

#define GPU_PAGE_SHIFT 16
#define GPU_PAGE_SIZE (1UL << GPU_PAGE_SHIFT)
#define GPU_PAGE_OFFSET (GPU_PAGE_SIZE - 1)
#define GPU_PAGE_MASK (~GPU_PAGE_OFFSET)

struct gdr;
typedef struct gdr *gdr_t;

typedef struct gdr_mh_s {
    unsigned long h;
} gdr_mh_t;

typedef enum gdr_mapping_type {
    GDR_MAPPING_TYPE_NONE = 0,
    GDR_MAPPING_TYPE_WC = 1,
    GDR_MAPPING_TYPE_CACHING = 2,
    GDR_MAPPING_TYPE_DEVICE = 3
} gdr_mapping_type_t;

typedef struct gdr_info_v2 {
    uint64_t va;          /* start of the pinned range */
    uint64_t mapped_size; /* bytes pinned (rounded up to GPU pages within the allocation) */
    uint32_t page_size;   /* GPU_PAGE_SIZE */
    uint64_t tm_cycles;   /* always 0 */
    uint32_t cycles_per_ms; /* always 0 */
    unsigned mapped : 1;
    unsigned wc_mapping : 1;
    gdr_mapping_type_t mapping_type;
} gdr_info_v2_t;
typedef gdr_info_v2_t gdr_info_t;

/* NULL on failure with errno set (ENODEV: no CUDA driver or GPU). */
gdr_t gdr_open(void);
/* Unmaps and unpins everything still pinned through g. */
int gdr_close(gdr_t g);

/* Pins device memory (cuMemAlloc/cudaMalloc or cuMemCreate) of any GPU. */
int gdr_pin_buffer(gdr_t g, unsigned long addr, size_t size, uint64_t p2p_token, uint32_t va_space,
                   gdr_mh_t *handle);
/* Unpins (and unmaps, if still mapped). */
int gdr_unpin_buffer(gdr_t g, gdr_mh_t handle);
/* *flag = 1 when the pinned device memory has been freed since pinning. */
int gdr_get_callback_flag(gdr_t g, gdr_mh_t handle, int *flag);
int gdr_get_info_v2(gdr_t g, gdr_mh_t handle, gdr_info_v2_t *info);
#define gdr_get_info gdr_get_info_v2

/* The pinned address must be GPU_PAGE_SIZE aligned (EINVAL otherwise); EAGAIN if mapped. */
int gdr_map(gdr_t g, gdr_mh_t handle, void **va, size_t size);
int gdr_unmap(gdr_t g, gdr_mh_t handle, void *va, size_t size);

/* map_d_ptr: an address inside what gdr_map returned. */
int gdr_copy_to_mapping(gdr_mh_t handle, void *map_d_ptr, const void *h_ptr, size_t size);
int gdr_copy_from_mapping(gdr_mh_t handle, void *h_ptr, const void *map_d_ptr, size_t size);

void gdr_runtime_get_version(int *major, int *minor);
int gdr_driver_get_version(gdr_t g, int *major, int *minor);

/* Strata extension: what carries the copies for g (a static string), NULL for a bad handle. */
const char *strata_gdr_backend(gdr_t g);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_GDRAPI_H */
