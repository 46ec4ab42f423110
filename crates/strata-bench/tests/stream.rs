//! The STREAM kernels validate their results through a pager region that evicts and writes back
//! (so `strata bench stream` cannot report a bandwidth over lost or corrupted pages).

use std::sync::Arc;

use strata_bench::stream::{StreamConfig, run_stream};
use strata_core::{MemoryStore, PagerConfig};
use strata_pager::Region;

fn uffd_available() -> bool {
    match strata_pager::probe::probe() {
        Ok(s) if s.write_protect() => true,
        other => {
            let why = match other {
                Ok(_) => "userfaultfd has no write-protect support".to_string(),
                Err(e) => e.to_string(),
            };
            assert!(
                std::env::var_os("CI").is_none(),
                "userfaultfd is required in CI but unavailable: {why}"
            );
            eprintln!("SKIPPED: userfaultfd unavailable ({why}); CI fails instead");
            false
        }
    }
}

#[test]
fn stream_kernels_validate_through_a_region() {
    if !uffd_available() {
        return;
    }
    let size = 6u64 << 20;
    let store = Arc::new(MemoryStore::new(size));
    let cfg = PagerConfig::builder()
        .page_bytes(16 << 10)
        .buffer_bytes(1 << 20)
        .fillers(2)
        .evictors(1)
        .read_ahead(4)
        .build()
        .expect("valid configuration");
    let region = Region::new(store, size, cfg).unwrap();
    let stream = StreamConfig::for_bytes(size, 2, 2);
    let mut steps = 0;
    let report = run_stream(&region, &stream, &mut |_| steps += 1).expect("STREAM validates");
    assert_eq!(steps, 2 + 2 * 4);
    assert_eq!(report.checked_elements, 3 * stream.elements as u64);
    let s = region.stats();
    assert!(s.evictions > 0 && s.writebacks > 0, "{s}");
    assert!(region.counters().read_ahead_pages > 0);
}
