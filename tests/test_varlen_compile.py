"""Compile-only tests of the varlen forward build (FwdConfig.varlen; kernels/attn_fwd_sm90.py
AttnFwdSm90Varlen): it builds for sm_90a on the CPU with HGMMA and no spills for the score
functions and windows a packed batch uses, and it is a build of its own (the dense builds'
SASS is pinned by tests/test_sass_defaults_compile.py)."""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("cutlass")

import builds as B  # noqa: E402

VARIANTS = [   # (mode, evaluator, head_dim, causal, window, softcap, dtype): tests/test_varlen_gpu.py's and more
    ("softmax", "native", 128, True, (-1, -1), None, "bf16"),
    ("softcap", "poly", 256, True, (-1, -1), 30.0, "bf16"),
    ("softmax", "native", 128, False, (48, 16), None, "bf16"),
    ("sigmoid", "poly", 128, True, (-1, -1), None, "fp16"),
    ("softcap", "native", 128, True, (63, -1), 50.0, "bf16"),
    ("sigmoid", "poly", 128, False, (-1, -1), None, "bf16"),
    ("softmax", "native", 64, True, (-1, -1), None, "bf16"),    # the 192 x 128 forward tile
    ("softmax", "native", 256, True, (-1, -1), None, "bf16"),   # O staged through a 128-column tile
]


def varlen_plan(*variant, kernel=True):
    """builds.varlen_plan with the varlen forward chosen (fwd.varlen: the plan's varlen row, a
    persistent grid)."""
    return B.varlen_plan(*variant, overrides={"fwd.varlen": True} if kernel else None)


@pytest.mark.compile
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-d{v[2]}-c{int(v[3])}-w{v[4][0]}_{v[4][1]}-{v[6]}")
def test_varlen_forward_builds_without_spills(variant):
    """The persistent varlen forward: every role decodes its tiles over (sequence, head) units,
    reads the sequence's offsets and skips tiles past its end; HGMMA, no spills."""
    p = varlen_plan(*variant)
    assert p.fwd.varlen and p.fwd.persistent == B.cat.SM_COUNT
    n = B.fwd(p.fwd).counts()
    assert n["HGMMA"] > 0
    assert n["STL"] == 0 and n["LDL"] == 0, f"register spills: {n}"


@pytest.mark.compile
def test_varlen_compact_order_builds_without_spills():
    """The compact order (fwd.varlen_compact: the live (query tile, sequence) pairs from a table,
    kernels/tile_scheduler.py): its own entry (the table after max_seqlen_q), HGMMA, no spills,
    the registers of the plan's varlen build."""
    p = B.varlen_plan(*VARIANTS[0], overrides={"fwd.varlen": True, "fwd.varlen_compact": True})
    assert p.fwd.varlen_compact
    comp, slots = B.fwd(p.fwd), B.fwd(dataclasses.replace(p.fwd, varlen_compact=False))
    n = comp.counts()
    assert n["HGMMA"] == slots.counts()["HGMMA"] > 0
    assert n["STL"] == 0 and n["LDL"] == 0, f"register spills: {n}"
    assert comp.sass != slots.sass


@pytest.mark.compile
def test_varlen_is_its_own_build():
    var = varlen_plan(*VARIANTS[0]).fwd
    dense = dataclasses.replace(var, varlen=False)
    a, b = B.fwd(dense), B.fwd(var)
    assert a.sass != b.sass
    # the same main loop: the GEMMs and the exponentials are the dense build's
    for fam in ("HGMMA", "MUFU.EX2", "MUFU.TANH"):
        assert a.counts()[fam] == b.counts()[fam], fam


def test_check_fwd_refuses_user_scores_in_varlen():
    from flash_attn_poly.kernels.config import check_fwd
    from flash_attn_poly.kernels.scores import ScoreSpec
    cfg = varlen_plan(*VARIANTS[0]).fwd
    with pytest.raises(ValueError, match="varlen: no user score"):
        check_fwd(dataclasses.replace(cfg, score=ScoreSpec(kind="user", evaluator="native", user=object())))
    with pytest.raises(ValueError, match="varlen forward is a persistent grid"):
        check_fwd(dataclasses.replace(cfg, persistent=0))


def test_plan_runs_packed_calls_on_the_varlen_forward():
    """The plan's varlen rows: packed calls run the varlen forward (persistent) except with
    sigmoid's per-sequence default bias (one dense launch per sequence); the override never
    takes a dense call or that bias."""
    from flash_attn_poly import plan
    p = varlen_plan(*VARIANTS[0], kernel=False)
    assert p.fwd.varlen and p.fwd.persistent == B.cat.SM_COUNT
    dense_seq = plan.resolve(dataclasses.replace(varlen_plan(*VARIANTS[5]).call, sigmoid_bias=None), 132)
    assert not dense_seq.fwd.varlen and dense_seq.fwd.persistent == 132   # per-sequence launches stay persistent
    call = varlen_plan(*VARIANTS[5]).call
    assert not plan.resolve(dataclasses.replace(call, sigmoid_bias=None), 132).fwd.varlen
    with pytest.raises(ValueError, match="default -ln S_k differs per sequence"):
        plan.resolve(dataclasses.replace(call, sigmoid_bias=None), 132, {"fwd.varlen": True})
    with pytest.raises(ValueError, match="runs packed calls"):
        plan.resolve(dataclasses.replace(call, varlen=False), 132, {"fwd.varlen": True})
