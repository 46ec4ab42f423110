"""Fills a float64 array of the given size with a smooth field (as a simulation keeps), lets
it page beyond the budget, and checks every value within the tolerance. Temporaries stay in
chunks of 128 KiB, below strata run's threshold, so only the array itself is paged: the
promise --lossy-floats makes."""
import sys

import numpy as np

seed, mib, tolerance = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
n = mib * (1 << 20) // 8
rng = np.random.default_rng(seed)
phase, scale = rng.random(), 10.0 ** int(rng.integers(0, 4))
CHUNK = 16384


def field(i):
    x = np.arange(i, min(i + CHUNK, n), dtype=np.float64)
    return scale * np.sin(x * 1e-4 + phase)


a = np.empty(n)
for i in range(0, n, CHUNK):
    a[i : i + CHUNK] = field(i)
worst = 0.0
for _ in range(2):
    for i in range(0, n, CHUNK):
        worst = max(worst, float(np.max(np.abs(a[i : i + CHUNK] - field(i)))))
assert worst <= tolerance, f"a value moved by {worst} > {tolerance}"
print("ok", n)
