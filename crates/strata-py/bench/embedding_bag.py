"""Benchmark: strata.torch.EmbeddingBag training steps (forward + backward with the fused SGD
step) against torch.nn.EmbeddingBag with the table in GPU memory and against the same kernels
reading a table in pinned host memory in place (zero-copy), plus the Python launch path's cost
over the same launch made from Rust.

    python3 crates/strata-py/bench/embedding_bag.py --out DIR [--cache-mib 512] [--ratios 2,4,8]
        [--dims 128,1024] [--bags 2048] [--bag-size 32] [--alpha 0.99] [--warmup 30] [--iters 30]
    python3 crates/strata-py/bench/embedding_bag.py --plot DIR/embedding_bag.json

Zero-copy runs --baseline-warmup + --baseline-iters steps (it has no cache to warm).
Ids: Zipf(alpha) ranks over the table's rows, scattered by a random permutation (hot rows are
not neighbours, as in real tables). Each mode runs `warmup` steps, then `iters` steps each timed
with CUDA events on the current stream; the JSON has medians. Strata's table is `ratio` times
the GPU memory given to its cache (`--cache-mib`); the baselines hold the same table.
"""

import argparse
import json
import os
import statistics
import sys
import time


def zipf_batches(torch, rows, count, n, alpha, dev, seed):
    """`count` batches of `n` ids: Zipf(alpha) ranks, scattered by a random permutation."""
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    w = torch.arange(1, rows + 1, device=dev, dtype=torch.float64).pow_(-alpha)
    cdf = torch.cumsum(w, 0)
    cdf /= cdf[-1].clone()
    perm = torch.randperm(rows, device=dev, generator=g)
    out = []
    for _ in range(count):
        u = torch.rand(n, device=dev, dtype=torch.float64, generator=g)
        ranks = torch.searchsorted(cdf, u).clamp_(max=rows - 1)
        out.append(perm[ranks])
    return out


def time_steps(torch, step, batches, warmup):
    """Runs step(batch) over the batches; returns the per-step milliseconds after warm-up."""
    times = []
    for i, b in enumerate(batches):
        if i < warmup:
            step(b)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(b)
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in times]


def launch_overhead(torch, strata, reps=20000):
    """Per-launch host cost of KernelModule.launch from Python against the same launches made
    from Rust (`_rust_launch_ns`), for a tiny kernel taking a space and a count."""
    s = strata.Space(1 << 20, cache_bytes=1 << 20)
    m = s.compile('#include "strata.cuh"\nextern "C" __global__ void noop(StrataSpace s, unsigned long long n) {}',
                  "noop.cu")
    stream = torch.cuda.current_stream().cuda_stream
    args = [s, 1]
    for _ in range(1000):
        m.launch("noop", args, blocks=1, threads=32, synchronize=False, stream=stream)
    torch.cuda.synchronize()
    rust, py = [], []
    for _ in range(5):
        rust.append(m._rust_launch_ns("noop", args, reps, blocks=1, threads=32, stream=stream))
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            m.launch("noop", args, blocks=1, threads=32, synchronize=False, stream=stream)
        py.append((time.perf_counter_ns() - t0) / reps)
        torch.cuda.synchronize()
    r, p = statistics.median(rust), statistics.median(py)
    return {"rust_ns_per_launch": r, "python_ns_per_launch": p, "python_overhead_ns": p - r,
            "reps": reps, "rounds": 5}


def run(args):
    import torch

    import strata
    from strata.torch import EmbeddingBag
    from strata.torch._embedding_bag import kernels

    dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.init()
    cache = args.cache_mib << 20
    n = args.bags * args.bag_size
    offsets = torch.arange(args.bags, device=dev, dtype=torch.int64) * args.bag_size
    results = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
               "cache_bytes": cache, "bags": args.bags, "bag_size": args.bag_size, "alpha": args.alpha,
               "warmup": args.warmup, "iters": args.iters, "lr": args.lr, "runs": []}
    results["launch"] = launch_overhead(torch, strata)
    print(json.dumps(results["launch"]), flush=True)
    total = args.warmup + args.iters
    for dim in args.dims:
        row = dim * 4
        max_rows = max(args.ratios) * cache // row
        # One pinned host table for the zero-copy baseline; each ratio uses its first rows.
        t0 = time.time()
        host = torch.zeros((max_rows, dim), dtype=torch.float32, pin_memory=True)
        print(f"dim {dim}: pinned {max_rows * row >> 20} MiB in {time.time() - t0:.1f} s", flush=True)
        for ratio in args.ratios:
            rows = ratio * cache // row
            batches = zipf_batches(torch, rows, total, n, args.alpha, dev, seed=1000 * dim + ratio)
            gout = torch.randn(args.bags, dim, device=dev)
            common = dict(dim=dim, ratio=ratio, rows=rows, table_bytes=rows * row, lookups=n)

            def record(mode, times, **extra):
                med = statistics.median(times)
                rec = dict(common, mode=mode, median_ms=med, min_ms=min(times), max_ms=max(times),
                           lookups_per_s=n / (med / 1e3), **extra)
                results["runs"].append(rec)
                print(json.dumps(rec), flush=True)
                save(results, args.out)  # after each run, so a cut-off benchmark keeps its rows

            # Strata: the table in a space `ratio` times its cache.
            t0 = time.time()
            bag = EmbeddingBag(rows, dim, mode="sum", cache_bytes=cache, init="zeros", validate_ids=False,
                               lr=args.lr, policy=args.policy)
            setup = time.time() - t0

            def strata_step(ids):
                bag(ids, offsets).backward(gout)

            for b in batches[: args.warmup]:
                strata_step(b)
            torch.cuda.synchronize()
            bag.space.reset_stats()
            times = time_steps(torch, strata_step, batches[args.warmup:], 0)
            bag.check_errors()
            st = bag.stats()
            accesses = st["hits"] + st["faults"]
            record("strata", times, setup_s=setup, hit_rate=st["hits"] / max(1, accesses),
                   faults=st["faults"], bytes_in=st["bytes_in"], bytes_out=st["bytes_out"],
                   evictions=st["evictions"], writebacks=st["writebacks"])
            mod = kernels(bag.space, dev.index, dim, dim)
            del bag
            torch.cuda.empty_cache()

            # The same kernels on a plain table: pinned host memory read in place (zero-copy),
            # and (where it fits) GPU memory.
            err = torch.tensor([0, -1], device=dev)
            out = torch.empty(args.bags, dim, device=dev)

            def ptr_step(table_ptr):
                def step(ids):
                    stream = torch.cuda.current_stream().cuda_stream
                    c = [("ptr", ids.data_ptr()), ("i64", n), ("ptr", offsets.data_ptr()), ("i64", args.bags),
                         ("i64", 0), ("ptr", 0), ("u64", args.bags), ("i64", rows), ("i32", 0), ("i64", -1)]
                    blocks = -(-args.bags * 32 // 256)
                    mod.launch("eb_forward_ptr", [("ptr", table_ptr), *c, ("ptr", out.data_ptr()),
                                                  ("ptr", err.data_ptr())],
                               blocks=blocks, threads=256, synchronize=False, stream=stream)
                    mod.launch("eb_sgd_ptr", [("ptr", table_ptr), *c, ("ptr", gout.data_ptr()),
                                              ("f32", args.lr), ("ptr", err.data_ptr())],
                               blocks=blocks, threads=256, synchronize=False, stream=stream)
                return step

            # Zero-copy has no cache to warm and is slow: fewer steps.
            zc = batches[: args.baseline_warmup + args.baseline_iters]
            record("zero-copy", time_steps(torch, ptr_step(host.data_ptr()), zc, args.baseline_warmup))
            assert err.tolist() == [0, -1]
            free, _ = torch.cuda.mem_get_info(dev)
            if rows * row * 2.5 < free:
                dev_table = torch.zeros((rows, dim), device=dev)
                record("ours-gpu-memory", time_steps(torch, ptr_step(dev_table.data_ptr()), batches,
                                                     args.warmup))
                del dev_table
                ref = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True, device=dev)
                with torch.no_grad():
                    ref.weight.zero_()
                opt = torch.optim.SGD(ref.parameters(), lr=args.lr)

                def torch_step(ids):
                    ref(ids, offsets).backward(gout)
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                record("torch-gpu-memory", time_steps(torch, torch_step, batches, args.warmup))
                del ref, opt
            torch.cuda.empty_cache()
        del host
    # Ratios against the baselines of the same table.
    by = {(r["dim"], r["ratio"], r["mode"]): r for r in results["runs"]}
    for r in results["runs"]:
        if r["mode"] == "strata":
            zc = by.get((r["dim"], r["ratio"], "zero-copy"))
            tg = by.get((r["dim"], r["ratio"], "torch-gpu-memory"))
            r["speedup_vs_zero_copy"] = zc["median_ms"] / r["median_ms"] if zc else None
            r["slowdown_vs_torch_gpu"] = r["median_ms"] / tg["median_ms"] if tg else None
    return results


def save(results, out):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "embedding_bag.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    return path


def plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (run --plot on the JSON where it is)")
        return False
    dims = sorted({r["dim"] for r in results["runs"]})
    fig, axes = plt.subplots(1, len(dims), figsize=(6 * len(dims), 4.5), squeeze=False)
    for ax, dim in zip(axes[0], dims):
        for mode in ("strata", "zero-copy", "torch-gpu-memory", "ours-gpu-memory"):
            pts = sorted((r["ratio"], r["median_ms"]) for r in results["runs"] if r["dim"] == dim and r["mode"] == mode)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("table size / Strata's GPU cache")
        ax.set_ylabel("ms per training step (median)")
        ax.set_title(f"{dim} floats per row ({dim * 4} B), Zipf {results['alpha']}, "
                     f"{results['bags']}x{results['bag_size']} lookups")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"EmbeddingBag forward+backward (SGD), {results['device']}, cache "
                 f"{results['cache_bytes'] >> 20} MiB")
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--cache-mib", type=int, default=512)
    p.add_argument("--ratios", default="2,4,8")
    p.add_argument("--dims", default="128,1024")
    p.add_argument("--bags", type=int, default=2048)
    p.add_argument("--bag-size", type=int, default=32)
    p.add_argument("--alpha", type=float, default=0.99)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--baseline-warmup", type=int, default=3, help="zero-copy warm-up steps")
    p.add_argument("--baseline-iters", type=int, default=10, help="zero-copy timed steps")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--policy", default="clock")
    p.add_argument("--plot", metavar="JSON", help="only draw the plot of an earlier run's JSON")
    args = p.parse_args()
    if args.plot:
        with open(args.plot) as f:
            results = json.load(f)
        plot(results, os.path.splitext(args.plot)[0] + ".png")
        return 0
    args.ratios = [int(x) for x in args.ratios.split(",")]
    args.dims = [int(x) for x in args.dims.split(",")]
    results = run(args)
    print(f"json: {save(results, args.out)}")
    plot(results, os.path.join(args.out, "embedding_bag.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
