"""One tolerance rule for every kernel test (tests/rule_harness.py applies it to whole cases).

A kernel's error against an upcast (FP64) reference may be at most FACTOR = 2 times the
error of the same computation done by torch in the kernel's own dtype pipeline (FP32
scores, 16-bit probabilities and output), plus a floor for outputs whose torch error
happens to be ~0 (floor_for). NaN or Inf never passes. The rule is relative to what the
dtype itself costs, so it tightens automatically for FP16 and for small inputs.
"""
from __future__ import annotations

import math
from typing import Optional

import torch


# The rule (issue 26; flash-attn's test rule), the one implementation every kernel test uses:
# for each checked tensor T,  max |T - T_ref| <= FACTOR x max |T_torch - T_ref| + floor.
FACTOR = 2.0
FLOOR_EPS_FRACTION = 1 / 8
FP32_NOISE = 2.0 ** -22   # 4 units of FP32 roundoff (tensor-core FP32 accumulation is not quite IEEE)
LSE_FLOOR_EPS_FRACTION = 1.0
# dQ and dK of the softmax-like scores: the floor also holds DTERM_SIGMAS standard deviations of
# what an O error of torch's size does to them through D = rowsum(dO o O) (each element of O off
# by torch's O error with a random sign; tests/rule_harness.py _dterm_sigmas).  With a handful of
# keys the gradients' max error is one realisation of that term and torch's another, so 2x
# torch's alone is a coin toss there (docs/MEASURED.md, "rule-dterm").
DTERM_SIGMAS = 1.25


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


max_err = max_abs_err


def rel_l2_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def floor_for(name: str, ref: torch.Tensor, dtype: torch.dtype, magnitude: float = 0.0) -> float:
    """The rule's floor: eps(dtype) / 8 x max |T_ref| (a quarter of the rounding of the largest
    element: where torch's own error is ~0, e.g. O = V at S_k = 1) plus 2^-22 x magnitude, the
    largest element of T computed from the absolute values of its terms (where the exact answer
    cancels to ~0, e.g. dQ and dK at S_k = 1, both sides are FP32 accumulation noise at that
    scale); for the LSE ("lse") eps(dtype), absolute (an LSE off by d scales every P the
    backward recomputes by e^d; d within two roundings of P is what an O that passes allows)."""
    eps = torch.finfo(dtype).eps
    if name == "lse":
        return eps * LSE_FLOOR_EPS_FRACTION
    scale = ref.abs().max().item() if ref.numel() else 0.0
    return eps * FLOOR_EPS_FRACTION * scale + FP32_NOISE * magnitude


def judge(name: str, got: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, dtype: torch.dtype,
          magnitude: float = 0.0, floor: Optional[float] = None) -> dict:
    """The rule for one tensor: {"err", "torch_err", "floor", "bound", "ratio", "ok", "why"}.
    ref: the FP64 reference; low: torch's result at the input precision; dtype: the input
    dtype; magnitude: the floor's FP32 noise term (floor_for); floor: an explicit floor instead
    of floor_for's.  A non-finite value where the reference is finite, or (name "lse") a -inf
    pattern that differs from the reference's (rows that see no key), never passes."""
    got, ref, low = got.detach(), ref.detach(), low.detach()
    floor = floor_for(name, ref, dtype, magnitude) if floor is None else floor
    out = {"err": math.inf, "torch_err": math.nan, "floor": floor, "bound": math.nan, "ratio": math.inf,
           "ok": False, "why": ""}
    if got.shape != ref.shape:
        out["why"] = f"shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
        return out
    fin = torch.isfinite(ref)
    if name == "lse" and not torch.equal(torch.isfinite(got), fin):
        bad = (torch.isfinite(got) != fin).sum().item()
        out["why"] = f"{bad} rows where the LSE is finite in one and not the other (rows that see no key: -inf)"
        return out
    if not torch.isfinite(got[fin]).all():
        out["why"] = f"{(~torch.isfinite(got[fin])).sum().item()} non-finite values"
        return out
    if name == "lse":
        got, ref, low = got[fin], ref[fin], low[fin]
    err, base = max_abs_err(got, ref), max_abs_err(low, ref)
    bound = FACTOR * base + floor
    out.update(err=err, torch_err=base, bound=bound,
               ratio=err / bound if bound > 0 else (0.0 if err == 0 else math.inf), ok=err <= bound)
    if not out["ok"]:
        out["why"] = f"max abs error {err:.3e} > {FACTOR:g} x {base:.3e} + {floor:.2e} = {bound:.3e}"
    return out


def assert_close_rule(out: torch.Tensor, ref: torch.Tensor, ref_lowprec: torch.Tensor, *,
                      floor: Optional[float] = None, name: str = "out", dtype: Optional[torch.dtype] = None,
                      magnitude: float = 0.0) -> dict:
    """judge(...) that raises AssertionError naming the tensor; dtype defaults to out's (FP32:
    BF16's eps for the floor); floor None: the rule's (floor_for).  Returns the numbers."""
    dt = dtype or (out.dtype if out.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16)
    c = judge(name, out, ref, ref_lowprec, dt, magnitude, floor)
    if not c["ok"]:
        raise AssertionError(f"{name}: {c['why']}")
    return {"name": name, "max_abs_err": c["err"], "lowprec_err": c["torch_err"], "bound": c["bound"],
            "rel_l2_err": rel_l2_err(out, ref)}


def plan_for(q, k, v, mode="softmax", evaluator="native", overrides=None, **kw):
    """The plan attention(q, k, v, mode, evaluator=..., **kw) resolves, with plan overrides
    ("fwd.<field>", "bwd.<field>", "poly_split", "grad_rule"; flash_attn_poly.plan.resolve):
    what a kernel test runs instead of a default."""
    from . import interface, plan as plan_mod
    call = interface.validate(q, k, v, mode, evaluator, kw.pop("causal", True), kw.pop("softcap", None),
                              kw.pop("sigmoid_bias", None), kw.pop("softmax_scale", None),
                              kw.pop("window_size", (-1, -1)), kw.pop("deterministic", False),
                              kw.pop("program", None), kw.pop("sigmoid_grad", None))
    if kw:
        raise TypeError(f"plan_for: unknown arguments {sorted(kw)}")
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
    return plan_mod.resolve(call, sms, overrides)


def run_forward(q, k, v, mode="softmax", evaluator="native", overrides=None, poison=False, **kw):
    """(o, lse or None, plan) of the CUDA forward for plan_for(...)'s plan; poison: into
    NaN-filled O and LSE buffers (forward_poisoned)."""
    from .kernels import dispatch
    p = plan_for(q, k, v, mode, evaluator, overrides, **kw)
    o, lse = forward_poisoned(p, q, k, v) if poison else dispatch.forward(p, q, k, v)
    return o, lse, p


def forward_poisoned(plan, q, k, v):
    """kernels.dispatch.forward of plan into NaN-filled O and LSE buffers, so an element the
    kernel never writes stays NaN and cannot pass (new buffers may hold an earlier call's
    correct values)."""
    from .kernels import dispatch
    b, s_q, h_q, _ = q.shape
    out = poison_(torch.empty_like(q))
    lse = poison_(torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device))
    return dispatch.forward(plan, q, k, v, out=out, lse=lse)


def run_backward(plan, dout, q, k, v, out, lse):
    """(dq, dk, dv) of the CUDA backward for a plan (run_forward's)."""
    from .kernels import dispatch
    return dispatch.backward(plan, dout, q, k, v, out, lse)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN so an element the kernel never writes cannot pass."""
    return t.fill_(float("nan"))
