"""GPU spaces: without a CUDA driver every GPU call raises NoCudaDriverError with a clear
message; with one (a GPU machine), fill/read round trips and a kernel launch are checked."""

import numpy as np
import pytest

import strata

HAS_DRIVER = strata.info()["cuda_driver"]


@pytest.mark.skipif(HAS_DRIVER, reason="this machine has a CUDA driver")
def test_space_without_driver_raises_a_clear_error():
    with pytest.raises(strata.NoCudaDriverError, match="no CUDA driver") as e:
        strata.Space(1 << 20, cache_bytes=1 << 20)
    assert isinstance(e.value, strata.StrataError)


def test_bad_space_options_raise_before_touching_the_gpu():
    with pytest.raises(strata.InvalidArgumentError, match="complex128"):
        strata.Space(1 << 20, dtype="complex128")
    with pytest.raises(strata.InvalidArgumentError, match="lru"):
        strata.Space(1 << 20, policy="lru")
    with pytest.raises(strata.InvalidArgumentError, match="sometimes"):
        strata.Space(1 << 20, remote_access="sometimes")
    with pytest.raises(strata.InvalidArgumentError, match="lots"):
        strata.Space(1 << 20, sector_bytes="lots")


@pytest.mark.skipif(not HAS_DRIVER, reason="needs a CUDA driver and GPU")
def test_sectors_remote_access_and_read_only_options(rng):
    """64 KiB pages with 4 KiB sectors and remote access off: sparse atomic adds migrate only
    their sectors (bytes in well under whole pages) and every element reads back right; a
    read-only space refuses a kernel's writes and keeps its bytes; a sector size that is not
    a power of two is refused."""
    n = 1 << 20  # u64 elements, 8 MiB: 128 pages of 64 KiB
    s = strata.Space(n * 8, cache_bytes=1 << 20, page_size=65536, remote_access="off",
                     sector_bytes="4KiB")
    want = rng.integers(0, 1 << 40, n, dtype=np.uint64)
    s.fill(want)
    idx = np.unique(rng.integers(0, n, 64, dtype=np.uint64))
    # The indices come through a space of their own (a kernel argument is a handle).
    ids = strata.Space(4096, cache_bytes=1 << 20, page_size=4096)
    ids.fill(idx)
    m = s.compile(
        r"""
        #include "strata.cuh"
        extern "C" __global__ void bump(StrataSpace s, StrataSpace ids, unsigned long long count) {
            strata::Array<unsigned long long> a(s);
            strata::Array<unsigned long long> at(ids);
            unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
            if (i < count) a.atomic_add(at.read(i), 1ull);
        }""",
        "bump.cu",
    )
    s.reset_stats()
    m.launch("bump", [s, ids, len(idx)], blocks=1, threads=64)
    s.check_errors()
    st = s.stats()
    want[idx] += 1
    np.testing.assert_array_equal(s.read(dtype=np.uint64), want)
    pages = len(np.unique(idx // 8192))
    assert 0 < st["bytes_in"] < pages * 65536, (st, pages)

    ro = strata.Space(n * 8, cache_bytes=1 << 20, page_size=65536, read_only=True)
    base = rng.integers(0, 1 << 40, n, dtype=np.uint64)
    ro.fill(base)
    m.launch("bump", [ro, ids, len(idx)], blocks=1, threads=64)
    with pytest.raises(strata.StrataError, match="read-only"):
        ro.check_errors()
    np.testing.assert_array_equal(ro.read(dtype=np.uint64), base)

    with pytest.raises(strata.StrataError, match="power of two"):
        strata.Space(n * 8, cache_bytes=1 << 20, page_size=65536, sector_bytes=3000)


@pytest.mark.skipif(not HAS_DRIVER, reason="needs a CUDA driver and GPU")
def test_space_round_trip_and_kernel(rng):
    n = 1 << 20
    s = strata.Space(n * 8, cache_bytes=1 << 20, dtype="float64", page_size=65536)
    want = rng.standard_normal(n)
    s.fill(want)
    np.testing.assert_array_equal(s.read(dtype=np.float64), want)
    assert len(s.handle()) == 96
    m = s.compile(
        r'''
        #include "strata.cuh"
        extern "C" __global__ void twice(StrataSpace s, unsigned long long n) {
            strata::Array<double> a(s);
            for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
                 i < n; i += (unsigned long long)gridDim.x * blockDim.x)
                a.write(i, a.read(i) * 2.0);
        }''',
        "twice.cu",
    )
    m.launch("twice", [s, n])
    s.check_errors()
    out = np.empty(n)
    s.read(out)
    np.testing.assert_array_equal(out, want * 2)
    assert s.stats()["faults"] > 0
    buf = bytearray(16)
    s.read(buf, offset=8)
    assert bytes(buf) == (want * 2)[1:3].tobytes()


def test_host_buffers_are_taken_without_copies_where_possible(rng):
    from strata.space import _host_array

    b = bytearray(rng.bytes(64))
    view = _host_array(b, writable=True)
    assert view.nbytes == 64 and np.shares_memory(view, np.frombuffer(b, np.uint8))
    a = rng.standard_normal((8, 8))
    assert _host_array(a, writable=False) is a
    strided = _host_array(a[:, ::2], writable=False)  # made contiguous for reading
    assert strided.flags.c_contiguous
    np.testing.assert_array_equal(strided, a[:, ::2])
    with pytest.raises(strata.InvalidArgumentError, match="not C-contiguous"):
        _host_array(a[:, ::2], writable=True)
    with pytest.raises(strata.InvalidArgumentError, match="read-only"):
        _host_array(bytes(8), writable=True)

    class DeviceOnly:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(strata.InvalidArgumentError, match="cuda_array_interface"):
        _host_array(DeviceOnly(), writable=False)


def test_bad_store_specs_raise_before_touching_the_gpu():
    with pytest.raises(strata.InvalidArgumentError, match="bogus"):
        strata.Space(1 << 20, store="bogus:x")
