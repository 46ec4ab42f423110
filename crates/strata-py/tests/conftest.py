import os
import random

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A NumPy generator with a fresh seed, printed so a failure can be replayed
    (STRATA_TEST_SEED=N reuses one)."""
    seed = int(os.environ.get("STRATA_TEST_SEED", random.SystemRandom().randrange(2**63)))
    print(f"{request.node.name}: seed {seed}")
    return np.random.default_rng(seed)
