"""One tolerance rule for every kernel test.

A kernel's error against an upcast (FP64) reference may be at most `factor` times the
error of the same computation done by torch in the kernel's own dtype pipeline (FP32
scores, 16-bit probabilities and output), plus an absolute floor for outputs whose
reference error happens to be ~0. NaN or Inf never passes. The rule is relative to what
the dtype itself costs, so it tightens automatically for FP16 and for small inputs.
"""
from __future__ import annotations

import torch


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def rel_l2_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def assert_close_rule(out: torch.Tensor, ref: torch.Tensor, ref_lowprec: torch.Tensor,
                      *, factor: float = 2.0, floor: float = 1e-5, name: str = "out") -> dict:
    """Assert max|out - ref| <= factor * max|ref_lowprec - ref| + floor; return the numbers."""
    if not torch.isfinite(out).all():
        bad = (~torch.isfinite(out)).sum().item()
        raise AssertionError(f"{name}: {bad} non-finite values (NaN/Inf never pass)")
    if out.shape != ref.shape:
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    err = max_abs_err(out, ref)
    base = max_abs_err(ref_lowprec, ref)
    bound = factor * base + floor
    stats = {"name": name, "max_abs_err": err, "lowprec_err": base, "bound": bound,
             "rel_l2_err": rel_l2_err(out, ref)}
    if not err <= bound:
        raise AssertionError(f"{name}: max abs error {err:.3e} > {factor} x {base:.3e} + {floor:.1e} = {bound:.3e}")
    return stats


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
