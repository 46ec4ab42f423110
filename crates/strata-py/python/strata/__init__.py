"""Strata from Python.

- ``strata.info()``: what this machine offers (userfaultfd, CUDA driver, GPUs).
- ``strata.pager.array(shape, dtype, store=..., buffer=...)``: a NumPy array whose memory is a
  pager region over a memory, file, remote or compressed store.
- ``strata.Space``: a GPU space larger than GPU memory; fill it from and read it into NumPy
  arrays (or anything with the buffer protocol), compile and launch kernels on it.

Every failure raises ``strata.StrataError`` (or a subclass: ``InvalidArgumentError``,
``NoCudaDriverError``) carrying the Rust library's message.
"""

from . import pager
from ._strata import (
    InvalidArgumentError,
    KernelModule,
    NoCudaDriverError,
    StrataError,
    info,
)
from .space import Space

__all__ = [
    "InvalidArgumentError",
    "KernelModule",
    "NoCudaDriverError",
    "Space",
    "StrataError",
    "info",
    "pager",
]
