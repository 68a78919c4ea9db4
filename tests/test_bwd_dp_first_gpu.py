"""GPU tier of the red.global backward's dp_first order (BwdConfig.dp_first, the chunked D = 256
build's default: packed, deterministic and user-score calls): dP^T before S^T, dO released once dV
has read it and loaded before Q.  The products and their per-thread order are the default's, so dK / dV are bitwise
equal where each CTA stores its KV head's sums (head_loop) and equal to FP32 reordering where
query heads add into the accumulator; dQ (FP32 atomics across key blocks) to FP32 reordering.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_bwd_dp_first_gpu.py   (the H200)
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, causal, head_loop)
SHAPES = [
    ("softmax", "native", "bf16", 2, 777, 777, 4, 2, True, True),
    ("softmax", "native", "bf16", 1, 517, 900, 2, 2, True, False),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, False, True),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, True, False),
]


def _grads(mode, evaluator, dtype, b, sq, sk, hq, hkv, causal, head_loop, dp_first, d=256):
    import plan_knobs
    from builds import CHUNKED_D256
    from flash_attn_poly.kernels import dispatch
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda s, h, a=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * a).to(dt)
    q, k, v = mk(sq, hq, 4.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv)
    do = mk(sq, hq)
    knob = plan_knobs.Knob("test", overrides=dict(CHUNKED_D256, **{"bwd.dp_first": dp_first, "bwd.head_loop": head_loop}))
    p = plan_knobs.plan_for(q, k, v, mode, evaluator, knob, causal=causal,
                            softcap=30.0 if mode == "softcap" else None)
    assert p.bwd.dp_first == dp_first and p.bwd.head_loop == head_loop and not p.bwd.dq_async, p.bwd
    o, lse = dispatch.forward(p, q, k, v)
    return dispatch.backward(p, do, q, k, v, o, lse)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-30)).item()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda x: "-".join(map(str, x)))
def test_dp_first_matches_default(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    (dq0, dk0, dv0), (dq1, dk1, dv1) = _grads(*shape, False), _grads(*shape, True)
    for name, a, b in (("dq", dq0, dq1), ("dk", dk0, dk1), ("dv", dv0, dv1)):
        assert torch.isfinite(b).all(), name
        assert _rel(a, b) < 1e-4, f"{name} rel L2 {_rel(a, b)}"
    if shape[-1]:   # head_loop: dK / dV stored per CTA, the same products in the same order
        assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1)
