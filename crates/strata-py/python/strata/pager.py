"""NumPy arrays over Strata pager regions.

``array(shape, dtype, store="memory", codec="none", buffer=None, ...)`` opens a region of
``prod(shape) * itemsize`` bytes over the store and returns a :class:`PagedArray`, an ordinary
``numpy.ndarray`` subclass whose pages come from the store on first touch and go back on
eviction or ``flush()``. The region stays mapped while any array or view over it lives (the
array's base holds it); when the last one goes, dirty pages are written back and it is
unmapped.

Stores: ``"memory"``, ``"file:PATH"`` (created or grown as needed), ``"remote:HOST:PORT[,...]"``
(memory nodes started with ``strata serve``; pass ``token=``). Codecs: ``"none"``, ``"lz4"``,
``"zfp:TOLERANCE"`` (lossy; float64/float32 data only).
"""

import math

import numpy as np

from ._strata import InvalidArgumentError, Region

__all__ = ["PagedArray", "Region", "array", "region_of"]


class _RegionMemory:
    """Exposes a region's bytes through ``__array_interface__`` and owns the region."""

    def __init__(self, region, nbytes):
        self.region = region
        self.__array_interface__ = {
            "version": 3,
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (region.address, False),
        }


class PagedArray(np.ndarray):
    """A NumPy array whose memory is a pager region (see :func:`array`).

    Views and slices share the region (found through their ``base`` chain); copies and
    results of arithmetic are ordinary memory, and their ``region`` is ``None``.
    """

    @property
    def region(self):
        """The :class:`Region` under this array, or ``None`` for a copy."""
        return region_of(self)

    def flush(self):
        """Writes every dirty page of the region back to its store (and flushes the store)."""
        region = region_of(self)
        if region is None:
            raise InvalidArgumentError(
                "this array does not live in a Strata region (it is a copy): flush the array "
                "strata.pager.array returned, or a view of it"
            )
        region.flush()

    def evict(self):
        """Drops the region's pages from memory (dirty ones written back first)."""
        region = region_of(self)
        if region is None:
            raise InvalidArgumentError("this array does not live in a Strata region")
        region.evict(0, len(region))

    def stats(self):
        """The region's counters (faults, evictions, writebacks, ...)."""
        region = region_of(self)
        return None if region is None else region.stats()


def region_of(arr):
    """The :class:`Region` whose memory ``arr`` (or the array it views) lives in, else None."""
    base = arr
    while base is not None:
        if isinstance(base, _RegionMemory):
            return base.region
        base = getattr(base, "base", None)
    return None


def array(
    shape,
    dtype=np.float64,
    store="memory",
    codec="none",
    buffer=None,
    page_size=None,
    token=None,
    grow=True,
    fillers=0,
    evictors=0,
    order="C",
):
    """A :class:`PagedArray` of ``shape`` and ``dtype`` over a new pager region.

    ``buffer``: resident-set budget in bytes, at least 4 pages (default 64 MiB, capped at the
    array's size);
    ``page_size``: bytes per page (a multiple of 4096 up to 2 MiB, default 65536). A new memory
    store reads as zeros; a file store reads the file's bytes (zeros past its end).
    """
    dtype = np.dtype(dtype)
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise InvalidArgumentError(f"invalid argument: negative dimension in shape {shape}")
    if dtype.itemsize == 0 or dtype.hasobject:
        raise InvalidArgumentError(
            f"invalid argument: dtype {dtype} cannot live in a region: use a fixed-size numeric dtype"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        raise InvalidArgumentError(
            f"invalid argument: shape {shape} holds no element; a region needs at least one byte"
        )
    region = Region(
        nbytes,
        store=store,
        codec=codec,
        token=token,
        grow=grow,
        page_bytes=page_size or 0,
        buffer_bytes=buffer or 0,
        fillers=fillers,
        evictors=evictors,
    )
    raw = np.asarray(_RegionMemory(region, nbytes))
    arr = raw.view(dtype).reshape(shape, order=order).view(PagedArray)
    return arr
