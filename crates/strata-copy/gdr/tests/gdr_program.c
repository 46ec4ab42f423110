/* A GDRCopy-style program built against libstrata_gdr.so. Without a CUDA driver it checks
 * the ABI and the error paths and exits 0 after saying it skipped the GPU part; with one it
 * also pins, maps and copies at many sizes and offsets, validating through cuMemcpy. Exit 0
 * means every check passed; any failure prints the line and exits 1. */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrapi.h"

#define CHECK(c)                                                              \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s (errno %d)\n", __FILE__, \
                    __LINE__, #c, errno);                                     \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_dev_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_alloc_t)(unsigned long long *, size_t);
typedef int (*cu_free_t)(unsigned long long);
typedef int (*cu_htod_t)(unsigned long long, const void *, size_t);
typedef int (*cu_dtoh_t)(void *, unsigned long long, size_t);
typedef int (*cu_sync_t)(void *);

static unsigned long long rng_state;
static unsigned char next_byte(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned char)(rng_state >> 56);
}

int main(int argc, char **argv) {
    /* ABI: the info struct has GDRCopy's layout. */
    CHECK(offsetof(gdr_info_t, va) == 0);
    CHECK(offsetof(gdr_info_t, mapped_size) == 8);
    CHECK(offsetof(gdr_info_t, page_size) == 16);
    CHECK(offsetof(gdr_info_t, tm_cycles) == 24);
    CHECK(offsetof(gdr_info_t, cycles_per_ms) == 32);
    CHECK(offsetof(gdr_info_t, mapping_type) == 40);
    CHECK(sizeof(gdr_info_t) == 48);
    CHECK(sizeof(gdr_mh_t) == sizeof(unsigned long));

    int major = 0, minor = 0;
    gdr_runtime_get_version(&major, &minor);
    CHECK(major == GDR_API_MAJOR_VERSION && minor == GDR_API_MINOR_VERSION);

    /* Bad arguments: errors, never crashes. */
    gdr_mh_t bogus = {12345};
    char buf[16];
    CHECK(gdr_close(NULL) == EINVAL);
    CHECK(gdr_close((gdr_t)0x1230) == EINVAL);
    CHECK(gdr_pin_buffer((gdr_t)0x1230, 0x10000, 4096, 0, 0, &bogus) == EINVAL);
    CHECK(gdr_unpin_buffer(NULL, bogus) == EINVAL);
    CHECK(gdr_copy_to_mapping(bogus, buf, buf, 8) == EINVAL);
    CHECK(gdr_copy_from_mapping(bogus, buf, buf, 8) == EINVAL);
    CHECK(gdr_copy_to_mapping(bogus, buf, buf, 0) == 0);
    CHECK(gdr_driver_get_version(NULL, &major, &minor) == EINVAL);
    CHECK(strata_gdr_backend(NULL) == NULL);

    rng_state = argc > 1 ? strtoull(argv[1], NULL, 10) : 42;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    gdr_t g = gdr_open();
    if (!cuda || !g) {
        CHECK(g == NULL || cuda != NULL);
        printf("skipped GPU part: %s\n", cuda ? "gdr_open failed (no GPU?)" : "no CUDA driver");
        return 0;
    }
    printf("backend: %s\n", strata_gdr_backend(g));
    cu_init_t cu_init = (cu_init_t)dlsym(cuda, "cuInit");
    cu_dev_get_t cu_dev_get = (cu_dev_get_t)dlsym(cuda, "cuDeviceGet");
    cu_ctx_retain_t cu_retain = (cu_ctx_retain_t)dlsym(cuda, "cuDevicePrimaryCtxRetain");
    cu_ctx_set_t cu_set = (cu_ctx_set_t)dlsym(cuda, "cuCtxSetCurrent");
    cu_alloc_t cu_alloc = (cu_alloc_t)dlsym(cuda, "cuMemAlloc_v2");
    cu_free_t cu_free = (cu_free_t)dlsym(cuda, "cuMemFree_v2");
    cu_htod_t cu_htod = (cu_htod_t)dlsym(cuda, "cuMemcpyHtoD_v2");
    cu_dtoh_t cu_dtoh = (cu_dtoh_t)dlsym(cuda, "cuMemcpyDtoH_v2");
    /* cuMemcpyHtoD from pageable memory may return before the DMA lands: wait for the legacy
     * stream before reading through the mapping. */
    cu_sync_t cu_stream_sync = (cu_sync_t)dlsym(cuda, "cuStreamSynchronize");
    int dev;
    void *ctx;
    CHECK(cu_init(0) == 0 && cu_dev_get(&dev, 0) == 0 && cu_retain(&ctx, dev) == 0 && cu_set(ctx) == 0);

    const size_t size = 4 * GPU_PAGE_SIZE;
    unsigned long long d;
    CHECK(cu_alloc(&d, size + GPU_PAGE_SIZE) == 0);
    unsigned long long aligned = (d + GPU_PAGE_OFFSET) & GPU_PAGE_MASK;
    gdr_mh_t mh;
    CHECK(gdr_pin_buffer(g, aligned, size, 0, 0, &mh) == 0);
    gdr_info_t info;
    CHECK(gdr_get_info(g, mh, &info) == 0);
    CHECK(info.va == aligned && info.mapped_size >= size && !info.mapped);
    void *map;
    CHECK(gdr_map(g, mh, &map, size) == 0);
    CHECK(gdr_map(g, mh, &map, size) == EAGAIN);
    CHECK(gdr_get_info(g, mh, &info) == 0 && info.mapped);
    char *m = (char *)map;

    unsigned char *src = malloc(size), *dst = malloc(size), *check = malloc(size);
    size_t sizes[] = {1, 2, 3, 4, 7, 8, 15, 16, 17, 63, 64, 65, 239, 240, 241, 1000, 4096, 65535, 65536, 100000};
    size_t offs[] = {0, 1, 2, 3, 4, 5, 7, 11, 129, 1023, 4096 + 3};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        for (size_t oi = 0; oi < sizeof offs / sizeof *offs; oi++) {
            size_t n = sizes[si], off = offs[oi];
            if (off + n > size) continue;
            for (size_t i = 0; i < n; i++) src[i] = next_byte();
            CHECK(gdr_copy_to_mapping(mh, m + off, src, n) == 0);
            CHECK(cu_dtoh(check, aligned + off, n) == 0);
            if (memcmp(check, src, n) != 0) {
                fprintf(stderr, "copy_to mismatch size %zu offset %zu\n", n, off);
                return 1;
            }
            for (size_t i = 0; i < n; i++) src[i] = next_byte();
            CHECK(cu_htod(aligned + off, src, n) == 0 && cu_stream_sync(NULL) == 0);
            memset(dst, 0xEE, n);
            CHECK(gdr_copy_from_mapping(mh, dst, m + off, n) == 0);
            if (memcmp(dst, src, n) != 0) {
                fprintf(stderr, "copy_from mismatch size %zu offset %zu\n", n, off);
                return 1;
            }
        }
    }
    /* Out of range and outside the mapping: refused. */
    CHECK(gdr_copy_to_mapping(mh, m + size - 4, src, 8) == EINVAL);
    CHECK(gdr_copy_to_mapping(mh, m - 1, src, 1) == EINVAL);
    CHECK(gdr_unmap(g, mh, map, size) == 0);
    CHECK(gdr_copy_to_mapping(mh, m, src, 8) == EINVAL);
    CHECK(gdr_unmap(g, mh, map, size) == EINVAL);
    CHECK(gdr_unpin_buffer(g, mh) == 0);
    CHECK(gdr_unpin_buffer(g, mh) == EINVAL);

    /* An unaligned pin works; mapping it is refused, as with GDRCopy. */
    CHECK(gdr_pin_buffer(g, aligned + 8, 64, 0, 0, &mh) == 0);
    CHECK(gdr_map(g, mh, &map, 64) == EINVAL);

    /* Freed while pinned: the callback flag says so and copies fail with EFAULT. */
    gdr_mh_t mh2;
    unsigned long long d2;
    CHECK(cu_alloc(&d2, 2 << 20) == 0);
    CHECK(gdr_pin_buffer(g, d2, GPU_PAGE_SIZE, 0, 0, &mh2) == 0);
    CHECK(gdr_map(g, mh2, &map, GPU_PAGE_SIZE) == 0);
    int flag = -1;
    CHECK(gdr_get_callback_flag(g, mh2, &flag) == 0 && flag == 0);
    CHECK(cu_free(d2) == 0);
    CHECK(gdr_get_callback_flag(g, mh2, &flag) == 0 && flag == 1);
    CHECK(gdr_copy_to_mapping(mh2, map, src, 8) == EFAULT);

    /* Close unpins everything; handles are dead afterwards. */
    CHECK(gdr_close(g) == 0);
    CHECK(gdr_copy_to_mapping(mh2, map, src, 8) == EINVAL);
    CHECK(gdr_unpin_buffer(g, mh) == EINVAL);
    CHECK(gdr_close(g) == EINVAL);
    cu_free(d);
    printf("gdr_program: all GPU checks passed\n");
    return 0;
}
