"""Variable-length (packed) attention: flash-attn's `flash_attn_varlen_func` layout.

q (total_q, H_q, D), k and v (total_k, H_kv, D) hold the sequences of a batch back to back;
sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1]
of k and v (int32 offsets on the tensors' device).  Each sequence is an attention call of its
own: causal masking and windows are aligned to the bottom-right corner of that sequence's
(S_q, S_k) block, sigmoid's default bias is -ln S_k of that sequence, and a sequence may be
empty (S_q = 0: nothing; S_k = 0: its rows see no key, O = 0 and LSE = -inf).  The LSE is
flash-attn varlen's (H_q, total_q), FP32, natural log.

What runs (`backend`): "reference" computes each sequence with flash_attn_poly.reference in
FP32; "cuda" runs the plan of the packed call (flash_attn_poly.plan, AttnCall.varlen): the varlen
forward kernel where it sets fwd.varlen (one launch, a CTA per query tile, head and sequence;
kernels/attn_fwd_sm90.py AttnFwdSm90Varlen), else each sequence through the dense kernels (one
launch per non-empty sequence after one device-to-host copy of the offsets, with the plan of
that sequence's shape, so each sequence gets exactly what attention() would give it).  The
backward likewise: the varlen backward kernels where the plan sets bwd.varlen (one pre, main and
post launch; kernels/attn_bwd_sm90.py AttnBwdSm90Varlen), else per sequence.  The API, the
checks and the reference do not depend on which runs.
"""
from __future__ import annotations

import math
import numbers
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch

from . import interface as _fi
from . import reference

_DTYPE_NAMES = _fi._DTYPE_NAMES


@dataclass(frozen=True)
class VarlenCall:
    """A validated varlen call: the options every sequence shares and the batch's shapes."""
    mode: str
    evaluator: str
    dtype: str
    head_dim: int
    batch: int
    max_seqlen_q: int
    max_seqlen_k: int
    heads_q: int
    heads_kv: int
    causal: bool
    window: tuple
    softmax_scale: float
    softcap: Optional[float] = None
    sigmoid_bias: Optional[float] = None
    program: object = None
    deterministic: bool = False
    sigmoid_grad: Optional[str] = None
    ragged: bool = False      # the query lengths differ (total_q < batch x max_seqlen_q): read off the
                              # shapes, no device sync (an overstated max_seqlen_q also counts as ragged)


# ------------------------------------------------------------------------------ validation
def _check_tensors(q, k, v) -> None:
    _fi.check_qkv_common(q, k, v, 3, "(total_tokens, heads, head_dim) for attention_varlen")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"head_dim mismatch: q has {q.shape[2]}, k/v have {k.shape[2]}")
    h_q, h_kv = q.shape[1], k.shape[1]
    if h_kv == 0 or h_q % h_kv != 0:
        raise ValueError(f"number of query heads ({h_q}) must be a multiple of key/value heads ({h_kv})")


def _check_offsets(cu_seqlens_q, cu_seqlens_k, q) -> int:
    """The checks that need no device sync; returns the batch size."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of int32 offsets, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must have dtype torch.int32 (flash-attn's offsets), got {cu.dtype}")
        if cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries (0, end of sequence 0, ...), "
                             f"got shape {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name} is on {cu.device}; it must be on the device of q ({q.device})")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q describes {cu_seqlens_q.numel() - 1} sequences, cu_seqlens_k "
                         f"{cu_seqlens_k.numel() - 1}: the batch sizes must agree")
    return cu_seqlens_q.numel() - 1


def _max_seqlen(name: str, value) -> int:
    """max_seqlen_*: a Python int or a 0-d integer tensor (transformers hands one), >= 0."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_floating_point \
            and not value.dtype.is_complex and value.dtype != torch.bool:
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def check_offsets_values(cu_q: list, cu_k: list, total_q: int, total_k: int, max_q: int, max_k: int) -> None:
    """The checks that read the offsets' values (host lists): each a clear error."""
    for name, cu, total, mx, mx_name in (("cu_seqlens_q", cu_q, total_q, max_q, "max_seqlen_q"),
                                         ("cu_seqlens_k", cu_k, total_k, max_k, "max_seqlen_k")):
        if cu[0] != 0:
            raise ValueError(f"{name}[0] must be 0, got {cu[0]}")
        lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
        bad = next((i for i, n in enumerate(lens) if n < 0), None)
        if bad is not None:
            raise ValueError(f"{name} must be non-decreasing: {name}[{bad + 1}] = {cu[bad + 1]} < "
                             f"{name}[{bad}] = {cu[bad]}")
        if cu[-1] != total:
            raise ValueError(f"{name}[-1] = {cu[-1]} must equal the number of rows of "
                             f"{'q' if name.endswith('q') else 'k and v'} ({total})")
        longest = max(lens)
        if longest > mx:
            i = lens.index(longest)
            raise ValueError(f"{mx_name} = {mx} is smaller than sequence {i}'s length {longest}")


def validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mode="softmax",
             evaluator="poly", causal=True, softcap=None, sigmoid_bias=None, softmax_scale=None,
             window_size=(-1, -1), deterministic=False, program=None, sigmoid_grad=None) -> VarlenCall:
    """The validated call of attention_varlen()'s arguments (no device sync: the offsets' values
    are checked by check_offsets_values)."""
    _check_tensors(q, k, v)
    batch = _check_offsets(cu_seqlens_q, cu_seqlens_k, q)
    max_q, max_k = _max_seqlen("max_seqlen_q", max_seqlen_q), _max_seqlen("max_seqlen_k", max_seqlen_k)
    cap, bias = _fi._check_options(mode, evaluator, softcap, sigmoid_bias, sigmoid_grad, None)
    _fi._check_program(mode, evaluator, program)
    _fi._bool("causal", causal)
    _fi._bool("deterministic", deterministic)
    window = _fi._window(window_size)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else _fi._number("softmax_scale", softmax_scale)
    if not scale > 0:
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale!r}")
    window, causal = _fi._canonical_window(window, causal, max_q, max_k)
    return VarlenCall(mode=mode, evaluator=evaluator, dtype=_DTYPE_NAMES[q.dtype], head_dim=q.shape[2],
                      batch=batch, max_seqlen_q=max_q, max_seqlen_k=max_k, heads_q=q.shape[1],
                      heads_kv=k.shape[1], causal=causal, window=window, softmax_scale=scale, softcap=cap,
                      sigmoid_bias=bias, program=program, deterministic=deterministic,
                      sigmoid_grad=sigmoid_grad, ragged=q.shape[0] < batch * max_q)


def _pick_backend(backend: str, call: VarlenCall, q) -> str:
    """interface's backend choice, asked for the dense call of one sequence of this batch (the
    CUDA path runs each sequence through the dense kernels, so it can run what they can)."""
    if backend not in _fi.BACKENDS:
        raise ValueError(f"backend must be one of {_fi.BACKENDS}, got {backend!r}")
    if backend == "reference":
        return backend
    if backend == "fa4":
        raise ValueError("backend='fa4' does not take packed sequences (attention_varlen): use backend='cuda' "
                         "(sm_90) or 'reference'")
    seq = _seq_call(call, max(call.max_seqlen_q, 1), max(call.max_seqlen_k, 1))
    which = _fi._pick_backend(backend, seq, q.device, _fi._capability(q))
    if which == "fa4":   # "auto" on a GPU where only flash-attn-4 would run attention()
        warnings.warn("flash_attn_poly: attention_varlen runs on sm_90 only (backend='fa4' takes no packed "
                      "sequences); backend='auto' runs the slow torch reference", stacklevel=3)
        return "reference"
    if which == "cuda" and call.evaluator == "poly" and call.mode == "sigmoid" and call.dtype != "bf16":
        _fi._check_sigmoid_program_dtype(seq)
    return which


def _seq_call(call: VarlenCall, s_q: int, s_k: int) -> _fi.AttnCall:
    """The dense AttnCall of one sequence (batch 1) of a varlen call."""
    return _fi.AttnCall(mode=call.mode, evaluator=call.evaluator, dtype=call.dtype, head_dim=call.head_dim,
                        batch=1, seqlen_q=s_q, seqlen_k=s_k, heads_q=call.heads_q, heads_kv=call.heads_kv,
                        causal=call.causal, window=call.window, softmax_scale=call.softmax_scale,
                        softcap=call.softcap, sigmoid_bias=call.sigmoid_bias, program=call.program,
                        deterministic=call.deterministic, sigmoid_grad=call.sigmoid_grad)


# ------------------------------------------------------------------------------ the API
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mode: str = "softmax",
                     *, causal: bool = True, window_size=(-1, -1), softcap: Optional[float] = None,
                     sigmoid_bias: Optional[float] = None, evaluator: str = "poly", program=None,
                     softmax_scale: Optional[float] = None, deterministic: bool = False,
                     return_lse: bool = False, sigmoid_grad: Optional[str] = None, backend: str = "auto",
                     check_inputs: bool = True):
    """Attention over packed sequences (flash_attn_varlen_func's layout); returns O (total_q, H_q, D).

    q (total_q, H_q, D), k/v (total_k, H_kv, D); cu_seqlens_q / cu_seqlens_k: int32 (batch + 1,)
    offsets on the tensors' device, 0 first, non-decreasing, the last equal to total_q / total_k;
    max_seqlen_q / max_seqlen_k: at least every sequence's length (an int or a 0-d tensor).
    Every option means what it means for flash_attn_poly.attention, applied to each sequence on
    its own: causal and window_size are aligned to each sequence's bottom-right corner, sigmoid's
    default bias is -ln S_k of each sequence.  Empty sequences are allowed (a query row with no
    key is zero, LSE -inf).  return_lse: also the FP32 LSE (H_q, total_q) (softmax modes).
    check_inputs: check the offsets' values (one device-to-host copy of them, which makes the
    host wait for the GPU; the varlen kernel path skips it for offsets it checked before, the same
    tensor objects unchanged since, so a model's layers copy once per batch); the per-sequence
    CUDA path reads them anyway and always checks; with False, offsets that break the rules
    give undefined results (as in flash-attn).  Differentiable; under torch.compile a custom op
    (`torch.ops.flash_attn_poly.attn_varlen_fwd`) traced without graph breaks.
    """
    call = validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mode, evaluator, causal,
                    softcap, sigmoid_bias, softmax_scale, window_size, deterministic, program, sigmoid_grad)
    if _fi._bool("return_lse", return_lse) and call.mode == "sigmoid":
        raise ValueError("return_lse: sigmoid attention has no log-sum-exp")
    check = _fi._bool("check_inputs", check_inputs)
    which = _pick_backend(backend, call, q)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.flash_attn_poly.attn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                             *_op_args(call), check, which)
    else:
        out, lse = _EagerVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, call, check, which)
    return (out, lse) if return_lse else out


class _EagerVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, call: VarlenCall, check: bool, backend: str):
        out, lse = _forward(q, k, v, cu_q, cu_k, call, check, backend)
        ctx.call, ctx.backend = call, backend
        ctx.save_for_backward(q, k, v, cu_q, cu_k, out, lse)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, cu_q, cu_k, out, lse = ctx.saved_tensors
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        grads = _backward(dout, q, k, v, cu_q, cu_k, out, lse, ctx.call, ctx.backend)
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:3])) + (None,) * 5


# ------------------------------------------------------------------------------ per-sequence bodies
def _offsets(cu_q, cu_k, q, k, call: VarlenCall, check: bool):
    """The offsets as host lists (one copy of both), checked when asked."""
    both = torch.cat([cu_q, cu_k]).tolist()
    n = cu_q.numel()
    cu_q_l, cu_k_l = both[:n], both[n:]
    if check:
        check_offsets_values(cu_q_l, cu_k_l, q.shape[0], k.shape[0], call.max_seqlen_q, call.max_seqlen_k)
    return cu_q_l, cu_k_l


# Offsets the varlen kernel path has checked: the same tensor objects (weak references, never
# addresses, which the caching allocator reuses) at the same version (torch bumps it on every
# in-place write it performs) with the same totals and maximum lengths pass without another copy
# to the host, so the layers of one step (or a timing loop) sync once for a batch's offsets.
_CHECKED: OrderedDict = OrderedDict()
_CHECKED_KEEP = 16


def check_once(tensors: tuple, facts: tuple, check) -> None:
    """check() unless these tensor objects passed it before unchanged (same versions) with the same
    facts (shapes, lengths, which check); inference-mode tensors keep no version: checked every time."""
    if any(t.is_inference() for t in tensors):
        check()
        return
    key = tuple(id(t) for t in tensors) + tuple(t._version for t in tensors) + tuple(facts)
    hit = _CHECKED.get(key)
    if hit is not None and all(r() is t for r, t in zip(hit, tensors)):
        _CHECKED.move_to_end(key)
        return
    check()
    _CHECKED[key] = tuple(weakref.ref(t) for t in tensors)
    while len(_CHECKED) > _CHECKED_KEEP:
        _CHECKED.popitem(last=False)


def _check_once(cu_q, cu_k, q, k, call: VarlenCall) -> None:
    """_offsets(..., check=True) unless these offsets passed it unchanged before."""
    check_once((cu_q, cu_k), ("kernel", q.shape[0], k.shape[0], call.max_seqlen_q, call.max_seqlen_k),
               lambda: _offsets(cu_q, cu_k, q, k, call, True))


def _lse_shape(call: VarlenCall, total_q: int) -> tuple:
    return (0,) if call.mode == "sigmoid" else (call.heads_q, total_q)


def _attn_call(call: VarlenCall) -> _fi.AttnCall:
    """The plan's view of a varlen call: batch = sequences, lengths = the longest ones."""
    return _fi.AttnCall(mode=call.mode, evaluator=call.evaluator, dtype=call.dtype, head_dim=call.head_dim,
                        batch=call.batch, seqlen_q=max(call.max_seqlen_q, 1), seqlen_k=max(call.max_seqlen_k, 1),
                        heads_q=call.heads_q, heads_kv=call.heads_kv, causal=call.causal, window=call.window,
                        softmax_scale=call.softmax_scale, softcap=call.softcap, sigmoid_bias=call.sigmoid_bias,
                        program=call.program, deterministic=call.deterministic, sigmoid_grad=call.sigmoid_grad,
                        varlen=True, varlen_ragged=call.ragged)


def _varlen_plan(call: VarlenCall, device, overrides=None):
    """The plan of the packed call: fwd.varlen says whether the varlen forward kernel runs (else
    one dense launch per sequence).  overrides: plan overrides (tests: {"fwd.varlen": True})."""
    if overrides:
        from . import plan as plan_mod
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
        return plan_mod.resolve(_attn_call(call), sms, overrides)
    return _fi.plan_for(_attn_call(call), device)


def _forward(q, k, v, cu_q, cu_k, call: VarlenCall, check: bool, backend: str, overrides=None):
    """(O (total_q, H_q, D) in q.dtype, LSE (H_q, total_q) FP32 or (0,) for sigmoid)."""
    if backend == "cuda":
        vp = _varlen_plan(call, q.device, overrides)
        if vp.fwd.varlen:
            return _forward_kernel(q, k, v, cu_q, cu_k, call, check, vp)
    cu_q_l, cu_k_l = _offsets(cu_q, cu_k, q, k, call, check or backend == "cuda")
    out = torch.zeros_like(q)   # rows of sequences with no key stay zero
    lse = torch.full(_lse_shape(call, q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(call.batch):
        q0, q1, k0, k1 = cu_q_l[b], cu_q_l[b + 1], cu_k_l[b], cu_k_l[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        qs, ks, vs = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        sc = _seq_call(call, q1 - q0, k1 - k0)
        p = _fi.plan_for(sc, q.device) if backend == "cuda" else None
        o_b, lse_b = _fi._forward(qs, ks, vs, sc, p, backend, ())
        out[q0:q1] = o_b[0]
        if call.mode != "sigmoid":
            lse[:, q0:q1] = lse_b[0]
    return out, lse


def _forward_kernel(q, k, v, cu_q, cu_k, call: VarlenCall, check: bool, vp):
    """The varlen forward kernel: one launch for the whole batch (kernels/attn_fwd_sm90.py,
    AttnFwdSm90Varlen)."""
    if check:
        _check_once(cu_q, cu_k, q, k, call)
    if q.shape[0] == 0 or call.max_seqlen_q == 0:   # no query row: nothing to launch
        return torch.zeros_like(q), q.new_empty(_lse_shape(call, q.shape[0]), dtype=torch.float32)
    from .kernels import dispatch
    out, lse = dispatch.forward_varlen(vp, q, k, v, cu_q.contiguous(), cu_k.contiguous(), call.max_seqlen_q)
    return out, (q.new_empty((0,), dtype=torch.float32) if lse is None else lse)


def _backward(dout, q, k, v, cu_q, cu_k, out, lse, call: VarlenCall, backend: str, overrides=None):
    """(dq, dk, dv); keys of a sequence with no query and rows with no key get zero gradients.
    overrides: plan overrides (tests: {"bwd.varlen": True})."""
    if backend == "cuda":
        vp = _varlen_plan(call, q.device, overrides)
        if vp.bwd.varlen:
            return _backward_kernel(dout, q, k, v, cu_q, cu_k, out, lse, call, vp)
    cu_q_l, cu_k_l = _offsets(cu_q, cu_k, q, k, call, False)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b in range(call.batch):
        q0, q1, k0, k1 = cu_q_l[b], cu_q_l[b + 1], cu_k_l[b], cu_k_l[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        sc = _seq_call(call, q1 - q0, k1 - k0)
        p = _fi.plan_for(sc, q.device) if backend == "cuda" else None
        lse_b = lse if call.mode == "sigmoid" else lse[None, :, q0:q1].contiguous()
        g = _fi._backward(dout[None, q0:q1].contiguous(), q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                          out[None, q0:q1], lse_b, sc, p, backend, ())
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def _backward_kernel(dout, q, k, v, cu_q, cu_k, out, lse, call: VarlenCall, vp):
    """The varlen backward kernels: one pre, main and post launch for the whole batch
    (kernels/dispatch.py backward_varlen; kernels/attn_bwd_sm90.py AttnBwdSm90Varlen)."""
    if q.shape[0] == 0 or k.shape[0] == 0 or call.max_seqlen_q == 0 or call.max_seqlen_k == 0:
        # no (query, key) pair in the batch: every gradient is zero, no launch
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    from .kernels import dispatch
    return dispatch.backward_varlen(vp, dout, q, k, v, out, lse, cu_q.contiguous(), cu_k.contiguous(),
                                    call.max_seqlen_q, call.max_seqlen_k)


# ------------------------------------------------------------------------------ custom ops
def _op_args(call: VarlenCall) -> tuple:
    prog = "" if call.program is None else (call.program if isinstance(call.program, str)
                                            else call.program.json_text)
    return (call.max_seqlen_q, call.max_seqlen_k, call.mode, call.evaluator, call.causal, call.softcap or 0.0,
            math.nan if call.sigmoid_bias is None else call.sigmoid_bias, call.softmax_scale, list(call.window),
            call.deterministic, prog, call.sigmoid_grad or "")


def _call_from_op(q, k, cu_q, max_q, max_k, mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale,
                  window, deterministic, program, sigmoid_grad) -> VarlenCall:
    if program.startswith("{"):
        program = _fi._programs.from_json(program)
    return VarlenCall(mode=mode, evaluator=evaluator, dtype=_DTYPE_NAMES[q.dtype], head_dim=q.shape[2],
                      batch=cu_q.shape[0] - 1, max_seqlen_q=max_q, max_seqlen_k=max_k, heads_q=q.shape[1],
                      heads_kv=k.shape[1], causal=causal, window=tuple(window), softmax_scale=softmax_scale,
                      softcap=softcap if mode == "softcap" else None,
                      sigmoid_bias=None if math.isnan(sigmoid_bias) else sigmoid_bias,
                      program=program or None, deterministic=deterministic, sigmoid_grad=sigmoid_grad or None,
                      ragged=q.shape[0] < (cu_q.shape[0] - 1) * max_q)


@torch.library.custom_op("flash_attn_poly::attn_varlen_fwd", mutates_args=())
def _varlen_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, mode: str, evaluator: str,
                   causal: bool, softcap: float, sigmoid_bias: float, softmax_scale: float,
                   window_size: list[int], deterministic: bool, program: str, sigmoid_grad: str,
                   check_inputs: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    call = _call_from_op(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, mode, evaluator, causal, softcap,
                         sigmoid_bias, softmax_scale, window_size, deterministic, program, sigmoid_grad)
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, call, check_inputs, backend)


@_varlen_fwd_op.register_fake
def _varlen_fwd_fake(q, k, v, cu_q, cu_k, max_q, max_k, mode, *rest):
    lse_shape = (0,) if mode == "sigmoid" else (q.shape[1], q.shape[0])
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flash_attn_poly::attn_varlen_bwd", mutates_args=())
def _varlen_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                   max_seqlen_k: int, mode: str, evaluator: str, causal: bool, softcap: float,
                   sigmoid_bias: float, softmax_scale: float, window_size: list[int], deterministic: bool,
                   program: str, sigmoid_grad: str, check_inputs: bool,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    call = _call_from_op(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, mode, evaluator, causal, softcap,
                         sigmoid_bias, softmax_scale, window_size, deterministic, program, sigmoid_grad)
    return _backward(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, call, backend)


@_varlen_bwd_op.register_fake
def _varlen_bwd_fake(dout, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *rest = inputs
    ctx.rest = rest
    ctx.save_for_backward(q, k, v, *output, cu_q, cu_k)


def _op_backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = _varlen_bwd_op(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k, *ctx.rest)
    need = ctx.needs_input_grad
    return ((dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None, None)
            + (None,) * len(ctx.rest))


_varlen_fwd_op.register_autograd(_op_backward, setup_context=_setup_context)
