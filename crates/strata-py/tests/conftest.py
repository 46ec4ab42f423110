import os
import random

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A NumPy generator with a fresh seed, printed so a failure can be replayed
    (PYSTRATA_SEED=N reuses one)."""
    seed = int(os.environ.get("PYSTRATA_SEED", random.SystemRandom().randrange(2**63)))
    print(f"{request.node.name}: seed {seed}")
    return np.random.default_rng(seed)


def _strata_binary():
    """The `strata` CLI (the variable is not named STRATA_*: the CLI refuses unknown STRATA_*
    variables, and the memory node inherits this environment): $PYSTRATA_BIN, else the workspace's debug build, else None."""
    path = os.environ.get("PYSTRATA_BIN")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    guess = os.path.join(here, "..", "..", "..", "target", "debug", "strata")
    return guess if os.path.exists(guess) else None


@pytest.fixture
def memory_node():
    """A `strata serve` memory node on 127.0.0.1 (address, token); stopped afterwards. Skips
    without the strata binary, except under CI (CI=true), where that is a failure."""
    import subprocess

    binary = _strata_binary()
    if binary is None or not os.path.exists(binary):
        if os.environ.get("CI"):
            pytest.fail(f"the strata binary is missing ({binary}): set PYSTRATA_BIN")
        pytest.skip("no strata binary (set PYSTRATA_BIN) to start a memory node")
    token = "pytest-" + os.urandom(8).hex()
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--capacity", "256MiB"],
        # The node takes its token from the environment or a file, never from argv.
        env={**os.environ, "STRATA_REMOTE_TOKEN": token},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        address, seen = None, []
        for _ in range(20):
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("memory node listening on "):
                address = line.split()[4]
                break
        assert address, "the memory node did not report its address:\n" + "".join(seen)
        yield address, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
