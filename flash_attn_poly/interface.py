"""Public attention entry point: validation, then the plan, then autograd around the kernels.

Everything a user can get wrong is checked here, before any kernel is compiled, with a message
that names the parameter and the problem.  What runs is decided by flash_attn_poly.plan (one
resolved AttnPlan per call signature, shared by the forward and the backward); the kernels'
torch launch is kernels/dispatch.py.
"""
from __future__ import annotations

import functools
import math
import numbers
import warnings
from typing import Optional

import torch

from . import plan as plan_mod
from . import reference
from .asm import programs as _programs
from .plan import AttnCall
from .score_mod import ScoreMod, as_score_mod, by_key as _score_mod_by_key

MODES = ("softmax", "softcap", "sigmoid")
EVALUATORS = ("poly", "native")
BACKENDS = ("auto", "cuda", "fa4", "reference")
DTYPES = (torch.bfloat16, torch.float16)          # what the CUDA kernels take
REFERENCE_DTYPES = DTYPES + (torch.float32,)       # the reference backend also takes FP32
HEAD_DIMS = (64, 128, 256)     # forward and backward
SIGMOID_GRADS = ("product", "surrogate")
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
FP32_MAX = torch.finfo(torch.float32).max     # scalar arguments reach the kernels as FP32
FP32_TINY = torch.finfo(torch.float32).tiny   # the smallest normal FP32 (softcap divides by it)


# ------------------------------------------------------------------------------ validation
def check_qkv_common(q, k, v, ndim: int, layout: str) -> None:
    """The checks attention() and attention_varlen share: tensors of rank ndim (layout names the
    dimensions in the message), a supported dtype, head_dim contiguous, one dtype, one device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in REFERENCE_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: torch.bfloat16, torch.float16 "
                            "(and torch.float32 with backend='reference')")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension, got strides {t.stride()}")
        if t.shape[-1] == 0:
            raise ValueError(f"{name} has head_dim 0 (shape {tuple(t.shape)}): head_dim must be > 0")
        if t.shape[-2] == 0:
            raise ValueError(f"{name} has 0 heads (shape {tuple(t.shape)}): attention needs at least one head")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def _check_tensors(q, k, v) -> None:
    check_qkv_common(q, k, v, 4, "(batch, seqlen, heads, head_dim)")
    b, s_q, h_q, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != b:
        raise ValueError(f"batch mismatch: q has {b}, k/v have {k.shape[0]}")
    if k.shape[3] != d:
        raise ValueError(f"head_dim mismatch: q has {d}, k/v have {k.shape[3]}")
    h_kv = k.shape[2]
    if h_kv == 0 or h_q % h_kv != 0:
        raise ValueError(f"number of query heads ({h_q}) must be a multiple of key/value heads ({h_kv})")
    if k.shape[1] == 0:
        raise ValueError("k and v have seqlen 0: attention needs at least one key (no softmax normaliser, "
                         "no default sigmoid bias -ln S_k)")


def _number(name: str, value, allow_none: bool = True) -> Optional[float]:
    """A finite real number (Python, numpy or a 0-d tensor), as a float; bools are refused."""
    if value is None and allow_none:
        return None
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_complex \
            and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if abs(value) > FP32_MAX:   # the kernels and the reference take it as an FP32 value
        raise ValueError(f"{name} must be finite in FP32 (|x| <= {FP32_MAX:.4g}), got {value!r}")
    return value


def _bool(name: str, value) -> bool:
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)   # numpy's bool scalar (numbers are taken from numpy as well)
    if not isinstance(value, bool):
        # a truthy string or tensor here is almost surely a misplaced argument
        kind = type(value).__qualname__ if type(value).__module__ == "builtins" else \
            f"{type(value).__module__}.{type(value).__qualname__}"
        raise TypeError(f"{name} must be a bool, got {kind} {value!r}")
    return value


def _window(window_size) -> tuple:
    if window_size is None:
        raise TypeError("window_size must be a (left, right) pair of ints (-1 = unbounded), got None; "
                        "use (-1, -1) for no window")
    if isinstance(window_size, (set, frozenset, dict)):   # no (left, right) order
        raise TypeError(f"window_size must be a (left, right) pair of ints (-1 = unbounded), got "
                        f"{type(window_size).__name__} {window_size!r}")
    try:
        pair = tuple(window_size)
    except TypeError:
        raise TypeError(f"window_size must be a (left, right) pair of ints (-1 = unbounded), got "
                        f"{type(window_size).__name__} {window_size!r}") from None
    if len(pair) != 2 or any(isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < -1 for w in pair):
        raise ValueError(f"window_size must be (left, right) ints >= -1 (-1 = unbounded), got {window_size!r}")
    return (int(pair[0]), int(pair[1]))


def _canonical_window(window: tuple, causal: bool, s_q: int, s_k: int) -> tuple:
    """(window, causal) in flash-attn's canonical form (FA2 and FA4 normalise the same way): a
    bound that masks no key is no bound (left >= S_k - 1: the last query, aligned to the
    bottom-right corner, already sees key 0; right >= S_q - 1: the first query sees key S_k - 1),
    a causal call's right bound is the diagonal itself, and a non-causal call whose only bound
    is right = 0 is causal.  Same keys, same scores: such a call runs the kernels and plan rows of
    the call it equals instead of a windowed build that compares every score with bounds that
    never bite.  Varlen calls pass their max_seqlen (a bound past every sequence's length)."""
    left, right = window
    if left >= max(s_k - 1, 0):
        left = -1
    if causal or right >= max(s_q - 1, 0):
        right = -1
    if not causal and left == -1 and right == 0:
        causal, right = True, -1
    return (left, right), causal


def _check_program(mode, evaluator, program) -> None:
    """program: a forward (non-derivative) program that mode's kernels run, poly only: a name
    of the committed table or a ProgramSpec (asm.programs.spec(name, table=...), any table)."""
    if program is None:
        return
    if not isinstance(program, (str, _programs.ProgramSpec)):
        raise TypeError(f"program must be a str naming a coefficient-table entry or a ProgramSpec, "
                        f"got {type(program).__name__}")
    label = program if isinstance(program, str) else program.name
    if evaluator != "poly" or mode not in _programs.MODE_TARGETS:
        raise ValueError(f"program={label!r} selects a polynomial program: it needs evaluator='poly' and "
                         f"mode {' or '.join(map(repr, _programs.MODE_TARGETS))} (got mode={mode!r}, "
                         f"evaluator={evaluator!r})")
    if isinstance(program, str) and not torch.compiler.is_compiling() and not _is_program_of(mode, program):
        known = _programs.names(mode=mode, derivative=False)
        raise ValueError(f"program {program!r} is not a {mode} program of the coefficient table; known: {known}")
    if not isinstance(program, str) and program.mode != mode:
        what = "a derivative program" if program.derivative else f"target {program.target!r}"
        raise ValueError(f"program {label!r} ({what}) is not a {mode} program; {mode} programs run targets "
                         f"{_programs.MODE_TARGETS[mode]} (committed table: "
                         f"{_programs.names(mode=mode, derivative=False)})")


def _is_program_of(mode: str, name: str) -> bool:
    """Is `name` a forward program of mode in the committed table?  Not asked under
    torch.compile (the table is not traced; the plan, resolved inside the custom op, refuses
    a name the table does not have).  No decorator that would import torch._dynamo at import
    time (2 s on a small CPU): a cached process's first call must not pay for it."""
    return name in _programs.names(mode=mode, derivative=False)


def _check_options(mode, evaluator, softcap, sigmoid_bias, sigmoid_grad, score_mod):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if evaluator not in EVALUATORS:
        raise ValueError(f"evaluator must be one of {EVALUATORS}, got {evaluator!r}")
    cap = _number("softcap", softcap)
    if mode == "softcap":
        if cap is None or cap < FP32_TINY:   # scores are divided by it in FP32: 0 or subnormal gives 0/0
            raise ValueError(f"mode='softcap' needs a finite softcap > 0, at least the smallest normal FP32 "
                             f"{FP32_TINY:.4g} (Gemma-2 uses 50.0), got {softcap!r}")
    elif cap is not None:
        raise ValueError(f"softcap={softcap!r} is only meaningful with mode='softcap' (got mode={mode!r})")
    bias = _number("sigmoid_bias", sigmoid_bias)
    if bias is not None and mode != "sigmoid":
        raise ValueError(f"sigmoid_bias is only meaningful with mode='sigmoid' (got mode={mode!r})")
    if sigmoid_grad is not None:
        if sigmoid_grad not in SIGMOID_GRADS:
            raise ValueError(f"sigmoid_grad must be one of {SIGMOID_GRADS}, got {sigmoid_grad!r}")
        if mode != "sigmoid" or evaluator != "poly":
            raise ValueError(f"sigmoid_grad selects the sigmoid poly backward's rule: it needs mode='sigmoid', "
                             f"evaluator='poly' (got mode={mode!r}, evaluator={evaluator!r})")
    if score_mod is not None and mode != "softmax":
        raise ValueError(f"score_mod runs before the softmax normalisation (FlexAttention's order): it needs "
                         f"mode='softmax', got mode={mode!r} (softcap is itself a score_mod: "
                         "flash_attn_poly.score_mod.softcap)")
    return cap, bias


def _check_aux(aux_tensors, q) -> tuple:
    if aux_tensors is None:
        return ()
    if isinstance(aux_tensors, torch.Tensor) or not isinstance(aux_tensors, (list, tuple)):
        raise TypeError(f"aux_tensors must be a list of tensors, got {type(aux_tensors).__name__}")
    from .kernels.config import AUX_DTYPES
    for i, t in enumerate(aux_tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"aux_tensors[{i}] must be a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"aux_tensors[{i}] is on {t.device}, q on {q.device}")
        if str(t.dtype).removeprefix("torch.") not in AUX_DTYPES:
            raise TypeError(f"aux_tensors[{i}] has dtype {t.dtype}; supported: {sorted(AUX_DTYPES)}")
        if t.dim() == 0:
            raise ValueError(f"aux_tensors[{i}] is 0-d; pass a 1-d tensor (a score_mod reads it by index)")
    return tuple(aux_tensors)


def validate(q, k, v, mode="softmax", evaluator="poly", causal=True, softcap=None, sigmoid_bias=None,
             softmax_scale=None, window_size=(-1, -1), deterministic=False, program=None,
             sigmoid_grad=None, score_mod=None, n_aux=0, aux_meta=()) -> AttnCall:
    """The validated call (flash_attn_poly.plan.AttnCall) of attention()'s arguments."""
    _check_tensors(q, k, v)
    cap, bias = _check_options(mode, evaluator, softcap, sigmoid_bias, sigmoid_grad, score_mod)
    _check_program(mode, evaluator, program)
    _bool("causal", causal)
    _bool("deterministic", deterministic)
    window = _window(window_size)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else _number("softmax_scale", softmax_scale)
    if not scale > 0:
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale!r}")
    b, s_q, h_q, d = q.shape
    window, causal = _canonical_window(window, causal, s_q, k.shape[1])
    return AttnCall(mode=mode, evaluator=evaluator, dtype=_DTYPE_NAMES[q.dtype], head_dim=d, batch=b,
                    seqlen_q=s_q, seqlen_k=k.shape[1], heads_q=h_q, heads_kv=k.shape[2], causal=causal,
                    window=window, softmax_scale=scale, softcap=cap, sigmoid_bias=bias, program=program,
                    deterministic=deterministic, sigmoid_grad=sigmoid_grad, score_mod=score_mod,
                    aux=tuple(aux_meta))


def _cuda_refusal(call: AttnCall, device: torch.device, capability) -> Optional[tuple]:
    """(exception type, problem) saying why the CUDA kernels cannot run `call` on `device`, or
    None when they can.  capability: the device's (major, minor), None for a non-CUDA device.
    One decision for both backends that can pick the kernels: backend='cuda' raises it,
    backend='auto' names it in the warning of its reference fallback, so "auto" never runs
    something "cuda" would refuse, and never silently."""
    if capability is None:
        return ValueError, f"the CUDA kernels need CUDA tensors, got tensors on {device}"
    if tuple(capability) != (9, 0):
        return RuntimeError, (f"the CUDA kernels are built for sm_90 (Hopper); this GPU is "
                              f"sm_{capability[0]}{capability[1]}")
    if call.dtype not in ("bf16", "fp16"):
        return TypeError, f"the CUDA kernels take torch.bfloat16 or torch.float16, got dtype {call.dtype}"
    if call.head_dim not in HEAD_DIMS:
        return ValueError, (f"head_dim {call.head_dim} is not supported by the CUDA kernels; "
                            f"supported: {HEAD_DIMS}")
    return None


def _fa4_refusal(call: AttnCall, device: torch.device, capability) -> Optional[tuple]:
    """(exception type, problem) saying why flash-attn-4's kernels cannot run `call`, or None
    (FA4 itself missing is asked separately: fa4.require)."""
    if capability is None:
        return ValueError, f"flash-attn-4 needs CUDA tensors, got tensors on {device}"
    if tuple(capability) not in plan_mod.FA4_ARCHS:
        archs = ", ".join(f"sm_{a}{b}" for a, b in plan_mod.FA4_ARCHS)
        return RuntimeError, (f"flash-attn-4 with score functions runs on {archs}; this GPU is "
                              f"sm_{capability[0]}{capability[1]}")
    if call.dtype not in ("bf16", "fp16"):
        return TypeError, f"flash-attn-4 takes torch.bfloat16 or torch.float16, got dtype {call.dtype}"
    if call.head_dim not in plan_mod.FA4_HEAD_DIMS:
        return ValueError, (f"head_dim {call.head_dim} is not supported with flash-attn-4 here; "
                            f"supported: {plan_mod.FA4_HEAD_DIMS}")
    if call.sigmoid_grad == "surrogate":
        return ValueError, ("sigmoid_grad='surrogate' (the coupled block) is our sm_90 kernels'; "
                            "flash-attn-4 runs the 'product' rule")
    return None


def _pick_backend(backend: str, call: AttnCall, device: torch.device, capability) -> str:
    """"cuda", "fa4" or "reference" for attention(backend=...) (see _cuda_refusal, _fa4_refusal)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference":
        return backend
    if backend == "fa4":
        refusal = _fa4_refusal(call, device, capability)
        if refusal is not None:
            exc, problem = refusal
            raise exc(f"backend='fa4': {problem} (backend='reference' runs any dtype, head_dim and device)")
        from . import fa4
        fa4.require()
        return "fa4"
    refusal = _cuda_refusal(call, device, capability)
    if refusal is None:
        return "cuda"
    exc, problem = refusal
    if backend == "cuda":
        raise exc(f"backend='cuda': {problem} (backend='reference' runs any dtype, head_dim and device)")
    if capability is not None and tuple(capability) in plan_mod.FA4_AUTO_ARCHS:
        fa4_refusal = _fa4_refusal(call, device, capability)
        if fa4_refusal is None:
            from . import fa4
            try:
                fa4.require()
                return "fa4"
            except ImportError:
                problem += f"; flash-attn-4 would run it: pip install '{fa4.EXTRA}'"
        else:
            problem += f"; {fa4_refusal[1]}"
    warnings.warn(
        f"flash_attn_poly: {problem}; backend='auto' runs the slow torch reference (exact functions, "
        "not the polynomial programs). Pass backend='reference' to silence this.", stacklevel=3)
    return "reference"


def _capability(t: torch.Tensor):
    """(major, minor) of a CUDA tensor's device; None elsewhere."""
    return torch.cuda.get_device_capability(t.device) if t.is_cuda else None


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=4096)
def _plan(call: AttnCall, sm_count: int):
    """The plan of a call signature (resolved once: the forward, the backward and the custom
    ops of one call all use this plan)."""
    return plan_mod.resolve(call, sm_count)


def plan_for(call: AttnCall, device) -> "plan_mod.AttnPlan":
    return _plan(call, _sm_count(device.index if device.index is not None else torch.cuda.current_device()))


# ------------------------------------------------------------------------------ the API
def attention(q, k, v, mode: str = "softmax", *, causal: bool = True, softcap: Optional[float] = None,
              sigmoid_bias: Optional[float] = None, evaluator: str = "poly",
              softmax_scale: Optional[float] = None, window_size=(-1, -1),
              backend: str = "auto", return_lse: bool = False, deterministic: bool = False,
              program=None, sigmoid_grad: Optional[str] = None, score_mod=None, score_mod_bwd=None,
              aux_tensors=None):
    """Attention over q (B, S_q, H_q, D), k/v (B, S_k, H_kv, D); returns O (B, S_q, H_q, D).

    mode: "softmax" | "softcap" (Gemma-2: logits = softcap * tanh(logits / softcap)) |
    "sigmoid" (O_i = sum_j sigmoid(scale * q_i.k_j + sigmoid_bias) v_j, bias default -ln S_k).
    evaluator: "poly" runs polynomial programs on the FMA pipe for part of the work (the plan's
    rows, flash_attn_poly/plan.py: softcap with BF16 inputs and softcap <= 50 takes P = 2^a on
    the FMA pipe for 1/8 of the key columns, every tanh on MUFU ("exp2_f32_d3", native's error);
    other softcap inputs the FP16 tanh program "softcap_c50_f16_odd" on 1/8 of the columns;
    sigmoid the FP16 program "sigmoid_attn_n4096_f16" on 1/16), "native" the MUFU instructions.
    program: with evaluator="poly", the program to run instead: a name of the committed table
    (flash_attn_poly/data/programs.json; `python -m flash_attn_poly.asm count` lists them, e.g.
    the seed's BF16 "softcap_c50" and "sigmoid_attn_n4096", or a refit "sigmoid_attn_n8192"), or a
    ProgramSpec of any table (`flash_attn_poly.asm.programs.spec(name, table=...)`).  The
    reference backend computes the exact functions and ignores it.
    sigmoid_grad: the sigmoid poly backward's rule: "product" (default: sigma' = p (1 - p)) or
    "surrogate" (the seed's coupled 22-instruction block, B3; programs with a _grad entry).
    score_mod / score_mod_bwd / aux_tensors: a user score function compiled into the kernels
    before the softmax (mode "softmax"), flash-attn-4's signature; see flash_attn_poly.score_mod
    (ScoreMod, and the documented examples alibi() and softcap()).  score_mod_bwd (its
    derivative) is needed when gradients are.
    backend: "auto" (the CUDA kernels where they can run the call; on Blackwell (sm_100,
    sm_103) flash-attn-4's kernels with our score functions; else the torch reference with a
    warning naming why: no sm_90 GPU, FP32 inputs, a head_dim other than 64/128/256), "cuda"
    (an error naming the problem instead), "fa4" (flash-attn-4's kernels, sm_90 or Blackwell,
    with our score functions as its score_mod, flash_attn_poly/fa4.py; needs the extra
    flash-attn-poly[fa4]; head_dim 64/96/128), or "reference" (exact functions in FP32 torch;
    slow, any device, dtype and head_dim).
    return_lse: also return the FP32 natural-log LSE (B, H_q, S_q) (softmax modes only).
    window_size: (left, right) sliding window like flash-attn (-1 = unbounded): query i sees
    keys j with i + S_k - S_q - left <= j <= i + S_k - S_q + right; causal sets right = 0.  A bound
    that masks no key (left >= S_k - 1, right >= S_q - 1) is dropped and window_size=(-1, 0) without
    causal is causal, as flash-attn does: such calls run the unwindowed (causal) kernels.
    head_dim: 64, 128 or 256 on the CUDA backend, forward and backward.
    deterministic: the CUDA backward adds its FP32 partial sums in a fixed order, so the
    gradients are bitwise reproducible run to run (a separate kernel build).
    Non-finite inputs follow the formula in IEEE arithmetic, as torch's own attention math does,
    on both backends: a NaN in q, k or v makes the output rows that see it NaN (never zero rows),
    with a non-finite LSE where q or k holds it, and reaches the gradients of those rows and keys;
    an Inf gives what the formula gives: a +Inf score makes its softmax row NaN (Inf - Inf), a
    -Inf score drops its key, softcap's tanh and sigmoid saturate, an Inf in v reaches O as +-Inf.
    Rows that do not see the element keep their values.  A row that sees no key (causal with
    S_q > S_k, or a window) is zero with LSE -inf.  A NaN or Inf in v may also reach rows of its
    head that do not see its key (P = 0 times it is NaN, as in torch).
    Differentiable; under torch.compile it is a torch custom op
    (`torch.ops.flash_attn_poly.attn_fwd`), traced without graph breaks.
    """
    mod = None
    if score_mod is not None or score_mod_bwd is not None:
        if score_mod is None:
            raise ValueError("score_mod_bwd given without score_mod")
        mod = as_score_mod(score_mod, score_mod_bwd)
    aux = _check_aux(aux_tensors, q) if isinstance(q, torch.Tensor) else ()
    if aux and mod is None:
        raise ValueError("aux_tensors are read by a score_mod: pass score_mod= too")
    aux_meta = tuple((str(t.dtype).removeprefix("torch."), t.dim()) for t in aux)
    call = validate(q, k, v, mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale, window_size,
                    deterministic, program, sigmoid_grad, mod, aux_meta=aux_meta)
    if _bool("return_lse", return_lse) and call.mode == "sigmoid":
        raise ValueError("return_lse: sigmoid attention has no log-sum-exp")
    which = _pick_backend(backend, call, q.device, _capability(q))
    if which == "cuda":
        if call.evaluator == "poly" and call.mode == "sigmoid" and q.dtype != torch.bfloat16:
            _check_sigmoid_program_dtype(call)
    if mod is not None:
        if which == "reference" and mod.reference is None:
            raise ValueError(f"score_mod {mod.name!r} is a CuTe DSL function: backend='reference' needs a torch "
                             "version of it, ScoreMod(fwd, bwd, reference=...)")
        if mod.bwd is None and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError(f"score_mod {mod.name!r} has no derivative and gradients are needed: pass "
                             "score_mod_bwd= (or ScoreMod(fwd, bwd)), or run under torch.no_grad()")
    if which == "fa4":   # FA4's own autograd (flash_attn_func) runs the backward
        from . import fa4
        return fa4.attention(q, k, v, plan_mod.resolve_fa4(call), aux, return_lse)
    if torch.compiler.is_compiling():
        out, lse = torch.ops.flash_attn_poly.attn_fwd(q, k, v, list(aux), *_op_args(call), which)
    else:
        out, lse = _EagerAttn.apply(q, k, v, call, which, *aux)
    return (out, lse) if return_lse else out


def _check_sigmoid_program_dtype(call: AttnCall) -> None:
    """sigmoid/poly writes its block's packed P straight into the PV / dV operand, so FP16
    inputs need an FP16 program (the default); the seed's BF16 program takes BF16 only."""
    if call.program is None:
        return
    spec = call.program if isinstance(call.program, _programs.ProgramSpec) else _programs.spec(call.program)
    if not spec.f16:
        raise ValueError(f"sigmoid/poly program {spec.name!r} writes packed bf16 P: BF16 inputs only "
                         "(FP16 inputs need an FP16 program, e.g. the default 'sigmoid_attn_n4096_f16')")


class _EagerAttn(torch.autograd.Function):
    """attention() outside torch.compile: the custom ops' bodies called directly, with the
    resolved plan in the autograd context (less host work than the custom-op dispatch)."""

    @staticmethod
    def forward(ctx, q, k, v, call: AttnCall, backend: str, *aux):
        p = plan_for(call, q.device) if backend == "cuda" else None
        out, lse = _forward(q, k, v, call, p, backend, aux)
        ctx.call, ctx.plan, ctx.backend, ctx.n_aux = call, p, backend, len(aux)
        ctx.save_for_backward(q, k, v, out, lse, *aux)
        ctx.mark_non_differentiable(lse)
        # no zero-filled gradient for the non-differentiable LSE (a fill launch per backward)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, *aux = ctx.saved_tensors
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        grads = _backward(dout, q, k, v, out, lse, ctx.call, ctx.plan, ctx.backend, aux)
        return (tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:3]))
                + (None, None) + (None,) * ctx.n_aux)


def _forward(q, k, v, call, p, backend, aux):
    if backend == "reference":
        out, lse = _reference_forward(q, k, v, call, aux)
    elif q.numel() == 0:   # no query rows: nothing to compute, and a grid of 0 CTAs is a launch error
        b, s_q, h_q, _ = q.shape
        out, lse = torch.empty_like(q), q.new_empty((b, h_q, s_q), dtype=torch.float32)
    else:
        from .kernels import dispatch
        out, lse = dispatch.forward(p, q, k, v, aux)
    return out, (q.new_empty((0,), dtype=torch.float32) if lse is None or call.mode == "sigmoid" else lse)


def _backward(dout, q, k, v, out, lse, call, p, backend, aux):
    if backend == "reference":
        return _reference_backward(dout, q, k, v, call, aux)
    if q.numel() == 0:   # no query rows: no (query, key) pair, every gradient is zero; no launch
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    from .kernels import dispatch
    return dispatch.backward(p, dout, q, k, v, out, lse, aux)


# ------------------------------------------------------------------------------ custom ops
def _op_args(call: AttnCall) -> tuple:
    """The call's options as the custom ops' arguments (shapes and dtype come from the tensors)."""
    prog = "" if call.program is None else (call.program if isinstance(call.program, str)
                                            else call.program.json_text)
    return (call.mode, call.evaluator, call.causal, call.softcap or 0.0,
            math.nan if call.sigmoid_bias is None else call.sigmoid_bias, call.softmax_scale,
            list(call.window), call.deterministic, prog, call.sigmoid_grad or "",
            "" if call.score_mod is None else call.score_mod.key)


def _call_from_op(q, k, aux, mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale, window,
                  deterministic, program, sigmoid_grad, score_mod) -> AttnCall:
    if program.startswith("{"):
        program = _programs.from_json(program)
    b, s_q, h_q, d = q.shape
    return AttnCall(mode=mode, evaluator=evaluator, dtype=_DTYPE_NAMES[q.dtype], head_dim=d, batch=b,
                    seqlen_q=s_q, seqlen_k=k.shape[1], heads_q=h_q, heads_kv=k.shape[2], causal=causal,
                    window=tuple(window), softmax_scale=softmax_scale,
                    softcap=softcap if mode == "softcap" else None,
                    sigmoid_bias=None if math.isnan(sigmoid_bias) else sigmoid_bias,
                    program=program or None, deterministic=deterministic, sigmoid_grad=sigmoid_grad or None,
                    score_mod=_score_mod_by_key(score_mod) if score_mod else None,
                    aux=tuple((str(t.dtype).removeprefix("torch."), t.dim()) for t in aux))


@torch.library.custom_op("flash_attn_poly::attn_fwd", mutates_args=())
def _attn_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, aux: list[torch.Tensor], mode: str,
                 evaluator: str, causal: bool, softcap: float, sigmoid_bias: float, softmax_scale: float,
                 window_size: list[int], deterministic: bool, program: str, sigmoid_grad: str,
                 score_mod: str, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    call = _call_from_op(q, k, aux, mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale,
                         window_size, deterministic, program, sigmoid_grad, score_mod)
    p = plan_for(call, q.device) if backend == "cuda" else None
    return _forward(q, k, v, call, p, backend, tuple(aux))


@_attn_fwd_op.register_fake
def _attn_fwd_fake(q, k, v, aux, mode, *rest):
    b, s_q, h_q, _ = q.shape
    lse_shape = (0,) if mode == "sigmoid" else (b, h_q, s_q)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flash_attn_poly::attn_bwd", mutates_args=())
def _attn_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, aux: list[torch.Tensor], mode: str, evaluator: str,
                 causal: bool, softcap: float, sigmoid_bias: float, softmax_scale: float,
                 window_size: list[int], deterministic: bool, program: str, sigmoid_grad: str,
                 score_mod: str, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    call = _call_from_op(q, k, aux, mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale,
                         window_size, deterministic, program, sigmoid_grad, score_mod)
    p = plan_for(call, q.device) if backend == "cuda" else None
    return _backward(dout, q, k, v, out, lse, call, p, backend, tuple(aux))


@_attn_bwd_op.register_fake
def _attn_bwd_fake(dout, q, k, v, out, lse, aux, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, aux, *rest = inputs
    ctx.rest = rest   # the forward op's options: the backward op's tail
    ctx.n_aux = len(aux)
    ctx.save_for_backward(q, k, v, *output, *aux)


def _op_backward(ctx, dout, _dlse):
    q, k, v, out, lse, *aux = ctx.saved_tensors
    dq, dk, dv = _attn_bwd_op(dout.contiguous(), q, k, v, out, lse, list(aux), *ctx.rest)
    need = ctx.needs_input_grad
    return ((dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, [None] * ctx.n_aux)
            + (None,) * len(ctx.rest))


_attn_fwd_op.register_autograd(_op_backward, setup_context=_setup_context)


# ------------------------------------------------------------------------------ reference backend
def _index_grids(q, k):
    """Broadcastable (batch, head, q_idx, kv_idx) index tensors of the (B, H, S_q, S_k) scores."""
    b, s_q, h_q, _ = q.shape
    s_k = k.shape[1]
    dev = q.device
    return (torch.arange(b, device=dev).view(b, 1, 1, 1), torch.arange(h_q, device=dev).view(1, h_q, 1, 1),
            torch.arange(s_q, device=dev).view(1, 1, s_q, 1), torch.arange(s_k, device=dev).view(1, 1, 1, s_k))


def _user_fns(call: AttnCall, q, k, aux):
    """(score_fn, score_grad_fn) of a user score_mod's torch reference for reference.attention_ref."""
    if call.score_mod is None:
        return None, None
    ref = call.score_mod.reference
    grids = _index_grids(q, k)
    aux = list(aux)

    def fn(x):
        return ref(x, *grids, aux)

    def grad(x):
        with torch.enable_grad():
            xr = x.detach().requires_grad_()
            (g,) = torch.autograd.grad(fn(xr).sum(), xr)
        return g

    return fn, grad


def _reference_forward(q, k, v, call: AttnCall, aux=()):
    fn, _ = _user_fns(call, q, k, aux)
    out, lse = reference.attention_ref(
        q, k, v, call.mode, causal=call.causal, softcap=call.softcap, sigmoid_bias=call.sigmoid_bias,
        softmax_scale=call.softmax_scale, window_size=call.window, dtype=torch.float32, score_fn=fn)
    return out.to(q.dtype).contiguous(), None if lse is None else lse.float().contiguous()


def _reference_backward(dout, q, k, v, call: AttnCall, aux=()):
    """Gradients by the reference's explicit backward formulas, in FP32."""
    fn, grad = _user_fns(call, q, k, aux)
    grads = reference.attention_ref_backward(
        dout, q, k, v, call.mode, causal=call.causal, softcap=call.softcap, sigmoid_bias=call.sigmoid_bias,
        softmax_scale=call.softmax_scale, window_size=call.window, dtype=torch.float32,
        score_fn=fn, score_grad_fn=grad)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
