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
