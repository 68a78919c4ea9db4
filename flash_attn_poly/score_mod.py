"""User score functions: `attention(q, k, v, score_mod=..., score_mod_bwd=..., aux_tensors=[...])`.

A score_mod is a CuTe DSL function compiled into our forward kernel between S = Q K^T and the
softmax (FlexAttention's order: the softmax normalises whatever it returns), with
flash-attn-4's signature:

    @cute.jit
    def score_mod(scores, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return scores + ...

`scores` is a `cute.TensorSSA` of two FP32 values, the scaled scores x = softmax_scale * q.k of
one query row and two adjacent keys (forward) or of two adjacent queries and one key (backward);
`batch_idx`, `head_idx`, `q_idx`, `kv_idx` are Int32 TensorSSAs of the same shape (query head,
absolute positions); `seqlen_info` has `seqlen_q` and `seqlen_k`; `aux_tensors` is the list of
tensors passed as `aux_tensors=` (CuTe tensors of the same shapes and dtypes). It must return an
FP32 TensorSSA of the same shape.  The backward recomputes it and needs its derivative:

    @cute.jit
    def score_mod_bwd(grad, scores, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return grad * d score_mod / d scores

(linear in `grad`).  Masking (causal, windows) applies after the score_mod.  The polynomial
programs are available inside a score_mod as `flash_attn_poly.poly.tanh(x, program=...)`,
`poly.sigmoid`, `poly.exp2` on the same two-value TensorSSAs.

`ScoreMod(fwd, bwd=None, reference=None, name=None)` bundles the device functions with an
optional torch reference `reference(x, b, h, q_idx, kv_idx, aux_tensors) -> x'` over
broadcastable tensors, which the reference backend (`backend="reference"`, CPU) runs.  Two
documented examples follow: `alibi(num_heads)` and `softcap(cap, program=None)`.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

FWD_PARAMS = ("scores", "batch_idx", "head_idx", "q_idx", "kv_idx", "seqlen_info", "aux_tensors")
BWD_PARAMS = ("grad",) + FWD_PARAMS


@dataclass(frozen=True, eq=False)
class ScoreMod:
    """A user score function: device forward, its derivative, an optional torch reference.

    Hash and equality are identity (two ScoreMods are one compiled kernel only if they are
    the same object): build a ScoreMod once and reuse it.  `cache_key` names it for logs."""
    fwd: Callable
    bwd: Optional[Callable] = None
    reference: Optional[Callable] = None
    name: Optional[str] = None
    key: str = field(default="", init=False)   # names it in this process (the custom ops carry it)

    def __post_init__(self):
        check_callable("score_mod", self.fwd, FWD_PARAMS)
        if self.bwd is not None:
            check_callable("score_mod_bwd", self.bwd, BWD_PARAMS)
        if self.reference is not None and not callable(self.reference):
            raise TypeError(f"ScoreMod reference must be callable, got {type(self.reference).__name__}")
        if self.name is None:
            object.__setattr__(self, "name", getattr(self.fwd, "__name__", "score_mod"))
        object.__setattr__(self, "key", f"{self.name}#{next(_COUNTER)}")
        _REGISTRY[self.key] = self


_COUNTER = itertools.count()
_REGISTRY: dict = {}


def by_key(key: str) -> ScoreMod:
    """The ScoreMod a custom-op argument names (this process's)."""
    try:
        return _REGISTRY[key]
    except KeyError:
        raise KeyError(f"no score_mod {key!r} in this process (a ScoreMod is named per process)") from None


def check_callable(what: str, fn, params: tuple) -> None:
    """A clear error at call time for something that cannot be a score_mod of this signature."""
    if not callable(fn):
        raise TypeError(f"{what} must be a callable (a @cute.jit function), got {type(fn).__name__}")
    target = getattr(fn, "__wrapped__", fn)
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return   # a builtin or C callable: nothing to check before tracing
    ps = list(sig.parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in ps):
        return
    positional = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not (len(required) <= len(params) <= len(positional)):
        raise TypeError(f"{what} must take {len(params)} arguments {params}, got {len(positional)} "
                        f"({', '.join(p.name for p in positional)})")


def as_score_mod(score_mod, score_mod_bwd=None) -> ScoreMod:
    """attention()'s score_mod / score_mod_bwd arguments as one ScoreMod (the same one for the
    same functions: a new ScoreMod per call would compile the kernels per call)."""
    for what, fn in (("score_mod", score_mod), ("score_mod_bwd", score_mod_bwd)):
        if fn is not None and not callable(fn) and not isinstance(fn, ScoreMod):
            # before the cache, which would say "unhashable type" of a list
            raise TypeError(f"{what} must be a callable (a @cute.jit function) or a ScoreMod, "
                            f"got {type(fn).__name__}")
    return _as_score_mod(score_mod, score_mod_bwd)


@functools.lru_cache(maxsize=256)
def _as_score_mod(score_mod, score_mod_bwd=None) -> ScoreMod:
    if isinstance(score_mod, ScoreMod):
        if score_mod_bwd is not None:
            if score_mod.bwd is not None:
                raise ValueError("score_mod_bwd given twice: in the ScoreMod and as score_mod_bwd=")
            return ScoreMod(score_mod.fwd, score_mod_bwd, score_mod.reference, score_mod.name)
        return score_mod
    return ScoreMod(score_mod, score_mod_bwd)


# ------------------------------------------------------------------------------ examples


def alibi_slopes(num_heads: int):
    """ALiBi's head slopes 2^(-8 (h + 1) / H) (Press et al.; H a power of two), FP32 torch tensor."""
    import torch
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)], dtype=torch.float32)


def alibi() -> ScoreMod:
    """ALiBi as a score_mod: x + slope[h] * (kv_idx - q_idx), slopes in aux_tensors[0] (FP32, one
    per query head, e.g. `alibi_slopes(H_q)`).  The bias does not depend on x, so the derivative
    is the identity.  Usage:
        attention(q, k, v, score_mod=alibi(), aux_tensors=[alibi_slopes(H_q).cuda()])"""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32

    @cute.jit
    def alibi_fwd(scores, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        slopes = aux_tensors[0]
        slope = cute.make_rmem_tensor(scores.shape, Float32)
        for i in cutlass.range_constexpr(cute.size(scores.shape)):
            slope[i] = slopes[head_idx[i]]
        return scores + slope.load() * (kv_idx - q_idx).to(Float32)

    @cute.jit
    def alibi_bwd(grad, scores, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return grad

    def alibi_ref(x, b, h, q_idx, kv_idx, aux_tensors):
        slopes = aux_tensors[0].to(x.device, x.dtype)[h]
        return x + slopes * (kv_idx - q_idx).to(x.dtype)

    return ScoreMod(alibi_fwd, alibi_bwd, alibi_ref, "alibi")


def softcap(cap: float, program: Optional[str] = None) -> ScoreMod:
    """Gemma-2's softcap as a score_mod: cap * tanh(x / cap), derivative 1 - tanh^2.  program=None
    takes tanh from MUFU (tanh.approx); a table tanh program (e.g. "tanh_d4") evaluates it as a
    packed polynomial on the FMA pipe (flash_attn_poly.poly.tanh).  The built-in
    `attention(mode="softcap")` is faster (its exp2 offload and fused clamp); this is the
    pattern for writing your own."""
    import cutlass.cute as cute
    from cutlass import Float32

    if not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
        raise ValueError(f"softcap cap must be a finite number > 0, got {cap!r}")
    inv = 1.0 / float(cap)
    c = float(cap)
    if program is None:
        def _tanh(u):
            return cute.math.tanh(u, fastmath=True)
    else:
        from . import poly

        def _tanh(u):
            return poly.tanh(u, program=program)

    @cute.jit
    def softcap_fwd(scores, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return _tanh(scores * Float32(inv)) * Float32(c)

    @cute.jit
    def softcap_bwd(grad, scores, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        t = _tanh(scores * Float32(inv))
        return grad * (Float32(1.0) - t * t)

    def softcap_ref(x, b, h, q_idx, kv_idx, aux_tensors):
        import torch
        return c * torch.tanh(x / c)

    return ScoreMod(softcap_fwd, softcap_bwd, softcap_ref, f"softcap{c:g}" + (f"_{program}" if program else ""))
