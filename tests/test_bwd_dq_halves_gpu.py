"""GPU tier of the backward's dq_halves (BwdConfig.dq_halves, kernels/bwd_reduce.py): in the
128-row D = 64 step each MMA warpgroup stages its own 64 rows of dQ and warp 1 adds each half
with its own bulk reduction behind its own barrier pair.  The same FP32 values reach the same
accumulator rows as with one buffer, in a possibly different order across CTAs, so dQ equals
the one-buffer build's to FP32 reordering (rounded to the input dtype: rel L2 well under 1e-3;
a half lost or added twice is ~0.5-0.7).  dK / dV's path is untouched: bitwise equal where each
CTA stores its KV head's sums (head_loop) or at most two query heads add into the FP32
accumulator (two adds onto zero commute); a CTA per query head of a larger group adds in
arrival order, so there they equal to FP32 reordering.  Shapes: query tails (S_q not a multiple of 128: the padding rows of the last
block), key tails, S_q < S_k causal (key blocks no query sees), non-causal, GQA (the per-KV-head
loop: the halves alternate through the group's heads) and MHA, FP16, every score.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_bwd_dq_halves_gpu.py   (the H200)
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tools"))

# (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, causal)
SHAPES = [
    ("softmax", "native", "bf16", 2, 777, 777, 8, 2, True),     # GQA, query and key tails (a CTA per query head)
    ("softmax", "native", "bf16", 8, 1000, 1000, 16, 4, True),  # GQA on the per-KV-head loop (4 heads per CTA)
    ("softmax", "native", "bf16", 1, 517, 900, 4, 4, True),     # MHA, S_q < S_k
    ("softmax", "native", "bf16", 2, 640, 640, 4, 4, False),
    ("softmax", "native", "fp16", 1, 600, 600, 4, 2, True),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, True),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, False),
]
# tile_m 64 (D = 128, a plan override): the halves are the warpgroups' columns, a bulk add per band
SHAPES_D128 = [
    ("softmax", "native", "bf16", 2, 777, 777, 8, 2, True),
    ("softmax", "native", "bf16", 1, 517, 900, 4, 4, True),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, False),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, True),
]


def _grads(mode, evaluator, dtype, b, sq, sk, hq, hkv, causal, halves, seed=0, d=64):
    import plan_knobs
    from flash_attn_poly.kernels import dispatch
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda s, h, a=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * a).to(dt)
    q, k, v = mk(sq, hq, 4.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv)
    do = mk(sq, hq)
    knob = plan_knobs.Knob("test", overrides={"bwd.dq_halves": halves})
    p = plan_knobs.plan_for(q, k, v, mode, evaluator, knob, causal=causal,
                            softcap=30.0 if mode == "softcap" else None)
    assert p.bwd.tile_m == (128 if d == 64 else 64) and p.bwd.dq_async and p.bwd.dq_halves == halves, p.bwd
    o, lse = dispatch.forward(p, q, k, v)
    return dispatch.backward(p, do, q, k, v, o, lse), p.bwd.head_loop or hq // hkv <= 2


def _rel(a, b):
    return ((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-30)).item()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [s + (64,) for s in SHAPES] + [s + (128,) for s in SHAPES_D128],
                         ids=lambda x: "-".join(map(str, x)))
def test_dq_halves_matches_one_buffer(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    *shape, d = shape
    ((dq0, dk0, dv0), ordered), ((dq1, dk1, dv1), _) = _grads(*shape, False, d=d), _grads(*shape, True, d=d)
    if ordered:
        assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1), "dK / dV differ"
    else:
        assert max(_rel(dk0, dk1), _rel(dv0, dv1)) < 1e-3, "dK / dV differ beyond FP32 reordering"
    assert torch.isfinite(dq1).all()
    err = _rel(dq0, dq1)
    assert err < 1e-3, f"dQ rel L2 {err}"
