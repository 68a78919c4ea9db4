"""Compile-only tests of the swapped D = 256 backward (BwdConfig.swap, kernels/attn_bwd_swap_sm90.py;
the plan's build for dense D = 256 calls of the built-in scores): per 64 x 64 block 56 HGMMA (S and
dP 16 each at K = 256, dV^T and dK^T 8 each, dQ two column passes of 4: no recompute), tile_n / 4
exponentials per thread where the score has them, no spills and no serialised wgmma (one
WARPGROUP.DEPBAR per wait, not per HGMMA)."""
from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

import builds as B  # noqa: E402


@pytest.mark.compile
@pytest.mark.parametrize("mode, evaluator, causal, window", [("softmax", "native", True, (-1, -1)),
                                                             ("softcap", "poly", False, (-1, -1)),
                                                             ("sigmoid", "poly", True, (-1, -1)),
                                                             # Gemma-2's local layers
                                                             ("softcap", "poly", True, (300, -1))])
def test_swap_backward_builds(mode, evaluator, causal, window):
    from flash_attn_poly.kernels import sass
    p = B.plan(mode, evaluator, d=256, causal=causal, window=window, shape=(2, 4096, 16, 8))
    assert p.bwd.swap and p.bwd.tile_n == 64 and p.bwd.stages == 2 and p.bwd.head_loop, p.bwd
    assert p.bwd.window_left == (window[0] >= 0), p.bwd
    b = B.bwd(p.bwd)
    n = b.counts(sass.families("HGMMA", "STL", "LDL", "MUFU.EX2"))
    assert n["HGMMA"] == 56 and n["STL"] + n["LDL"] == 0, n
    assert n["MUFU.EX2"] == (0 if mode == "sigmoid" else 64 // 4), n
    assert b.depbar() <= 5, b.depbar()
    assert "spill stores" not in b.ptxas_log() or "0 bytes spill stores" in b.ptxas_log()


@pytest.mark.compile
@pytest.mark.parametrize("mode, evaluator, softcap", [("softmax", "native", None), ("softcap", "poly", 30.0),
                                                      ("sigmoid", "poly", None)])
def test_swap_varlen_builds(mode, evaluator, softcap):
    """AttnBwdSm90SwapVarlen: the dense swapped loop (56 HGMMA, no spills) with the CTA table, the
    sequence views and (sigmoid) the dO tail zeroing; at most a few loop-invariant words more."""
    from flash_attn_poly.kernels import sass
    p = B.varlen_plan(mode, evaluator, 256, True, (-1, -1), softcap)   # the plan's packed D = 256 build
    assert p.bwd.swap and p.bwd.varlen and p.bwd.head_loop and p.bwd.tile_n == 64, p.bwd
    b = B.bwd(p.bwd)
    n = b.counts(sass.families("HGMMA", "STL", "LDL"))
    assert n["HGMMA"] == 56 and n["STL"] + n["LDL"] == 0, n
    assert b.depbar() <= 5, b.depbar()
