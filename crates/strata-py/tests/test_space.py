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
    assert len(s.handle()) == 72
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
