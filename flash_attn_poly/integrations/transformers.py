"""Hugging Face transformers integration: `attn_implementation="poly_attention"`.

    import flash_attn_poly.integrations.transformers as fap_hf
    fap_hf.register()                       # once; evaluator="poly" by default
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="poly_attention")

The name is not "flash_attn_poly": transformers 5.x treats every implementation name
that contains "flash" as a FlashAttention build to be loaded from its kernel hub
(`is_flash_attention_requested` is a substring test) and fails to find ours.

Gemma-2's `softcap`, `scaling` and `sliding_window` map onto `flash_attn_poly.attention`
(mode="softcap", softmax_scale, window_size=(sliding_window - 1, 0)). transformers hands
us q/k/v as (B, H, S, D); we pass transposed views (no copy: the kernels need only a unit
stride along D) and return (B, S, H, D) as transformers' other implementations do.

Inputs run in autocast's dtype when autocast is on (Gemma-2's rotary embedding hands us
FP32 q/k under autocast; eager's matmuls would cast them the same way), else in the 16-bit
dtype the model runs in.

Ragged batches run as flash_attn_poly.attention_varlen, as transformers' flash-attention
implementations do: a padded batch (the 2-D padding mask that the registered mask function
`flash_attention_mask` hands us) is unpadded, run as packed sequences and padded back (pad
rows are zero); a packed batch (padding-free collators: the `cu_seq_lens_q/k` and
`max_length_q/k` kwargs, or `position_ids` that restart inside a row) runs as the sequences it
holds, each causal on its own.  A sequence starts where its position id is not the previous
one plus 1, as transformers' eager masks read them (masking_utils.find_packed_sequence_indices).
What we cannot express falls back, with a one-time warning naming the reason, to an explicit
masked torch computation: a 4-D mask, dropout during training, and cases the CUDA kernels do
not support (head dims other than 64/128/256); the fallback keeps packed sequences apart and
honours a non-causal module.  Non-causal modules (is_causal False, or the is_causal kwarg) see
transformers' bidirectional window |i - j| < w.  What no path can compute (attention sinks,
s_aux; attention weights, output_attentions) is an error or a one-time warning, never ignored.
"""
from __future__ import annotations

import numbers
import warnings
import weakref
from typing import Optional

import torch

from .. import interface, reference, varlen

NAME = "poly_attention"
_warned: set[str] = set()


def _warn_once(reason: str, fallback: bool = True) -> None:
    if reason not in _warned:
        _warned.add(reason)
        what = "falling back to the masked torch path: " if fallback else ""
        warnings.warn(f"flash_attn_poly: {what}{reason}", stacklevel=3)


def _window(sliding_window: Optional[int], s_k: int, causal: bool = True) -> tuple[int, int]:
    """transformers' sliding window w lets query i see keys j with i - j < w (left = w - 1); a
    non-causal module's window is both ways, |i - j| < w.  None or 0: no window."""
    if sliding_window is not None and (isinstance(sliding_window, bool)
                                       or not isinstance(sliding_window, numbers.Integral)):
        raise TypeError(f"sliding_window must be an int or None, got {type(sliding_window).__name__} "
                        f"{sliding_window!r}")
    if sliding_window is not None and sliding_window < 0:
        raise ValueError(f"sliding_window must be >= 0 (0 or None: no window), got {sliding_window}")
    if not sliding_window or sliding_window >= s_k:
        return (-1, -1)
    w = int(sliding_window) - 1
    return (w, 0) if causal else (w, w)


def _check_mask(attention_mask, query, key) -> None:
    """A 2-D padding mask (B, >= S_q) or a 4-D mask (B or 1, 1 or H, S_q, S_k), else an error naming it."""
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor or None, got {type(attention_mask).__name__}")
    b, s_q = query.shape[0], query.shape[2]
    if attention_mask.dim() == 2:
        if attention_mask.shape[0] != b or attention_mask.shape[1] < s_q:
            raise ValueError(f"attention_mask: a 2-D padding mask must be (batch {b}, >= S_q {s_q}) wide, got "
                             f"shape {tuple(attention_mask.shape)}")
    elif attention_mask.dim() == 4:
        if attention_mask.shape[0] not in (1, b) or attention_mask.shape[2] != s_q:
            raise ValueError(f"attention_mask: a 4-D mask must be (1 or batch {b}, heads, S_q {s_q}, S_k), got "
                             f"shape {tuple(attention_mask.shape)}")
    else:
        raise ValueError(f"attention_mask must be 2-D (batch, keys: 1 = token) or 4-D, got shape "
                         f"{tuple(attention_mask.shape)}")


def _fallback_reason(module, query, key, value, attention_mask, dropout, window,
                     backend) -> Optional[str]:
    if attention_mask is not None and attention_mask.dim() != 2:
        return "a 4-D attention mask is not expressible as causal/window (register() installs the 2-D padding mask)"
    if dropout and module.training:
        return "attention dropout in training is not implemented"
    if backend == "reference":
        return None
    if query.is_cuda and query.shape[-1] not in interface.HEAD_DIMS:
        return f"head_dim {query.shape[-1]} is not supported by the CUDA kernels {interface.HEAD_DIMS}"
    if query.is_cuda and _kernel_dtype(query, key, value) is None:
        return (f"{query.dtype} attention inputs outside autocast: the CUDA kernels take bfloat16 "
                "or float16 (load the model in bf16, or run under torch.autocast)")
    return None


def _kernel_dtype(query, key, value):
    """The 16-bit dtype the kernels run in: autocast's when autocast is on (Gemma-2's rotary
    embedding returns FP32 q/k under autocast, as eager's matmuls would cast them), else the
    first 16-bit dtype among value, key, query; None if there is none."""
    dev = query.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        return dt if dt in interface.DTYPES else None
    return next((t.dtype for t in (value, key, query) if t.dtype in interface.DTYPES), None)


def _masked_torch(query, key, value, attention_mask, scaling, softcap, window, dropout, training,
                  causal=True, packed=None):
    """(B, H, S, D) inputs; explicit boolean mask; softcap; returns (B, S, H, D).  packed: the
    (cu_q, cu_k, ...) offsets of a packed batch (self-attention over B x S flattened tokens):
    a query sees keys of its own sequence only."""
    if attention_mask is not None and attention_mask.dim() == 2 and key.shape[2] > attention_mask.shape[1]:
        key, value = key[:, :, :attention_mask.shape[1]], value[:, :, :attention_mask.shape[1]]   # as _padded
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    s_q, s_k = q.shape[1], k.shape[1]
    allowed = reference.window_mask(s_q, s_k, *window, q.device)
    if causal:
        allowed = allowed & reference.causal_mask(s_q, s_k, q.device)
    x = reference.scores(q, k, scaling, torch.float32)
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    mask = allowed[None, None]
    if packed is not None:
        # the sequence id of every token: how many sequence ends lie at or before it (empty
        # sequences add repeated ends, which count the same)
        cu = packed[0].long()
        tokens = torch.arange(q.shape[0] * s_q, device=q.device)
        seg = torch.bucketize(tokens, cu[1:], right=True).view(q.shape[0], s_q)
        mask = mask & (seg[:, :, None] == seg[:, None, :])[:, None]
    if attention_mask is not None:
        mask = mask & _as_bool_mask(attention_mask, s_k)
    p, _ = reference.softmax_rows(x.masked_fill(~mask, float("-inf")))   # NaN inputs stay NaN
    p = torch.nn.functional.dropout(p, dropout, training).to(v.dtype)
    grp = q.shape[2] // k.shape[2]
    out = torch.einsum("bhqk,bkhd->bqhd", p.float(), v.repeat_interleave(grp, 2).float())
    return out.to(query.dtype).contiguous()


def _as_bool_mask(mask: torch.Tensor, s_k: int) -> torch.Tensor:
    """A 2-D padding mask (1 = token, any dtype) or a 4-D one (bool, or additive float: 0 keeps,
    large negative drops) as a boolean (B, 1 or H, S_q, S_k) mask."""
    mask = mask[..., -s_k:]   # the keys' columns, as _padded reads them (wider keys were cut to the mask)
    if mask.dim() == 2:
        return (mask != 0)[:, None, None, :]
    if mask.dtype != torch.bool:
        mask = mask > torch.finfo(mask.dtype).min / 2 if mask.dtype.is_floating_point else mask != 0
    return mask


def make_attention_forward(evaluator: str = "poly", backend: str = "auto"):
    """A function with transformers' attention-interface signature."""
    def flash_attn_poly_forward(module, query, key, value, attention_mask, dropout=0.0,
                                scaling=None, softcap=None, sliding_window=None, **kwargs):
        if kwargs.get("s_aux") is not None:
            raise ValueError("s_aux (attention sinks) is not supported by poly_attention: use "
                             "attn_implementation='eager' for this model")
        if kwargs.get("output_attentions"):
            _warn_once("output_attentions: poly_attention returns no attention weights (None)", fallback=False)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
        _check_mask(attention_mask, query, key)
        causal = kwargs.pop("is_causal", None)
        causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        window = _window(sliding_window, key.shape[2], causal)
        reason = _fallback_reason(module, query, key, value, attention_mask, dropout, window, backend)
        if reason is not None:
            _warn_once(reason)
            packed = None
            if attention_mask is None:
                q_, k_ = query.transpose(1, 2), key.transpose(1, 2)
                packed = _packed_offsets(q_, k_, kwargs)
                if packed is not None and kwargs.get("cu_seq_lens_q") is not None:
                    # once per offsets tensor (a host copy per layer would sync every layer of a step)
                    facts = ("fallback", tuple(q_.shape[:2]), tuple(k_.shape[:2]),
                             varlen._max_seqlen("max_length_q", packed[2]), varlen._max_seqlen("max_length_k", packed[3]))
                    varlen.check_once(packed[:2], facts, lambda: _check_fallback_offsets(packed, q_, k_))
            return _masked_torch(query, key, value, attention_mask, scaling, softcap, window,
                                 dropout, module.training, causal, packed), None
        mode = "softcap" if softcap else "softmax"
        dt = _kernel_dtype(query, key, value)
        mixed = len({query.dtype, key.dtype, value.dtype}) > 1   # autocast: FP32 q/k, 16-bit v
        if dt is not None and ((query.is_cuda and backend != "reference") or mixed):
            query, key, value = (t.to(dt) for t in (query, key, value))   # differentiable casts
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))   # (B, S, H, D) views
        opts = dict(causal=causal, softcap=softcap or None, evaluator=evaluator,
                    softmax_scale=scaling, window_size=window, backend=backend)
        if attention_mask is not None:
            return _padded(q, k, v, attention_mask, mode, opts), None
        if torch.compiler.is_compiling() and _positions_to_read(q, k, kwargs) is not None:
            # one custom op reads the position ids and runs the dense or the varlen kernels:
            # no data-dependent branch for the compiler to break the layer's graph at
            out = _positions_attention(q, k, v, kwargs["position_ids"], mode, opts)
            if out is not None:
                return out, None
        packed = _packed_offsets(q, k, kwargs)
        if packed is not None:
            b, s_q = q.shape[:2]
            # offsets handed in as kwargs are checked (once per forward: the check is cached per
            # tensor object); those read off position_ids are ours
            given = kwargs.get("cu_seq_lens_q") is not None
            out = varlen.attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), *packed, mode,
                                          check_inputs=given and not torch.compiler.is_compiling(), **opts)
            return out.view(b, s_q, *out.shape[1:]), None
        return interface.attention(q, k, v, mode, **opts), None
    return flash_attn_poly_forward


def _check_fallback_offsets(packed, q, k) -> None:
    """The torch fallback's view of offsets handed in as kwargs: checked as attention_varlen
    checks them (types, device, values against the flattened B x S tokens), and the same for
    queries and keys (it masks packed self-attention by one segment id per token)."""
    cu_q, cu_k, max_q, max_k = packed
    qf, kf = q.flatten(0, 1), k.flatten(0, 1)
    varlen._check_offsets(cu_q, cu_k, qf)
    max_q, max_k = varlen._max_seqlen("max_length_q", max_q), varlen._max_seqlen("max_length_k", max_k)
    both = torch.cat([cu_q, cu_k]).tolist()
    n = cu_q.numel()
    varlen.check_offsets_values(both[:n], both[n:], qf.shape[0], kf.shape[0], max_q, max_k)
    if both[:n] != both[n:]:
        raise ValueError("cu_seq_lens_q and cu_seq_lens_k differ: the torch fallback (attention dropout in "
                         "training) runs packed self-attention only, one sequence id per token")
    s = q.shape[1]
    cross = next((b for b in range(1, q.shape[0]) if b * s not in both[:n]), None)
    if cross is not None:
        raise ValueError(f"cu_seq_lens_q has a sequence across batch rows {cross - 1} and {cross} (no offset at "
                         f"{cross * s}): the torch fallback (attention dropout in training) masks each row of the "
                         f"batch on its own")


def _offsets(lens: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))


def _padded(q, k, v, attention_mask, mode, opts):
    """A padded batch (B, S, H, D) with its 2-D mask (B, S_k), 1 = token (left or right
    padding; the last S_q columns are the queries' own, as transformers' _upad_input reads
    them): unpad, attention_varlen, pad back with zero rows."""
    b, s_q = q.shape[:2]
    if k.shape[1] > attention_mask.shape[1]:   # a static cache's unused slots (transformers' _upad_input)
        k, v = k[:, :attention_mask.shape[1]], v[:, :attention_mask.shape[1]]
    s_k = k.shape[1]
    keep_k = attention_mask[:, -s_k:] != 0
    keep_q = keep_k[:, -s_q:]
    idx_q = keep_q.flatten().nonzero().squeeze(1)
    idx_k = keep_k.flatten().nonzero().squeeze(1)
    lens_q, lens_k = keep_q.sum(1, dtype=torch.int32), keep_k.sum(1, dtype=torch.int32)
    max_q, max_k = (int(x) for x in torch.stack([lens_q.max(), lens_k.max()]).tolist())
    out = varlen.attention_varlen(q.flatten(0, 1)[idx_q], k.flatten(0, 1)[idx_k], v.flatten(0, 1)[idx_k],
                                  _offsets(lens_q), _offsets(lens_k), max_q, max_k, mode, check_inputs=False,
                                  **opts)
    full = out.new_zeros((b * s_q,) + tuple(out.shape[1:]))
    return full.index_put((idx_q,), out).view(b, s_q, *out.shape[1:])


def _packed_offsets(q, k, kwargs):
    """(cu_q, cu_k, max_q, max_k) of a packed batch, or None for a plain one: transformers'
    cu_seq_lens_q/k and max_length_q/k kwargs as given, else the sequences that position_ids
    mark (a new sequence wherever a position id is not the previous one plus 1, and at every
    row start)."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if all(x is not None for x in (cu_q, cu_k, max_q, max_k)):
        for name, cu in (("cu_seq_lens_q", cu_q), ("cu_seq_lens_k", cu_k)):
            if not isinstance(cu, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor of offsets, got {type(cu).__name__}")
            if cu.dtype != torch.int32:   # as flash-attn's varlen: a cast would wrap large int64 offsets
                raise TypeError(f"{name} must have dtype torch.int32 (transformers' and flash-attn's "
                                f"offsets), got {cu.dtype}")
        return cu_q, cu_k, max_q, max_k
    pos = _positions_to_read(q, k, kwargs)
    return None if pos is None else _packed_from_positions(pos, q.shape[0])


def _positions_to_read(q, k, kwargs):
    """The position_ids whose values say whether the batch is packed (shapes only: no cu_seq_lens
    kwargs, self-attention over more than one position), else None."""
    if all(kwargs.get(n) is not None for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")):
        return None
    pos = kwargs.get("position_ids")
    if pos is None or q.shape[1] != k.shape[1] or pos.shape[-1] != q.shape[1] or q.shape[1] < 2:
        return None
    return pos


# ---- under torch.compile: the position ids read inside one custom op ----------------------------
# Traced, the reading below is data-dependent (nonzero, a host int) and broke every compiled
# decoder layer into several graphs.  These ops take the position ids as an input and decide
# dense or varlen when they run (the reading cached per forward as below); the compiler sees one
# op with fixed output shapes: O like q (empty_like: its strides too), the LSE as the dense
# call's (B, H_q, S), the gradients contiguous in q's, k's, v's shapes.

def _op_opts(causal, softcap, evaluator, softmax_scale, window, backend) -> dict:
    return dict(causal=causal, softcap=softcap or None, evaluator=evaluator, softmax_scale=softmax_scale,
                window_size=tuple(window), backend=backend)


def _like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t with ref's strides (the op's fake tensors are empty_like of its inputs); no allocation
    when they already match (the dense call's O is empty_like(q))."""
    if t.stride() == ref.stride():
        return t
    want = torch.empty_like(ref)
    return t if t.stride() == want.stride() else want.copy_(t)


@torch.library.custom_op("flash_attn_poly::hf_positions_fwd", mutates_args=())
def _positions_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position_ids: torch.Tensor, mode: str,
                   evaluator: str, causal: bool, softcap: float, softmax_scale: float, window: list[int],
                   backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    b, s, h = q.shape[:3]
    opts = _op_opts(causal, softcap, evaluator, softmax_scale, window, backend)
    packed = _packed_from_positions(position_ids, b)
    with torch.no_grad():
        if packed is None:
            out, lse = interface.attention(q, k, v, mode, return_lse=True, **opts)
        else:
            out, lse = varlen.attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), *packed, mode,
                                               check_inputs=False, return_lse=True, **opts)
            out, lse = out.view(q.shape), lse.view(h, b, s).transpose(0, 1)
    return _like(out, q), lse.contiguous()


@_positions_fwd.register_fake
def _positions_fwd_fake(q, k, v, position_ids, *rest):
    b, s, h = q.shape[:3]
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op("flash_attn_poly::hf_positions_bwd", mutates_args=())
def _positions_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, position_ids: torch.Tensor, mode: str, evaluator: str, causal: bool,
                   softcap: float, softmax_scale: float, window: list[int],
                   backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, s, h = q.shape[:3]
    opts = _op_opts(causal, softcap, evaluator, softmax_scale, window, backend)
    packed = _packed_from_positions(position_ids, b)
    dout = dout.contiguous()
    if packed is None:
        call = interface.validate(q, k, v, mode, evaluator, causal, opts["softcap"], None, softmax_scale,
                                  opts["window_size"])
        which = interface._pick_backend(backend, call, q.device, interface._capability(q))
        plan = interface.plan_for(call, q.device) if which == "cuda" else None
        grads = interface._backward(dout, q, k, v, out, lse, call, plan, which, ())
    else:
        qf, kf, vf = (t.flatten(0, 1) for t in (q, k, v))
        call = varlen.validate(qf, kf, vf, packed[0], packed[1], packed[2], packed[3], mode, evaluator, causal,
                               opts["softcap"], None, softmax_scale, opts["window_size"], False, None, None)
        which = varlen._pick_backend(backend, call, qf)
        grads = varlen._backward(dout.flatten(0, 1), qf, kf, vf, packed[0], packed[1], out.flatten(0, 1),
                                 lse.transpose(0, 1).reshape(h, b * s), call, which)
        grads = tuple(g.view(t.shape) for g, t in zip(grads, (q, k, v)))
    return tuple(g.contiguous() for g in grads)


@_positions_bwd.register_fake
def _positions_bwd_fake(dout, q, k, v, *rest):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _positions_setup(ctx, inputs, output):
    q, k, v, pos, *rest = inputs
    ctx.rest = rest
    ctx.save_for_backward(q, k, v, pos, *output)


def _positions_backward(ctx, dout, _dlse):
    q, k, v, pos, out, lse = ctx.saved_tensors
    dq, dk, dv = _positions_bwd(dout, q, k, v, out, lse, pos, *ctx.rest)
    need = ctx.needs_input_grad
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + (None,) * (1 + len(ctx.rest))


_positions_fwd.register_autograd(_positions_backward, setup_context=_positions_setup)


def _positions_attention(q, k, v, position_ids, mode, opts):
    """O through the position-ids op, or None where that op does not apply (backends whose
    autograd is not ours: flash-attn-4's; a user score or other options go the other way)."""
    call = interface.validate(q, k, v, mode, opts["evaluator"], opts["causal"], opts["softcap"], None,
                              opts["softmax_scale"], opts["window_size"])
    if interface._pick_backend(opts["backend"], call, q.device, interface._capability(q)) not in ("cuda", "reference"):
        return None
    out, _ = torch.ops.flash_attn_poly.hf_positions_fwd(
        q, k, v, position_ids, mode, opts["evaluator"], opts["causal"], float(opts["softcap"] or 0.0),
        float(call.softmax_scale), list(call.window), opts["backend"])
    return out


# The model hands every layer the same position_ids tensor: read it (a device sync) once per
# forward, not once per layer.  Keyed on the tensor object and its version counter.
_last_positions: list = [None, -1, 0, None]   # [weakref to position_ids, its _version, batch, result]


# Traced, this reading is data-dependent (nonzero, a host int) and its cache check does not
# survive tracing: a compiled layer read the ids itself.  Compiled calls read them inside the
# position-ids op above; where that op does not apply (flash-attn-4's backend) the compiler
# calls this eagerly (a graph break, and still one read per forward).
@torch.compiler.disable
def _packed_from_positions(pos, batch):
    ref, version, b, result = _last_positions
    if ref is not None and ref() is pos and version == pos._version and b == batch:
        return result
    if pos.dim() != 2 or pos.shape[0] not in (1, batch):
        raise ValueError(f"position_ids must be (1 or batch {batch}, seqlen), got shape {tuple(pos.shape)}")
    rows = pos.expand(batch, -1)
    start = torch.ones_like(rows, dtype=torch.bool)
    start[:, 1:] = rows[:, 1:] != rows[:, :-1] + 1
    starts = start.flatten().nonzero().squeeze(1)
    result = None
    if starts.numel() != batch:   # else one sequence per row: the dense call
        cu = torch.cat([starts, starts.new_tensor([rows.numel()])]).to(torch.int32)
        longest = int((cu[1:] - cu[:-1]).max())
        result = (cu, cu, longest, longest)
    _last_positions[:] = [weakref.ref(pos), pos._version, batch, result]
    return result


def register(evaluator: str = "poly", backend: str = "auto", name: str = NAME) -> str:
    """Register with transformers' AttentionInterface (and a mask function that returns None
    for plain causal/sliding masks, so padding is the only mask we are ever handed)."""
    if evaluator not in interface.EVALUATORS:
        raise ValueError(f"evaluator must be one of {interface.EVALUATORS}, got {evaluator!r}")
    if backend not in interface.BACKENDS:
        raise ValueError(f"backend must be one of {interface.BACKENDS}, got {backend!r}")
    if not isinstance(name, str) or not name or "flash" in name:
        raise ValueError(f"name must be a non-empty str without 'flash' (transformers loads every implementation "
                         f"whose name contains it from its kernel hub), got {name!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register(name, make_attention_forward(evaluator, backend))
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
