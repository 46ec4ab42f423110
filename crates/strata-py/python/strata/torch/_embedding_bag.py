"""``strata.torch.EmbeddingBag``: ``torch.nn.EmbeddingBag``'s forward, with the table in a Strata
GPU space (which may be many times the GPU memory given to it) and backward applying a fused
sparse optimizer step (SGD or row-wise Adagrad) in place in the space with atomic adds.

Forward and backward are one opaque custom op each (``torch.ops.strata.embedding_bag`` and
``torch.ops.strata.embedding_bag_update``), so ``torch.compile`` treats them as calls it does not
trace into. Their kernels (``embedding_bag.cu``, compiled with NVRTC) run on PyTorch's current
CUDA stream in the primary context PyTorch uses, and write straight into the output tensor: no
copy, and no synchronisation unless ``validate_ids`` asks for one.
"""

import itertools
import os
import threading
import weakref
from typing import Optional

import numpy as np
import torch

from ..space import Space
from ._options import bag_options

__all__ = ["EmbeddingBag", "kernels"]

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "embedding_bag.cu")
_THREADS = 256  # 8 warps per block: one warp per bag (or per distinct row)
_MAX_BLOCKS = 65535
_CHUNK_BYTES = 64 << 20  # host staging for weight reads, writes and initialisation

_modules = {}
_modules_lock = threading.Lock()


def kernels(space, device_index, embedding_dim, stride_floats):
    """The EmbeddingBag kernels for rows of ``embedding_dim`` floats ``stride_floats`` apart,
    compiled once per GPU and row layout (through ``space``'s runtime; NVRTC, disk-cached)."""
    key = (device_index, embedding_dim, stride_floats)
    with _modules_lock:
        module = _modules.get(key)
        if module is None:
            with open(_SOURCE) as f:
                source = f.read()
            module = space.compile(
                source, "embedding_bag.cu", [f"-DDIM={embedding_dim}", f"-DSTRIDE={stride_floats}"]
            )
            _modules[key] = module
        return module


def _blocks(work_items):
    """Blocks of _THREADS threads giving each item (bag, distinct row) a warp (grid-stride
    beyond _MAX_BLOCKS)."""
    return max(1, min(-(-work_items * 32 // _THREADS), _MAX_BLOCKS))


def _ptr(t):
    return ("ptr", 0 if t is None else t.data_ptr())


# Bags by handle, for the custom ops (which take plain values, not modules).
_bags = {}
_handles = itertools.count(1)


def _bag(handle):
    ref = _bags.get(handle)
    bag = ref() if ref is not None else None
    if bag is None:
        raise RuntimeError(f"strata.torch.EmbeddingBag #{handle} no longer exists")
    return bag


@torch.library.custom_op("strata::embedding_bag", mutates_args=())
def _forward_op(
    ids: torch.Tensor,
    offsets: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    anchor: torch.Tensor,
    handle: int,
    dim: int,
    bags: int,
    fixed_len: int,
) -> torch.Tensor:
    return _bag(handle)._forward_impl(ids, offsets, weights, bags, fixed_len)


@_forward_op.register_fake
def _forward_fake(ids, offsets, weights, anchor, handle, dim, bags, fixed_len):
    return ids.new_empty((bags, dim), dtype=torch.float32)


@torch.library.custom_op("strata::embedding_bag_update", mutates_args=())
def _update_op(
    grad: torch.Tensor,
    ids: torch.Tensor,
    offsets: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    anchor: torch.Tensor,
    handle: int,
    bags: int,
    fixed_len: int,
) -> torch.Tensor:
    _bag(handle)._update_impl(grad, ids, offsets, weights, bags, fixed_len)
    # The anchor's "gradient" (empty, like the anchor). Returning it keeps the update in a
    # compiled backward graph (an op whose output nobody uses could be dropped).
    return torch.zeros_like(anchor)


@_update_op.register_fake
def _update_fake(grad, ids, offsets, weights, anchor, handle, bags, fixed_len):
    return torch.empty_like(anchor)


def _setup_context(ctx, inputs, output):
    ids, offsets, weights, anchor, handle, _dim, bags, fixed_len = inputs
    ctx.save_for_backward(ids, offsets, weights, anchor)
    ctx.handle, ctx.bags, ctx.fixed_len = handle, bags, fixed_len


def _backward(ctx, grad):
    ids, offsets, weights, anchor = ctx.saved_tensors
    done = torch.ops.strata.embedding_bag_update(
        grad.contiguous(), ids, offsets, weights, anchor, ctx.handle, ctx.bags, ctx.fixed_len
    )
    return None, None, None, done, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


class EmbeddingBag(torch.nn.Module):
    """``torch.nn.EmbeddingBag(num_embeddings, embedding_dim, ...)`` with the table in a Strata
    GPU space and a fused in-place optimizer step in backward.

    torch's arguments: ``max_norm``, ``scale_grad_by_freq`` and ``mode='max'`` raise
    ``NotImplementedError``; ``sparse`` is accepted and ignored (the update is always sparse);
    ``_weight`` initialises the table (else N(0, 1) like torch, or zeros with ``init='zeros'``);
    ``padding_idx`` rows are skipped in forward (and in mean's count) and never updated.

    Strata's knobs (keyword-only): ``cache_bytes`` (GPU memory for the page cache; default the
    table's size up to 1 GiB), ``page_size`` (default max(4 KiB, the row rounded up to a power of
    two)), ``policy`` ('clock' or 'scan-resistant'), ``optimizer`` ('sgd' or 'adagrad', row-wise,
    its per-row state of ``num_embeddings`` floats in GPU memory), ``lr`` (also the attribute
    ``lr``), ``eps`` and ``initial_accumulator_value`` (Adagrad), ``validate_ids`` (default True:
    each forward waits for its kernel and raises ``IndexError`` if an id was outside
    ``[0, num_embeddings)``; False: no wait, bad ids are still never read or written, and
    :meth:`check_errors` raises for them later), ``init``, and ``store`` (with ``token``,
    ``host_cache_bytes``): the table lives in that store (``"file:PATH"``, ``"memory"``,
    ``"remote:HOST:PORT"``) instead of pinned host memory, paged through a host cache.

    Backward takes no ``.grad`` anywhere: it applies ``lr`` times the gradient to the rows the
    batch used, in place, on the current stream. ``per_sample_weights`` get no gradient (one
    that requires grad raises).
    """

    def __init__(
        self,
        num_embeddings,
        embedding_dim,
        max_norm=None,
        norm_type=2.0,
        scale_grad_by_freq=False,
        mode="mean",
        sparse=False,
        _weight=None,
        include_last_offset=False,
        padding_idx=None,
        device=None,
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
        store=None,
        token=None,
        host_cache_bytes=None,
    ):
        # Every argument but these few is one of bag_options' (checked there, torch-free).
        checked = {k: v for k, v in locals().items()
                   if k not in ("self", "_weight", "device", "store", "token", "host_cache_bytes",
                                "__class__")}
        super().__init__()
        o = bag_options(**checked)
        dev = torch.device("cuda") if device is None else torch.device(device)
        if dev.type != "cuda":
            raise ValueError(
                f"strata.torch.EmbeddingBag lives on a CUDA device, not {dev}: pass device='cuda' "
                "or 'cuda:N' (its table is paged into that GPU's memory)"
            )
        if not torch.cuda.is_available():
            raise RuntimeError("strata.torch.EmbeddingBag needs a CUDA GPU, and torch sees none")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        # PyTorch first: its lazy init retains the primary context Strata then shares.
        torch.cuda.current_stream(dev)
        self.options = o
        self.num_embeddings = o.num_embeddings
        self.embedding_dim = o.embedding_dim
        self.mode = o.mode
        self.padding_idx = None if o.padding_idx < 0 else o.padding_idx
        self.include_last_offset = o.include_last_offset
        self.lr = o.lr
        self.device = dev
        self.space = Space(
            o.table_bytes,
            page_size=o.page_size,
            cache_bytes=o.cache_bytes,
            dtype="float32",
            policy=o.policy,
            device=dev.index,
            store=store,
            token=token,
            host_cache_bytes=host_cache_bytes,
        )
        self._kernels = kernels(self.space, dev.index, o.embedding_dim, o.stride_floats)
        self._err = torch.tensor([0, -1], dtype=torch.int64, device=dev)
        # Autograd calls backward only for outputs of inputs that require grad: the table is
        # no tensor, so an empty stand-in does (no Parameter: optimizers never see it; empty, so
        # its "gradient" costs no kernel).
        self._anchor = torch.zeros(0, device=dev, requires_grad=True)
        self._adagrad_sum = (
            torch.full((o.num_embeddings,), o.initial_accumulator_value, device=dev)
            if o.optimizer == "adagrad"
            else None
        )
        self._handle = next(_handles)
        _bags[self._handle] = weakref.ref(self)
        weakref.finalize(self, _bags.pop, self._handle, None)
        if _weight is not None:
            self.write_weight(_weight)
        elif o.init == "normal":
            self._init_normal()

    def extra_repr(self):
        o = self.options
        return (
            f"{o.num_embeddings}, {o.embedding_dim}, mode={o.mode!r}, optimizer={o.optimizer!r}, "
            f"lr={self.lr}, cache_bytes={o.cache_bytes}, page_size={o.page_size}, "
            f"table_bytes={o.table_bytes}"
        )

    # ---- forward ---------------------------------------------------------------------------

    def forward(self, input, offsets=None, per_sample_weights=None):
        ids, offsets, weights, bags, fixed_len = self._prepare(input, offsets, per_sample_weights)
        return torch.ops.strata.embedding_bag(
            ids, offsets, weights, self._anchor, self._handle, self.embedding_dim, bags, fixed_len
        )

    def _check_device(self, name, t):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
        if t.device != self.device:
            raise ValueError(
                f"{name} is on {t.device} but this EmbeddingBag is on {self.device}: move it "
                f"there (e.g. {name}.to('{self.device}'))"
            )

    def _prepare(self, input, offsets, per_sample_weights):
        """ids (1-D int64), offsets (int64, None for 2-D input), weights, the number of bags
        and (2-D input) their fixed length: what the kernels take, made without extra kernels
        where the input already has that form."""
        self._check_device("input", input)
        if input.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"input must hold int32 or int64 ids, not {input.dtype}")
        if per_sample_weights is not None:
            self._check_device("per_sample_weights", per_sample_weights)
            if self.mode != "sum":
                raise NotImplementedError(
                    "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                    f"supported for mode='sum' (got mode='{self.mode}')"
                )
            if per_sample_weights.shape != input.shape:
                raise ValueError(
                    f"per_sample_weights has shape {tuple(per_sample_weights.shape)}, input "
                    f"{tuple(input.shape)}: they must match"
                )
            if per_sample_weights.requires_grad and torch.is_grad_enabled():
                raise NotImplementedError(
                    "per_sample_weights that require grad are not supported: the fused update "
                    "computes no gradient for them (pass per_sample_weights.detach())"
                )
            per_sample_weights = per_sample_weights.reshape(-1).to(torch.float32).contiguous()
        if input.dim() == 2:
            if offsets is not None:
                raise ValueError(
                    "if input is 2D, then offsets has to be None, as input is treated as a "
                    "mini-batch of fixed length sequences"
                )
            bags, fixed_len = input.shape
            ids = input.reshape(-1).to(torch.int64).contiguous()
        elif input.dim() == 1:
            if offsets is None:
                raise ValueError("offsets has to be a 1D Tensor but got None")
            self._check_device("offsets", offsets)
            if offsets.dim() != 1:
                raise ValueError("offsets has to be a 1D Tensor")
            if offsets.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"offsets must be int32 or int64, not {offsets.dtype}")
            ids = input.to(torch.int64).contiguous()
            offsets = offsets.to(torch.int64).contiguous()
            fixed_len = 0
            bags = offsets.shape[0]
            if self.include_last_offset:
                if bags == 0:
                    raise ValueError("include_last_offset=True needs at least one offset")
                bags -= 1
        else:
            raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.dim()}")
        return ids, offsets, per_sample_weights, bags, fixed_len

    def _stream(self):
        return torch.cuda.current_stream(self.device).cuda_stream

    def _common_args(self, ids, offsets, fixed_len, weights, bags):
        """The bag kernels' arguments from ids to padding_idx (BAG_PARAMS, then the rest)."""
        o = self.options
        return [
            _ptr(ids),
            ("i64", ids.numel()),
            _ptr(offsets),
            ("i64", 0 if offsets is None else offsets.numel()),
            ("i64", fixed_len),
            _ptr(weights),
            ("u64", bags),
            ("i64", o.num_embeddings),
            ("i32", 1 if o.mode == "mean" else 0),
            ("i64", o.padding_idx),
        ]

    def _forward_impl(self, ids, offsets, weights, bags, fixed_len):
        out = torch.empty((bags, self.embedding_dim), dtype=torch.float32, device=self.device)
        if bags > 0:
            common = self._common_args(ids, offsets, fixed_len, weights, bags)
            args = [self.space, *common, _ptr(out), _ptr(self._err)]
            self._kernels.launch(
                "eb_forward_space", args, blocks=_blocks(bags), threads=_THREADS,
                synchronize=False, stream=self._stream(),
            )
        if self.options.validate_ids:
            self._raise_bad_ids()
        return out

    # ---- backward: the fused optimizer step ------------------------------------------------

    def _update_impl(self, grad, ids, offsets, weights, bags, fixed_len):
        if bags == 0 or ids.numel() == 0 or self.lr == 0.0:
            return
        grad = grad.to(torch.float32).contiguous()
        o = self.options
        stream = self._stream()
        common = self._common_args(ids, offsets, fixed_len, weights, bags)
        if o.optimizer == "sgd":
            args = [self.space, *common, _ptr(grad), ("f32", self.lr), _ptr(self._err)]
            self._kernels.launch(
                "eb_sgd_space", args, blocks=_blocks(bags), threads=_THREADS,
                synchronize=False, stream=stream,
            )
            return
        # Row-wise Adagrad needs each row's whole gradient before its step: number the
        # distinct ids (sort, no host sync), sum the gradients per number, then step each row.
        n = ids.numel()
        sorted_ids, order = torch.sort(ids)
        first = torch.ones(n, dtype=torch.bool, device=self.device)
        first[1:] = sorted_ids[1:] != sorted_ids[:-1]
        slot_sorted = torch.cumsum(first, 0) - 1
        slot = torch.empty_like(slot_sorted)
        slot[order] = slot_sorted
        rows_of = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        rows_of[slot_sorted] = sorted_ids
        gsum = torch.zeros((n, self.embedding_dim), dtype=torch.float32, device=self.device)
        args = [_ptr(gsum), *common[:5], _ptr(slot), *common[5:], _ptr(grad), _ptr(self._err)]
        self._kernels.launch(
            "eb_grad_sum", args, blocks=_blocks(bags), threads=_THREADS,
            synchronize=False, stream=stream,
        )
        args = [
            self.space, _ptr(rows_of), ("u64", n), _ptr(gsum), _ptr(self._adagrad_sum),
            ("i64", o.num_embeddings), ("i64", o.padding_idx), ("f32", self.lr), ("f32", o.eps),
        ]
        self._kernels.launch(
            "eb_adagrad_space", args, blocks=_blocks(n), threads=_THREADS,
            synchronize=False, stream=stream,
        )

    # ---- errors, weights, state ------------------------------------------------------------

    def _raise_bad_ids(self):
        bad, first = self._err.tolist()  # waits for the kernels that wrote it
        if bad:
            self._err.copy_(torch.tensor([0, -1], dtype=torch.int64))
            raise IndexError(
                f"strata.torch.EmbeddingBag: {bad} id(s) outside [0, {self.num_embeddings}) "
                f"(the first seen: {first}); those lookups were skipped, no row outside the table "
                "was read or written"
            )

    def check_errors(self):
        """Waits for the GPU, then raises ``IndexError`` if an id was out of range since the
        last check (with ``validate_ids=False``), or ``StrataError`` if the space reported one."""
        self._raise_bad_ids()
        self.space.check_errors()

    def flush(self):
        """Writes every updated row cached on the GPU back to the space's host copy."""
        self.space.flush()

    def stats(self):
        """The space's counters (hits, faults, evictions, writebacks, bytes moved, ...)."""
        return self.space.stats()

    def _chunk_rows(self):
        return max(1, _CHUNK_BYTES // (self.options.stride_floats * 4))

    def read_weight(self):
        """The whole table as a CPU tensor (num_embeddings x embedding_dim), after the GPU's
        queued work."""
        o = self.options
        out = torch.empty((o.num_embeddings, o.embedding_dim), dtype=torch.float32)
        stride = o.stride_floats
        if stride == o.embedding_dim:
            self.space.read(out.numpy())
            return out
        step = self._chunk_rows()
        buf = np.empty((step, stride), dtype=np.float32)
        for r0 in range(0, o.num_embeddings, step):
            n = min(step, o.num_embeddings - r0)
            self.space.read(buf[:n], offset=r0 * stride * 4)
            out[r0 : r0 + n] = torch.from_numpy(buf[:n, : o.embedding_dim])
        return out

    def write_weight(self, weight, row0=0):
        """Copies ``weight`` (rows x embedding_dim, any device, converted to float32) into the
        table from row ``row0``, after the GPU's queued work."""
        o = self.options
        if not isinstance(weight, torch.Tensor):
            weight = torch.as_tensor(weight)
        if weight.dim() != 2 or weight.shape[1] != o.embedding_dim:
            raise ValueError(
                f"weight must be (rows, {o.embedding_dim}), got {tuple(weight.shape)}"
            )
        if row0 < 0 or row0 + weight.shape[0] > o.num_embeddings:
            raise ValueError(
                f"rows [{row0}, {row0 + weight.shape[0]}) are outside the table of {o.num_embeddings}"
            )
        weight = weight.detach()
        stride = o.stride_floats
        step = self._chunk_rows()
        for r0 in range(0, weight.shape[0], step):
            part = weight[r0 : r0 + step].to("cpu", torch.float32)
            if stride != o.embedding_dim:
                padded = torch.zeros((part.shape[0], stride), dtype=torch.float32)
                padded[:, : o.embedding_dim] = part
                part = padded
            self.space.fill(part.contiguous().numpy(), offset=(row0 + r0) * stride * 4)

    def _init_normal(self):
        """N(0, 1) rows, drawn on the GPU with torch's generator (so torch.manual_seed applies),
        the padding row zero, as torch.nn.EmbeddingBag does."""
        o = self.options
        step = self._chunk_rows()
        for r0 in range(0, o.num_embeddings, step):
            n = min(step, o.num_embeddings - r0)
            self.write_weight(torch.randn((n, o.embedding_dim), device=self.device), row0=r0)
        if self.padding_idx is not None:
            self.write_weight(torch.zeros((1, o.embedding_dim)), row0=self.padding_idx)

    @property
    def adagrad_sum(self):
        """Row-wise Adagrad's per-row sums of mean squared gradients (GPU tensor), or None."""
        return self._adagrad_sum

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.read_weight()
        if self._adagrad_sum is not None:
            destination[prefix + "adagrad_sum"] = self._adagrad_sum.detach().cpu().clone()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        ours = {prefix + "weight"}
        if self._adagrad_sum is not None:
            ours.add(prefix + "adagrad_sum")
        for key in ours:
            if key not in state_dict:
                missing_keys.append(key)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key not in ours and "." not in key[len(prefix) :]:
                    unexpected_keys.append(key)
        w = state_dict.get(prefix + "weight")
        if w is not None:
            if tuple(w.shape) != (self.num_embeddings, self.embedding_dim):
                error_msgs.append(
                    f"size mismatch for {prefix}weight: copying a param with shape "
                    f"{tuple(w.shape)}, the table has ({self.num_embeddings}, {self.embedding_dim})"
                )
            else:
                self.write_weight(w)
        s = state_dict.get(prefix + "adagrad_sum")
        if s is not None and self._adagrad_sum is not None:
            if tuple(s.shape) != (self.num_embeddings,):
                error_msgs.append(
                    f"size mismatch for {prefix}adagrad_sum: {tuple(s.shape)}, expected "
                    f"({self.num_embeddings},)"
                )
            else:
                self._adagrad_sum.copy_(s)
