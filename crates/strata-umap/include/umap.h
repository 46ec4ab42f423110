/*
 * umap.h: Strata's Umap-compatible C API (libstrata_umap.so).
 *
 * A program written for LLNL Umap builds against this header and links with
 * -lstrata_umap instead of -lumap. Regions are paged through userfaultfd by Strata's
 * pager; see the crate documentation (crates/strata-umap/src/lib.rs) for the list of
 * differences from Umap.
 */
#ifndef STRATA_UMAP_H
#define STRATA_UMAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Flags: UMAP_PRIVATE is required; UMAP_FIXED maps at exactly `addr`. */
#define UMAP_PRIVATE MAP_PRIVATE
#define UMAP_FIXED MAP_FIXED

/* Returned by umap() on failure (errno is set; strata_umap_last_error() says why). */
#define UMAP_FAILED ((void *)-1)

/*
 * Maps `length` bytes of the file open on `fd`, starting at byte `offset` of the file
 * (unlike Umap, the offset is honoured). `prot` is PROT_READ, or PROT_READ|PROT_WRITE.
 * Pages past the end of the file read as zero; written pages extend the file.
 */
void *umap(void *addr, size_t length, int prot, int flags, int fd, off_t offset);

/* Writes the region's dirty pages back and unmaps it. 0 on success; -1 with errno set
 * (EINVAL: no region starts at addr; EIO: write-back failed, the region stays mapped). */
int uunmap(void *addr, size_t length);

/* Writes every dirty page of every region back (pages stay resident). 0, or -1 with
 * errno = EIO if a store failed. */
int umap_flush(void);

/* One page to prefetch: any address inside the page. */
struct umap_prefetch_item {
    void *page_base_addr;
};

/* Reads the listed pages in now. Unlike Umap, this returns once they are resident. */
void umap_prefetch(int npages, struct umap_prefetch_item *page_array);

/* Drops every resident page of every region (dirty pages written back first). 0, or -1
 * with errno = EIO. (Umap has this only on its remote_region branch.) */
int umap_evict(void);

/* 1: writable regions are supported (this kernel offers userfaultfd write-protect). */
int umap_has_write_support(void);

/* Configuration in force, from the UMAP_* environment variables (read once). */
long umapcfg_get_system_page_size(void);
uint64_t umapcfg_get_umap_page_size(void);
uint64_t umapcfg_get_max_pages_in_buffer(void);
uint64_t umapcfg_get_num_fillers(void);
uint64_t umapcfg_get_num_evictors(void);
uint64_t umapcfg_get_max_fault_events(void);
uint64_t umapcfg_get_read_ahead(void);
int umapcfg_get_evict_low_water_threshold(void);
int umapcfg_get_evict_high_water_threshold(void);

/* ---- Strata extensions ---- */

/* Maps `length` bytes of the file at `path` from byte `offset` (created and sized if it
 * does not exist and prot includes PROT_WRITE). Same flags and result as umap(). */
void *strata_umap_file(const char *path, size_t length, int prot, int flags, off_t offset);

/* Drops the resident pages covering [addr, addr+length) (dirty pages written back first).
 * Returns the number of pages dropped, or -1 with errno set. */
long strata_umap_evict_range(void *addr, size_t length);

/* Page faults served so far by the region starting at addr, or -1 (errno = EINVAL). */
long long strata_umap_faults(void *addr);

/* The calling thread's last error message from this library ("" if none). */
const char *strata_umap_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_UMAP_H */
