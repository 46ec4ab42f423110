//! Regions opened from a `remote:` store spec (the path the C API and Python bindings share)
//! over a memory node on 127.0.0.1, with and without a codec: random data survives flush and
//! eviction, and a wrong token is refused with a clear error.

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use strata::{RegionSpec, Status, open_region};
use strata_net::{MemoryNode, ServeOptions};

const TOKEN: &str = "strata-c-test-token";

fn node() -> MemoryNode {
    let mut opts = ServeOptions::new(
        "127.0.0.1:0".parse().expect("loopback address"),
        64 << 20,
        TOKEN,
    );
    opts.transports = Some("tcp".into());
    MemoryNode::start(opts)
        .expect("start a memory node on 127.0.0.1 (is UCX installed? apt-get install libucx0)")
}

fn spec(node: &MemoryNode, codec: &str, token: &str) -> RegionSpec {
    RegionSpec {
        store: format!("remote:{}", node.address()),
        codec: codec.into(),
        token: Some(token.into()),
        page_bytes: 16 << 10,
        buffer_bytes: 8 * (16 << 10),
        ..RegionSpec::default()
    }
}

#[test]
fn remote_regions_keep_random_data_through_eviction() {
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let node = node();
    for codec in ["none", "lz4"] {
        let size = 1_000_003usize;
        let mut region = open_region(size as u64, &spec(&node, codec, TOKEN))
            .unwrap_or_else(|e| panic!("open a remote region ({codec}): {e}"));
        let mut want = vec![0u8; size];
        rng.fill_bytes(&mut want);
        region.as_mut_slice().copy_from_slice(&want);
        region.flush().expect("flush");
        region.evict_all().expect("evict");
        assert!(
            region.as_slice() == want.as_slice(),
            "{codec}: bytes differ after a round trip through the node (seed {seed})"
        );
        let stats = region.stats();
        assert!(stats.writebacks > 0 && stats.faults > 0, "{stats:?}");
        region.unmap().expect("unmap");
    }
    node.shutdown();
}

#[test]
fn remote_region_with_wrong_token_is_refused() {
    let node = node();
    let err = open_region(1 << 20, &spec(&node, "none", "wrong-token"))
        .expect_err("a wrong token must be refused");
    assert_eq!(err.status(), Status::Store, "{err}");
    assert!(err.to_string().contains("token"), "message: {err}");
    node.shutdown();
}
