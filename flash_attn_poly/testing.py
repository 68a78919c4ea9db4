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


def fixed_max_m0(mode: str, dtype: torch.dtype, softcap, tuning=None):
    """The constant row max (logits) the forward uses for these arguments (attn_fwd's
    AttnFwdConfig.fixed_max choice), or None: for attention_ref_lowprec(fixed_max=...)."""
    from .kernels import attn_fwd_sm90 as A, score_stages as S
    cap = 50.0 if softcap is None else float(softcap)
    dt = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    on = A._fixed_max_kw(mode, dt, cap, tuning).get("fixed_max") or bool((tuning or {}).get("fixed_max"))
    return cap - S.FIXED_MAX_HEADROOM if on else None


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN so an element the kernel never writes cannot pass."""
    return t.fill_(float("nan"))
