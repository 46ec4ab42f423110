"""Strata for PyTorch: ``strata.torch.EmbeddingBag``, a drop-in for ``torch.nn.EmbeddingBag``
whose table lives in a Strata GPU space that may be many times the GPU memory given to it.

This module imports without PyTorch (so ``import strata`` never needs it); using
``EmbeddingBag`` without PyTorch installed raises ``ImportError`` saying what to install.
"""

__all__ = ["EmbeddingBag", "bag_options"]

from ._options import bag_options


def __getattr__(name):
    if name == "EmbeddingBag":
        try:
            import torch  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "strata.torch.EmbeddingBag needs PyTorch with CUDA: pip install torch "
                f"(importing torch failed: {e})"
            ) from e
        from ._embedding_bag import EmbeddingBag

        return EmbeddingBag
    raise AttributeError(f"module 'strata.torch' has no attribute {name!r}")
