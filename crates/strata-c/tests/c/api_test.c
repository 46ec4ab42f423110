/* Exercises libstrata's CPU-side calls from C (built with gcc by tests/c_api.rs):
 * pager regions over memory, lz4 and file stores with random data, error codes and last-error
 * strings for bad input, and the GPU calls (a clear STRATA_E_NO_DRIVER without a driver; a
 * fill/read-back round trip where one exists).
 * Usage: api_test SEED DIR. Prints "ok N checks" and exits 0, or names the failed check. */
#include "check.h"

_Static_assert(sizeof(strata_space_options_t) == 40, "strata_space_options_t layout");
_Static_assert(sizeof(strata_space_stats_t) == 72, "strata_space_stats_t layout");
_Static_assert(sizeof(strata_region_options_t) == 56, "strata_region_options_t layout");
_Static_assert(sizeof(strata_region_stats_t) == 40, "strata_region_stats_t layout");

static void fill_random(unsigned char* p, uint64_t n, uint64_t seed) {
    rng = seed | 1;
    for (uint64_t i = 0; i < n; i++) p[i] = (unsigned char)next();
}
static void expect_error(int rc, int want, const char* needle, const char* what) {
    const char* msg = strata_last_error();
    CHECK(rc == want, "%s: got %s, want %s", what, strata_status_name(rc), strata_status_name(want));
    CHECK(msg && strstr(msg, needle), "%s: message \"%s\" lacks \"%s\"", what, msg, needle);
}

/* Writes random bytes through a region, flushes, evicts every page and checks they come back. */
static void round_trip(const char* store, const char* codec, uint64_t size, uint64_t seed) {
    strata_region_options_t o = {0};
    o.store = store;
    o.codec = codec;
    o.grow = 1;
    o.page_bytes = 16384;
    o.buffer_bytes = 8 * 16384; /* far smaller than the region: eviction must happen */
    strata_region_t* r = NULL;
    OK(strata_region_open(size, &o, &r));
    CHECK(strcmp(strata_last_error(), "") == 0, "success leaves an empty message");
    CHECK(strata_region_len(r) == size, "len %" PRIu64, strata_region_len(r));
    unsigned char* p = strata_region_data(r);
    unsigned char* want = malloc(size);
    fill_random(want, size, seed);
    memcpy(p, want, size);
    OK(strata_region_flush(r));
    OK(strata_region_evict(r, 0, size));
    CHECK(memcmp(p, want, size) == 0, "%s/%s: bytes differ after evict", store, codec);
    strata_region_stats_t st;
    OK(strata_region_stats(r, &st));
    CHECK(st.faults > 0 && st.writebacks > 0 && st.evictions > 0,
          "stats faults %" PRIu64 " writebacks %" PRIu64, st.faults, st.writebacks);
    OK(strata_region_prefetch(r, 0, 16384));
    expect_error(strata_region_evict(r, size, 1), STRATA_E_REGION, "past the region", "evict past end");
    OK(strata_region_close(r));
    free(want);
}

int main(int argc, char** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: api_test SEED DIR\n");
        return 2;
    }
    uint64_t seed = strtoull(argv[1], NULL, 10);
    printf("libstrata %s, seed %" PRIu64 "\n", strata_version(), seed);

    /* Regions over memory, compressed memory and a file. */
    round_trip("memory", NULL, 1000003, seed);
    round_trip(NULL, "lz4", 600000, seed + 1);
    char path[4096];
    snprintf(path, sizeof path, "file:%s/region.bin", argv[2]);
    uint64_t size = 777777;
    round_trip(path, NULL, size, seed + 2);
    /* The file keeps the data: reopen and compare (the last round trip wrote seed + 2). */
    {
        strata_region_options_t o = {0};
        o.store = path;
        strata_region_t* r = NULL;
        OK(strata_region_open(size, &o, &r));
        unsigned char* want = malloc(size);
        fill_random(want, size, seed + 2);
        CHECK(memcmp(strata_region_data(r), want, size) == 0, "reopened file differs");
        OK(strata_region_close(r));
        free(want);
    }

    /* Bad input: a clear code and message, never a crash. */
    strata_region_t* r = NULL;
    strata_region_options_t bad = {0};
    bad.store = "tape:/dev/st0";
    expect_error(strata_region_open(4096, &bad, &r), STRATA_E_CONFIG, "tape:/dev/st0", "bad store");
    CHECK(r == NULL, "no region on failure");
    bad.store = NULL;
    bad.codec = "gzip";
    expect_error(strata_region_open(4096, &bad, &r), STRATA_E_CONFIG, "gzip", "bad codec");
    bad.codec = NULL;
    bad.page_bytes = 1000;
    expect_error(strata_region_open(4096, &bad, &r), STRATA_E_CONFIG, "1000", "bad page size");
    expect_error(strata_region_open(0, NULL, &r), STRATA_E_INVALID, "0 bytes", "zero size");
    expect_error(strata_region_open(4096, NULL, NULL), STRATA_E_INVALID, "NULL", "NULL out");
    bad.page_bytes = 0;
    bad.store = "remote:127.0.0.1:1";
    expect_error(strata_region_open(4096, &bad, &r), STRATA_E_CONFIG, "TOKEN", "remote without token");
    expect_error(strata_region_flush(NULL), STRATA_E_INVALID, "NULL", "flush NULL");
    CHECK(strata_region_data(NULL) == NULL && strata_region_len(NULL) == 0, "NULL region getters");
    OK(strata_region_close(NULL));
    CHECK(strcmp(strata_status_name(999), "STRATA_E_UNKNOWN") == 0, "unknown status name");

    /* GPU calls. */
    strata_gpu_t* gpu = NULL;
    int rc = strata_gpu_open(0, &gpu);
    if (rc == STRATA_E_NO_DRIVER) {
        expect_error(rc, STRATA_E_NO_DRIVER, "no CUDA driver", "gpu open without a driver");
        CHECK(gpu == NULL, "no GPU on failure");
        printf("no CUDA driver: GPU round trip skipped\n");
    } else {
        OK(rc);
        strata_space_options_t so;
        strata_space_options_default(&so);
        so.cache_bytes = 4 << 20;
        so.element = 99;
        strata_space_t* s = NULL;
        expect_error(strata_space_create(gpu, 1 << 20, &so, &s), STRATA_E_INVALID, "99", "bad element");
        so.element = STRATA_ELEM_U32;
        OK(strata_space_create(gpu, 64 << 20, &so, &s));
        uint64_t n = 3 << 20;
        unsigned char* want = malloc(n);
        unsigned char* got = malloc(n);
        fill_random(want, n, seed + 3);
        OK(strata_space_fill(s, 4096, want, n));
        OK(strata_space_prefetch(s, 0, 8 << 20));
        OK(strata_space_read(s, 4096, got, n));
        CHECK(memcmp(want, got, n) == 0, "space round trip");
        strata_space_handle_t h;
        OK(strata_space_handle(s, &h));
        CHECK(h.size_bytes == 64 << 20 && h.page_shift == 16, "handle size/page");
        expect_error(strata_space_read(s, 64 << 20, got, 1), STRATA_E_RANGE, "outside", "read past end");
        strata_space_stats_t st;
        OK(strata_space_stats(s, &st));
        CHECK(st.prefetched > 0, "prefetched pages counted");
        strata_space_destroy(s);
        strata_gpu_close(gpu);
        free(want);
        free(got);
    }
    expect_error(strata_space_create(NULL, 4096, NULL, NULL), STRATA_E_INVALID, "NULL", "space on NULL gpu");
    printf("ok %d checks\n", checks);
    return 0;
}
