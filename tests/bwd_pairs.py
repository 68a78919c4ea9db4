"""GPU helper of the backward tests that compare a plan knob's build with another build of the
same call (tests/test_bwd_step_order_gpu.py, test_bwd_dq_halves_gpu.py): knobs that change only the
order in time or the path of the same sums (p_turns, dq_defer, dq_halves), so dK / dV are bitwise
equal where each CTA stores its own sums and dQ equals to FP32 reordering across CTAs.

A shape is (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, causal, D[, window]).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tools"))


def grads(shape, overrides: dict, seed: int = 0):
    """(dq, dk, dv), the plan's bwd config, ordered: the backward of one call under the plan with
    `overrides`.  ordered: each CTA stores its own dK / dV sums (head_loop) or at most two query
    heads add onto the zeroed FP32 accumulator (two adds onto zero commute)."""
    import plan_knobs
    from flash_attn_poly.kernels import dispatch
    mode, evaluator, dtype, b, sq, sk, hq, hkv, causal, d, *window = shape
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda s, h, a=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * a).to(dt)
    q, k, v = mk(sq, hq, 4.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv)
    do = mk(sq, hq)
    p = plan_knobs.plan_for(q, k, v, mode, evaluator, plan_knobs.Knob("test", overrides=overrides), causal=causal,
                            softcap=30.0 if mode == "softcap" else None,
                            window_size=window[0] if window else (-1, -1))
    o, lse = dispatch.forward(p, q, k, v)
    out = dispatch.backward(p, do, q, k, v, o, lse)
    torch.cuda.synchronize()
    return out, p.bwd, p.bwd.head_loop or hq // hkv <= 2


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-30)).item()


def assert_same_sums(base, other, ordered: bool) -> None:
    """dK / dV bitwise equal where ordered (else to FP32 reordering), dQ finite and to FP32
    reordering (rel L2 < 1e-3: a dQ tile lost or added twice is ~0.5-0.7)."""
    (dq0, dk0, dv0), (dq1, dk1, dv1) = base, other
    if ordered:
        assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1), "dK / dV differ"
    else:
        assert max(rel(dk0, dk1), rel(dv0, dv1)) < 1e-3, "dK / dV differ beyond FP32 reordering"
    assert torch.isfinite(dq1).all()
    assert rel(dq0, dq1) < 1e-3, f"dQ rel L2 {rel(dq0, dq1)}"
