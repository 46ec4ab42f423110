//! A pager region over a file: 64 MiB of `u64`s paged through a 8 MiB buffer, written,
//! flushed, and read back from the file itself.
//!
//! Run: `cargo run --release -p strata-pager --example file_region [PATH]` (needs
//! userfaultfd: root, or `vm.unprivileged_userfaultfd=1`).

use std::sync::Arc;

use strata_core::{FileStore, PagerConfig, Store};
use strata_pager::Region;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).map_or_else(
        || std::env::temp_dir().join("strata-example-region.bin"),
        Into::into,
    );
    let size: u64 = 64 << 20;
    let store: Arc<dyn Store> = Arc::new(FileStore::create(&path, size)?);
    let config = PagerConfig::builder()
        .buffer_bytes(8 << 20) // an eighth of the region stays resident
        .page_bytes(64 << 10)
        .build()?;
    let mut region = Region::builder(store, size).config(config).build()?;
    // The region is ordinary memory to this code; every page beyond the buffer faults into
    // the pager, which evicts (and writes back) others to make room.
    let words: &mut [u64] = bytemuck_free_cast(region.as_mut_slice());
    for (i, w) in words.iter_mut().enumerate() {
        *w = i as u64 * 3;
    }
    let sum: u64 = words.iter().copied().fold(0, u64::wrapping_add);
    let count = words.len();
    region.flush()?; // every dirty page is in the file after this
    println!("wrote and summed {count} u64s through an 8 MiB buffer: sum {sum}");
    println!("{}", region.stats());
    region.unmap().map_err(|e| e.error)?;
    let bytes = std::fs::read(&path)?;
    let last = u64::from_ne_bytes(bytes[bytes.len() - 8..].try_into()?);
    assert_eq!(
        last,
        (size / 8 - 1) * 3,
        "the file holds what the program wrote"
    );
    println!(
        "the file {} holds the data (last word {last})",
        path.display()
    );
    std::fs::remove_file(&path)?;
    Ok(())
}

/// Views page-aligned bytes as `u64`s (the region is page-aligned, so the cast is exact).
fn bytemuck_free_cast(bytes: &mut [u8]) -> &mut [u64] {
    // SAFETY: a region's memory is page-aligned and its length a multiple of the page size,
    // so it is aligned for u64 and holds a whole number of them; every bit pattern is a u64.
    let (head, words, tail) = unsafe { bytes.align_to_mut::<u64>() };
    assert!(head.is_empty() && tail.is_empty());
    words
}
