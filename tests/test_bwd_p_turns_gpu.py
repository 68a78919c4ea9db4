"""GPU tier of the backward's p_turns (BwdConfig.p_turns, kernels/attn_bwd_sm90.py): the two MMA
warpgroups run their P blocks in turns (named barriers P_TURN + w) instead of at once.  Only the
order in time changes: every GEMM, every score and every dQ tile is the same arithmetic in the same
order per warpgroup, so dK / dV equal the default build's bitwise where each CTA stores its own sums
(head_loop, or at most two query heads adding onto zero), and dQ to FP32 reordering across CTAs (rel
L2 well under 1e-3).  A barrier phase left open or a turn missed hangs the kernel (the test's timeout
catches it): shapes with key blocks that no query sees (S_q < S_k causal: no step, no turn), query and
key tails, GQA on the per-KV-head loop and a CTA per query head, MHA, non-causal, FP16, every score,
D 64 (the 128-row step) and 128.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_bwd_p_turns_gpu.py   (the H200)
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tools"))

# (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, causal, D)
SHAPES = [
    ("softmax", "native", "bf16", 2, 777, 777, 8, 2, True, 64),     # GQA, query and key tails
    ("softmax", "native", "bf16", 8, 1000, 1000, 16, 4, True, 64),  # the per-KV-head loop
    ("softmax", "native", "bf16", 1, 517, 900, 4, 4, True, 64),     # MHA, S_q < S_k
    ("softmax", "native", "fp16", 2, 640, 640, 4, 4, False, 64),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, True, 64),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, False, 64),
    ("softmax", "native", "bf16", 2, 777, 777, 8, 2, True, 128),
    ("softmax", "native", "bf16", 1, 517, 900, 4, 4, True, 128),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, False, 128),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, True, 128),
]


def _grads(mode, evaluator, dtype, b, sq, sk, hq, hkv, causal, d, turns, seed=0):
    import plan_knobs
    from flash_attn_poly.kernels import dispatch
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda s, h, a=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * a).to(dt)
    q, k, v = mk(sq, hq, 4.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv)
    do = mk(sq, hq)
    knob = plan_knobs.Knob("test", overrides={"bwd.p_turns": turns})
    p = plan_knobs.plan_for(q, k, v, mode, evaluator, knob, causal=causal,
                            softcap=30.0 if mode == "softcap" else None)
    assert p.bwd.p_turns == turns and not p.bwd.swap, p.bwd
    o, lse = dispatch.forward(p, q, k, v)
    grads = dispatch.backward(p, do, q, k, v, o, lse)
    torch.cuda.synchronize()
    return grads, p.bwd.head_loop or hq // hkv <= 2


def _rel(a, b):
    return ((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-30)).item()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda x: "-".join(map(str, x)))
def test_p_turns_matches_the_default_build(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ((dq0, dk0, dv0), ordered), ((dq1, dk1, dv1), _) = _grads(*shape, False), _grads(*shape, True)
    if ordered:
        assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1), "dK / dV differ"
    else:
        assert max(_rel(dk0, dk1), _rel(dv0, dv1)) < 1e-3, "dK / dV differ beyond FP32 reordering"
    assert torch.isfinite(dq1).all()
    assert _rel(dq0, dq1) < 1e-3, f"dQ rel L2 {_rel(dq0, dq1)}"
