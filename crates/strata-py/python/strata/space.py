"""GPU spaces from Python (see :class:`Space`)."""

import numpy as np

from ._strata import InvalidArgumentError
from ._strata import Space as _Space

__all__ = ["Space"]


def _host_array(obj, writable):
    """A C-contiguous NumPy view of ``obj`` (a NumPy array or any buffer-protocol object)."""
    if hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "__array_interface__"):
        raise InvalidArgumentError(
            "invalid argument: device arrays (__cuda_array_interface__) are not supported yet: "
            "copy to the host first (e.g. cupy.asnumpy) or launch a kernel on the space"
        )
    arr = obj if isinstance(obj, np.ndarray) else np.asarray(memoryview(obj))
    if writable:
        if not arr.flags.writeable:
            raise InvalidArgumentError("invalid argument: the output array is read-only")
        if not arr.flags.c_contiguous:
            raise InvalidArgumentError(
                "invalid argument: the output array is not C-contiguous: pass np.empty(...) "
                "or a contiguous slice"
            )
        return arr
    return np.ascontiguousarray(arr)


class Space(_Space):
    """A GPU space: ``size`` bytes paged through a cache of ``cache_bytes`` in GPU memory.

    ``Space(size, page_size=65536, cache_bytes=1<<30, dtype="uint64", policy="clock",
    protected_fraction=0.5, read_through=False, device=0, store=None, token=None,
    host_cache_bytes=None, remote_access=None, sector_bytes=None, read_only=False)``: over
    pinned host memory, or with ``store`` (``"memory"``, ``"file:PATH"``,
    ``"remote:HOST:PORT[,...]"`` with ``token``) over that store through a pinned host cache.
    ``remote_access``: how kernels reach pages that are not resident (``"auto"``, ``"off"``,
    or the number of accesses after which a page migrates); ``sector_bytes``: sub-page fetch
    (a size such as ``4096`` or ``"4KiB"``: a miss that must migrate loads only the sectors
    it touches); ``read_only``: kernels' writes are refused and reported by
    ``check_errors``. Raises ``NoCudaDriverError`` on a machine without a CUDA driver.
    """

    def fill(self, data, offset=0):
        """Copies ``data`` (a NumPy array or buffer-protocol object) into the space at byte
        ``offset``."""
        arr = _host_array(data, writable=False)
        self._fill_from_address(int(offset), arr.ctypes.data, arr.nbytes)

    def read(self, out=None, offset=0, count=None, dtype=None):
        """Reads from byte ``offset`` into ``out`` (a writable C-contiguous array or buffer),
        or into a new array of ``count`` elements of ``dtype`` (default: the rest of the space
        as bytes). Returns the array."""
        if out is None:
            dtype = np.dtype(dtype or np.uint8)
            if count is None:
                count = (self.size - int(offset)) // dtype.itemsize
            out = np.empty(int(count), dtype=dtype)
            arr = out
        else:
            arr = _host_array(out, writable=True)
        self._read_to_address(int(offset), arr.ctypes.data, arr.nbytes)
        return out
