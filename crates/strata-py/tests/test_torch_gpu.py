"""strata.torch.EmbeddingBag on a GPU against torch.nn.EmbeddingBag on the same data: forward
(sum, mean, per-sample weights, empty bags, padding, 2-D input, other streams), out-of-range ids,
training with the fused SGD and row-wise Adagrad steps (losses equal to a torch reference over
hundreds of steps, with the table 4x its cache), the state dict, and torch.compile. Skipped
without PyTorch or a GPU."""

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU visible to PyTorch", allow_module_level=True)

import strata  # noqa: E402
from strata.torch import EmbeddingBag  # noqa: E402
from strata.torch._embedding_bag import kernels  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def gen(rng):
    """A torch generator seeded from the printed test seed (conftest's rng)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(rng.integers(2**62)))
    return g


def zipf_ids(gen, rows, n, alpha=0.99):
    """n ids in [0, rows), Zipf(alpha) ranks scattered by a random permutation."""
    w = torch.arange(1, rows + 1, dtype=torch.float64) ** -alpha
    ranks = torch.multinomial(w, n, replacement=True, generator=gen)
    return torch.randperm(rows, generator=gen)[ranks]


def random_bags(gen, rows, bags, max_len, empty_every=5):
    """(ids, offsets): bags of 0..max_len Zipf ids, every `empty_every`-th bag empty."""
    lengths = torch.randint(0, max_len + 1, (bags,), generator=gen)
    lengths[::empty_every] = 0
    offsets = torch.zeros(bags, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)[:-1]
    ids = zipf_ids(gen, rows, int(lengths.sum()))
    return ids, offsets


def reference(bag, **kw):
    """torch.nn.EmbeddingBag with `bag`'s table, on the GPU."""
    ref = torch.nn.EmbeddingBag(bag.num_embeddings, bag.embedding_dim, mode=bag.mode,
                                padding_idx=bag.padding_idx,
                                include_last_offset=bag.include_last_offset, **kw).to(DEV)
    with torch.no_grad():
        ref.weight.copy_(bag.read_weight())
    return ref


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("dim", [128, 100, 1024])
def test_forward_matches_torch(gen, mode, dim):
    rows = 3000
    bag = EmbeddingBag(rows, dim, mode=mode, cache_bytes=1024 * 4096)
    ref = reference(bag)
    ids, offsets = random_bags(gen, rows, 257, 40)
    ids, offsets = ids.to(DEV), offsets.to(DEV)
    got = bag(ids, offsets)
    assert got.shape == (257, dim) and got.dtype == torch.float32 and got.device == DEV
    torch.testing.assert_close(got, ref(ids, offsets), rtol=1e-5, atol=1e-5)
    assert (got[::5] == 0).all()  # empty bags give zeros
    # int32 ids and offsets, 2-D input
    torch.testing.assert_close(bag(ids.int(), offsets.int()), ref(ids, offsets), rtol=1e-5, atol=1e-5)
    two_d = zipf_ids(gen, rows, 64 * 7).reshape(64, 7).to(DEV)
    torch.testing.assert_close(bag(two_d), ref(two_d), rtol=1e-5, atol=1e-5)
    if mode == "sum":
        w = torch.rand(ids.shape, generator=gen).to(DEV)
        torch.testing.assert_close(bag(ids, offsets, w), ref(ids, offsets, w), rtol=1e-5, atol=1e-5)
    else:
        with pytest.raises(NotImplementedError, match="only supported for mode='sum'"):
            bag(ids, offsets, torch.ones_like(ids, dtype=torch.float32))
    assert bag.stats()["faults"] > 0


def test_padding_last_offset_and_other_streams(gen):
    rows, dim = 500, 64
    bag = EmbeddingBag(rows, dim, mode="mean", padding_idx=7, include_last_offset=True)
    assert (bag.read_weight()[7] == 0).all()
    ref = reference(bag)
    ids, offsets = random_bags(gen, rows, 100, 20)
    ids[::3] = 7
    ends = torch.cat([offsets, torch.tensor([ids.numel()])])
    ids, ends = ids.to(DEV), ends.to(DEV)
    want = ref(ids, ends)
    torch.testing.assert_close(bag(ids, ends), want, rtol=1e-5, atol=1e-5)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = bag(ids, ends)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_out_of_range_ids_raise_and_are_never_read(gen):
    rows = 1000
    bag = EmbeddingBag(rows, 32, mode="sum")
    offsets = torch.tensor([0, 2], device=DEV)
    for bad in (rows, -1, 1 << 40):
        with pytest.raises(IndexError, match=rf"outside \[0, {rows}\) \(the first seen: {bad}\)"):
            bag(torch.tensor([1, bad, 3], device=DEV), offsets)
    good = torch.tensor([1, 2, 3], device=DEV)
    torch.testing.assert_close(bag(good, offsets), reference(bag)(good, offsets))
    lazy = EmbeddingBag(rows, 32, mode="sum", validate_ids=False)
    ref = reference(lazy)
    out = lazy(torch.tensor([1, rows + 5, 3], device=DEV), offsets)
    # The bad id contributed nothing: bag 0 is row 1 alone.
    torch.testing.assert_close(out[0], ref.weight[1].detach())
    with pytest.raises(IndexError, match="the first seen: 1005"):
        lazy.check_errors()
    lazy.check_errors()  # cleared
    with pytest.raises(ValueError, match="offsets has to be a 1D Tensor but got None"):
        bag(good)
    with pytest.raises(ValueError, match="is on cpu"):
        bag(good.cpu(), offsets.cpu())
    with pytest.raises(TypeError, match="int32 or int64"):
        bag(good.float(), offsets)
    with pytest.raises(ValueError, match="offsets has to be None"):
        bag(good.reshape(1, 3), offsets)


def train(bag_like, ref_step, steps, gen, rows, dim, bags, mode):
    """Runs `steps` steps of a small regression on both tables; returns both loss lists."""
    losses, ref_losses = [], []
    for _ in range(steps):
        ids, offsets = random_bags(gen, rows, bags, 24)
        target = torch.randn(bags, dim, generator=gen).to(DEV)
        ids, offsets = ids.to(DEV), offsets.to(DEV)
        out = bag_like(ids, offsets)
        loss = ((out - target) ** 2).sum(1).mean()
        loss.backward()
        losses.append(loss.item())
        ref_losses.append(ref_step(ids, offsets, target))
    return losses, ref_losses


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_training_matches_torch_with_the_table_4x_its_cache(gen, optimizer, mode):
    rows, dim, bags = 32768, 64, 128
    table = rows * dim * 4
    lr = 0.5 if optimizer == "sgd" else 0.05
    bag = EmbeddingBag(rows, dim, mode=mode, cache_bytes=table // 4, page_size=4096,
                       optimizer=optimizer, lr=lr)
    assert bag.space.frames * 4096 * 4 == table
    ref = reference(bag)
    state = torch.zeros(rows, device=DEV)

    def ref_step(ids, offsets, target):
        out = ref(ids, offsets)
        loss = ((out - target) ** 2).sum(1).mean()
        ref.weight.grad = None
        loss.backward()
        with torch.no_grad():
            g = ref.weight.grad
            if optimizer == "sgd":
                ref.weight -= lr * g
            else:  # row-wise Adagrad (rows the batch did not use have g = 0: unchanged)
                state.add_((g * g).mean(dim=1))
                ref.weight -= lr * g / (state.sqrt() + 1e-10)[:, None]
        return loss.item()

    before = bag.read_weight()
    losses, ref_losses = train(bag, ref_step, 300, gen, rows, dim, bags, mode)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-4, atol=1e-6)
    assert (bag.read_weight() - before).abs().max() > 0.05  # the steps moved the table
    torch.testing.assert_close(bag.read_weight().to(DEV), ref.weight.detach(), rtol=1e-3, atol=1e-4)
    if optimizer == "adagrad":
        torch.testing.assert_close(bag.adagrad_sum, state, rtol=1e-3, atol=1e-6)
    stats = bag.stats()
    assert stats["evictions"] > 0 and stats["writebacks"] > 0, stats
    bag.check_errors()


def test_state_dict_round_trip(gen):
    rows, dim = 2000, 96
    a = EmbeddingBag(rows, dim, mode="sum", optimizer="adagrad", lr=0.1, cache_bytes=128 * 4096)
    ids, offsets = random_bags(gen, rows, 64, 16)
    ids, offsets = ids.to(DEV), offsets.to(DEV)
    for _ in range(5):
        a(ids, offsets).sum().backward()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    sd = torch.load(io.BytesIO(buf.getvalue()))
    assert set(sd) == {"weight", "adagrad_sum"} and sd["weight"].shape == (rows, dim)
    b = EmbeddingBag(rows, dim, mode="sum", optimizer="adagrad", lr=0.1, cache_bytes=128 * 4096)
    assert not torch.equal(b.read_weight(), sd["weight"])
    b.load_state_dict(sd)
    assert torch.equal(b.read_weight(), a.read_weight())
    assert torch.equal(b.adagrad_sum, a.adagrad_sum)
    torch.testing.assert_close(b(ids, offsets), a(ids, offsets), rtol=0, atol=0)
    # Inside a model, with its prefix; a wrong shape is refused with torch's message.
    model = torch.nn.Sequential(b)
    assert set(model.state_dict()) == {"0.weight", "0.adagrad_sum"}
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        b.load_state_dict({"weight": torch.zeros(rows + 1, dim), "adagrad_sum": sd["adagrad_sum"]})
    with pytest.raises(RuntimeError, match="Missing key"):
        b.load_state_dict({"weight": sd["weight"]})


def test_zero_copy_kernels_match_the_space(gen):
    """The benchmark's zero-copy baseline (the same kernels over pinned host memory read in
    place) computes what the space does."""
    rows, dim = 4096, 128
    bag = EmbeddingBag(rows, dim, mode="sum", lr=0.25, cache_bytes=512 * 4096)
    host = bag.read_weight().pin_memory()
    mod = kernels(bag.space, DEV.index, dim, dim)
    ids, offsets = random_bags(gen, rows, 100, 30)
    ids, offsets = ids.to(DEV), offsets.to(DEV)
    err = torch.tensor([0, -1], device=DEV)
    out = torch.empty(100, dim, device=DEV)
    stream = torch.cuda.current_stream().cuda_stream
    common = [("ptr", ids.data_ptr()), ("i64", ids.numel()), ("ptr", offsets.data_ptr()), ("i64", 100),
              ("i64", 0), ("ptr", 0), ("u64", 100), ("i64", rows), ("i32", 0), ("i64", -1)]
    # CUDA tensors pass as their device pointers (__cuda_array_interface__).
    mod.launch("eb_forward_ptr", [("ptr", host.data_ptr()), *common, out, err],
               blocks=13, threads=256, synchronize=False,
               stream=stream)
    got = bag(ids, offsets)
    torch.testing.assert_close(out, got, rtol=1e-6, atol=1e-6)
    grad = torch.randn(100, dim, generator=gen).to(DEV)
    got.backward(grad)
    mod.launch("eb_sgd_ptr", [("ptr", host.data_ptr()), *common, ("ptr", grad.data_ptr()), ("f32", 0.25),
                              ("ptr", err.data_ptr())], blocks=13, threads=256, stream=stream)
    torch.testing.assert_close(host, bag.read_weight(), rtol=1e-5, atol=1e-5)
    assert err.tolist() == [0, -1]


def test_python_launch_overhead_is_small():
    """The Python launch path adds little over the same launches made from Rust (the
    benchmark reports the numbers; this only guards against a gross regression)."""
    s = strata.Space(1 << 20, cache_bytes=1 << 20)
    m = s.compile('#include "strata.cuh"\nextern "C" __global__ void noop(StrataSpace s, unsigned long long n) {}')
    stream = torch.cuda.current_stream().cuda_stream
    import time

    for _ in range(200):
        m.launch("noop", [s, 1], blocks=1, threads=32, synchronize=False, stream=stream)
    rust_ns = min(m._rust_launch_ns("noop", [s, 1], 2000, stream=stream) for _ in range(3))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for _ in range(2000):
            m.launch("noop", [s, 1], blocks=1, threads=32, synchronize=False, stream=stream)
        best = min(best, (time.perf_counter_ns() - t0) / 2000)
        torch.cuda.synchronize()
    print(f"launch: rust {rust_ns:.0f} ns, python {best:.0f} ns, overhead {best - rust_ns:.0f} ns")
    assert best - rust_ns < 50_000


def test_torch_compile_runs_the_op_opaquely(gen):
    rows, dim = 1000, 64
    eager = EmbeddingBag(rows, dim, mode="mean", lr=0.1)
    compiled_bag = EmbeddingBag(rows, dim, mode="mean", lr=0.1, _weight=eager.read_weight())
    lin = torch.nn.Linear(dim, 1).to(DEV)

    def step(b, ids, offsets):
        return lin(b(ids, offsets)).square().mean()

    compiled = torch.compile(step, fullgraph=True)
    for _ in range(5):
        ids, offsets = random_bags(gen, rows, 32, 10)
        ids, offsets = ids.to(DEV), offsets.to(DEV)
        le = step(eager, ids, offsets)
        le.backward()
        lc = compiled(compiled_bag, ids, offsets)
        lc.backward()
        torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_bag.read_weight(), eager.read_weight(), rtol=1e-5, atol=1e-6)


def test_table_in_a_file_store(gen, tmp_path):
    """The table in a file store (paged store -> host cache -> GPU cache), 4x its GPU cache:
    forward and SGD steps as torch computes them, and the file holds the trained rows."""
    rows, dim, lr = 16384, 64, 0.5
    path = tmp_path / "table.bin"
    bag = EmbeddingBag(rows, dim, mode="sum", lr=lr, cache_bytes=rows * dim, page_size=4096,
                       store=f"file:{path}", host_cache_bytes=1 << 20)
    ref = reference(bag)

    def ref_step(ids, offsets, target):
        loss = ((ref(ids, offsets) - target) ** 2).sum(1).mean()
        ref.weight.grad = None
        loss.backward()
        with torch.no_grad():
            ref.weight -= lr * ref.weight.grad
        return loss.item()

    losses, ref_losses = train(bag, ref_step, 40, gen, rows, dim, 128, "sum")
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-4, atol=1e-6)
    bag.flush()
    on_disk = torch.from_numpy(np.fromfile(path, dtype=np.float32, count=rows * dim)).reshape(rows, dim)
    torch.testing.assert_close(on_disk.to(DEV), ref.weight.detach(), rtol=1e-3, atol=1e-4)


def test_backward_on_a_thread_without_a_current_context():
    """Autograd runs backward on its own thread; when the update is the first CUDA work there,
    no context is current yet (a fresh interpreter, so no earlier test made one current)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from strata.torch import EmbeddingBag\n"
        "bag = EmbeddingBag(1000, 48, mode='sum', lr=1.0, init='zeros')\n"
        "ids = torch.arange(10, device='cuda')\n"
        "out = bag(ids, torch.tensor([0, 5], device='cuda'))\n"
        "out.backward(torch.ones(2, 48, device='cuda'))\n"
        "w = bag.read_weight()\n"
        "assert (w[:10] == -1).all() and (w[10:] == 0).all(), w[:12]\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
