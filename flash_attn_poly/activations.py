"""Polynomial SiLU and fused SwiGLU for torch: validation, custom ops, autograd, modules.

``silu(x, evaluator="poly")``: x * p(x) with the packed D3 sigmoid program ``sigmoid_d3``
(BF16); backward recomputes p and applies dx = g * (p + x*p*(1-p)).
``evaluator="native"`` runs the same kernel with the SFU sigmoid (tanh.approx), the
comparator that isolates the evaluator.

``swiglu(gate, up)`` / ``swiglu(gate_up)``: silu(gate) * up in one kernel, no
intermediate; the backward writes d_gate and d_up in one kernel.  ``gate_up`` is the
concatenated ``[..., 2H]`` output of a fused gate-up projection (gate first).

``geglu(gate, up)``: gelu(gate) * up, Gemma-2's MLP (``gelu_pytorch_tanh``), with the same
structure: the packed D4 GELU program ``gelu_d4`` forward, and its directly fitted derivative
``gelu_d4_grad`` beside the value in the backward (the programs are fitted to the erf GELU,
3-5% of their own error away from the tanh form: asm/blocks.py); ``"native"`` computes the
tanh form in FP32 with one SFU tanh.

The public functions are torch custom ops (``flash_attn_poly::*``) with fake
implementations, so ``torch.compile`` traces them without graph breaks.  The kernels take
contiguous BF16 CUDA tensors on sm_90; ``backend`` picks as attention() does: "auto" runs
them where they can and otherwise the torch reference (exact function in FP32, any device,
BF16/FP16/FP32) with a warning naming why, "cuda" raises that reason instead, "reference"
always runs torch.  A bad tensor, dtype, shape, evaluator or backend raises
``TypeError``/``ValueError`` naming it, whatever the device.  A contiguous view that is not
16-byte aligned (e.g. ``x[1:]``) is copied once to an aligned buffer.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LIB = "flash_attn_poly"
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
_MAX_NUMEL = 2**31 - 1     # the kernels index with 32-bit integers
_ALIGN = 16                # bytes: one 128-bit load per 8 values


# ---- validation ------------------------------------------------------------------------

BACKENDS = ("auto", "cuda", "reference")
REFERENCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)   # the torch reference's


def _check_tensor(name: str, t, dtypes=REFERENCE_DTYPES) -> None:
    """What every backend needs: a tensor of a supported dtype (the device comes later)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {allowed}")


def _check_layout(name: str, t: Tensor) -> None:
    """What the kernels need of a tensor's layout: contiguous, 32-bit indexable."""
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {tuple(t.stride())}); call "
                         ".contiguous() first, or pass the fused [gate | up] tensor to swiglu")
    if t.numel() > _MAX_NUMEL:
        raise ValueError(f"{name} has {t.numel()} elements; at most {_MAX_NUMEL} are supported")


def _check(name: str, t, dtypes=(torch.bfloat16,)) -> None:
    """A kernel input without a reference path (the FP16 sweeps): every check, device included."""
    _check_tensor(name, t, dtypes)
    if t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}; the polynomial kernels need a CUDA tensor")
    _check_layout(name, t)


def _same_shape(a_name: str, a: Tensor, b_name: str, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{a_name} {tuple(a.shape)} and {b_name} {tuple(b.shape)} differ in shape")
    if a.dtype != b.dtype:
        raise TypeError(f"{a_name} and {b_name} must share one dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"{a_name} is on {a.device} but {b_name} is on {b.device}")


def _check_gate_up(gate, up) -> None:
    """The two inputs of a gated activation: tensors of one shape, dtype and device."""
    _check_tensor("gate", gate)
    _check_tensor("up", up)
    _same_shape("gate", gate, "up", up)


def _evaluator(evaluator: str) -> str:
    if evaluator not in ("poly", "native"):
        raise ValueError(f"evaluator must be 'poly' or 'native', got {evaluator!r}")
    return evaluator


def _backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple:
    return torch.cuda.get_device_capability(device_index)


def _cuda_refusal(name: str, t: Tensor, capability):
    """(exception type, problem) saying why the kernels cannot take `t`, or None when they can.
    capability: its device's (major, minor), None off CUDA.  Layout (contiguity, size) is no
    reason: the caller fixes it cheaply, so it stays an error under backend="auto" too."""
    if capability is None:
        return ValueError, f"{name} is on {t.device}; the polynomial kernels need a CUDA tensor"
    if tuple(capability) != (9, 0):
        return RuntimeError, (f"the polynomial kernels are built for sm_90 (Hopper); this GPU is "
                              f"sm_{capability[0]}{capability[1]}")
    if t.dtype != torch.bfloat16:
        return TypeError, f"{name} has dtype {t.dtype}; the polynomial kernels take torch.bfloat16"
    return None


def _pick_backend(fn: str, backend: str, name: str, t: Tensor, capability) -> str:
    """"cuda" or "reference" for fn(backend=...); `t` stands for the inputs (one device and
    dtype, checked before).  backend="cuda" raises the refusal, "auto" warns with it and runs
    the reference, as attention() does."""
    if backend == "reference":
        return backend
    refusal = _cuda_refusal(name, t, capability)
    if refusal is None:
        return "cuda"
    exc, problem = refusal
    if backend == "cuda":
        raise exc(f"{fn}(backend='cuda'): {problem} (backend='reference' runs any device and float dtype)")
    warnings.warn(f"flash_attn_poly.{fn}: {problem}; backend='auto' runs the torch reference (exact "
                  "function, not the polynomial program). Pass backend='reference' to silence this.",
                  stacklevel=4)
    return "reference"


def _which(fn: str, backend: str, name: str, t: Tensor) -> str:
    if backend == "reference":
        return backend
    if not t.is_cuda:
        cap = None
    elif torch.compiler.is_compiling():   # traced as attention() does it (no lru_cache under dynamo)
        cap = torch.cuda.get_device_capability(t.device)
    else:                                 # eager hot path: the properties lookup costs microseconds
        cap = _capability(t.get_device())
    return _pick_backend(fn, backend, name, t, cap)


# ---- torch reference -------------------------------------------------------------------
# The exact functions in FP32, rounded once to the input dtype; torch autograd differentiates
# them (the evaluator is ignored: there is no program to run).

def _silu_ref(x: Tensor) -> Tensor:
    return F.silu(x.float()).to(x.dtype)


def _swiglu_ref(gate: Tensor, up: Tensor) -> Tensor:
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


def _geglu_ref(gate: Tensor, up: Tensor) -> Tensor:
    return (F.gelu(gate.float(), approximate="tanh") * up.float()).to(gate.dtype)


# ---- launching -------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _aligned(t: Tensor) -> Tensor:
    t = t.contiguous()
    return t if t.data_ptr() % _ALIGN == 0 else t.clone()


@functools.lru_cache(maxsize=None)
def _key(kind: str, dtype: str, evaluator: str, layout: str):
    """The kernel's compile key per configuration.  Memoised here because building it
    (program bits from the table) costs ~100 us, more than a 4M-element kernel runs; the
    compiled kernel itself lives in kernels/compile_cache.py."""
    from flash_attn_poly.kernels import elementwise as ew

    return ew.ElementwiseKey(kind, dtype, evaluator, layout, ew.program_bits(kind, dtype, evaluator))


def _compiled(key):
    """The compiled kernel of an ElementwiseKey (kernels/compile_cache.py)."""
    return _ew().get_compiled(key)


@functools.lru_cache(maxsize=None)
def _ew():
    from flash_attn_poly.kernels import elementwise as ew

    return ew


@functools.lru_cache(maxsize=4096)   # per (n, kind, device): bounded, n varies
def _grid(n: int, kind: str, device_index: int) -> int:
    from flash_attn_poly.kernels.elementwise import CHUNK, GRID_POLICY, ElementwiseKernel, grid_size

    return grid_size(n // CHUNK, ElementwiseKernel.unroll_for(kind), _sm_count(device_index),
                     GRID_POLICY.get(kind, "default"))


def launch(kind: str, dtype: str, evaluator: str, ins: list, outs: list,
           layout: str = "flat", h: int = 0) -> None:
    """Run the compiled kernel for (kind, dtype, evaluator, layout) on flat views.

    `ins`/`outs`: contiguous tensors (any shape); `h`: half-row width for concat.
    Torch tensors and ints go straight into the tvm-ffi build (kernels/compile_cache.py)."""
    from flash_attn_poly.kernels.elementwise import CHUNK

    cfg = (kind, dtype, evaluator, layout)
    n = outs[0].numel() if layout == "flat" else outs[0].numel() // (2 if kind.endswith("bwd") else 1)
    if n == 0:
        return
    ints = (n, max(h // CHUNK, 1), _grid(n, kind, outs[0].device.index or 0))
    flat_in = [_aligned(t).view(-1) for t in ins]
    flat_out = [t.view(-1) for t in outs]
    flat_in += [flat_in[0]] * (3 - len(flat_in))      # unused slots: never touched
    flat_out += [flat_out[0]] * (2 - len(flat_out))
    _compiled(_key(*cfg))(*flat_in, *flat_out, *ints)


_FAST: dict = {}    # (kind, dtype, evaluator, layout, n, h, device index) -> (compile key, ints)


def _launch_fast(kind: str, dtype: str, evaluator: str, ins: list, outs: list,
                 layout: str = "flat", h: int = 0) -> None:
    """launch() with the per-shape work cached: grid, ints and the compile key are computed
    once per (config, numel, h, device); per call only the alignment test of the inputs,
    the flat views and the compiled-kernel lookup (a dict hit) remain."""
    out0 = outs[0]
    numel = out0.numel()
    if numel == 0:
        return
    dev = out0.get_device()
    key = (kind, dtype, evaluator, layout, numel, h, dev)
    hit = _FAST.get(key)
    if hit is None:
        from flash_attn_poly.kernels.elementwise import CHUNK

        n = numel if layout == "flat" else numel // (2 if kind.endswith("bwd") else 1)
        hit = (_key(kind, dtype, evaluator, layout),
               (n, max(h // CHUNK, 1), _grid(n, kind, max(dev, 0))))
        _FAST[key] = hit
    ew_key, ints = hit
    # inputs are contiguous (checked / .contiguous() by the callers); views only when
    # not already 1-D, and one view per distinct tensor (concat passes gate_up twice)
    flat_in = [t if t.data_ptr() % _ALIGN == 0 else t.clone() for t in ins]
    if ins[0].dim() != 1:
        flat_in = [flat_in[0].view(-1)] * 2 if len(ins) == 2 and ins[0] is ins[1] \
            else [t.view(-1) for t in flat_in]
        outs = [outs[0].view(-1)] * 2 if len(outs) == 2 and outs[0] is outs[1] \
            else [t.view(-1) for t in outs]
    flat_in = flat_in + [flat_in[0]] * (3 - len(flat_in))      # unused slots: never touched
    tensors = flat_in + (outs if len(outs) == 2 else [outs[0], outs[0]])
    _compiled(ew_key)(*tensors, *ints)


def _concat_ok(gate_up: Tensor) -> bool:
    """The concat kernel needs H % 8 == 0 so both halves stay 16-byte aligned."""
    return (gate_up.shape[-1] // 2) % 8 == 0


# ---- custom ops ------------------------------------------------------------------------

@torch.library.custom_op(f"{_LIB}::silu_fwd", mutates_args=())
def _silu_fwd(x: Tensor, evaluator: str) -> Tensor:
    y = torch.empty_like(x)
    launch("silu_fwd", "bf16", evaluator, [x], [y])
    return y


@_silu_fwd.register_fake
def _(x, evaluator):
    return torch.empty_like(x)


@torch.library.custom_op(f"{_LIB}::silu_bwd", mutates_args=())
def _silu_bwd(x: Tensor, grad: Tensor, evaluator: str) -> Tensor:
    dx = torch.empty_like(x)
    launch("silu_bwd", "bf16", evaluator, [x, grad], [dx])
    return dx


@_silu_bwd.register_fake
def _(x, grad, evaluator):
    return torch.empty_like(x)


def _save_tensors_and_evaluator(ctx, inputs, output):
    """Every activation op is (tensor inputs..., evaluator): backward needs exactly the inputs."""
    ctx.save_for_backward(*inputs[:-1])
    ctx.evaluator = inputs[-1]


def _silu_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return _silu_bwd(x, grad.contiguous(), ctx.evaluator), None


torch.library.register_autograd(f"{_LIB}::silu_fwd", _silu_backward, setup_context=_save_tensors_and_evaluator)


@dataclasses.dataclass(frozen=True)
class _Gated:
    """A gated activation f(gate) * up over two tensors of one shape: its kernel kinds
    (``fwd_kind``: (gate, up) -> y; ``bwd_kind``: (gate, up, grad) -> (d_gate, d_up)) and
    their custom ops."""
    fwd_kind: str
    bwd_kind: str
    fwd_op: object
    bwd_op: object


def _gated_ops(name: str) -> _Gated:
    """Register ``flash_attn_poly::{name}_fwd`` / ``{name}_bwd`` for the kernels of the same
    kinds, their fakes and the forward op's autograd (the backward op on the saved inputs)."""
    fwd_kind, bwd_kind = f"{name}_fwd", f"{name}_bwd"

    @torch.library.custom_op(f"{_LIB}::{fwd_kind}", mutates_args=())
    def fwd_op(gate: Tensor, up: Tensor, evaluator: str) -> Tensor:
        y = torch.empty_like(gate)
        launch(fwd_kind, "bf16", evaluator, [gate, up], [y])
        return y

    @fwd_op.register_fake
    def _(gate, up, evaluator):
        return torch.empty_like(gate)

    @torch.library.custom_op(f"{_LIB}::{bwd_kind}", mutates_args=())
    def bwd_op(gate: Tensor, up: Tensor, grad: Tensor, evaluator: str) -> tuple[Tensor, Tensor]:
        d_gate, d_up = torch.empty_like(gate), torch.empty_like(up)
        launch(bwd_kind, "bf16", evaluator, [gate, up, grad], [d_gate, d_up])
        return d_gate, d_up

    @bwd_op.register_fake
    def _(gate, up, grad, evaluator):
        return torch.empty_like(gate), torch.empty_like(up)

    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        d_gate, d_up = bwd_op(gate, up, grad.contiguous(), ctx.evaluator)
        return d_gate, d_up, None

    torch.library.register_autograd(f"{_LIB}::{fwd_kind}", backward,
                                    setup_context=_save_tensors_and_evaluator)
    return _Gated(fwd_kind, bwd_kind, fwd_op, bwd_op)


_SWIGLU = _gated_ops("swiglu")
_GEGLU = _gated_ops("geglu")
_swiglu_fwd, _swiglu_bwd = _SWIGLU.fwd_op, _SWIGLU.bwd_op    # the ops bench/ and tests/ call
_geglu_fwd, _geglu_bwd = _GEGLU.fwd_op, _GEGLU.bwd_op


def _half_shape(gate_up: Tensor):
    return (*gate_up.shape[:-1], gate_up.shape[-1] // 2)


@torch.library.custom_op(f"{_LIB}::swiglu_concat_fwd", mutates_args=())
def _swiglu_concat_fwd(gate_up: Tensor, evaluator: str) -> Tensor:
    y = gate_up.new_empty(_half_shape(gate_up))
    launch("swiglu_fwd", "bf16", evaluator, [gate_up, gate_up], [y], "concat",
           gate_up.shape[-1] // 2)
    return y


@_swiglu_concat_fwd.register_fake
def _(gate_up, evaluator):
    return gate_up.new_empty(_half_shape(gate_up))


@torch.library.custom_op(f"{_LIB}::swiglu_concat_bwd", mutates_args=())
def _swiglu_concat_bwd(gate_up: Tensor, grad: Tensor, evaluator: str) -> Tensor:
    d_gate_up = torch.empty_like(gate_up)
    launch("swiglu_bwd", "bf16", evaluator, [gate_up, gate_up, grad], [d_gate_up, d_gate_up],
           "concat", gate_up.shape[-1] // 2)
    return d_gate_up


@_swiglu_concat_bwd.register_fake
def _(gate_up, grad, evaluator):
    return torch.empty_like(gate_up)


def _swiglu_concat_backward(ctx, grad):
    (gate_up,) = ctx.saved_tensors
    return _swiglu_concat_bwd(gate_up, grad.contiguous(), ctx.evaluator), None


torch.library.register_autograd(f"{_LIB}::swiglu_concat_fwd", _swiglu_concat_backward,
                                setup_context=_save_tensors_and_evaluator)


# ---- eager fast path ---------------------------------------------------------------------
# The custom ops above are what torch.compile / export trace (fake impls, no graph break).
# In eager mode their dispatch (custom-op wrapper, dispatcher, Python autograd kernel) is
# most of the per-call host cost, so eager calls on plain tensors go through these
# autograd.Functions instead, which launch the same compiled kernels directly.  Same
# kernels, same saved tensors, same results.

def _eager(t: Tensor) -> bool:
    """Plain tensor outside tracing: FakeTensor / functional / other subclasses, and
    anything under torch.compile or export, take the custom-op path."""
    return type(t) is Tensor and not torch.compiler.is_compiling()


def needs_grad(*ts: Tensor) -> bool:
    """Autograd will record an op on these inputs (shared with interface.py)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def _silu_fwd_eager(x: Tensor, evaluator: str) -> Tensor:
    y = torch.empty_like(x)
    _launch_fast("silu_fwd", "bf16", evaluator, [x], [y])
    return y


def _glu_fwd_eager(kind: str, gate: Tensor, up: Tensor, evaluator: str) -> Tensor:
    y = torch.empty_like(gate)
    _launch_fast(kind, "bf16", evaluator, [gate, up], [y])
    return y


def _swiglu_concat_fwd_eager(gate_up: Tensor, evaluator: str) -> Tensor:
    y = gate_up.new_empty(_half_shape(gate_up))
    _launch_fast("swiglu_fwd", "bf16", evaluator, [gate_up, gate_up], [y], "concat",
                 gate_up.shape[-1] // 2)
    return y


class _SiLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, evaluator):
        ctx.save_for_backward(x)          # backward recomputes p(x): x is all it needs
        ctx.evaluator = evaluator
        return _silu_fwd_eager(x, evaluator)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        dx = torch.empty_like(x)
        _launch_fast("silu_bwd", "bf16", ctx.evaluator, [x, grad.contiguous()], [dx])
        return dx, None


class _GatedFn(torch.autograd.Function):
    """Eager autograd of the gated activation `g` (a _Gated)."""

    @staticmethod
    def forward(ctx, g, gate, up, evaluator):
        ctx.save_for_backward(gate, up)   # inputs only; no intermediate, no output
        ctx.g, ctx.evaluator = g, evaluator
        return _glu_fwd_eager(g.fwd_kind, gate, up, evaluator)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        d_gate, d_up = torch.empty_like(gate), torch.empty_like(up)
        _launch_fast(ctx.g.bwd_kind, "bf16", ctx.evaluator, [gate, up, grad.contiguous()],
                     [d_gate, d_up])
        return None, d_gate, d_up, None


class _SwiGLUConcatFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up, evaluator):
        ctx.save_for_backward(gate_up)
        ctx.evaluator = evaluator
        return _swiglu_concat_fwd_eager(gate_up, evaluator)

    @staticmethod
    def backward(ctx, grad):
        (gate_up,) = ctx.saved_tensors
        d = torch.empty_like(gate_up)
        _launch_fast("swiglu_bwd", "bf16", ctx.evaluator, [gate_up, gate_up, grad.contiguous()],
                     [d, d], "concat", gate_up.shape[-1] // 2)
        return d, None


def _silu_any(x: Tensor, evaluator: str) -> Tensor:
    if _eager(x):
        return _SiLUFn.apply(x, evaluator) if needs_grad(x) else _silu_fwd_eager(x, evaluator)
    return _silu_fwd(x, evaluator)


def _gated_kernel(g: _Gated, gate: Tensor, up: Tensor, evaluator: str) -> Tensor:
    """The kernel path of a gated activation on validated inputs (layout checked here)."""
    _check_layout("gate", gate)
    _check_layout("up", up)
    if _eager(gate) and type(up) is Tensor:
        if needs_grad(gate, up):
            return _GatedFn.apply(g, gate, up, evaluator)
        return _glu_fwd_eager(g.fwd_kind, gate, up, evaluator)
    return g.fwd_op(gate, up, evaluator)


def _swiglu_concat_any(gate_up: Tensor, evaluator: str) -> Tensor:
    if _eager(gate_up):
        if needs_grad(gate_up):
            return _SwiGLUConcatFn.apply(gate_up, evaluator)
        return _swiglu_concat_fwd_eager(gate_up, evaluator)
    return _swiglu_concat_fwd(gate_up, evaluator)


# ---- public API ------------------------------------------------------------------------

def silu(x: Tensor, evaluator: str = "poly", *, backend: str = "auto") -> Tensor:
    """SiLU with the packed D3 sigmoid polynomial (``evaluator="poly"``) or the SFU sigmoid
    (``"native"``) on a contiguous BF16 CUDA tensor; differentiable.  backend: "auto" (the
    kernel where it can run, else the torch reference with a warning), "cuda" or "reference"
    (the exact function, any device, BF16/FP16/FP32)."""
    _check_tensor("x", x)
    evaluator, backend = _evaluator(evaluator), _backend(backend)
    if _which("silu", backend, "x", x) == "reference":
        return _silu_ref(x)
    _check_layout("x", x)
    return _silu_any(x, evaluator)


def swiglu(gate: Tensor, up: Tensor | None = None, evaluator: str = "poly", *,
           backend: str = "auto") -> Tensor:
    """silu(gate) * up in one kernel; differentiable (one backward kernel for both grads).

    ``swiglu(gate, up)``: two tensors of one shape.  ``swiglu(gate_up)``: the
    concatenated ``[..., 2H]`` fused projection (gate = first H columns), result ``[..., H]``.
    backend: as silu's.
    """
    evaluator, backend = _evaluator(evaluator), _backend(backend)
    if up is None:
        _check_tensor("gate_up", gate)
        if gate.dim() == 0 or gate.shape[-1] % 2:
            raise ValueError(f"gate_up must have an even last dimension [..., 2H], got "
                             f"{tuple(gate.shape)}")
        if _which("swiglu", backend, "gate_up", gate) == "reference":
            return _swiglu_ref(*gate.chunk(2, dim=-1))
        _check_layout("gate_up", gate)
        if not _concat_ok(gate):
            # H % 8 != 0: the halves are not 16-byte aligned; run the two-tensor kernel on
            # contiguous copies (correct, one extra read+write of the input).
            g, u = gate.chunk(2, dim=-1)
            return _gated_kernel(_SWIGLU, g.contiguous(), u.contiguous(), evaluator)
        return _swiglu_concat_any(gate, evaluator)
    _check_gate_up(gate, up)
    if _which("swiglu", backend, "gate", gate) == "reference":
        return _swiglu_ref(gate, up)
    return _gated_kernel(_SWIGLU, gate, up, evaluator)


def geglu(gate: Tensor, up: Tensor, evaluator: str = "poly", *, backend: str = "auto") -> Tensor:
    """gelu(gate) * up in one kernel (Gemma-2's ``gelu_pytorch_tanh`` GLU); differentiable (one
    backward kernel for both grads).  Two tensors of one shape; backend as silu's (the
    reference is torch's ``gelu(approximate="tanh")`` in FP32)."""
    evaluator, backend = _evaluator(evaluator), _backend(backend)
    _check_gate_up(gate, up)
    if _which("geglu", backend, "gate", gate) == "reference":
        return _geglu_ref(gate, up)
    return _gated_kernel(_GEGLU, gate, up, evaluator)


class _PolyActivation(nn.Module):
    """What the activation modules share: the evaluator and backend, validated once."""

    def __init__(self, evaluator: str = "poly", *, backend: str = "auto"):
        super().__init__()
        self.evaluator = _evaluator(evaluator)
        self.backend = _backend(backend)

    def extra_repr(self) -> str:
        return f"evaluator={self.evaluator!r}, backend={self.backend!r}"


class PolySiLU(_PolyActivation):
    """Drop-in ``nn.SiLU`` replacement (the kernel on BF16 CUDA inputs; backend as silu's)."""

    def forward(self, x: Tensor) -> Tensor:
        return silu(x, self.evaluator, backend=self.backend)


class PolySwiGLU(_PolyActivation):
    """The activation of a SwiGLU MLP: ``forward(gate, up)`` or ``forward(gate_up)``.

    Llama: ``down(PolySwiGLU()(gate_proj(x), up_proj(x)))``; fused gate-up projections
    (DeepSeek experts): ``down(PolySwiGLU()(gate_up_proj(x)))``."""

    def forward(self, gate: Tensor, up: Tensor | None = None) -> Tensor:
        return swiglu(gate, up, self.evaluator, backend=self.backend)


class PolyGeGLU(_PolyActivation):
    """The activation of a GeGLU MLP: ``forward(gate, up)`` = gelu(gate) * up (Gemma-2:
    ``down(PolyGeGLU()(gate_proj(x), up_proj(x)))``); backend as silu's."""

    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        return geglu(gate, up, self.evaluator, backend=self.backend)


# ---- FP16 standalone sweep (bench/elementwise.py) ----------------------------------------

SWEEP_FNS = ("sigmoid", "tanh", "silu", "gelu")


def sweep_forward(fn: str, x: Tensor) -> Tensor:
    """Packed FP16 polynomial forward of `fn` (sigmoid, tanh, silu, gelu); no autograd."""
    _check("x", x, (torch.float16,))
    if fn not in SWEEP_FNS:
        raise ValueError(f"fn must be one of {SWEEP_FNS}, got {fn!r}")
    y = torch.empty_like(x)
    launch(f"{fn}_fwd", "f16", "poly", [x], [y])
    return y


def sweep_backward(fn: str, x: Tensor, grad: Tensor) -> Tensor:
    """g * f'(x) from x with the direct FP16 derivative program of `fn`; no autograd."""
    _check("x", x, (torch.float16,))
    _check("grad", grad, (torch.float16,))
    _same_shape("x", x, "grad", grad)
    if fn not in SWEEP_FNS:
        raise ValueError(f"fn must be one of {SWEEP_FNS}, got {fn!r}")
    dx = torch.empty_like(x)
    launch(f"{fn}_bwd", "f16", "poly", [x, grad], [dx])
    return dx
