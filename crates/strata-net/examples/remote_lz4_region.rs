//! A pager region over a memory node, with LZ4 on the wire. The node is started in this
//! process on 127.0.0.1 (in production run `strata serve --listen HOST:PORT --capacity 8GiB`
//! on the lending machine and give its token to clients as `STRATA_REMOTE_TOKEN`).
//!
//! Run: `cargo run --release -p strata-net --example remote_lz4_region` (needs UCX and
//! userfaultfd).

use strata_core::PagerConfig;
use strata_core::config::{CodecKind, StoreConfig, StoreKind};
use strata_net::{MemoryNode, ServeOptions};
use strata_pager::Region;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let token = "example-token".to_string();
    let mut opts = ServeOptions::new("127.0.0.1:0".parse()?, 256 << 20, token.clone());
    opts.transports = Some("tcp".into());
    let node = MemoryNode::start(opts)?;
    let size: u64 = 32 << 20;
    let kind: StoreKind = format!("remote:{}", node.address()).parse()?;
    let config = StoreConfig::builder()
        .kind(kind)
        .codec(CodecKind::Lz4) // text-like pages cross the wire at a third of their size
        .token(token)
        .build()?;
    let store = strata_net::open_store(&config, size)?;
    let pager = PagerConfig::builder()
        .buffer_bytes(4 << 20)
        .page_bytes(64 << 10)
        .build()?;
    let mut region = Region::builder(store, size).config(pager).build()?;
    let text = b"strata pages this sentence to a memory node and back. ";
    for (i, b) in region.as_mut_slice().iter_mut().enumerate() {
        *b = text[i % text.len()];
    }
    region.flush()?;
    let ok = region
        .as_slice()
        .iter()
        .enumerate()
        .all(|(i, b)| *b == text[i % text.len()]);
    assert!(ok, "every byte came back from the node");
    println!("32 MiB through a 4 MiB buffer over a memory node with LZ4: verified");
    println!("{}", region.stats());
    region.unmap().map_err(|e| e.error)?;
    node.shutdown();
    Ok(())
}
