"""GPU tests of the persistent forward (FwdConfig.persistent): a grid of at most N CTAs,
each walking tiles in snake order over the LPT order, the pipeline states running on across
tiles.  Per tile the arithmetic is the single-tile kernel's (persistent=0, one CTA per tile),
so O and LSE must be bitwise equal to that build's; one case per mode is also checked against
the reference (tests/test_attn_fwd_gpu.run_case).  Small CTA counts (3, 7) put many tiles,
tiles that see no key (S_q > S_k, causal) and partial last rounds on each CTA; "sms" is the
plan's default, the device's SM count.
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, D, causal, window)
EQ_CASES = [
    ("softmax", "native", "bf16", 2, 333, 333, 8, 2, 128, True, (-1, -1)),
    ("softmax", "native", "bf16", 2, 517, 200, 4, 1, 128, True, (-1, -1)),    # tiles with no key
    ("softmax", "native", "bf16", 1, 200, 517, 8, 8, 64, False, (-1, -1)),
    ("softmax", "native", "fp16", 1, 381, 381, 8, 2, 128, True, (-1, -1)),
    ("softcap", "native", "bf16", 1, 333, 333, 8, 2, 128, True, (-1, -1)),
    ("softcap", "poly", "bf16", 2, 333, 333, 8, 2, 128, True, (-1, -1)),
    ("softcap", "poly", "bf16", 1, 517, 517, 8, 4, 256, True, (-1, -1)),
    ("softcap", "poly", "bf16", 1, 517, 517, 8, 4, 256, True, (100, 0)),     # sliding window
    ("softmax", "native", "bf16", 1, 600, 600, 4, 2, 128, False, (150, 90)),
    ("sigmoid", "native", "bf16", 1, 333, 333, 8, 2, 128, True, (-1, -1)),
    ("sigmoid", "poly", "bf16", 2, 300, 411, 4, 2, 128, False, (-1, -1)),
    ("softmax", "native", "bf16", 1, 2048, 2048, 32, 8, 128, True, (-1, -1)),  # 512 tiles > SMs
]


def _qkv(dtype, b, s_q, s_k, h_q, h_kv, d, spread):
    g = torch.Generator(device="cuda").manual_seed(1234 + s_q + 7 * s_k + d)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    mk = lambda s, h, f: (torch.randn(b, s, h, d, device="cuda", generator=g) * f).to(dt)
    return mk(s_q, h_q, spread), mk(s_k, h_kv, 1.0), mk(s_k, h_kv, 1.0)


def _run(q, k, v, mode, evaluator, causal, window, overrides):
    from flash_attn_poly import testing

    o, l, _ = testing.run_forward(q, k, v, mode, evaluator, overrides, poison=True, causal=causal,
                                  softcap=50.0 if mode == "softcap" else None, window_size=window)
    torch.cuda.synchronize()
    return o, l


@pytest.mark.gpu
@pytest.mark.parametrize("ctas", [3, 7, None], ids=lambda n: "ctas_sms" if n is None else f"ctas{n}")
@pytest.mark.parametrize("case", EQ_CASES, ids=lambda c: "-".join(map(str, c)))
def test_persistent_equals_single_tile(case, ctas):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    mode, ev, dtype, b, s_q, s_k, h_q, h_kv, d, causal, window = case
    q, k, v = _qkv(dtype, b, s_q, s_k, h_q, h_kv, d, 8.0 if mode == "softcap" else 1.0)
    o0, l0 = _run(q, k, v, mode, ev, causal, window, {"fwd.persistent": 0})
    o1, l1 = _run(q, k, v, mode, ev, causal, window, None if ctas is None else {"fwd.persistent": ctas})
    assert not torch.isnan(o1).any(), "persistent O has unwritten (poisoned) elements"
    assert torch.equal(o0, o1), f"O differs: max |diff| {(o0.float() - o1.float()).abs().max().item()}"
    if l0 is not None:
        assert torch.equal(l0.isnan(), l1.isnan()) and not l1.isnan().any()
        assert torch.equal(l0, l1), "LSE differs"


REF_CASES = [("softmax", "native", "bf16", 2, 333, 517, 8, 2, 128, True),
             ("softcap", "poly", "bf16", 1, 333, 333, 8, 2, 128, True),
             ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 4, 128, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: "-".join(map(str, c)))
def test_persistent_against_reference(case):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_attn_fwd_gpu import run_case

    run_case(*case, overrides={"fwd.persistent": 5})
