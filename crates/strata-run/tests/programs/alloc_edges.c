/* The allocation calls' edges, checked the same way alone and under strata run: alignments
 * beyond a page, bad alignments, calloc overflow and zeroing of reused memory, realloc both
 * ways, a hole punched in a mapping, mremap growing and shrinking, MAP_FIXED of fresh
 * anonymous memory over part of a mapping. Prints ALL OK or what failed.
 * `alloc_edges fixed-file` instead maps a file with MAP_FIXED over part of a large anonymous
 * mapping, moves one there with mremap, and locks it, printing what each call answered
 * (strata run refuses them: they would split the arena, or lock pages it must evict). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <malloc.h>
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>
#define MiB (1ul<<20)
static void fill(unsigned char *p, size_t n, unsigned seed){ for(size_t i=0;i<n;i+=512) p[i]=(unsigned char)(seed+i/512); }
static int check(const unsigned char *p, size_t n, unsigned seed){ for(size_t i=0;i<n;i+=512) if(p[i]!=(unsigned char)(seed+i/512)) {printf("bad at %zu\n",i); return 0;} return 1; }
static int fixed_file(void) {
  unsigned char *m = mmap(NULL, 8*MiB, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) { printf("mmap failed\n"); return 1; }
  memset(m, 7, 8*MiB);
  FILE *f = tmpfile();
  if (!f || ftruncate(fileno(f), 1*MiB)) { printf("tmpfile failed\n"); return 1; }
  void *r = mmap(m + 2*MiB, 1*MiB, PROT_READ, MAP_PRIVATE|MAP_FIXED, fileno(f), 0);
  if (r == MAP_FAILED) printf("fixed-file: refused errno %d\n", errno);
  else printf("fixed-file: mapped\n");
  /* A file mapping moved onto part of it. */
  void *fm = mmap(NULL, 1*MiB, PROT_READ, MAP_PRIVATE, fileno(f), 0);
  void *moved = mremap(fm, 1*MiB, 1*MiB, MREMAP_MAYMOVE|MREMAP_FIXED, m + 5*MiB);
  if (moved == MAP_FAILED) printf("fixed-remap: refused errno %d\n", errno);
  else printf("fixed-remap: moved\n");
  /* Locking paged memory. */
  if (mlock(m, 1*MiB)) printf("mlock: refused errno %d\n", errno); else { printf("mlock: locked\n"); munlock(m, 1*MiB); }
  if (mlockall(MCL_CURRENT)) printf("mlockall: refused errno %d\n", errno); else { printf("mlockall: locked\n"); munlockall(); }
  /* The rest of the mapping is intact either way. */
  for (size_t i = 0; i < 8*MiB; i += 4096) if ((i < 2*MiB || i >= 3*MiB) && (i < 5*MiB || i >= 6*MiB) && m[i] != 7) { printf("lost at %zu\n", i); return 1; }
  printf("rest ok\n");
  return 0;
}

int main(int argc, char **argv){
  if (argc > 1 && strcmp(argv[1], "fixed-file") == 0) return fixed_file();
  int ok=1; void *p = NULL;
  // alignments beyond the page
  for (size_t al = 4096; al <= (8ul<<20); al <<= 1) {
    int rc = posix_memalign(&p, al, 4*MiB);
    if (rc || ((uintptr_t)p % al)) { printf("posix_memalign %zu rc %d p %p\n", al, rc, p); ok=0; continue; }
    fill(p, 4*MiB, al); if(!check(p,4*MiB,al)) ok=0; free(p);
  }
  p = aligned_alloc(1ul<<22, 8*MiB); if(!p || (uintptr_t)p%(1ul<<22)) {printf("aligned_alloc %p\n",p); ok=0;} else {fill(p,8*MiB,3); ok&=check(p,8*MiB,3); free(p);}
  errno=0; int rc = posix_memalign(&p, 3000, 4*MiB); if (rc != EINVAL) { printf("posix_memalign(3000) rc %d\n", rc); ok=0; }
  p = memalign(1ul<<16, 5*MiB); if(!p || (uintptr_t)p%(1ul<<16)) {printf("memalign %p\n",p); ok=0;} else { if (malloc_usable_size(p) < 5*MiB) {printf("usable %zu\n", malloc_usable_size(p)); ok=0;} free(p);} 
  p = valloc(3*MiB+1); if(!p || (uintptr_t)p%4096) {printf("valloc\n"); ok=0;} else free(p);
  p = pvalloc(3*MiB+1); if(!p || (uintptr_t)p%4096 || malloc_usable_size(p) < 3*MiB+4096) {printf("pvalloc %zu\n", p?malloc_usable_size(p):0); ok=0;} else free(p);
  // requests no allocator can serve: refused, with ENOMEM
  { volatile size_t too_big = SIZE_MAX - 4096, beyond = 1ul << 62;
    errno=0; p = malloc(too_big); if (p || errno != ENOMEM) { printf("malloc(SIZE_MAX-4096) gave %p errno %d\n", p, errno); ok=0; }
    errno=0; p = realloc(NULL, beyond); if (p || errno != ENOMEM) { printf("realloc(NULL, 2^62) gave %p errno %d\n", p, errno); ok=0; }
    int rc = posix_memalign(&p, 4096, beyond); if (rc != ENOMEM) { printf("posix_memalign(2^62) rc %d\n", rc); ok=0; }
    void *m = mmap(NULL, beyond, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) { printf("mmap(2^62) gave %p\n", m); ok=0; } }
  // calloc overflow
  errno=0; volatile size_t huge = SIZE_MAX/2; p = calloc(huge, 4); if (p) { printf("calloc overflow gave %p\n", p); ok=0; }
  // calloc zeroes reused memory
  unsigned char *a = malloc(8*MiB); memset(a, 0xAB, 8*MiB); free(a);
  unsigned char *z = calloc(1, 8*MiB); for (size_t i=0;i<8*MiB;i+=4096) if (z[i]) { printf("calloc not zero at %zu\n", i); ok=0; break; } free(z);
  // realloc grow and shrink keeps contents
  unsigned char *r = malloc(4*MiB); fill(r,4*MiB,7); r = realloc(r, 16*MiB); ok&=check(r,4*MiB,7); r = realloc(r, 100); if (r[0] != 7) { printf("realloc shrink lost byte 0\n"); ok=0; } free(r);
  r = realloc(NULL, 4*MiB); fill(r,4*MiB,9); ok&=check(r,4*MiB,9); r = realloc(r, 0); 
  // mmap, hole punch in the middle, ends survive
  unsigned char *m = mmap(NULL, 8*MiB, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) { printf("mmap failed\n"); return 1; }
  fill(m, 8*MiB, 11);
  if (munmap(m + 2*MiB, 2*MiB)) { printf("munmap middle failed %d\n", errno); ok=0; }
  ok &= check(m, 2*MiB, 11); ok &= check(m + 4*MiB, 4*MiB, (unsigned char)(11 + (4*MiB)/512));
  // a new mapping must not overlap the surviving ends
  unsigned char *m2 = mmap(NULL, 2*MiB, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  memset(m2, 0x5A, 2*MiB);
  ok &= check(m, 2*MiB, 11); ok &= check(m + 4*MiB, 4*MiB, (unsigned char)(11 + (4*MiB)/512));
  for (size_t i=0;i<2*MiB;i+=4096) if (m2[i]!=0x5A) { ok=0; printf("m2\n"); break; }
  munmap(m, 2*MiB); munmap(m+4*MiB, 4*MiB); munmap(m2, 2*MiB);
  // mremap grow (may move) keeps contents
  unsigned char *g = mmap(NULL, 4*MiB, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  fill(g, 4*MiB, 13);
  g = mremap(g, 4*MiB, 12*MiB, MREMAP_MAYMOVE); if (g == MAP_FAILED) { printf("mremap %d\n", errno); ok=0; } else { ok&=check(g,4*MiB,13); for (size_t i=4*MiB;i<12*MiB;i+=4096) if (g[i]) { printf("mremap tail not zero\n"); ok=0; break; } }
  // shrink without move
  unsigned char *g2 = mremap(g, 12*MiB, 2*MiB, 0); if (g2 != g) { printf("mremap shrink moved %p %p\n", g, g2); ok=0; } else ok&=check(g,2*MiB,13);
  munmap(g, 2*MiB);
  // MAP_FIXED over part of an arena mapping
  unsigned char *f = mmap(NULL, 8*MiB, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  fill(f, 8*MiB, 17);
  unsigned char *f2 = mmap(f + 2*MiB, 2*MiB, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0);
  if (f2 != f + 2*MiB) { printf("MAP_FIXED returned %p (%d)\n", f2, errno); ok=0; } else { for (size_t i=0;i<2*MiB;i+=4096) if (f2[i]) { printf("MAP_FIXED not zero at %zu\n", i); ok=0; break; } }
  ok &= check(f, 2*MiB, 17);
  printf(ok ? "ALL OK\n" : "FAILURES\n");
  return ok ? 0 : 1;
}
