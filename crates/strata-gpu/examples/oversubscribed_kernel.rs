//! A CUDA kernel over a GPU space four times larger than its page cache: the kernel scales
//! every element, its warps serve their own page faults, and the result is checked on the
//! host.
//!
//! Run on a machine with an NVIDIA GPU (driver 580+ and NVRTC 13):
//! `cargo run --release -p strata-gpu --example oversubscribed_kernel [CACHE_MIB]`.

use strata_gpu::driver::Args;
use strata_gpu::{ElementType, SpaceOptions, Strata};

const KERNEL: &str = r#"
#include "strata.cuh"
extern "C" __global__ void scale(StrataSpace s, unsigned long long n, double k) {
    strata::Array<double> a(s);
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x)
        a.write(i, a.read(i) * k);
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cache_mib: u64 = std::env::args().nth(1).map_or(Ok(256), |a| a.parse())?;
    let strata = Strata::new(0)?;
    let opts = SpaceOptions {
        page_size: 64 << 10,
        cache_bytes: cache_mib << 20,
        element: ElementType::F64,
        ..Default::default()
    };
    let n = 4 * (cache_mib << 20) / 8; // four times the cache
    let mut space = strata.space(n * 8, &opts)?;
    space.with_host_mut(|bytes| {
        for (i, chunk) in bytes.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&(i as f64).to_ne_bytes());
        }
    })?;
    let module = strata.compile(KERNEL, "scale.cu")?;
    let scale = module.function("scale")?;
    scale.launch(
        scale.full_grid(256)?,
        &Args::new().arg(space.handle()).arg(n).arg(2.0f64),
    )?;
    space.check_errors()?;
    let mut tail = vec![0f64; 1024];
    space.read_back((n - 1024) * 8, &mut tail)?;
    for (j, v) in tail.iter().enumerate() {
        let i = n - 1024 + j as u64;
        assert_eq!(*v, i as f64 * 2.0, "element {i}");
    }
    println!(
        "scaled {} MiB of doubles through a {} MiB GPU cache: checked",
        (n * 8) >> 20,
        cache_mib
    );
    println!("{}", space.stats()?.to_snapshot());
    Ok(())
}
