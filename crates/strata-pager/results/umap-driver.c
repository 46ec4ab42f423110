/*
 * umap-driver: times random 4 KiB page touches through a region mapped with the C
 * function umap() (from a separately built Umap library), with the same touch schedule
 * as `strata bench pager --access random`: a random permutation of the region's 4 KiB
 * pages, dealt round-robin to the touching threads, walked PASSES times, one 8-byte word
 * checked per page against the data pattern the file was written with.
 *
 * Build (against a Umap install in $UMAP):
 *   cc -O2 -pthread -I$UMAP/include umap-driver.c -L$UMAP/lib -lumap -o umap-driver
 * Run:
 *   UMAP_PAGESIZE=4096 UMAP_BUFSIZE=16384 UMAP_PAGE_FILLERS=1 UMAP_PAGE_EVICTORS=1 \
 *   LD_LIBRARY_PATH=$UMAP/lib ./umap-driver FILE SIZE_MIB THREADS [--mmap]
 * The file is created (or rewritten) with the pattern and read once so it sits in the page
 * cache; --mmap times the kernel's own mmap of the same file instead (no memory limit).
 * Prints one line: touches, seconds, touches/s, us per touch.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <umap/umap.h>

#define PAGE 4096u
#define PASSES 2

/* Same pattern as Strata's pager benchmark: word i holds i * K ^ KEY. */
static uint64_t pattern(uint64_t word) {
  return word * 0x9E3779B97F4A7C15ull ^ 0x5354524154410001ull;
}

struct worker {
  const volatile uint64_t *base;
  const uint64_t *pages; /* this thread's pages, in touch order */
  size_t count;
  pthread_barrier_t *start;
  int bad; /* set when a checked word is wrong */
};

static void *touch(void *arg) {
  struct worker *w = arg;
  pthread_barrier_wait(w->start);
  for (int pass = 0; pass < PASSES; pass++) {
    for (size_t i = 0; i < w->count; i++) {
      uint64_t word = w->pages[i] * (PAGE / 8);
      if (w->base[word] != pattern(word)) {
        w->bad = 1;
        return NULL;
      }
    }
  }
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void write_file(const char *path, uint64_t size) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) { perror("open data file"); exit(2); }
  size_t chunk = 1u << 20;
  uint64_t *buf = malloc(chunk);
  for (uint64_t off = 0; off < size; off += chunk) {
    for (size_t i = 0; i < chunk / 8; i++) buf[i] = pattern(off / 8 + i);
    if (pwrite(fd, buf, chunk, (off_t)off) != (ssize_t)chunk) { perror("pwrite"); exit(2); }
  }
  /* read it back once so the whole file is in the page cache */
  for (uint64_t off = 0; off < size; off += chunk)
    if (pread(fd, buf, chunk, (off_t)off) != (ssize_t)chunk) { perror("pread"); exit(2); }
  free(buf);
  close(fd);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s FILE SIZE_MIB THREADS [--mmap]\n", argv[0]);
    return 2;
  }
  const char *path = argv[1];
  uint64_t size = strtoull(argv[2], NULL, 10) << 20;
  int threads = atoi(argv[3]);
  int use_mmap = argc > 4 && strcmp(argv[4], "--mmap") == 0;
  if (size == 0 || threads < 1) { fprintf(stderr, "size and threads must be positive\n"); return 2; }
  write_file(path, size);

  uint64_t npages = size / PAGE;
  uint64_t *order = malloc(npages * sizeof *order);
  for (uint64_t i = 0; i < npages; i++) order[i] = i;
  uint64_t x = ((uint64_t)time(NULL) << 1) | 1;
  for (uint64_t i = npages - 1; i > 0; i--) { /* Fisher-Yates with xorshift64 */
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    uint64_t j = x % (i + 1), t = order[i];
    order[i] = order[j]; order[j] = t;
  }
  uint64_t **dealt = calloc((size_t)threads, sizeof *dealt);
  size_t *counts = calloc((size_t)threads, sizeof *counts);
  for (int t = 0; t < threads; t++) dealt[t] = malloc((npages / threads + 1) * sizeof **dealt);
  for (uint64_t i = 0; i < npages; i++) {
    int t = (int)(i % (uint64_t)threads);
    dealt[t][counts[t]++] = order[i];
  }

  int fd = open(path, O_RDONLY);
  if (fd < 0) { perror("open"); return 2; }
  void *base = use_mmap ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0)
                        : umap(NULL, size, PROT_READ, UMAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED || base == UMAP_FAILED) { perror("map"); return 2; }

  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  pthread_t *tid = calloc((size_t)threads, sizeof *tid);
  struct worker *w = calloc((size_t)threads, sizeof *w);
  for (int t = 0; t < threads; t++) {
    w[t] = (struct worker){base, dealt[t], counts[t], &start, 0};
    pthread_create(&tid[t], NULL, touch, &w[t]);
  }
  pthread_barrier_wait(&start);
  double t0 = now();
  int bad = 0;
  for (int t = 0; t < threads; t++) { pthread_join(tid[t], NULL); bad |= w[t].bad; }
  double secs = now() - t0;

  if (use_mmap) munmap(base, size); else uunmap(base, size);
  close(fd);
  if (bad) { fprintf(stderr, "a checked word was wrong\n"); return 1; }
  uint64_t touches = npages * PASSES;
  printf("%s touches %llu seconds %.4f touches_per_s %.0f us_per_touch %.3f\n",
         use_mmap ? "mmap" : "umap", (unsigned long long)touches, secs, touches / secs,
         secs * 1e6 / (double)touches);
  return 0;
}
