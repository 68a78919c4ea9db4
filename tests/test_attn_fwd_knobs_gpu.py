"""GPU tests of forward configs that no default picks at these shapes but plan overrides
select ("fwd.<FwdConfig field>", flash_attn_poly.plan.resolve; docs/NOTES_attn_fwd.md, ninth session):
- tile_n=64 at D = 128 on two consumer warpgroups: other key blocks, so another summation order:
  checked against the reference with the tolerance rule (tests/test_attn_fwd_gpu.run_case).
- tile_m=192 (three consumer warpgroups; the default for softcap under the constant row max
  at D = 128): against the reference, on the persistent grid and one CTA per tile.
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _program(case):
    """softcap/poly rows run the FP16 tanh program (a poly score on these tiles): BF16 softcap's
    default is the exp2 offload, a native score that CASES of test_attn_fwd_gpu already run on
    the three-warpgroup tile."""
    from test_attn_fwd_gpu import TANH_PROGRAM
    return TANH_PROGRAM if case[:2] == ("softcap", "poly") else None


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

    run_case(*case, overrides={"fwd.tile_m": 128, "fwd.tile_n": 64, "fwd.num_stages": 3}, program=_program(case))



# three consumer warpgroups (tile_m 192, 160 registers each, no ping-pong): other query tiles,
# so checked against the reference; the shapes put tails, tiles with no key and GQA in play
WG3 = {"fwd.tile_m": 192, "fwd.tile_n": 64, "fwd.num_stages": 4, "fwd.pingpong": False}
WG3_CASES = [("softmax", "native", "bf16", 2, 333, 517, 8, 2, 128, True),
             ("softmax", "native", "bf16", 1, 517, 200, 4, 1, 128, True),
             ("softmax", "native", "bf16", 1, 200, 517, 8, 8, 64, False),
             ("softcap", "native", "bf16", 1, 333, 333, 8, 2, 128, True),
             ("softcap", "poly", "bf16", 1, 300, 411, 4, 4, 128, False),
             ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 128, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [None, 0], ids=["persistent", "single_tile"])   # None: the plan's SM count
@pytest.mark.parametrize("case", WG3_CASES, ids=lambda c: "-".join(map(str, c)))
def test_three_warpgroups_against_reference(case, persistent):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_attn_fwd_gpu import run_case

    run_case(*case, overrides=WG3 if persistent is None else {**WG3, "fwd.persistent": persistent},
             program=_program(case))
