/* Writes a block of MIB MiB once, one byte per 4 KiB page in order, then sums the bytes of
 * its last MiB (still resident under any budget of a few MiB): memory that is never read
 * back. Usage: write_once MIB SEED; prints the sum. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: write_once MIB SEED\n");
        return 2;
    }
    size_t n = (size_t)atoll(argv[1]) << 20;
    unsigned long seed = strtoul(argv[2], NULL, 10);
    unsigned char *b = malloc(n);
    if (!b || n < (1 << 20)) {
        fprintf(stderr, "write_once: no memory or block under 1 MiB\n");
        return 2;
    }
    for (size_t i = 0; i < n; i += 4096)
        b[i] = (unsigned char)((i >> 12) * seed % 251);
    unsigned long sum = 0;
    for (size_t i = n - (1 << 20); i < n; i += 4096)
        sum += b[i];
    printf("%lu\n", sum);
    free(b);
    return 0;
}
