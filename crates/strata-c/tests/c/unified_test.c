/* Exercises libstrata's unified allocations from C (built with gcc by tests/unified_c.rs in CI,
 * and by crates/strata-unified/gpu-check.sh on a GPU machine): bad input and bad handles give
 * codes and messages, never crashes, with or without a GPU; with a GPU ("gpu" mode), an
 * allocation's CPU pointer, syncs, hints, discard, double free and use after free.
 * Usage: unified_test SEED cpu|gpu. Prints "ok N checks" and exits 0, or names the failed check. */
#include "check.h"

_Static_assert(sizeof(strata_unified_options_t) == 24, "strata_unified_options_t layout");
_Static_assert(sizeof(strata_unified_handle_t) == 128, "strata_unified_handle_t layout");

static void expect_error(int rc, int want, const char* needle, const char* what) {
    const char* msg = strata_last_error();
    CHECK(rc == want, "%s: got %s, want %s", what, strata_status_name(rc), strata_status_name(want));
    CHECK(msg && strstr(msg, needle), "%s: message \"%s\" lacks \"%s\"", what, msg, needle);
}

/* Every call on a handle that is not live says so. */
static void dead_handle_calls(strata_unified_t h) {
    void* p = NULL;
    strata_unified_handle_t kh;
    expect_error(strata_free(h), STRATA_E_HANDLE, "not a live unified allocation", "free");
    expect_error(strata_sync(h, 0, 8, STRATA_SYNC_TO_GPU), STRATA_E_HANDLE, "freed already", "sync");
    expect_error(strata_advise(h, 0, 8, STRATA_ADVISE_READ_MOSTLY, 0), STRATA_E_HANDLE, "not a live", "advise");
    expect_error(strata_prefetch(h, 0, 8, STRATA_LOCATION_GPU), STRATA_E_HANDLE, "not a live", "prefetch");
    expect_error(strata_discard(h, 0, 8, NULL), STRATA_E_HANDLE, "not a live", "discard");
    expect_error(strata_mark_written(h, 0, 8), STRATA_E_HANDLE, "not a live", "mark_written");
    expect_error(strata_unified_info(h, &p, NULL, NULL), STRATA_E_HANDLE, "not a live", "info");
    expect_error(strata_unified_handle(h, &kh), STRATA_E_HANDLE, "not a live", "handle");
}

static void cpu_paths(void) {
    strata_unified_options_t o;
    strata_unified_t h = 0;
    OK(strata_unified_options_default(&o));
    CHECK(o.page_size == 65536 && o.dirty_tracking == STRATA_TRACK_WRITE_PROTECT, "defaults");
    expect_error(strata_unified_options_default(NULL), STRATA_E_INVALID, "NULL", "options NULL");
    CHECK(strcmp(strata_status_name(STRATA_E_HANDLE), "STRATA_E_HANDLE") == 0, "name 12");
    CHECK(strcmp(strata_status_name(STRATA_E_CONFLICT), "STRATA_E_CONFLICT") == 0, "name 13");
    CHECK(strcmp(strata_status_name(STRATA_E_READ_MOSTLY), "STRATA_E_READ_MOSTLY") == 0, "name 14");
    CHECK(strcmp(strata_status_name(STRATA_E_UNSUPPORTED), "STRATA_E_UNSUPPORTED") == 0, "name 15");
    /* Size and options are checked before the GPU is needed. */
    expect_error(strata_alloc(NULL, 0, NULL, &h, NULL), STRATA_E_INVALID, "size > 0", "size 0");
    expect_error(strata_alloc(NULL, UINT64_MAX, NULL, &h, NULL), STRATA_E_INVALID, "too large", "size 2^64-1");
    expect_error(strata_alloc(NULL, (uint64_t)1 << 60, NULL, &h, NULL), STRATA_E_UNSUPPORTED,
                 "larger than host memory", "size 2^60");
    strata_unified_options_t bad = o;
    bad.page_size = 3000;
    expect_error(strata_alloc(NULL, 1 << 20, &bad, &h, NULL), STRATA_E_INVALID, "power of two", "page size");
    bad = o;
    bad.cache_bytes = 1;
    expect_error(strata_alloc(NULL, 1 << 20, &bad, &h, NULL), STRATA_E_INVALID, "fewer than 2 pages", "cache");
    bad = o;
    bad.dirty_tracking = 7;
    expect_error(strata_alloc(NULL, 1 << 20, &bad, &h, NULL), STRATA_E_INVALID, "STRATA_TRACK_HASH", "tracking");
    CHECK(o.flags == 0, "reads in place by default");
    bad = o;
    bad.flags = STRATA_UNIFIED_NO_READS_IN_PLACE << (1 + next() % 31); /* one unknown bit */
    char want[64];
    snprintf(want, sizeof want, "unknown bits %#x", (unsigned)bad.flags);
    expect_error(strata_alloc(NULL, 1 << 20, &bad, &h, NULL), STRATA_E_INVALID, want, "unknown flag");
    bad.flags |= STRATA_UNIFIED_NO_READS_IN_PLACE; /* a known bit does not hide an unknown one */
    expect_error(strata_alloc(NULL, 1 << 20, &bad, &h, NULL), STRATA_E_INVALID, want, "unknown flag with known");
    expect_error(strata_alloc(NULL, 1 << 20, &bad, &h, NULL), STRATA_E_INVALID, "STRATA_UNIFIED_NO_READS_IN_PLACE",
                 "unknown flag names the known one");
    /* The known flag passes the option checks: what fails next is the missing GPU. */
    bad = o;
    bad.flags = STRATA_UNIFIED_NO_READS_IN_PLACE;
    expect_error(strata_alloc(NULL, 1 << 20, &bad, &h, NULL), STRATA_E_INVALID, "strata_gpu_open", "flag accepted");
    expect_error(strata_alloc(NULL, 1 << 20, NULL, NULL, NULL), STRATA_E_INVALID, "out is NULL", "out NULL");
    expect_error(strata_alloc(NULL, 1 << 20, NULL, &h, NULL), STRATA_E_INVALID, "strata_gpu_open", "gpu NULL");
    CHECK(h == 0, "no handle written on failure");
    /* Handles that never existed. */
    dead_handle_calls(0);
    dead_handle_calls(next() | 1);
    /* Argument errors are reported before the handle is looked up. */
    expect_error(strata_advise(1, 0, 8, 99, 0), STRATA_E_INVALID, "advice 99 is unknown", "advice code");
    expect_error(strata_advise(1, 0, 8, STRATA_ADVISE_ACCESSED_BY, STRATA_LOCATION_NONE), STRATA_E_INVALID,
                 "not NONE", "accessed-by none");
    expect_error(strata_prefetch(1, 0, 8, 5), STRATA_E_INVALID, "unknown", "prefetch location");
    expect_error(strata_sync(1, 0, 8, 0), STRATA_E_INVALID, "direction 0 is unknown", "sync direction");
    expect_error(strata_sync(1, UINT64_MAX, 2, STRATA_SYNC_TO_GPU), STRATA_E_INVALID, "overflows", "overflow");
}

static void gpu_paths(void) {
    strata_gpu_t* gpu = NULL;
    int rc = strata_gpu_open(0, &gpu);
    CHECK(rc == STRATA_OK, "strata_gpu_open: %s", strata_status_name(rc));
    const uint64_t size = (8u << 20) + 1000; /* not a whole number of pages */
    strata_unified_t h = 0;
    unsigned char* p = NULL;
    OK(strata_alloc(gpu, size, NULL, &h, (void**)&p));
    CHECK(h != 0 && p != NULL, "handle and pointer");
    for (uint64_t i = 0; i < size; i++) CHECK(p[i] == 0 || (fprintf(stderr, "byte %" PRIu64, i), 0), "zero-filled");
    for (uint64_t i = 0; i < size; i++) p[i] = (unsigned char)next();
    unsigned char* copy = malloc(size);
    memcpy(copy, p, size);
    OK(strata_sync(h, 0, size, STRATA_SYNC_TO_GPU));
    OK(strata_prefetch(h, 0, size, STRATA_LOCATION_GPU));
    OK(strata_sync(h, 0, size, STRATA_SYNC_TO_CPU));
    CHECK(memcmp(p, copy, size) == 0, "bytes survive syncs and prefetch");
    OK(strata_advise(h, 0, 1 << 20, STRATA_ADVISE_READ_MOSTLY, 0));
    OK(strata_advise(h, 0, 1 << 20, STRATA_ADVISE_PREFERRED_LOCATION, STRATA_LOCATION_GPU));
    OK(strata_advise(h, 0, 1 << 20, STRATA_ADVISE_ACCESSED_BY, STRATA_LOCATION_GPU));
    expect_error(strata_advise(h, 5, 0, STRATA_ADVISE_READ_MOSTLY, 0), STRATA_E_INVALID, "empty range", "empty");
    p[12345] ^= 0xff; /* a CPU write found by write protection at the next sync */
    copy[12345] ^= 0xff;
    OK(strata_sync(h, 0, size, STRATA_SYNC_TO_GPU));
    uint64_t pages = 0;
    OK(strata_discard(h, 0, size, &pages));
    CHECK(pages == (size + 65535) / 65536, "discarded %" PRIu64 " pages", pages);
    OK(strata_prefetch(h, 0, size, STRATA_LOCATION_CPU));
    CHECK(memcmp(p, copy, size) == 0, "discard keeps the host's bytes");
    expect_error(strata_sync(h, 0, size + 1, STRATA_SYNC_TO_CPU), STRATA_E_RANGE, "outside", "range");
    strata_unified_handle_t kh;
    OK(strata_unified_handle(h, &kh));
    CHECK(kh.cpu_base == (uint64_t)(uintptr_t)p && kh.space.size_bytes >= size, "kernel handle");
    CHECK(kh.replica != 0 && kh.replica_begin == 0 && kh.replica_end == (1u << 20),
          "the read-mostly megabyte has a GPU replica (%" PRIu64 "..%" PRIu64 ")", kh.replica_begin, kh.replica_end);
    OK(strata_sync(h, 0, size, STRATA_SYNC_TO_CPU));
    uint64_t got_size = 0, page = 0;
    OK(strata_unified_info(h, NULL, &got_size, &page));
    CHECK(got_size == size && page == 65536, "info");
    expect_error(strata_alloc(gpu, 0, NULL, &h, NULL), STRATA_E_INVALID, "size > 0", "size 0 with a GPU");
    OK(strata_free(h));
    dead_handle_calls(h); /* double free and use after free */
    /* A second allocation gets a new handle: freed ones are never reused. */
    strata_unified_t h2 = 0;
    OK(strata_alloc(gpu, 4096, NULL, &h2, NULL));
    CHECK(h2 != h, "handles are not reused");
    OK(strata_free(h2));
    /* Without reads in place every missed page comes into the cache; the bytes are the same. */
    strata_unified_options_t fetch_all;
    OK(strata_unified_options_default(&fetch_all));
    fetch_all.flags = STRATA_UNIFIED_NO_READS_IN_PLACE;
    strata_unified_t h3 = 0;
    unsigned char* p3 = NULL;
    OK(strata_alloc(gpu, size, &fetch_all, &h3, (void**)&p3));
    memcpy(p3, copy, size);
    OK(strata_sync(h3, 0, size, STRATA_SYNC_TO_GPU));
    OK(strata_prefetch(h3, 0, size, STRATA_LOCATION_GPU));
    OK(strata_sync(h3, 0, size, STRATA_SYNC_TO_CPU));
    CHECK(memcmp(p3, copy, size) == 0, "bytes survive syncs without reads in place");
    OK(strata_free(h3));
    free(copy);
    strata_gpu_close(gpu);
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: unified_test SEED cpu|gpu\n");
        return 2;
    }
    rng = strtoull(argv[1], NULL, 10) | 1;
    printf("seed %s\n", argv[1]);
    cpu_paths();
    if (strcmp(argv[2], "gpu") == 0) gpu_paths();
    printf("ok %d checks\n", checks);
    return 0;
}
