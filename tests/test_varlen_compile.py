"""Compile-only tests of the varlen forward build (FwdConfig.varlen; kernels/attn_fwd_sm90.py
AttnFwdSm90Varlen): it builds for sm_90a on the CPU with HGMMA and no spills for the score
functions and windows a packed batch uses, and it is a build of its own (the dense builds'
SASS is pinned by tests/test_sass_defaults_compile.py)."""
from __future__ import annotations

import dataclasses
import math
import warnings

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
    ("softmax", "native", 64, True, (-1, -1), None, "bf16"),    # the 192 x 128 forward tile, turns, keep words
    ("softcap", "poly", 64, True, (-1, -1), 50.0, "bf16"),      # ... under the constant max (the exp2 offload)
    ("softmax", "native", 256, True, (-1, -1), None, "bf16"),   # O staged through a 128-column tile
    ("sigmoid", "poly", 64, True, (-1, -1), None, "bf16"),      # the 192 x 128 tile, one bias: the program
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
@pytest.mark.parametrize("d", [64, 128, 256])
def test_varlen_sigmoid_default_bias_builds(d):
    """Packed sigmoid at the default bias: each sequence's -ln S_k from one MUFU.LG2 per tile in the
    forward (D = 64's 192-row tile in turns and D = 128; D = 256 is the same code) and the backward
    (D = 64's staggered 128-row step; the D = 256 one is the swapped build:
    kernels/attn_bwd_swap_sm90.py); HGMMA, no spills; the one-bias builds have no LG2."""
    p = B.varlen_plan("sigmoid", "poly", d, True, (-1, -1), None, sigmoid_bias=None)
    assert p.score.seq_bias and p.fwd.varlen and p.bwd.varlen and p.bwd.swap == (d == 256)
    if d == 64:
        assert (p.fwd.tile_m, p.fwd.pingpong, p.bwd.tile_m, p.bwd.p_turns) == (192, True, 128, True)
    builds = [B.bwd(p.bwd)] + ([B.fwd(p.fwd)] if d != 256 else [])
    for b in builds:
        n = b.counts()
        assert n["HGMMA"] > 0 and n["STL"] == 0 and n["LDL"] == 0, n
        assert b.sass.count("MUFU.LG2") == 1
    if d == 128:
        one = varlen_plan(*VARIANTS[5])   # sigmoid with one bias (a shared build)
        assert B.fwd(one.fwd).sass.count("MUFU.LG2") == 0


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
    """The plan's varlen rows: packed calls run the varlen forward (persistent), sigmoid at its
    per-sequence default bias too (ScoreSpec.seq_bias: the host's bias 0, the kernels add -ln S_k;
    the default program resolves native there: a sequence under 124 keys leaves its span); the
    override never takes a dense call."""
    from flash_attn_poly import plan
    p = varlen_plan(*VARIANTS[0], kernel=False)
    assert p.fwd.varlen and p.fwd.persistent == B.cat.SM_COUNT and not p.score.seq_bias
    call = varlen_plan(*VARIANTS[5]).call
    assert not varlen_plan(*VARIANTS[5]).score.seq_bias     # one bias given: no per-sequence bias
    d = plan.resolve(dataclasses.replace(call, sigmoid_bias=None), 132)
    assert d.fwd.varlen and d.bwd.varlen and d.sigmoid_bias == 0.0
    assert d.score.seq_bias and d.score_bwd.seq_bias and d.score.evaluator == "native"
    dense = plan.resolve(dataclasses.replace(call, sigmoid_bias=None, varlen=False), 132)
    assert not dense.score.seq_bias and dense.sigmoid_bias == pytest.approx(-math.log(4096))
    named = dataclasses.replace(call, evaluator="poly", sigmoid_bias=None, program="sigmoid_attn_n4096")
    assert "fewer than 124 keys" in plan.poly_outside_rule(named, plan._program_spec("sigmoid_attn_n4096"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # a named program runs as asked, with that reason
        p_named = plan.resolve(named, 132)
    assert p_named.score.evaluator == "poly" and p_named.score.seq_bias and p_named.fwd.varlen
    with pytest.raises(ValueError, match="seq_bias"):
        dataclasses.replace(p.score, seq_bias=True)          # sigmoid's only
    with pytest.raises(ValueError, match="runs packed calls"):
        plan.resolve(dataclasses.replace(call, varlen=False), 132, {"fwd.varlen": True})


@pytest.mark.compile
@pytest.mark.parametrize("variant,compact", [(VARIANTS[6], True), (VARIANTS[2], False)], ids=["d64-compact", "d128-window-slot"])
def test_varlen_pack_gqa_builds_without_spills(variant, compact):
    """The varlen forward with the GQA group packed into its tiles (each sequence's rows ((g, S_b), ...)
    from its offset; the plan's pick at causal D = 64 softmax / softcap, by override here at D = 128):
    Q by 5-D TMA boxes, HGMMA, no spills (the compact D = 128 softcap build, 192 x 64, spills 2 words:
    not a plan pick)."""
    from flash_attn_poly.kernels import sass
    p = B.varlen_plan(*variant, overrides={"fwd.varlen": True, "fwd.pack_gqa": True, "fwd.varlen_compact": compact})
    assert p.fwd.pack_gqa == 4 and p.fwd.varlen_compact == compact
    n = sass.count_opcodes(B.fwd(p.fwd).sass, sass.families("UTMALDG.5D", "HGMMA", "STL", "LDL"))
    assert n["UTMALDG.5D"] == variant[2] // 64 and n["HGMMA"] > 0 and n["STL"] == n["LDL"] == 0, n
