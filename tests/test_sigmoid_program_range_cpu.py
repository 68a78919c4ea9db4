"""The default sigmoid program at large score magnitudes (CPU, the kernel's P replayed).

The default sigmoid_attn program clamps its input x' = x + b + ln n to [lo, hi] = [-3.5, 12]
(fitted for scores of std 1-2), so on the key columns of the plan's 1/16 split P stops at
p(hi) = 0.975 where the exact sigmoid goes to 1.  At score std 16 (D = 64, S = 1024, default
bias) the output then misses the FlashAttention rule (max error <= 2x torch's + floor) in two
of four draws (ratio up to 1.13); with the exact sigmoid above the clamp the same draws pass
with a wide margin, so the cap is the cause.  The kernel's P on those columns is what
tests/poly_reference.split_fns replays (the GPU tests judge the kernels against it); on the
H200 the kernel's O error at score std 8 was 2.1x native's (bench/results/sigmoid_poly_diag.md).
Not fixed: refits with the clamp at 14.5-16 overshoot to P > 1, and a native fix-up of each
block pair above the clamp moved the loop's MUFU-column work behind the PV wait and left 14
spilled words in the D = 64 one-CTA-per-tile build (docs/MEASURED.md sigmoid-program-cap).
"""
from __future__ import annotations

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import poly_reference as PR  # noqa: E402
import rule_harness as H  # noqa: E402

S, D, HEADS = 1024, 64, 2


def _default_sigmoid(exact_above_clamp=False):
    """The default plan's sigmoid poly score at this shape and its per-column P: the kernel's
    (poly_reference.split_fns), or the same with the exact sigmoid where the block input is above
    the program's clamp."""
    from flash_attn_poly import plan as P
    from flash_attn_poly.kernels import scores
    call = P.AttnCall(mode="sigmoid", evaluator="poly", dtype="bf16", head_dim=D, batch=1, seqlen_q=S,
                      seqlen_k=S, heads_q=HEADS, heads_kv=HEADS, causal=True, window=(-1, -1),
                      softmax_scale=D ** -0.5, softcap=None, sigmoid_bias=None)
    pl = P.resolve(call, 132)
    assert pl.score.evaluator == "poly" and pl.score.poly_split == (1, 16)
    fn, _ = PR.split_fns("sigmoid", scores.device(pl.score), S, 50.0, sigmoid_bias=pl.sigmoid_bias,
                         sigmoid_grad=None, io_dtype="bf16")
    if not exact_above_clamp:
        return pl, fn
    hi = pl.score.program.param("hi")
    shift = pl.sigmoid_bias + math.log(pl.score.program.param("n"))
    return pl, lambda x: torch.where(x + shift > hi, torch.sigmoid(x + pl.sigmoid_bias).to(torch.float64), fn(x))


def _worst_ratio(score_fn, sigma: float, seeds=range(4)) -> float:
    from flash_attn_poly import reference as R
    from flash_attn_poly.testing import judge
    worst = 0.0
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        q = (torch.randn(1, S, HEADS, D, generator=g) * sigma).bfloat16()
        k, v = (torch.randn(1, S, HEADS, D, generator=g).bfloat16() for _ in range(2))
        ref, _ = R.attention_ref(q, k, v, "sigmoid")
        low, _ = R.attention_ref_lowprec(q, k, v, "sigmoid")
        got, _ = R.attention_ref_lowprec(q, k, v, "sigmoid", score_fn=score_fn)
        mag = H.magnitudes(None, q, k, v, ref, "sigmoid", o_only=True, causal=True)
        worst = max(worst, judge("o", got.to(torch.bfloat16), ref, low, torch.bfloat16, mag["o"])["ratio"])
    return worst


def test_the_default_program_caps_p_below_one():
    pl, kernel = _default_sigmoid()
    _, fixed = _default_sigmoid(exact_above_clamp=True)
    hi, n = pl.score.program.param("hi"), pl.score.program.param("n")
    x = torch.full((1, 1, 1, S), 40.0, dtype=torch.float64)   # far above the clamp
    cap = float(kernel(x)[0, 0, 0, 0])
    assert 0.97 < cap < 0.98 and cap == pytest.approx(1.0 / (1.0 + math.exp(-(hi - math.log(n)))), abs=2e-3)
    assert float(kernel(x)[0, 0, 0, 8]) == pytest.approx(1.0, abs=1e-12)     # a MUFU column
    assert float(fixed(x)[0, 0, 0, 0]) == pytest.approx(1.0, abs=1e-12)
    x = torch.full((1, 1, 1, S), 1.0, dtype=torch.float64)                   # inside the clamp: the block's P
    assert float(fixed(x)[0, 0, 0, 0]) == float(kernel(x)[0, 0, 0, 0])


@pytest.mark.xfail(strict=True, reason="the default sigmoid program's input clamp caps P at 0.975 on the split's "
                                       "columns: the rule misses at score std 16 (module docstring)")
def test_default_sigmoid_program_holds_the_rule_at_score_std_16():
    _, kernel = _default_sigmoid()
    assert _worst_ratio(kernel, 16.0) <= 1.0


def test_the_cap_is_the_cause():
    """The same draws with the exact sigmoid above the clamp pass with a wide margin."""
    _, fixed = _default_sigmoid(exact_above_clamp=True)
    assert _worst_ratio(fixed, 16.0) < 0.7
