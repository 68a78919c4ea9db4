"""Public attention entry point: validation, dispatch, autograd.

Everything a user can get wrong is checked here, before any kernel is compiled, with a
message that names the problem. Kernels live in `flash_attn_poly.kernels`; this module
only decides which one runs.
"""
from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from . import reference
from .activations import needs_grad
from .asm import programs as _programs

MODES = ("softmax", "softcap", "sigmoid")
EVALUATORS = ("poly", "native")
BACKENDS = ("auto", "cuda", "reference")
DTYPES = (torch.bfloat16, torch.float16)          # what the CUDA kernels take
REFERENCE_DTYPES = DTYPES + (torch.float32,)       # the reference backend also takes FP32
HEAD_DIMS = (64, 128, 256)     # forward and backward


@dataclass(frozen=True)
class AttnArgs:
    """Validated call: everything a kernel needs besides the tensors."""
    mode: str
    evaluator: str
    causal: bool
    softcap: Optional[float]
    sigmoid_bias: Optional[float]
    softmax_scale: float
    window_size: tuple[int, int]
    deterministic: bool = False   # backward adds in a fixed order (CUDA backend)
    # poly evaluator's program: a committed table entry's name or a ProgramSpec (None: default)
    program: Optional[object] = None


def _check_tensors(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in REFERENCE_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: torch.bfloat16, torch.float16 "
                            "(and torch.float32 with backend='reference')")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension, got strides {t.stride()}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
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
    if isinstance(program, str) and not _is_program_of(mode, program):
        known = _programs.names(mode=mode, derivative=False)
        raise ValueError(f"program {program!r} is not a {mode} program of the coefficient table; known: {known}")
    if not isinstance(program, str) and program.mode != mode:
        what = "a derivative program" if program.derivative else f"target {program.target!r}"
        raise ValueError(f"program {label!r} ({what}) is not a {mode} program; {mode} programs run targets "
                         f"{_programs.MODE_TARGETS[mode]} (committed table: "
                         f"{_programs.names(mode=mode, derivative=False)})")


@torch.compiler.assume_constant_result
def _is_program_of(mode: str, name: str) -> bool:
    """Is `name` a forward program of mode in the committed table?  A constant under
    torch.compile (the table is read when tracing, not traced)."""
    return name in _programs.names(mode=mode, derivative=False)


def _check_options(mode, evaluator, softcap, sigmoid_bias, window_size) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if evaluator not in EVALUATORS:
        raise ValueError(f"evaluator must be one of {EVALUATORS}, got {evaluator!r}")
    if mode == "softcap":
        if softcap is None or not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"mode='softcap' needs a finite softcap > 0 (Gemma-2 uses 50.0), got {softcap!r}")
    elif softcap is not None:
        raise ValueError(f"softcap={softcap!r} is only meaningful with mode='softcap' (got mode={mode!r})")
    if sigmoid_bias is not None:
        if mode != "sigmoid":
            raise ValueError(f"sigmoid_bias is only meaningful with mode='sigmoid' (got mode={mode!r})")
        if not math.isfinite(sigmoid_bias):
            raise ValueError(f"sigmoid_bias must be finite, got {sigmoid_bias!r}")
    if len(window_size) != 2 or any(not isinstance(w, int) or w < -1 for w in window_size):
        raise ValueError(f"window_size must be (left, right) ints >= -1 (-1 = unbounded), got {window_size!r}")


def validate(q, k, v, mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale,
             window_size=(-1, -1), deterministic=False, program=None) -> AttnArgs:
    _check_tensors(q, k, v)
    _check_options(mode, evaluator, softcap, sigmoid_bias, tuple(window_size))
    _check_program(mode, evaluator, program)
    if not isinstance(deterministic, bool):
        # a truthy string or tensor here is almost surely a misplaced argument
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale!r}")
    if program is None and evaluator == "poly" and mode in _programs.MODE_TARGETS:
        program = _default_program(mode, q.dtype, softcap)
    return AttnArgs(mode, evaluator, bool(causal), None if softcap is None else float(softcap),
                    None if sigmoid_bias is None else float(sigmoid_bias), scale, tuple(window_size),
                    deterministic, program)


@functools.lru_cache(maxsize=None)
def _default_program(mode: str, dtype: torch.dtype, softcap) -> Optional[str]:
    """kernels/score_stages.default_program for these inputs (None where the kernels are not
    installed: the reference backend ignores the program).  Cached: validate runs per call, and
    without the kernels a failed import would be retried every time."""
    try:
        from .kernels import score_stages
    except ImportError:
        return None
    return score_stages.default_program(mode, "bf16" if dtype == torch.bfloat16 else "f16", softcap)


def _pick_backend(q: torch.Tensor, backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    if q.is_cuda and torch.cuda.get_device_capability(q.device) == (9, 0):
        return "cuda"
    warnings.warn(
        f"flash_attn_poly: no sm_90 GPU for tensors on {q.device}; running the slow torch reference "
        "(exact functions, not the polynomial programs). Pass backend='reference' to silence this.",
        stacklevel=3)
    return "reference"


def _check_cuda_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: AttnArgs) -> None:
    if not q.is_cuda:
        raise ValueError(f"backend='cuda' needs CUDA tensors, got {q.device}")
    if q.dtype not in DTYPES:
        raise TypeError(f"the CUDA kernels take torch.bfloat16 or torch.float16, got {q.dtype}; "
                        "use backend='reference' for FP32")
    cap = torch.cuda.get_device_capability(q.device)
    if cap != (9, 0):
        raise RuntimeError(f"the CUDA kernels are built for sm_90 (Hopper); this GPU is sm_{cap[0]}{cap[1]}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head_dim {q.shape[-1]} is not supported by the CUDA kernels; supported: {HEAD_DIMS}")
    check_program_dtype(q.dtype, a)


def check_program_dtype(dtype: torch.dtype, a: AttnArgs) -> None:
    """sigmoid/poly writes its block's packed P straight into the PV / dV operand, so FP16
    inputs need an FP16 program (the default); the seed's BF16 program takes BF16 only."""
    if a.mode == "sigmoid" and a.evaluator == "poly" and dtype != torch.bfloat16:
        from .kernels import score_stages
        score_stages.check_sigmoid_dtype(a.evaluator, a.program or score_stages.DEFAULT_PROGRAM["sigmoid"],
                                         False)


def attention(q, k, v, mode: str = "softmax", *, causal: bool = True, softcap: Optional[float] = None,
              sigmoid_bias: Optional[float] = None, evaluator: str = "poly",
              softmax_scale: Optional[float] = None, window_size=(-1, -1),
              backend: str = "auto", return_lse: bool = False, deterministic: bool = False,
              program=None):
    """Attention over q (B, S_q, H_q, D), k/v (B, S_k, H_kv, D); returns O (B, S_q, H_q, D).

    mode: "softmax" | "softcap" (Gemma-2: logits = softcap * tanh(logits / softcap)) |
    "sigmoid" (O_i = sum_j sigmoid(scale * q_i.k_j + sigmoid_bias) v_j, bias default -ln S_k).
    evaluator: "poly" runs a polynomial program on the FMA pipe for part of the key columns
    (the rest on MUFU; kernels/score_stages.default_poly_split: softcap 1/8, sigmoid 1/16, 1/8
    at D = 256), "native" the MUFU instructions.
    program: with evaluator="poly", the program to run: a name of the committed coefficient table
    (flash_attn_poly/data/programs.json), or a ProgramSpec of any table, e.g. a refit
    `flash_attn_poly.asm.programs.spec("sigmoid_attn_n8192", table=load_table(path))` (None: the
    default for the inputs, kernels/score_stages.default_program). Softcap with BF16 inputs and
    softcap <= 50: "exp2_f32_d3", the exp2 offload. Every tanh stays on MUFU, and P = 2^a comes
    from an FP32 degree-3 polynomial (fit/exp2.py) for 1/8 of the columns of the mask-free key
    blocks. Its error is native's (1.00x at every spread, bench/results/accuracy_softcap.md). Its
    forward is 1.04x faster than native's at the anchor shape (gqa_4096_pairs.md), and its
    backward is the native one. Softcap otherwise (FP16 inputs, larger caps): packed-FP16
    "softcap_c50_f16_odd". This evaluates the residual u - tanh u as an odd polynomial in u, with
    the clamp on the FMA pipe, on 1/8 of the columns. Its error is native's at score std ~12 and
    1.3-1.8x native's at a saturating std ~20 (accuracy_softcap.md). Sigmoid: packed-FP16
    "sigmoid_attn_n4096_f16" (D4). Softcap also has:
      - "softcap_c50_f16" (D5 in |u|, 1.2-1.7x at std ~20);
      - "softcap_c50_f16_tail" (two regions: D5 residual below |x/c| = 1, 1 - tanh above; 1.03x
        native's error at std ~20; its backward is slower at D = 256: poly_split_r16.md,
        gemma2_d256_programs.md).
    The seed's packed-BF16 programs are "softcap_c50" (D4) and "sigmoid_attn_n4096" (D3). They
    are several times less accurate at wide score spreads (bench/results/poly_split.md). The
    reference backend always computes the exact functions and ignores program.
    backend: "auto" (CUDA kernels on sm_90, else the torch reference with a warning),
    "cuda", or "reference" (exact functions in FP32 torch; slow, any device).
    return_lse: also return the FP32 natural-log LSE (B, H_q, S_q) (softmax modes only).
    window_size: (left, right) sliding window like flash-attn (-1 = unbounded): query i sees
    keys j with i + S_k - S_q - left <= j <= i + S_k - S_q + right; causal sets right = 0.
    head_dim: 64, 128 or 256, forward and backward (the D = 256 backward recomputes the
    scores once per 128-column chunk of the gradients: docs/NOTES_attn_bwd.md).
    deterministic: the CUDA backward adds its FP32 partial sums in a fixed order, so the
    gradients are bitwise reproducible run to run (a separate kernel build; slower where
    CTAs wait for their turn).  The forward and the reference backend are deterministic
    already and ignore it.
    Differentiable; under torch.compile it is a torch custom op
    (`torch.ops.flash_attn_poly.attn_fwd`), traced without graph breaks (eagerly a
    torch.autograd.Function runs the same kernels with less host work).
    """
    a = validate(q, k, v, mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale, window_size,
                 deterministic, program)
    if return_lse and a.mode == "sigmoid":
        raise ValueError("return_lse: sigmoid attention has no log-sum-exp")
    which = _pick_backend(q, backend)
    if which == "cuda":
        _check_cuda_support(q, k, v, a)
    bias = a.sigmoid_bias if a.sigmoid_bias is not None else reference.default_sigmoid_bias(k.shape[1])
    if torch.compiler.is_compiling():
        out, lse = torch.ops.flash_attn_poly.attn_fwd(
            q, k, v, a.mode, a.evaluator, a.causal, a.softcap or 0.0, bias, a.softmax_scale,
            list(a.window_size), which, a.deterministic, _program_arg(a.program))
    else:
        op_args = _args_from_op(a.mode, a.evaluator, a.causal, a.softcap, bias, a.softmax_scale,
                                a.window_size, a.deterministic, a.program)
        out, lse = _EagerAttn.apply(q, k, v, op_args, which)
    return (out, lse) if return_lse else out


class _EagerAttn(torch.autograd.Function):
    """attention() outside torch.compile: the custom ops' forward and backward bodies called
    directly.  Same kernels, same arguments, without the two custom-op dispatches (torch's
    Python layers around a custom op: softmax backward host time 325 -> 218 us per call on
    the H200 host, bench/results/host_cost.md).  Under torch.compile, attention() uses the
    custom ops, which trace without graph breaks."""

    @staticmethod
    def forward(ctx, q, k, v, a: AttnArgs, backend: str):
        out, lse = _reference_forward(q, k, v, a) if backend == "reference" else _cuda_forward(q, k, v, a)
        lse = _lse_or_empty(q, lse)
        ctx.a, ctx.backend = a, backend
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        # no zero-filled gradient for the non-differentiable LSE (a fill launch per backward)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        grads = (_reference_backward(dout, q, k, v, ctx.a) if ctx.backend == "reference"
                 else _cuda_backward(dout, q, k, v, out, lse, ctx.a))
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:3])) + (None, None)


def _args_from_op(mode, evaluator, causal, softcap, bias, scale, window, deterministic=False,
                  program="") -> AttnArgs:
    return AttnArgs(mode, evaluator, causal, softcap if mode == "softcap" else None,
                    bias if mode == "sigmoid" else None, scale, tuple(window), deterministic,
                    _program_from_arg(program))


def _program_arg(program) -> str:
    """AttnArgs.program as the custom ops' str argument: "" (none), a committed table's name,
    or a ProgramSpec's JSON (its content: the ops stay traceable with a program of any table)."""
    if program is None:
        return ""
    return program if isinstance(program, str) else program.json_text


def _program_from_arg(program):
    """The inverse of _program_arg (a ProgramSpec or None passes through)."""
    if not program:
        return None
    if isinstance(program, str) and program.startswith("{"):
        return _programs.from_json(program)
    return program


@torch.library.custom_op("flash_attn_poly::attn_fwd", mutates_args=())
def _attn_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str, evaluator: str,
                 causal: bool, softcap: float, sigmoid_bias: float, softmax_scale: float,
                 window_size: list[int], backend: str,
                 deterministic: bool = False, program: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    # deterministic only matters to the backward op (it gets it via the autograd context)
    a = _args_from_op(mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale, window_size,
                      program=program)
    out, lse = _reference_forward(q, k, v, a) if backend == "reference" else _cuda_forward(q, k, v, a)
    return out, _lse_or_empty(q, lse)


@_attn_fwd_op.register_fake
def _attn_fwd_fake(q, k, v, mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale,
                   window_size, backend, deterministic=False, program=""):
    b, s_q, h_q, _ = q.shape
    lse_shape = (0,) if mode == "sigmoid" else (b, h_q, s_q)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flash_attn_poly::attn_bwd", mutates_args=())
def _attn_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, mode: str, evaluator: str, causal: bool,
                 softcap: float, sigmoid_bias: float, softmax_scale: float, window_size: list[int],
                 backend: str, deterministic: bool = False,
                 program: str = "") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = _args_from_op(mode, evaluator, causal, softcap, sigmoid_bias, softmax_scale, window_size,
                      deterministic, program)
    if backend == "reference":
        return _reference_backward(dout, q, k, v, a)
    return _cuda_backward(dout, q, k, v, out, lse, a)


@_attn_bwd_op.register_fake
def _attn_bwd_fake(dout, q, k, v, out, lse, mode, evaluator, causal, softcap, sigmoid_bias,
                   softmax_scale, window_size, backend, deterministic=False, program=""):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, *rest = inputs
    ctx.rest = rest   # the forward op's options (deterministic last): the backward op's tail
    ctx.save_for_backward(q, k, v, *output)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _attn_bwd_op(dout.contiguous(), q, k, v, out, lse, *ctx.rest)
    need = ctx.needs_input_grad
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + (None,) * len(ctx.rest)


_attn_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def _lse_or_empty(q, lse):
    return q.new_empty((0,), dtype=torch.float32) if lse is None else lse


def _reference_forward(q, k, v, a: AttnArgs):
    out, lse = reference.attention_ref(
        q, k, v, a.mode, causal=a.causal, softcap=a.softcap, sigmoid_bias=a.sigmoid_bias,
        softmax_scale=a.softmax_scale, window_size=a.window_size, dtype=torch.float32)
    return out.to(q.dtype).contiguous(), None if lse is None else lse.float().contiguous()


def _reference_backward(dout, q, k, v, a: AttnArgs):
    """Gradients by the reference's explicit backward formulas, in FP32."""
    grads = reference.attention_ref_backward(
        dout, q, k, v, a.mode, causal=a.causal, softcap=a.softcap, sigmoid_bias=a.sigmoid_bias,
        softmax_scale=a.softmax_scale, window_size=a.window_size, dtype=torch.float32)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


def _cuda_forward(q, k, v, a: AttnArgs):
    if q.numel() == 0:   # no query rows (batch, seqlen_q or heads 0): nothing to compute, and a
        # grid of 0 CTAs is a CUDA launch error
        b, s_q, h_q, _ = q.shape
        lse = None if a.mode == "sigmoid" else q.new_empty((b, h_q, s_q), dtype=torch.float32)
        return torch.empty_like(q), lse
    from .kernels import attn_fwd_sm90
    return attn_fwd_sm90.attn_fwd(q, k, v, mode=a.mode, evaluator=a.evaluator, causal=a.causal,
                                  softcap=a.softcap, sigmoid_bias=a.sigmoid_bias,
                                  softmax_scale=a.softmax_scale, window_size=a.window_size,
                                  program=a.program)


def _cuda_backward(dout, q, k, v, out, lse, a: AttnArgs):
    if q.numel() == 0:   # no query rows: no (query, key) pair, every gradient is zero; no launch
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    try:
        from .kernels import attn_bwd_sm90
    except ImportError as e:
        raise NotImplementedError("the CUDA attention backward is not available in this build") from e
    return attn_bwd_sm90.attn_bwd(dout, q, k, v, out, lse, mode=a.mode, evaluator=a.evaluator,
                                  causal=a.causal, softcap=a.softcap, sigmoid_bias=a.sigmoid_bias,
                                  softmax_scale=a.softmax_scale, window_size=a.window_size,
                                  deterministic=a.deterministic, program=a.program)
