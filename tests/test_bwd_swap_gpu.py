"""GPU tier of the swapped D = 256 backward (BwdConfig.swap, kernels/attn_bwd_swap_sm90.py; the plan's
build for dense D = 256 calls of the built-in scores): a CTA owns 64 keys and all 256 columns, dK^T /
dV^T with the head dim on the wgmma M axis, P and dS through shared memory, dQ in two column
passes, no recompute.

Each case runs the plan's (swap) build and the chunked build (tests/builds.CHUNKED_D256 over the
same plan) on the same inputs; both are judged by the FlashAttention rule (tests/rule_harness.judge_case: dQ, dK,
dV against the FP64 reference, within 2x torch's own low-precision error plus the floor), and
the two must agree to FP32 reordering and a few BF16 roundings (rel L2 < 1e-2; a lost tile or a
transposed store is O(1)).  Shapes: query and key tails (keys past S_k inside the 64-key tile),
S_q < S_k causal (key blocks no query sees: zeros stored), S_q > S_k, non-causal, MHA and GQA
(the per-KV-head loop over the group's heads), FP16, every score.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_bwd_swap_gpu.py   (the H200)
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, causal)
SHAPES = [
    ("softmax", "native", "bf16", 2, 777, 777, 4, 2, True),
    ("softmax", "native", "bf16", 1, 517, 900, 2, 2, True),
    ("softmax", "native", "bf16", 1, 900, 333, 4, 2, True),
    ("softmax", "native", "bf16", 1, 640, 640, 4, 4, False),
    ("softmax", "native", "fp16", 1, 600, 600, 4, 2, True),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, True),
    ("softcap", "native", "bf16", 1, 500, 700, 2, 1, False),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, False),
    ("sigmoid", "native", "bf16", 1, 384, 384, 2, 2, True),
    ("softcap", "poly", "bf16", 1, 700, 700, 4, 2, True, (300, -1)),   # Gemma-2's local layers: a left window
    ("softmax", "native", "bf16", 1, 500, 600, 2, 1, False, (100, 50)),
]


def _case(mode, evaluator, dtype, b, sq, sk, hq, hkv, causal, window=(-1, -1)):
    import cases
    side = None if window == (-1, -1) else ("both" if min(window) >= 0 else "left" if window[0] >= 0 else "right")
    v = cases.Variant(mode, evaluator, dtype, 256, causal, side)
    return cases.Case(v, b, sq, sk, hq, hkv, window_size=window, softcap=cases.SOFTCAP if mode == "softcap" else None,
                      tier="swap")


def _run(case, q, k, v, dout, overrides):
    from flash_attn_poly import testing
    from flash_attn_poly.kernels import dispatch
    kw = case.kwargs()
    p = testing.plan_for(q, k, v, case.mode, case.evaluator, overrides=overrides, **kw)
    o, lse = dispatch.forward(p, q, k, v)
    return p, o, lse, dispatch.backward(p, dout, q, k, v, o, lse)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / a.float().norm().clamp_min(1e-30)).item()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda x: "-".join(map(str, x)))
def test_swap_matches_rule_and_chunked(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import rule_harness
    from builds import CHUNKED_D256
    case = _case(*shape)
    q, k, v, dout = (t.detach() for t in rule_harness.make_inputs(case))
    p0, o, lse, g0 = _run(case, q, k, v, dout, dict(CHUNKED_D256, **{"bwd.head_loop": True}))
    p1, _, _, g1 = _run(case, q, k, v, dout, {})
    assert p1.bwd.swap and not p0.bwd.swap and p1.bwd.tile_n == 64, p1.bwd
    for name, a, b in zip(("dq", "dk", "dv"), g0, g1):
        assert torch.isfinite(b).all(), f"{name}: non-finite"
        assert _rel(a, b) < 1e-2, f"{name}: swap vs chunked rel L2 {_rel(a, b)}"
    checks = rule_harness.judge_case(case, q, k, v, dout, o, lse, g1, directions=("bwd",))
    bad = [f"{n}: {c['why']}" for n, c in checks.items() if not c["ok"]]
    assert not bad, "; ".join(bad)
