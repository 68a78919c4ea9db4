"""GPU tier: dQ/dK/dV of kernels/attn_bwd_sm90.py against FP64 autograd of the torch reference."""
import pytest

torch = pytest.importorskip("torch")

CASES = [  # (B, S_q, S_k, H_q, H_kv, D, causal, mode)
    (1, 128, 128, 2, 2, 128, False, "softmax"),
    (2, 200, 200, 8, 2, 128, True, "softmax"),
    (1, 333, 333, 8, 1, 64, True, "softmax"),
    (1, 177, 301, 4, 4, 64, False, "softmax"),
    (1, 301, 177, 4, 2, 128, True, "softmax"),
    (1, 257, 257, 8, 8, 128, True, "softcap"),
    (1, 257, 257, 8, 2, 128, True, "sigmoid"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_attn_bwd_matches_fp64_autograd(case):
    import sys, os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    from attn_bwd_check import run_case
    errs, finite = run_case(case)
    assert finite
    assert max(errs) < 2e-2, errs
