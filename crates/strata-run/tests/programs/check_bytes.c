/* A multi-threaded program that writes known bytes into many large blocks obtained through
 * every allocation entry point the interposer replaces, then checks every byte it wrote.
 * Usage: check_bytes SEED THREADS MIB_PER_THREAD. Prints "ok <checksum>" or fails loudly. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static uint64_t seed;
static int mib_per_thread;

static uint8_t byte_at(uint64_t block, size_t i) {
  uint64_t x = (seed ^ (block * 0x9e3779b97f4a7c15ull)) + i * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  return (uint8_t)(x * 0x94d049bb133111ebull >> 56);
}

static void fill(uint8_t *p, size_t n, uint64_t block) {
  for (size_t i = 0; i < n; i++) p[i] = byte_at(block, i);
}

static void check(const uint8_t *p, size_t n, uint64_t block, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != byte_at(block, i)) {
      fprintf(stderr, "MISMATCH in %s block %llu at byte %zu: %u != %u\n", what,
              (unsigned long long)block, i, p[i], byte_at(block, i));
      exit(2);
    }
}

static void *worker(void *arg) {
  uint64_t t = (uint64_t)(uintptr_t)arg;
  size_t blk = 1 << 20; /* 1 MiB blocks */
  int n = mib_per_thread;
  uint8_t **b = calloc(n, sizeof *b);
  for (int i = 0; i < n; i++) {
    uint64_t id = t * 1000 + i;
    switch (i % 5) {
    case 0: b[i] = malloc(blk); break;
    case 1: {
      /* calloc must be zero even when it reuses freed space */
      b[i] = calloc(1, blk);
      for (size_t k = 0; k < blk; k++)
        if (b[i][k]) { fprintf(stderr, "calloc not zero at %zu\n", k); exit(3); }
      break;
    }
    case 2: {
      void *p = NULL;
      size_t align = (size_t)1 << (12 + i % 10); /* 4 KiB .. 2 MiB */
      if (posix_memalign(&p, align, blk) || ((uintptr_t)p % align)) {
        fprintf(stderr, "posix_memalign(%zu) misaligned %p\n", align, p); exit(4);
      }
      b[i] = p;
      break;
    }
    case 3: {
      /* realloc across the threshold, up from the C library's heap */
      uint8_t *small = malloc(100);
      fill(small, 100, id);
      b[i] = realloc(small, blk);
      check(b[i], 100, id, "realloc-up");
      break;
    }
    default: b[i] = memalign(1 << 16, blk); break;
    }
    if (!b[i]) { fprintf(stderr, "allocation failed\n"); exit(5); }
    if (malloc_usable_size(b[i]) < blk) { fprintf(stderr, "usable size too small\n"); exit(6); }
    fill(b[i], blk, id);
  }
  /* free every third block and allocate again (reuse of freed arena space) */
  for (int i = 0; i < n; i += 3) {
    free(b[i]);
    b[i] = calloc(blk, 1);
    for (size_t k = 0; k < blk; k += 4096)
      if (b[i][k]) { fprintf(stderr, "reused calloc not zero\n"); exit(7); }
    fill(b[i], blk, t * 1000 + i);
  }
  uint64_t sum = 0;
  for (int i = 0; i < n; i++) {
    check(b[i], blk, t * 1000 + i, "final");
    sum += b[i][i];
  }
  /* grow one block (in place or moved), shrink one below the threshold */
  b[0] = realloc(b[0], 3 * blk);
  check(b[0], blk, t * 1000, "realloc-grow");
  b[1] = realloc(b[1], 64);
  check(b[1], 64, t * 1000 + 1, "realloc-shrink");
  for (int i = 0; i < n; i++) free(b[i]);
  free(b);
  return (void *)(uintptr_t)sum;
}

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: check_bytes SEED THREADS MIB\n"); return 1; }
  seed = strtoull(argv[1], 0, 10);
  int threads = atoi(argv[2]);
  mib_per_thread = atoi(argv[3]);
  /* anonymous mmap, partial munmap, mremap */
  size_t len = 8 << 20;
  uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) { perror("mmap"); return 1; }
  for (size_t k = 0; k < len; k += 4096)
    if (m[k]) { fprintf(stderr, "mmap not zero\n"); return 8; }
  fill(m, len, 99999);
  m = mremap(m, len, 2 * len, MREMAP_MAYMOVE);
  if (m == MAP_FAILED) { perror("mremap"); return 1; }
  check(m, len, 99999, "mremap");
  for (size_t k = len; k < 2 * len; k += 4096)
    if (m[k]) { fprintf(stderr, "mremap growth not zero\n"); return 9; }
  munmap(m + len, len);
  check(m, len, 99999, "after partial munmap");
  munmap(m, len);
  pthread_t th[64];
  uint64_t total = 0;
  for (int t = 0; t < threads; t++) pthread_create(&th[t], 0, worker, (void *)(uintptr_t)t);
  for (int t = 0; t < threads; t++) {
    void *r;
    pthread_join(th[t], &r);
    total += (uint64_t)(uintptr_t)r;
  }
  printf("ok %llu\n", (unsigned long long)total);
  return 0;
}
