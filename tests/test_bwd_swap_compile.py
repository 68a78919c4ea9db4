"""Compile-only tests of the swapped D = 256 backward (BwdConfig.swap, kernels/attn_bwd_swap_sm90.py;
a plan override): per 64 x 48 block 51 HGMMA (S and dP 16 each at K = 256, dV^T and dK^T 8 each,
dQ 3: no recompute), 12 exponentials per thread where the score has them, no spills and no
serialised wgmma (one WARPGROUP.DEPBAR per wait, not per HGMMA)."""
from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

import builds as B  # noqa: E402

SWAP = {"bwd.swap": True, "bwd.tile_n": 48, "bwd.stages": 2, "bwd.head_loop": True}


@pytest.mark.compile
@pytest.mark.parametrize("mode, evaluator, causal", [("softmax", "native", True), ("softcap", "poly", False),
                                                     ("sigmoid", "poly", True)])
def test_swap_backward_builds(mode, evaluator, causal):
    from flash_attn_poly.kernels import sass
    p = B.plan(mode, evaluator, d=256, causal=causal, shape=(2, 4096, 16, 8), overrides=SWAP)
    assert p.bwd.swap and p.bwd.tile_n == 48 and p.bwd.head_loop, p.bwd
    b = B.bwd(p.bwd)
    n = b.counts(sass.families("HGMMA", "STL", "LDL", "MUFU.EX2"))
    assert n["HGMMA"] == 51 and n["STL"] + n["LDL"] == 0, n
    assert n["MUFU.EX2"] == (0 if mode == "sigmoid" else 12), n
    assert b.depbar() <= 4, b.depbar()
    assert "spill stores" not in b.ptxas_log() or "0 bytes spill stores" in b.ptxas_log()
