/*
 * Exercises libstrata_umap.so through include/umap.h as a Umap program would.
 * Run by tests/c_api.rs with UMAP_PAGESIZE=16384, UMAP_BUFSIZE=16, UMAP_PAGE_FILLERS=2,
 * UMAP_PAGE_EVICTORS=1, UMAP_READ_AHEAD=2 and a seed in UMAP_TEST_SEED.
 * Prints "OK" and exits 0 when every check passes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "umap.h"

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (last error: %s)\n", strata_umap_last_error());   \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static uint64_t key;

static uint64_t pattern(uint64_t word) { return word * 0x9E3779B97F4A7C15ull ^ key; }

static void write_file(const char *path, size_t words) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0, "open %s", path);
    uint64_t *buf = malloc(words * 8);
    for (size_t i = 0; i < words; i++) buf[i] = pattern(i);
    CHECK(write(fd, buf, words * 8) == (ssize_t)(words * 8), "write");
    free(buf);
    close(fd);
}

static uint64_t file_word(int fd, size_t i) {
    uint64_t v = 0;
    CHECK(pread(fd, &v, 8, (off_t)(i * 8)) == 8, "pread word %zu", i);
    return v;
}

struct worker {
    uint64_t *base;
    size_t lo, hi;
    uint64_t tag;
};

static void *writer(void *arg) {
    struct worker *w = arg;
    for (int round = 0; round < 3; round++)
        for (size_t i = w->lo; i < w->hi; i++) w->base[i] = (w->tag << 48) ^ (i * 7 + round);
    for (size_t i = w->lo; i < w->hi; i++)
        if (w->base[i] != ((w->tag << 48) ^ (i * 7 + 2))) return (void *)1;
    return NULL;
}

int main(void) {
    const char *seed = getenv("UMAP_TEST_SEED");
    key = seed ? strtoull(seed, NULL, 10) : 12345;
    const char *dir = getenv("UMAP_TEST_DIR");
    CHECK(dir != NULL, "UMAP_TEST_DIR not set");
    char path[4096];
    snprintf(path, sizeof path, "%s/umap-c-test.bin", dir);

    /* Configuration comes from the UMAP_* variables. */
    CHECK(umapcfg_get_umap_page_size() == 16384, "page size %llu",
          (unsigned long long)umapcfg_get_umap_page_size());
    CHECK(umapcfg_get_max_pages_in_buffer() == 16, "bufsize");
    CHECK(umapcfg_get_num_fillers() == 2 && umapcfg_get_num_evictors() == 1, "workers");
    CHECK(umapcfg_get_read_ahead() == 2, "read-ahead");
    CHECK(umapcfg_get_evict_low_water_threshold() == 70, "low water");
    CHECK(umapcfg_get_evict_high_water_threshold() == 90, "high water");
    CHECK(umapcfg_get_max_fault_events() == 256, "fault events");
    CHECK(umapcfg_get_system_page_size() == sysconf(_SC_PAGESIZE), "system page size");
    CHECK(umap_has_write_support() == 1, "write support");

    /* A file of 4 MiB: 16x the 256 KiB buffer. */
    const size_t size = 4u << 20, words = size / 8;
    write_file(path, words);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0, "open");

    uint64_t *p = umap(NULL, size, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED, "umap failed: errno %d", errno);
    for (size_t i = 0; i < words; i++) CHECK(p[i] == pattern(i), "read word %zu", i);
    CHECK(strata_umap_faults(p) > 0, "faults counted");

    /* Concurrent writers on disjoint quarters, while the buffer churns. */
    pthread_t t[4];
    struct worker w[4];
    for (int k = 0; k < 4; k++) {
        w[k] = (struct worker){p, k * words / 4, (k + 1) * words / 4, (uint64_t)k + 1};
        CHECK(pthread_create(&t[k], NULL, writer, &w[k]) == 0, "thread");
    }
    for (int k = 0; k < 4; k++) {
        void *ret;
        pthread_join(t[k], &ret);
        CHECK(ret == NULL, "writer %d saw a wrong value", k);
    }
    CHECK(umap_flush() == 0, "flush");
    for (size_t i = 0; i < words; i += 509) {
        uint64_t tag = (uint64_t)(i / (words / 4)) + 1;
        CHECK(file_word(fd, i) == ((tag << 48) ^ (i * 7 + 2)), "file word %zu after flush", i);
    }

    /* Prefetch and evict. */
    struct umap_prefetch_item items[2] = {{(char *)p + 3 * 16384 + 5}, {(char *)p + size - 1}};
    CHECK(umap_evict() == 0, "evict all");
    long long before = strata_umap_faults(p);
    umap_prefetch(2, items);
    volatile uint64_t sink = p[3 * 16384 / 8] + p[words - 1];
    (void)sink;
    CHECK(strata_umap_faults(p) == before, "prefetched pages need no fault");
    CHECK(strata_umap_evict_range(p, 4 * 16384) == 1, "evict range drops the prefetched page");
    CHECK(strata_umap_evict_range(p, size + 1) == -1 && errno == EINVAL, "evict past end");

    /* Dirty pages survive uunmap; a second mapping with an offset sees them. */
    p[0] = 0xABCDEF;
    CHECK(uunmap(p, size) == 0, "uunmap");
    CHECK(file_word(fd, 0) == 0xABCDEF, "dirty page written by uunmap");
    CHECK(uunmap(p, size) == -1 && errno == EINVAL, "second uunmap is refused");

    uint64_t *q = umap(NULL, 1u << 20, PROT_READ, UMAP_PRIVATE, fd, 8 * 16384);
    CHECK(q != UMAP_FAILED, "umap with offset");
    size_t first = 8 * 16384 / 8;
    for (size_t i = 0; i < (1u << 20) / 8; i += 97) {
        uint64_t tag = (uint64_t)((first + i) / (words / 4)) + 1;
        CHECK(q[i] == ((tag << 48) ^ ((first + i) * 7 + 2)), "offset word %zu", i);
    }
    CHECK(uunmap(q, 1u << 20) == 0, "uunmap read-only");

    /* A region over a path (Strata extension), past the end of the file: zeros. */
    uint64_t *r = strata_umap_file(path, size * 2, PROT_READ | PROT_WRITE, UMAP_PRIVATE, 0);
    CHECK(r != UMAP_FAILED, "strata_umap_file");
    CHECK(r[words + 5] == 0, "bytes past the end read as zero");
    r[words + 5] = 42;
    CHECK(uunmap(r, size * 2) == 0, "uunmap file region");
    CHECK(file_word(fd, words + 5) == 42, "write past the end extends the file");

    /* Bad arguments fail with EINVAL and UMAP_FAILED. */
    errno = 0;
    CHECK(umap(NULL, size, PROT_READ, MAP_SHARED, fd, 0) == UMAP_FAILED && errno == EINVAL,
          "MAP_SHARED refused");
    CHECK(umap(NULL, size, PROT_READ | PROT_EXEC, UMAP_PRIVATE, fd, 0) == UMAP_FAILED &&
              errno == EINVAL,
          "PROT_EXEC refused");
    CHECK(umap(NULL, 0, PROT_READ, UMAP_PRIVATE, fd, 0) == UMAP_FAILED, "length 0 refused");
    CHECK(umap(NULL, size, PROT_READ, UMAP_PRIVATE, fd, -1) == UMAP_FAILED, "negative offset");
    CHECK(umap(NULL, size, PROT_READ, UMAP_PRIVATE, 9999, 0) == UMAP_FAILED && errno == EBADF,
          "bad fd refused");
    int ro = open(path, O_RDONLY);
    CHECK(umap(NULL, size, PROT_READ | PROT_WRITE, UMAP_PRIVATE, ro, 0) == UMAP_FAILED,
          "PROT_WRITE on a read-only descriptor refused");
    CHECK(strlen(strata_umap_last_error()) > 0, "an error message is kept");
    close(ro);

    close(fd);
    unlink(path);
    printf("OK\n");
    return 0;
}
