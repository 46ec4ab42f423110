"""strata.torch without a GPU (and without PyTorch): the module imports lazily and says what to
install, the constructor's arguments are checked before anything touches a GPU, and the
EmbeddingBag kernels compile with NVRTC for rows of several widths."""

import os
import sys

import pytest

import strata
import strata.torch as st
from strata.torch import bag_options


def test_embedding_bag_without_torch_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    monkeypatch.delitem(sys.modules, "strata.torch._embedding_bag", raising=False)
    with pytest.raises(ImportError, match="pip install torch"):
        st.EmbeddingBag
    with pytest.raises(AttributeError, match="no attribute 'Embedding'"):
        st.Embedding


def test_torch_defaults_and_row_layout():
    o = bag_options(1000, 128)
    assert o.mode == "mean"  # torch's default
    assert (o.padding_idx, o.include_last_offset, o.optimizer) == (-1, False, "sgd")
    assert (o.stride_floats, o.page_size) == (128, 4096)
    assert o.table_bytes == 1000 * 512
    assert o.cache_bytes == 1000 * 512  # the whole (small) table, in whole pages
    # Rows that are not a power of two of bytes get a power-of-two stride (never straddling
    # pages); long rows get pages that hold them.
    o = bag_options(10, 100, mode="sum")
    assert (o.stride_floats, o.table_bytes) == (128, 10 * 512)
    assert o.cache_bytes == 2 * 4096  # at least 2 pages
    o = bag_options(10, 3000, page_size=None)
    assert (o.stride_floats, o.page_size) == (4096, 16384)
    assert bag_options(10, 8, padding_idx=-1).padding_idx == 9
    assert bag_options(10, 8, padding_idx=0).padding_idx == 0
    o = bag_options(1 << 20, 1024, cache_bytes=1 << 28, optimizer="adagrad", lr=0.1, page_size=8192)
    assert (o.cache_bytes, o.optimizer, o.lr, o.page_size) == (1 << 28, "adagrad", 0.1, 8192)
    assert bag_options(1 << 30, 256).cache_bytes == 1 << 30  # capped at 1 GiB by default


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(mode="max"), NotImplementedError, "'max'"),
        (dict(mode="median"), ValueError, "sum, mean or max"),
        (dict(max_norm=1.0), NotImplementedError, "max_norm"),
        (dict(scale_grad_by_freq=True), NotImplementedError, "scale_grad_by_freq"),
        (dict(dtype="float16"), NotImplementedError, "float32"),
        (dict(padding_idx=10), ValueError, "within num_embeddings"),
        (dict(padding_idx=-11), ValueError, "within num_embeddings"),
        (dict(padding_idx=1.5), TypeError, "padding_idx"),
        (dict(optimizer="adam"), strata.InvalidArgumentError, "'sgd' or 'adagrad'"),
        (dict(lr=-1.0), strata.InvalidArgumentError, "lr"),
        (dict(lr=float("nan")), strata.InvalidArgumentError, "lr"),
        (dict(eps=0.0), strata.InvalidArgumentError, "eps"),
        (dict(initial_accumulator_value=-1.0), strata.InvalidArgumentError, "initial_accumulator"),
        (dict(init="uniform"), strata.InvalidArgumentError, "'normal'"),
        (dict(page_size=1000), strata.InvalidArgumentError, "power of two"),
        (dict(page_size=2048), strata.InvalidArgumentError, "power of two of at least 4096"),
        (dict(cache_bytes=4096), strata.InvalidArgumentError, "fewer than 2 pages"),
        (dict(cache_bytes=0), ValueError, "cache_bytes must be positive"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        bag_options(10, 8, **kwargs)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="num_embeddings must be positive"):
        bag_options(0, 8)
    with pytest.raises(ValueError, match="embedding_dim must be positive"):
        bag_options(10, -1)
    with pytest.raises(TypeError, match="num_embeddings must be an int"):
        bag_options(10.0, 8)
    with pytest.raises(TypeError, match="embedding_dim must be an int"):
        bag_options(10, True)
    with pytest.raises(strata.InvalidArgumentError, match="page_size=8192 or more"):
        bag_options(10, 2000, page_size=4096)


@pytest.mark.skipif(not strata.info()["nvrtc"], reason="needs NVRTC")
@pytest.mark.parametrize("dim, stride", [(128, 128), (1024, 1024), (100, 128), (64, 64), (33, 64), (1, 1)])
def test_kernels_compile_for_every_row_width(dim, stride):
    path = os.path.join(os.path.dirname(st.__file__), "embedding_bag.cu")
    with open(path) as f:
        source = f.read()
    cubin = strata._strata.nvrtc_compile(source, "embedding_bag.cu", "sm_90", [f"-DDIM={dim}", f"-DSTRIDE={stride}"])
    for name in (b"eb_forward_space", b"eb_forward_ptr", b"eb_sgd_space", b"eb_sgd_ptr", b"eb_grad_sum",
                 b"eb_adagrad_space", b"eb_adagrad_ptr"):
        assert name in cubin


@pytest.mark.skipif(not strata.info()["nvrtc"], reason="needs NVRTC")
def test_compile_errors_carry_nvrtc_log():
    with pytest.raises(strata.StrataError, match="DIM"):
        path = os.path.join(os.path.dirname(st.__file__), "embedding_bag.cu")
        with open(path) as f:
            strata._strata.nvrtc_compile(f.read(), "embedding_bag.cu", "sm_90", [])


def test_embedding_bag_refuses_cpu_and_missing_gpu():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="CUDA device"):
        st.EmbeddingBag(10, 8, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            st.EmbeddingBag(10, 8)
    with pytest.raises(NotImplementedError, match="'max'"):
        st.EmbeddingBag(10, 8, mode="max")
