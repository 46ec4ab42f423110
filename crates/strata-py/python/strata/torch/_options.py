"""Argument checks and derived sizes of ``strata.torch.EmbeddingBag``, without PyTorch (so they
run, and are tested, on machines without it)."""

from dataclasses import dataclass

from .._strata import InvalidArgumentError

__all__ = ["BagOptions", "bag_options"]

MODES = ("sum", "mean")
OPTIMIZERS = ("sgd", "adagrad")
INITS = ("normal", "zeros")
SMALLEST_PAGE = 4096


@dataclass(frozen=True)
class BagOptions:
    """What an EmbeddingBag was asked for, checked, with the table's layout in its space."""

    num_embeddings: int
    embedding_dim: int
    mode: str
    padding_idx: int  # -1: none (torch's negative indices already resolved)
    include_last_offset: bool
    optimizer: str
    lr: float
    eps: float
    initial_accumulator_value: float
    validate_ids: bool
    init: str
    stride_floats: int  # floats between row starts in the space (a power of two in bytes)
    page_size: int
    cache_bytes: int
    policy: str

    @property
    def row_bytes(self):
        return self.embedding_dim * 4

    @property
    def table_bytes(self):
        """Bytes of the space that holds the table."""
        return self.num_embeddings * self.stride_floats * 4


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _next_pow2(n):
    return 1 << (n - 1).bit_length()


def bag_options(
    num_embeddings,
    embedding_dim,
    max_norm=None,
    norm_type=2.0,
    scale_grad_by_freq=False,
    mode="mean",
    sparse=False,
    include_last_offset=False,
    padding_idx=None,
    dtype=None,
    *,
    cache_bytes=None,
    page_size=None,
    policy="clock",
    optimizer="sgd",
    lr=0.01,
    eps=1e-10,
    initial_accumulator_value=0.0,
    validate_ids=True,
    init="normal",
):
    """Checks the constructor's arguments (``torch.nn.EmbeddingBag``'s, then Strata's) and
    returns the :class:`BagOptions`. Options torch has that this table does not support raise
    ``NotImplementedError`` saying so; bad values raise ``ValueError``/``TypeError`` as torch
    does, or ``InvalidArgumentError`` for Strata's knobs."""
    _positive_int("num_embeddings", num_embeddings)
    _positive_int("embedding_dim", embedding_dim)
    if mode == "max":
        raise NotImplementedError(
            "strata.torch.EmbeddingBag supports mode='sum' and mode='mean', not 'max' "
            "(max pooling has no in-place sparse update): use torch.nn.EmbeddingBag for it"
        )
    if mode not in MODES:
        raise ValueError(f"mode has to be one of sum, mean or max, got {mode!r}")
    if max_norm is not None:
        raise NotImplementedError(
            "max_norm is not supported: it renormalises rows in place during forward, which "
            "this table does not do; leave max_norm=None"
        )
    del norm_type  # only meaningful with max_norm
    if scale_grad_by_freq:
        raise NotImplementedError("scale_grad_by_freq=True is not supported: leave it False")
    del sparse  # the update is always sparse and in place: nothing to choose
    if dtype is not None and str(dtype) not in ("float32", "torch.float32"):
        raise NotImplementedError(f"dtype {dtype} is not supported: the table holds float32")
    if padding_idx is None:
        pad = -1
    else:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
            raise TypeError(f"padding_idx must be an int or None, not {type(padding_idx).__name__}")
        if not -num_embeddings <= padding_idx < num_embeddings:
            raise ValueError(
                f"padding_idx must be within num_embeddings: {padding_idx} is outside "
                f"[-{num_embeddings}, {num_embeddings})"
            )
        pad = padding_idx % num_embeddings
    if optimizer not in OPTIMIZERS:
        raise InvalidArgumentError(
            f"invalid argument: optimizer {optimizer!r} is unknown: use 'sgd' or 'adagrad' "
            "(row-wise), applied in place by backward"
        )
    if not lr >= 0.0:
        raise InvalidArgumentError(f"invalid argument: lr must be >= 0, got {lr}")
    if not eps > 0.0:
        raise InvalidArgumentError(f"invalid argument: eps must be > 0, got {eps}")
    if not initial_accumulator_value >= 0.0:
        raise InvalidArgumentError(
            f"invalid argument: initial_accumulator_value must be >= 0, got {initial_accumulator_value}"
        )
    if init not in INITS:
        raise InvalidArgumentError(
            f"invalid argument: init {init!r} is unknown: use 'normal' (N(0, 1), as torch) or 'zeros'"
        )
    row_bytes = embedding_dim * 4
    stride_bytes = _next_pow2(row_bytes)
    if page_size is None:
        page_size = max(SMALLEST_PAGE, stride_bytes)
    _positive_int("page_size", page_size)
    if page_size & (page_size - 1) or page_size < SMALLEST_PAGE:
        raise InvalidArgumentError(
            f"invalid argument: page_size {page_size} must be a power of two of at least {SMALLEST_PAGE}"
        )
    if stride_bytes > page_size:
        raise InvalidArgumentError(
            f"invalid argument: a row of {embedding_dim} floats ({row_bytes} bytes) does not fit "
            f"in a page of {page_size} bytes: pass page_size={stride_bytes} or more"
        )
    table_bytes = num_embeddings * stride_bytes
    if cache_bytes is None:
        cache_bytes = max(2 * page_size, min(1 << 30, -(-table_bytes // page_size) * page_size))
    _positive_int("cache_bytes", cache_bytes)
    if cache_bytes < 2 * page_size:
        raise InvalidArgumentError(
            f"invalid argument: cache_bytes {cache_bytes} holds fewer than 2 pages of {page_size} "
            "bytes: give the cache more GPU memory"
        )
    return BagOptions(
        num_embeddings=num_embeddings,
        embedding_dim=embedding_dim,
        mode=mode,
        padding_idx=pad,
        include_last_offset=bool(include_last_offset),
        optimizer=optimizer,
        lr=float(lr),
        eps=float(eps),
        initial_accumulator_value=float(initial_accumulator_value),
        validate_ids=bool(validate_ids),
        init=init,
        stride_floats=stride_bytes // 4,
        page_size=page_size,
        cache_bytes=cache_bytes,
        policy=policy,
    )
