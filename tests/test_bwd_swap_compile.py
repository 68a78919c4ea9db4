"""Compile-only tests of the swapped D = 256 backward (BwdConfig.swap, kernels/attn_bwd_swap_sm90.py;
a plan override): per 64 x 48 block 51 HGMMA (S and dP 16 each at K = 256, dV^T and dK^T 8 each,
dQ 3: no recompute; 56 at 64 keys, dQ in two passes), tile_n / 4 exponentials per thread where
the score has them, no spills and no
serialised wgmma (one WARPGROUP.DEPBAR per wait, not per HGMMA)."""
from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

import builds as B  # noqa: E402

def swap(tile_n):
    return {"bwd.swap": True, "bwd.tile_n": tile_n, "bwd.stages": 2, "bwd.head_loop": True}


@pytest.mark.compile
@pytest.mark.parametrize("mode, evaluator, causal, tile_n", [("softmax", "native", True, 48),
                                                             ("softcap", "poly", False, 48),
                                                             ("sigmoid", "poly", True, 48),
                                                             ("softmax", "native", False, 64)])
def test_swap_backward_builds(mode, evaluator, causal, tile_n):
    from flash_attn_poly.kernels import sass
    p = B.plan(mode, evaluator, d=256, causal=causal, shape=(2, 4096, 16, 8), overrides=swap(tile_n))
    assert p.bwd.swap and p.bwd.tile_n == tile_n and p.bwd.head_loop, p.bwd
    b = B.bwd(p.bwd)
    n = b.counts(sass.families("HGMMA", "STL", "LDL", "MUFU.EX2"))
    # S, dP 16 each; dV^T, dK^T 8 each; dQ 3 (48 keys) or 2 passes x 4 (64 keys)
    assert n["HGMMA"] == (51 if tile_n == 48 else 56) and n["STL"] + n["LDL"] == 0, n
    assert n["MUFU.EX2"] == (0 if mode == "sigmoid" else tile_n // 4), n
    assert b.depbar() <= 5, b.depbar()
    assert "spill stores" not in b.ptxas_log() or "0 bytes spill stores" in b.ptxas_log()


@pytest.mark.compile
def test_swap_staged_dq_builds():
    """dq_async on the swap build (48 keys, one Q / dO stage): the dQ tile staged by 16 STS.128 per
    thread, warp 1's 8 bulk adds per block (4 bands x 2 warpgroup halves), no spills."""
    from flash_attn_poly.kernels import sass
    ov = dict(swap(48), **{"bwd.stages": 1, "bwd.dq_async": True, "bwd.dq_halves": True})
    p = B.plan("softmax", "native", d=256, causal=True, shape=(2, 4096, 16, 8), overrides=ov)
    b = B.bwd(p.bwd)
    n = b.counts(sass.families("HGMMA", "STL", "LDL", "UBLKRED", "STS"))
    assert n["HGMMA"] == 51 and n["STL"] + n["LDL"] == 0 and n["UBLKRED"] == 8, n


@pytest.mark.compile
def test_swap_windowed_builds():
    """Sliding windows (Gemma-2's local layers): the window masks compile into the swap build too."""
    from flash_attn_poly.kernels import sass
    p = B.plan("softcap", "poly", d=256, causal=True, window=(300, -1), shape=(2, 4096, 16, 8), overrides=swap(48))
    assert p.bwd.swap and p.bwd.window_left, p.bwd
    n = B.bwd(p.bwd).counts(sass.families("HGMMA", "STL", "LDL"))
    assert n["HGMMA"] == 51 and n["STL"] + n["LDL"] == 0, n
