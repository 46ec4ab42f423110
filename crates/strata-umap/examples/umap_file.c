/* A Umap program on Strata: maps a file far larger than the buffer (UMAP_BUFSIZE pages),
 * writes it through the mapping, flushes, unmaps, and checks the file.
 *
 * Build and run (from the repository root, after `cargo build --release -p strata-umap`):
 *   gcc -std=c11 -O2 -Icrates/strata-umap/include crates/strata-umap/examples/umap_file.c \
 *       -Ltarget/release -Wl,-rpath,$PWD/target/release -lstrata_umap -lpthread -o umap_file
 *   UMAP_BUFSIZE=256 ./umap_file /tmp/umap-example.bin
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "umap.h"

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "/tmp/strata-umap-example.bin";
    const size_t size = 64u << 20;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        perror(path);
        return 1;
    }
    uint64_t *words = umap(NULL, size, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    if (words == UMAP_FAILED) {
        fprintf(stderr, "umap: %s\n", strata_umap_last_error());
        return 1;
    }
    const size_t n = size / sizeof(uint64_t);
    for (size_t i = 0; i < n; i++) words[i] = i * 7;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += words[i];
    if (umap_flush() != 0 || uunmap(words, size) != 0) {
        fprintf(stderr, "flush/uunmap: %s\n", strata_umap_last_error());
        return 1;
    }
    uint64_t last = 0;
    if (pread(fd, &last, sizeof last, (off_t)(size - sizeof last)) != (ssize_t)sizeof last ||
        last != (n - 1) * 7) {
        fprintf(stderr, "the file does not hold what was written (last word %llu)\n",
                (unsigned long long)last);
        return 1;
    }
    printf("wrote %zu words through a %llu-page buffer (sum %llu); the file holds them\n", n,
           (unsigned long long)umapcfg_get_max_pages_in_buffer(), (unsigned long long)sum);
    close(fd);
    unlink(path);
    return 0;
}
