"""GPU tests of forward timing knobs that are off by default but selectable through
`tuning` (docs/NOTES_attn_fwd.md, ninth session):
- pingpong_arrive="qk" / "stage": a warpgroup hands the GEMM turn over once its own QK GEMM
  landed / halfway through its score stage.  Only the issue order changes, so O and LSE must
  be bitwise equal to the default build's, for the persistent grid and the single-tile one (a
  lost or extra hand-over would hang or race, and the poisoned outputs would show it).
  "qk" passed on the H200 (round knobs34); "stage" is prepared (round ho37).
- tile_n=64 at D = 128: other key blocks, so another summation order: checked against the
  reference with the tolerance rule (tests/test_attn_fwd_gpu.run_case).
- tile_m=192 (three consumer warpgroups, prepared in the ninth session): against the reference.
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_attn_fwd_persistent_gpu import EQ_CASES  # noqa: E402

# (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, D, causal, window): five of the persistent
# tests' cases (two softmax, one with key-less tiles; softcap native; the windowed D = 256
# softcap poly; sigmoid poly) and a non-causal softcap poly one, in the order the H200 runs used
QK_CASES = ([EQ_CASES[i] for i in (0, 1, 4)]
            + [("softcap", "poly", "bf16", 2, 333, 411, 8, 2, 128, False, (-1, -1))]
            + [EQ_CASES[i] for i in (7, 10)])


@pytest.mark.gpu
@pytest.mark.parametrize("arrive", ["qk", "stage"])
@pytest.mark.parametrize("persistent", [1, 0], ids=["persistent", "single_tile"])
@pytest.mark.parametrize("case", QK_CASES, ids=lambda c: "-".join(map(str, c)))
def test_pingpong_arrive_equals_default(case, persistent, arrive):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_attn_fwd_persistent_gpu import _qkv, _run

    mode, ev, dtype, b, s_q, s_k, h_q, h_kv, d, causal, window = case
    q, k, v = _qkv(dtype, b, s_q, s_k, h_q, h_kv, d, 8.0 if mode == "softcap" else 1.0)
    # the two-warpgroup ping-pong build with the default hand-over (softcap's default at D = 128
    # is the three-warpgroup tile since the tenth session; ping-pong pairs two warpgroups)
    o0, l0 = _run(q, k, v, mode, ev, causal, window, {"persistent": persistent, "pingpong": True})
    o1, l1 = _run(q, k, v, mode, ev, causal, window,
                  {"persistent": persistent, "pingpong": True, "pingpong_arrive": arrive})
    assert not torch.isnan(o1).any(), "O has unwritten (poisoned) elements"
    assert torch.equal(o0, o1), f"O differs: max |diff| {(o0.float() - o1.float()).abs().max().item()}"
    if l0 is not None:
        assert torch.equal(l0, l1), "LSE differs"


TILE_N64_CASES = [("softmax", "native", "bf16", 2, 333, 517, 8, 2, 128, True),
                  ("softcap", "native", "bf16", 1, 333, 333, 8, 2, 128, True),
                  ("softcap", "poly", "bf16", 1, 300, 411, 4, 4, 128, False),
                  ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 128, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", TILE_N64_CASES, ids=lambda c: "-".join(map(str, c)))
def test_tile_n64_d128_against_reference(case):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_attn_fwd_gpu import run_case

    run_case(*case, tuning={"tile_n": 64, "num_stages": 3})



# three consumer warpgroups (tile_m 192, 160 registers each, no ping-pong): other query tiles,
# so checked against the reference; the shapes put tails, tiles with no key and GQA in play
WG3 = {"tile_m": 192, "tile_n": 64, "num_stages": 4, "pingpong": False}
WG3_CASES = [("softmax", "native", "bf16", 2, 333, 517, 8, 2, 128, True),
             ("softmax", "native", "bf16", 1, 517, 200, 4, 1, 128, True),
             ("softmax", "native", "bf16", 1, 200, 517, 8, 8, 64, False),
             ("softcap", "native", "bf16", 1, 333, 333, 8, 2, 128, True),
             ("softcap", "poly", "bf16", 1, 300, 411, 4, 4, 128, False),
             ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 128, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [1, 0], ids=["persistent", "single_tile"])
@pytest.mark.parametrize("case", WG3_CASES, ids=lambda c: "-".join(map(str, c)))
def test_three_warpgroups_against_reference(case, persistent):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_attn_fwd_gpu import run_case

    run_case(*case, tuning=dict(WG3, persistent=persistent))
