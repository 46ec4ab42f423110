"""Sorts a float64 array of the given size with NumPy and checks it: sorted order, the same
multiset (sum and a sample), printed digest identical with and without strata run."""
import hashlib
import sys

import numpy as np

seed, mib = int(sys.argv[1]), int(sys.argv[2])
n = mib * (1 << 20) // 8
a = np.random.default_rng(seed).random(n)
total = a.sum()
s = np.sort(a)
assert np.all(s[1:] >= s[:-1]), "not sorted"
assert abs(s.sum() - total) <= 1e-6 * abs(total), "sum changed"
b = a.copy()
b.sort(kind="stable")
assert np.array_equal(b, s), "two sorts disagree"
print(n, hashlib.sha256(s.tobytes()).hexdigest())
