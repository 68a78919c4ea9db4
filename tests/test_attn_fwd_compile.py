"""Compile-only tests of the Hopper attention forward: build for sm_90a on the CPU
(CUTE_DSL_ARCH=sm_90a, no GPU) and check the SASS of every mode x evaluator x D x causal.

Each build is named by the call that picks it (tests/builds.py: the plan of attention()'s
arguments at the catalogue's anchor shape, with plan overrides for the non-default builds a test
compares against) and compiled once per session, shared with the other compile tests.

What the SASS must show:
  * HGMMA present (QK^T and PV run on the tensor cores);
  * no local-memory traffic (STL/LDL = register spills);
  * MUFU per mode: softmax has EX2 and no TANH; softcap/native has TANH; pure poly
    (poly_split (1, 1)): softcap has no TANH; sigmoid's TANH are the MUFU branch's alone (one per
    block pair score, in a branch typical scores skip: kernels/scores/sigmoid.py _above_clamp),
    its other MUFU the prologue's integer divides (RCP);
  * the default poly split (j, k) keeps MUFU.TANH by design: exactly (1 - j/k) of native's
    (sigmoid: plus the branch's j/k, native's count in all).
"""
from __future__ import annotations

import collections
import dataclasses

import pytest

pytest.importorskip("cutlass")

import builds as B  # noqa: E402

# the seed's packed-BF16 programs (the poly default is FP16 since the H200 accuracy runs: the
# plan's program rows); tests of BF16-block SASS facts name them
BF16 = {"softcap": "softcap_c50", "sigmoid": "sigmoid_attn_n4096"}
# softcap caps: ONLINE (above plan.FIXED_MAX_CAP) resolves the online-max builds (two consumer
# warpgroups, the FP16 tanh program for poly: also what FP16 inputs run), FIXED the constant
# row max (BF16, cap <= 50: three warpgroups at D = 128, the exp2 offload for poly)
ONLINE, FIXED = 60.0, 50.0


def _plan(mode, evaluator="native", head_dim=128, causal=True, dtype="bf16", split=None, program=None,
          softcap=ONLINE, window=(-1, -1), **fwd):
    """The plan of attention(mode, evaluator, ...) with forward overrides `fwd` (FwdConfig fields)
    and `split` (the poly split, taken as given)."""
    ov = {f"fwd.{k}": v for k, v in fwd.items()}
    if split:
        ov["poly_split"] = split
    return B.plan(mode, evaluator, d=head_dim, causal=causal, dtype=dtype, program=program, window=window,
                  softcap=softcap if mode == "softcap" else None, overrides=ov)


def _build(*args, **kw) -> "B.Build":
    return B.fwd(_plan(*args, **kw).fwd)


def _counts(*args, **kw) -> dict:
    """SASS opcode family counts of the forward build of _plan(*args, **kw)."""
    return _build(*args, **kw).counts()


# softcap here: the online-max builds (ONLINE cap); the cap-50 defaults (fixed max, three warpgroups,
# the exp2 offload) are built by test_three_consumer_warpgroups_build_without_spills,
# test_softcap_exp2_offload_build and tests/test_sass_defaults_compile.py
COMBOS = [(m, e, d, c) for m, e in [("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
                                    ("sigmoid", "native"), ("sigmoid", "poly")]
          for d in (64, 128) for c in (True, False)]


# default builds that spill, with their bound: the non-causal D = 64 sigmoid poly forward stages O
# (fwd-d64-sigmoid-osmem: 0.94-0.98x the time) at 3 words stored before the persistent tile loop and
# reloaded once per tile after the key-block loops, none inside them (fwd-d64-sigmoid-osmem-spill)
SPILL_BOUND = {("sigmoid", "poly", 64, False): 3}


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,head_dim,causal", COMBOS)
def test_compiles_with_hgmma_and_no_spills(mode, evaluator, head_dim, causal):
    n = _counts(mode, evaluator, head_dim, causal)
    assert n["HGMMA"] > 0
    # the default poly splits do not spill either (pure-poly builds may: docs/NOTES_attn_fwd.md)
    bound = SPILL_BOUND.get((mode, evaluator, head_dim, causal), 0)
    assert n["STL"] <= bound and n["LDL"] <= bound, f"register spills: {n} (bound {bound})"


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "native"), ("sigmoid", "native")])
def test_native_mufu(mode, evaluator):
    n = _counts(mode, evaluator)
    if mode == "softmax":
        assert n["MUFU.EX2"] > 0 and n["MUFU.TANH"] == 0
    elif mode == "softcap":
        assert n["MUFU.TANH"] > 0 and n["MUFU.EX2"] > 0
    else:
        assert n["MUFU.TANH"] > 0 and n["MUFU.EX2"] == 0


@pytest.mark.compile
def test_softcap_pure_poly_has_no_tanh():
    n = _counts("softcap", "poly", split=(1, 1), pingpong=True)
    assert n["MUFU.TANH"] == 0 and n["HFMA2"] > 0


@pytest.mark.compile
def test_sigmoid_pure_poly_has_no_mufu():
    """All key columns on the block: the only TANH are the MUFU branch's (one per block-pair
    score: native's count), no other transcendental, and RCP of the prologue's integer divides:
    2 for head // (H_q / H_kv), 3 more for the LPT tile decode (kernels/tile_scheduler.py), once
    per CTA."""
    nat = _counts("sigmoid", "native", pingpong=True, persistent=0)
    n = _counts("sigmoid", "poly", split=(1, 1), pingpong=True, persistent=0)
    assert n["MUFU.TANH"] == nat["MUFU.TANH"] > 0 and n["MUFU.EX2"] == n["MUFU.RSQ"] == 0, (n, nat)
    assert n["MUFU"] - n["MUFU.RCP"] - n["MUFU.TANH"] == 0 and n["MUFU.RCP"] <= 5 and n["HFMA2"] > 0, n
    # persistent CTAs (the default): the decode runs once per tile in the producer and in the
    # consumers (rounds, batch and section divides): RCP only, a handful
    n2 = _counts("sigmoid", "poly", split=(1, 1), pingpong=True)
    assert n2["MUFU.EX2"] == n2["MUFU.RSQ"] == 0 and n2["MUFU.TANH"] == n["MUFU.TANH"], n2
    assert n2["MUFU"] - n2["MUFU.RCP"] - n2["MUFU.TANH"] == 0 and n2["MUFU.RCP"] <= 10 and n2["HFMA2"] > 0, n2


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,head_dim", [("softmax", "native", 128), ("softcap", "poly", 128),
                                                     ("sigmoid", "poly", 64), ("softcap", "poly", 256)])
def test_persistent_default_keeps_the_loop(mode, evaluator, head_dim):
    """The default forward is persistent (FwdConfig.persistent = the SM count): the tile loop
    wraps the one-tile-per-CTA body (persistent=0, the same LPT order), so the GEMMs and the
    stage's MUFU and packed FMAs are that build's, with no spills; only the tile decode
    (integer divides, RCP) is added.  The one-CTA-per-tile build (no plan row picks it) of
    sigmoid poly at D = 64 spilled 3 words with its warpgroups free-running (the clamp fix-up keeps
    the block pairs' raw scores, docs/MEASURED.md sigmoid-program-cap); in turns (the D = 64 default
    since fwd-d64-turns) it does not, nor does the persistent default."""
    assert _plan(mode, evaluator, head_dim).fwd.persistent == B.cat.SM_COUNT   # the H200's SMs
    a, b = _counts(mode, evaluator, head_dim), _counts(mode, evaluator, head_dim, persistent=0)
    for op in ("HGMMA", "MUFU.EX2", "MUFU.TANH", "HFMA2"):
        assert a[op] == b[op], (op, a, b)
    one_cta_spill = 0
    assert a["STL"] == 0 and a["LDL"] == 0, a
    assert b["STL"] == one_cta_spill and b["LDL"] == one_cta_spill, b
    assert b["MUFU.RCP"] < a["MUFU.RCP"] <= b["MUFU.RCP"] + 6, (a, b)


@pytest.mark.compile
@pytest.mark.parametrize("mode", ["softcap", "sigmoid"])
def test_default_split_keeps_its_share_of_tanh(mode):
    """The default split sends (1 - j/k) of the pairs to MUFU.TANH: exactly that share of
    the native build's TANH count (same loop structure), and no spills.  Sigmoid's block pairs
    have their TANH too, in the branch typical scores skip (the pure-poly test counts it: one per
    block-pair score), so its static count is native's."""
    p = _plan(mode, "poly")
    j, k = p.score.poly_split
    n = _counts(mode, "poly")
    nat = _counts(mode, "native", pingpong=p.fwd.pingpong)
    assert 0 < j < k, "defaults are measured splits, not the pure paths"
    branch = nat["MUFU.TANH"] * j if mode == "sigmoid" else 0
    assert n["MUFU.TANH"] * k == nat["MUFU.TANH"] * (k - j) + branch, (n, nat)
    assert n["HFMA2"] > 0 and n["STL"] == 0 and n["LDL"] == 0


@pytest.mark.compile
def test_fp16_and_d256_compile():
    for dtype, d in (("fp16", 128), ("bf16", 256)):
        n = _counts("softmax", "native", d, True, dtype)
        assert n["HGMMA"] > 0 and n["STL"] == 0


# ---------------------------------------------------------------- sliding window (kernels/mask.py)
@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,causal,left,right", [
    ("softmax", "native", True, True, False), ("softcap", "poly", True, True, False),
    ("softcap", "native", False, True, True), ("sigmoid", "poly", False, True, True),
    ("sigmoid", "native", False, False, True)])
def test_window_builds_hgmma_no_spills(mode, evaluator, causal, left, right):
    """Windowed builds (sizes are runtime Int32): HGMMA, no spills, and one more loop copy
    than the unwindowed build when there is a left bound (the masked left-edge blocks)."""
    # sizes do not matter (runtime Int32); causal compiles no right bound (right = 0)
    win = (512 if left else -1, (64 if right else -1) if not causal else 0)
    n = _counts(mode, evaluator, 128, causal, window=win)
    base = _counts(mode, evaluator, 128, causal)
    # (softcap/poly with the two-region program spills 2 words here, 2 STL + 4 LDL; with the
    # one-region default none; CPU SASS, 2026-11-30)
    assert n["HGMMA"] > 0 and n["STL"] == 0 and n["LDL"] == 0, n
    if left:
        assert n["HGMMA"] > base["HGMMA"], (n["HGMMA"], base["HGMMA"])


def _ptxas_report(plan):
    """(ptxas -v stderr, SASS opcode counts, WARPGROUP.DEPBAR count, SASS text) of plan's forward."""
    b = B.fwd(plan.fwd)
    return b.ptxas_log(), b.counts(), b.depbar(), b.sass


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "native"),
                                            ("softcap", "poly"), ("sigmoid", "native")])
def test_overlapped_loop_has_no_c7513(mode, evaluator):
    """The overlapped loop (attn_fwd block_overlap: P packed after wait_group(0)) must not make
    ptxas serialise the wgmma.  Measured here (D=128 causal BF16, 168 regs, no spills): HGMMA
    72 and WARPGROUP.DEPBAR 9 (the real waits) for all four; a P packed while PV is in flight
    gave DEPBAR 72 = one after every HGMMA (C7513)."""
    log, n, depbar, _ = _ptxas_report(_loop_cfg(mode, evaluator))
    assert "C7513" not in log, log[-600:]
    assert "0 bytes spill stores" in log and n["STL"] == 0 and n["LDL"] == 0, n
    assert n["HGMMA"] > 0 and depbar < n["HGMMA"], (depbar, n)


def _loop_cfg(mode, evaluator, **kw):   # kw: _plan's (split, program)
    """D = 128 causal BF16 without ping-pong (the overlapped loop alone) and with the register
    epilogue (the spill counts below were read before O staging became D = 128's default)."""
    return _plan(mode, evaluator, pingpong=False, o_smem=False, **kw)


@pytest.mark.compile
@pytest.mark.parametrize("split", [(1, 4), (1, 2), (1, 1)])
def test_sigmoid_poly_overlapped_loop_has_no_c7513(split):
    """sigmoid/poly (BF16 D3 program) in the overlapped loop: the stage runs sigmoid_fwd_head,
    write_p the last squaring (sigmoid_fwd_tail) and the MUFU pairs' packs after wait_group(0).

    Measured here (D=128 causal BF16, 168 regs, HGMMA 72, DEPBAR 9, no C7513): TANH 256 (native's)
    at every split: 1/4 192 on the MUFU columns and 64 in the MUFU branch, 1/2 128 + 128, 1/1 all in
    the branch.  The branch keeps the block pairs' raw scores through the stage: 1/4 no spills, 1/2
    15 words (17 with the EX2 + RSQ branch; none before the branch), 1/1 5 (11 before it; 4 while it
    branched once per thread, not per thread row); the default splits (1/16, 1/8 at D = 256) none."""
    log, n, depbar, _ = _ptxas_report(_loop_cfg("sigmoid", "poly", split=split, program=BF16["sigmoid"]))
    assert "C7513" not in log, log[-600:]
    assert n["HGMMA"] > 0 and depbar < n["HGMMA"], (depbar, n)
    _, nat, _, _ = _ptxas_report(_loop_cfg("sigmoid", "native"))
    j, k = split
    # TANH: the MUFU pairs' share of native's, (k - j) / k, and the branch's one per block-pair
    # score, j / k: native's count in all; no other transcendental
    assert n["MUFU.TANH"] == nat["MUFU.TANH"] and n["MUFU.EX2"] == n["MUFU.RSQ"] == 0, (n, nat)
    # two squarings per block pair (head's first, tail's last), as in the whole block (the
    # branch's P skips the tail by a select)
    assert n["HMUL2"] == 2 * n["HFMA2.BF16"] // 3, n
    spill = {(1, 4): 0, (1, 2): 17, (1, 1): 5}[split]
    assert n["STL"] <= spill, n
    if spill == 0:
        assert "0 bytes spill stores" in log and n["LDL"] == 0, n


@pytest.mark.compile
@pytest.mark.parametrize("evaluator", ["native", "poly"])
def test_softcap_d256_forward_spills(evaluator):
    """Gemma-2 head dim: the forward builds at tile 128 x 64 (smem: Q 64 KB + 2 x (K+V) 64 KB),
    one CTA per tile and persistent (the default), without spills for either evaluator (the
    poly ping-pong build spilled 5 words with the BF16 program on 1/2; none with the FP16
    default).  Its backward: tests/test_attn_bwd_compile.py::test_d256_bwd_builds."""
    n = _counts("softcap", evaluator, 256, True, persistent=0)
    assert n["HGMMA"] > 0 and n["STL"] == 0 and n["LDL"] == 0, n
    d = _counts("softcap", evaluator, 256, True)
    assert d["HGMMA"] == n["HGMMA"] and d["STL"] == 0 and d["LDL"] == 0, d


@pytest.mark.compile
def test_softcap_f16_program_fwd_builds_without_spills():
    """program="softcap_c50_f16" (FP16 D5 residual, once the default): HGMMA, no spills, no bf16x2
    FMA left, the same MUFU counts as the BF16 program's build at the same split."""
    n = _counts("softcap", "poly", program="softcap_c50_f16")
    base = _counts("softcap", "poly", program=BF16["softcap"])
    assert n["HGMMA"] == base["HGMMA"] and n["STL"] == 0 and n["LDL"] == 0, n
    assert n.get("HFMA2.BF16", 0) == 0 and n["MUFU.TANH"] == base["MUFU.TANH"], (n, base)


@pytest.mark.compile
def test_sigmoid_f16_program_fwd_builds_without_spills():
    """program="sigmoid_attn_n4096_f16" (FP16 D4, the default; P converted to bf16x2): both P paths
    (the overlapped steps' head/tail, the first block's full block) build with HGMMA, no spills,
    no bf16x2 FMA, the same MUFU.TANH count as the BF16 program's default build."""
    n = _counts("sigmoid", "poly", program="sigmoid_attn_n4096_f16")
    assert _plan("sigmoid", "poly").score.program.name == "sigmoid_attn_n4096_f16"   # the default
    base = _counts("sigmoid", "poly", program=BF16["sigmoid"])
    assert n["HGMMA"] == base["HGMMA"] and n["STL"] == 0 and n["LDL"] == 0, n
    assert n.get("HFMA2.BF16", 0) == 0 < n["HFMA2"] and n["MUFU.TANH"] == base["MUFU.TANH"], (n, base)


@pytest.mark.compile
@pytest.mark.parametrize("split,stl_max", [(None, 0), ((1, 1), 17)], ids=["default-split", "all-block"])
def test_softcap_tail_program_fwd_builds(split, stl_max):
    """program="softcap_c50_f16_tail" (two-region FP16, the default for part of 2026-11-30):
    HGMMA, the MUFU.TANH count of the split (none all-block), more HFMA2 and LOP3 (the FP32
    region select and per-lane coefficient selects) than the one-region residual program at
    the same split.  Measured (D=128 causal BF16, then split 1/4): HFMA2 160 (residual 128),
    LOP3 367 (74); all-block 17 STL / 31 LDL."""
    n = _counts("softcap", "poly", split=split, program="softcap_c50_f16_tail")
    base = _counts("softcap", "poly", split=split, program="softcap_c50_f16")
    assert n["HGMMA"] == base["HGMMA"] > 0 and n["MUFU.TANH"] == base["MUFU.TANH"], (n, base)
    assert (n["MUFU.TANH"] == 0) == (split == (1, 1))
    assert n["HFMA2"] > base["HFMA2"] and n["LOP3"] > base["LOP3"], (n, base)
    assert n["STL"] <= stl_max, n


@pytest.mark.compile
def test_row_max_chains_knob_builds():
    """FwdConfig.row_max_chains=4: four running row maxima then a tree instead of one
    31-deep FMNMX chain (on by default for softmax at D = 128, with row_sum_carry).  The same
    arithmetic instructions as the default (the max is exact in any order; register moves may
    differ), a different schedule, no spills; measured (softmax D=128 causal):
    interior-loop instructions before the PV wait 183 -> 133 (ptxas places the wait earlier)."""
    from flash_attn_poly.kernels import sass

    assert _plan("softmax").fwd.row_max_chains == 4   # the default at D = 128
    base, four = _build("softmax", row_max_chains=1).sass, _build("softmax").sass
    fam = dict(sass.FAMILIES, **sass.STAGE_FAMILIES)   # arithmetic families (moves/NOPs may differ)
    assert sass.count_opcodes(four, fam) == sass.count_opcodes(base, fam)
    assert four != base
    assert sass.count_opcodes(four)["STL"] == 0


@pytest.mark.compile
def test_row_sum_carry_moves_o_rescale_to_the_pv_wait():
    """FwdConfig.row_sum_carry=True: the block's row sum starts from row_sum * row_scale,
    so the row-scale exp2 is computed first and ptxas places the 64 O-rescale FMULs of the
    interior (mask-free) loop right after the PV wait (WARPGROUP.DEPBAR 0x0) instead of after
    the last exp2 (found by reading the SASS beside FA4's; softmax D=128 causal: first O FMUL
    132 instructions after the wait without the knob, 5 with it). No spills either way."""
    from flash_attn_poly.kernels import sass

    def gap_after_pv_wait(**kw):   # without softmax's stale-max default (its branch moves the rescale)
        txt = _build("softmax", rescale_threshold=0.0, persistent=0, **kw).sass   # one tile's loops
        assert sass.count_opcodes(txt)["STL"] == 0
        lp = next(lp for lp in sass.overlap_loops(txt) if not lp["masked"])
        lines = sass._sass_lines(txt)[lp["lines"][0]:lp["lines"][1] + 1]
        body = [t for k, t in lines if k == "instr"]
        s_ready = next(i for i, t in enumerate(body) if t.startswith("WARPGROUP.DEPBAR") and t.endswith("0x1"))
        wait = next(i for i, t in enumerate(body) if i > s_ready and t.startswith("WARPGROUP.DEPBAR") and t.endswith("0x0"))
        fmul = [i for i, t in enumerate(body) if t.startswith("FMUL") and i > wait]
        return fmul[0] - wait
    assert gap_after_pv_wait(row_sum_carry=True, pingpong=False) <= 16 < gap_after_pv_wait(row_sum_carry=False, pingpong=False)


@pytest.mark.compile
@pytest.mark.parametrize("evaluator", ["native", "poly"])
def test_fixed_max_drops_the_row_max_and_o_rescale(evaluator):
    """FwdConfig.fixed_max=True (softcap, BF16): the interior (mask-free) loop has no
    FMNMX, no shuffles and no O-rescale FMULs, the same HGMMA and MUFU work, no spills, and
    is shorter (D=128 causal, 128 x 128 tile: native 622 -> 602 instructions, poly 1/8 745 -> 665;
    the row sum of the BF16-rounded P for O, common.write_p_fixed, costs 2 integer ops and 2
    FADD per pair on top of the FP32 sum the LSE keeps)."""
    from flash_attn_poly.kernels import sass

    def interior(fixed):   # the two-warpgroup 128 x 128 tile both ways (fixed_max's default is 192 x 64)
        # poly: the FP16 tanh program on 1/8 (not the exp2 offload, the cap-50 default)
        txt = _build("softcap", evaluator, softcap=FIXED, fixed_max=fixed, tile_m=128, tile_n=128,
                     num_stages=2, pingpong=evaluator == "poly",
                     program="softcap_c50_f16_odd" if evaluator == "poly" else None).sass
        assert sass.count_opcodes(txt)["STL"] == 0
        lp = next(lp for lp in sass.overlap_loops(txt) if not lp["masked"])
        body = [t for k, t in sass._sass_lines(txt)[lp["lines"][0]:lp["lines"][1] + 1] if k == "instr"]
        return collections.Counter(t.split()[0] for t in body), len(body)
    (on, n_on), (off, n_off) = interior(True), interior(False)
    ops = lambda c, p: sum(v for k, v in c.items() if k.startswith(p))
    assert ops(on, "FMNMX") <= ops(off, "FMNMX") - 64 and ops(on, "SHFL") == 0 < ops(off, "SHFL")
    assert ops(on, "HGMMA") == ops(off, "HGMMA") and ops(on, "MUFU.TANH") == ops(off, "MUFU.TANH")
    assert ops(on, "MUFU.EX2") == ops(off, "MUFU.EX2") - 2   # the two rows' O-rescale exp2
    assert n_on < n_off - 10, (n_on, n_off)


@pytest.mark.compile
def test_rescale_threshold_branches_around_the_o_rescale():
    """FwdConfig.rescale_threshold=8: a row keeps its stale max until a block raises it by
    more than 2^8, and a warp skips the O rescale when none of its rows moved (VOTE.ANY, then a
    branch over the 64 O FMULs; softmax D=128 causal; the softmax default).  No C7513 (the wgmma stay
    pipelined: WARPGROUP.DEPBAR 9 for 72 HGMMA), no spills; the rescale_threshold=0 build has no vote."""
    assert _plan("softmax").fwd.rescale_threshold == 8.0   # the default
    log, n, depbar, text = _ptxas_report(_plan("softmax"))
    assert "C7513" not in log, log[-600:]
    assert "0 bytes spill stores" in log and n["STL"] == 0 and n["LDL"] == 0, n
    assert n["HGMMA"] > 0 and depbar < n["HGMMA"], (depbar, n)
    lines = [ln.strip() for ln in text.splitlines()]
    labels = {ln.split(":")[0]: i for i, ln in enumerate(lines) if ln.startswith(".L_x_")}
    votes = [i for i, ln in enumerate(lines) if "VOTE.ANY" in ln]
    assert votes, "no warp vote"
    skipped = []
    for v in votes:   # the first predicated forward branch after each vote: what it skips
        br = next(i for i in range(v, len(lines)) if " BRA " in lines[i] and lines[i].split("*/")[1].strip().startswith("@"))
        tgt = labels[lines[br].split("(")[1].split(")")[0]]
        skipped.append(sum("FMUL" in ln for ln in lines[br + 1:tgt]) if tgt > br else 0)
    assert max(skipped) >= 64, skipped
    assert "VOTE.ANY" not in _build("softmax", rescale_threshold=0.0).sass


@pytest.mark.compile
@pytest.mark.parametrize("fixed_max", [True, False], ids=["fixed_max", "online"])
def test_softcap_odd_program_clamps_on_the_fma_pipe(fixed_max):
    """odd_u2 program (fit/softcap_odd.py) at split 1/2: its pairs clamp with fma.rn.sat.f32 and
    run no abs / min / sign ops, so the forward has no HMNMX2, no FMNMX beyond native's (the
    online row max; none under fixed_max) and fewer LOP3 than the one-region program; HGMMA,
    no spills, half of native's MUFU.TANH."""
    cap = FIXED if fixed_max else ONLINE   # the cap-50 builds: three warpgroups, 192 x 64
    odd = _counts("softcap", "poly", split=(1, 2), program="softcap_c50_f16_odd", softcap=cap)
    one = _counts("softcap", "poly", split=(1, 2), program="softcap_c50_f16", softcap=cap)
    nat = _counts("softcap", "native", softcap=cap)
    assert _plan("softcap", "poly", program="softcap_c50_f16_odd", softcap=cap).fwd.fixed_max == fixed_max
    assert odd["HGMMA"] > 0 and odd["STL"] == 0 and odd["LDL"] == 0
    assert odd["HMNMX2"] == 0 and odd["FMNMX"] == nat["FMNMX"] < one["FMNMX"]
    assert odd["LOP3"] < one["LOP3"]
    assert odd["MUFU.TANH"] == nat["MUFU.TANH"] // 2


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", [("softcap", "native"), ("softcap", "poly"), ("softmax", "native"),
                                            ("sigmoid", "poly")])
def test_three_consumer_warpgroups_build_without_spills(mode, evaluator):
    """tile_m 192 = three consumer warpgroups of 160 registers (24 + 3 x 160 = 504 per thread
    slot), tile_n 64: HGMMA present, no spills, no wgmma serialisation (C7512 / C7513 / C7514);
    softcap's default takes its GEMMs in turns (fwd-three-warpgroups-turns), sigmoid's is built
    free-running.  At tile_n 128 the same build spills (not a supported combination)."""
    if mode == "softcap":   # BF16 cap 50: the default tile (poly: the FP16 tanh program, not the exp2 offload)
        p = _plan(mode, evaluator, softcap=FIXED, program="softcap_c50_f16_odd" if evaluator == "poly" else None)
        assert p.fwd.fixed_max
    else:                   # the plan coarsens the split to the 64-key block
        p = _plan(mode, evaluator, tile_m=192, tile_n=64, pingpong=False, num_stages=4)
    assert (p.fwd.tile_m, p.fwd.tile_n, p.fwd.num_stages, p.fwd.pingpong) == (192, 64, 4, mode == "softcap")
    log, n, _, _ = _ptxas_report(p)
    assert n.get("HGMMA", 0) > 0 and n.get("STL", 0) == 0 and n.get("LDL", 0) == 0, n
    assert "0 bytes spill stores" in log and not any(c in log for c in ("C7512", "C7513", "C7514")), log[-800:]


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,causal", [(128, True), (128, False), (256, True), (64, True)])
def test_softcap_exp2_offload_build(head_dim, causal):
    """program="exp2_f32_d3" (the exp2 offload, the default for BF16 softcap with cap <= 50: the
    constant row max): the tanh
    stays on MUFU for every score (native's MUFU.TANH count), the exp2_f32 block replaces
    MUFU.EX2 in 1/8 of the mask-free blocks' columns (its 3 FFMA + 1 IMAD per score), and
    the build neither spills nor serialises its wgmma."""
    p = _plan("softcap", "poly", head_dim, causal, softcap=FIXED)
    assert p.score.evaluator == "native" and p.score.program.name == "exp2_f32_d3"
    assert p.fwd.fixed_max and p.fwd.exp2_fma == 1
    n = _counts("softcap", "poly", head_dim, causal, softcap=FIXED)
    # native on the offload's tile (at D = 256 with ping-pong, and 80-key blocks when non-causal)
    tile = dict(tile_n=p.fwd.tile_n, pingpong=p.fwd.pingpong) if head_dim == 256 else {}
    nat = _counts("softcap", "native", head_dim, causal, softcap=FIXED, **tile)
    assert n["MUFU.TANH"] == nat["MUFU.TANH"] > 0
    assert 0 < n["MUFU.EX2"] < nat["MUFU.EX2"], (n["MUFU.EX2"], nat["MUFU.EX2"])
    assert n["FFMA"] > nat["FFMA"] and n["HGMMA"] == nat["HGMMA"]
    assert n["STL"] == 0 and n["LDL"] == 0, n
    log = _ptxas_report(p)[0]
    assert "C7512" not in log and "C7513" not in log, log


# ------------------------------------------ the tiles of issue 27's cells (plan rows fwd-d64-tile,
# fwd-d256-tile-n80): they build without spills or wgmma serialisation, with the GEMMs their tiles
# imply, beside the tiles they replaced
CAND_MODES = [("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")]


def _clean(p):
    """ptxas log and SASS counts of p's forward, asserting no spill and no C7512-C7514."""
    log, n, depbar, _ = _ptxas_report(p)
    assert n["STL"] == 0 and n["LDL"] == 0 and "0 bytes spill stores" in log, (n, log[-800:])
    assert not any(c in log for c in ("C7512", "C7513", "C7514")), log[-800:]
    return n, depbar


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", CAND_MODES)
def test_d64_three_warpgroups_tile_192x128(mode, evaluator):
    """D = 64 on three consumer warpgroups, tile 192 x 128, 3 K/V stages (FA4's D <= 64 tile; the
    default): O is 32 registers a thread, so the 128-key S (64) and P (32) fit 160 registers where
    D = 128 spills.  Same GEMM count as the 128 x 128 two-warpgroup tile it replaced (each
    warpgroup's GEMM shapes are unchanged)."""
    kw = dict(softcap=FIXED) if mode == "softcap" else {}
    d = _plan(mode, evaluator, 64, **kw)
    old = _plan(mode, evaluator, 64, tile_m=128, num_stages=2, **kw)
    # the default since fwd-d64-turns issues the three warpgroups' GEMMs in turns
    assert (d.fwd.tile_m, d.fwd.tile_n, d.fwd.num_stages, d.fwd.pingpong, old.fwd.tile_m) == (192, 128, 3, True, 128)
    assert d.score == old.score   # the split repeats in 128 keys either way
    n, _ = _clean(d)
    no, _ = _clean(old)
    assert n["HGMMA"] == no["HGMMA"] > 0, (n["HGMMA"], no["HGMMA"])


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", CAND_MODES[:2])
def test_d256_tile_n80(mode, evaluator):
    """D = 256 with 80-key blocks (FA4's D = 256 tile; the non-causal exp2 offload's default, with
    ping-pong): Q 64 KB + 2 stages of 80-key K and V (160 KB) fill 224 of sm_90's 227 KB, so the
    register epilogue (no room for O staging).  Per block the QK GEMM is 16 k-steps of m64n80 as
    before and PV gains a fifth k-step of 16 keys: HGMMA = the 64-key build's + 5 (one per loop
    copy and the last PV).  The causal exp2 offload's default is the 64-key tile with O staging."""
    kw = dict(softcap=FIXED) if mode == "softcap" else {}
    p = _plan(mode, evaluator, 256, tile_n=80, pingpong=False, o_smem=False, **kw)
    d = _plan(mode, evaluator, 256, tile_n=64, pingpong=False, o_smem=False, **kw)
    assert (p.fwd.tile_n, d.fwd.tile_n, p.fwd.num_stages) == (80, 64, 2)
    n, depbar = _clean(p)
    nd, _ = _clean(d)
    assert n["HGMMA"] == nd["HGMMA"] + 5 and depbar == 9, (n["HGMMA"], nd["HGMMA"], depbar)
    if mode == "softcap":   # the non-causal default is that tile (with ping-pong); causal: 64 keys, O staged
        nc = _plan(mode, evaluator, 256, False, **kw)
        assert (nc.fwd.tile_n, nc.fwd.pingpong, nc.fwd.o_smem) == (80, True, False)
        _clean(nc)
        c = _plan(mode, evaluator, 256, **kw)
        assert (c.fwd.tile_n, c.fwd.pingpong, c.fwd.o_smem) == (64, True, True)
        _clean(c)


def test_d256_tile_n80_refuses_splits_that_cannot_repeat():
    """sigmoid/poly's 1/16 split (1/8 at 64-key blocks) cannot repeat in 80 keys (k must divide
    10 groups of 8 and be a power of two: 1 or 2): the plan refuses the candidate there, naming
    the split, rather than run another split than the backward's."""
    with pytest.raises(ValueError, match="poly_split"):
        _plan("sigmoid", "poly", 256, tile_n=80)


def test_check_fwd_tile_n_is_a_multiple_of_16_up_to_256():
    """tile_n is the K of the PV wgmma (16 per instruction) and the N of the QK wgmma and the
    K/V TMA box rows (<= 256)."""
    import dataclasses
    from flash_attn_poly.kernels.config import check_fwd
    p = _plan("softmax", "native", 64)
    check_fwd(dataclasses.replace(p.fwd, tile_n=80))
    for bad in (72, 0, 272):
        with pytest.raises(ValueError, match="tile_n"):
            check_fwd(dataclasses.replace(p.fwd, tile_n=bad))


@pytest.mark.compile
@pytest.mark.parametrize("d", [64, 128, 256])
def test_o_smem_epilogue(d):
    """FwdConfig.o_smem: O goes registers -> stmatrix -> smem -> 16-byte row chunks, per thread
    D / 16 STSM.x4, LDS.128 and STG.E.128 (64 rows x D of 16-bit values over 128 threads) instead
    of D / 4 four-byte stores (D = 256: in two passes through a 128-column tile, so four
    warpgroup barriers); the main loop is untouched (same HGMMA), no spills.  D = 256's 80-key
    exp2 offload (its non-causal tile) has no room for the staging tile: check_fwd says so."""
    import re
    base = B.plan("softmax", "native", d=d, overrides={"fwd.o_smem": False})   # the default stages O
    staged = B.plan("softmax", "native", d=d, overrides={"fwd.o_smem": True})
    assert not base.fwd.o_smem and staged.fwd.o_smem
    a, b = B.fwd(base.fwd), B.fwd(staged.fwd)
    na, nb = a.counts(), b.counts()
    ops = lambda text, pat: len(re.findall(pat, text))
    assert ops(b.sass, r"STSM\.16\.M88\.4") == d // 16 and ops(b.sass, r"LDS\.128") == d // 16, b.counts()
    assert ops(b.sass, r"STG\.E\.128") == d // 16 and ops(a.sass, r"STG\.E\.128") == 0
    assert ops(a.sass, r"STSM") == 0
    assert na["HGMMA"] == nb["HGMMA"] and nb["STL"] == 0 and nb["LDL"] == 0, (na, nb)
    bars = r"BAR\.SYNC\.DEFER_BLOCKING R\w+, 0x80"   # a warpgroup's 128 threads, its id from the warpgroup
    assert ops(b.sass, bars) == 2 * (d // min(d, 128)) and ops(a.sass, bars) == 0
    with pytest.raises(ValueError, match="set o_smem=False"):
        B.plan("softcap", "poly", d=256, causal=False, overrides={"fwd.o_smem": True})


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")])
def test_three_warpgroup_pingpong(mode, evaluator):
    """fwd.pingpong on D = 64's three consumer warpgroups (tile 192 x 128): the GEMM issue goes
    round robin through three named barriers (FA4's sm90 forward at D = 64 syncs its warpgroups
    the same way, 2 BAR per block): each interior loop gains its BAR.SYNC + BAR.ARV, the
    HGMMA and wgmma waits stay as they are, no spills."""
    import re
    a = B.fwd(B.plan(mode, evaluator, d=64, overrides={"fwd.pingpong": False}).fwd)
    p = B.plan(mode, evaluator, d=64, overrides={"fwd.pingpong": True})
    assert p.fwd.tile_m == 192 and p.fwd.pingpong
    b = B.fwd(p.fwd)
    na, nb = a.counts(), b.counts()
    assert nb["STL"] == 0 and nb["HGMMA"] == na["HGMMA"] and b.depbar() == a.depbar(), (na, nb)
    bars = lambda text: len(re.findall(r"\bBAR\.(SYNC|ARV)\b", text))
    assert bars(b.sass) > bars(a.sass), (bars(a.sass), bars(b.sass))


def test_mask_bits_prefix_rule():
    """kernels/mask.elements_below's rule, exhaustively: in acc_mn_view's column order a thread
    of a 64 x N wgmma C fragment holds columns 2 (lane % 4) + (c // 2) * 8 + c % 2, so for any
    limit the columns below it are a prefix of its elements, of length lim // 8 * 2 +
    min(lim % 8, 2) with lim = max(limit - first column, 0); a left bound keeps the complement
    of such a prefix.  (The kernel's words: bits 0 .. k-1, kernels/mask.keep_below.)"""
    for n in (64, 80, 128):
        for lane4 in range(4):
            cols = [2 * lane4 + (c // 2) * 8 + c % 2 for c in range(n // 4)]
            for limit in range(-20, n + 20):
                below = [col < limit for col in cols]
                lim = max(limit - cols[0], 0)
                k = lim // 8 * 2 + min(lim % 8, 2)
                assert below == [c < k for c in range(len(cols))], (n, lane4, limit)


@pytest.mark.compile
def test_d64_noncausal_window_default_takes_keep_words():
    """The D = 64 forward of a non-causal window (the 192-row tile in turns) takes keep words: with
    a compare per score against both bounds the build spilled 84 words (CPU SASS; plan row
    fwd-d64-window-keep-words); with them none."""
    p = B.plan("softmax", "native", d=64, causal=False, window=(48, 16))
    assert p.fwd.tile_m == 192 and p.fwd.mask_bits, p.fwd
    n = B.fwd(p.fwd).counts()
    assert n["STL"] == n["LDL"] == 0 and n["HGMMA"] > 0, n


@pytest.mark.compile
@pytest.mark.parametrize("d,window", [(64, (-1, -1)), (128, (-1, -1)), (128, (200, -1))])
def test_mask_bits(d, window):
    """FwdConfig.mask_bits: the masked blocks build each row's keep word once and select by
    its bits (R2P moves them into predicates): the masked loop gets shorter (D = 64: 621 -> 560
    instructions, FA4's 535), the interior loop, HGMMA and wgmma waits stay, no spills."""
    import re
    kw = dict(d=d, window=window)
    a = B.fwd(B.plan("softmax", "native", **kw, overrides={"fwd.mask_bits": False}).fwd)   # D = 64's default
    b = B.fwd(B.plan("softmax", "native", **kw, overrides={"fwd.mask_bits": True}).fwd)
    na, nb = a.counts(), b.counts()
    assert len(re.findall(r"\bR2P\b", b.sass)) > 0 and len(re.findall(r"\bR2P\b", a.sass)) == 0
    assert nb["HGMMA"] == na["HGMMA"] and b.depbar() == a.depbar() and nb["STL"] == 0, (na, nb)
    assert len(b.sass.splitlines()) < len(a.sass.splitlines())


# packed GQA (fwd.pack_gqa: the GQA group's heads packed into the M tile): the builds the GPU test
# (tests/test_pack_gqa_gpu.py) runs, at the group of a 32 / 8 call
PACK_BUILDS = [("softmax", "native", 64, True, (-1, -1)), ("softcap", "poly", 64, True, (-1, -1)),
               ("sigmoid", "poly", 64, False, (-1, -1)), ("softmax", "native", 64, False, (100, 37)),
               ("softmax", "native", 128, True, (-1, -1)), ("softcap", "native", 256, True, (-1, -1))]


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,d,causal,window", PACK_BUILDS, ids=lambda v: str(v))
def test_pack_gqa_builds(mode, evaluator, d, causal, window):
    """Q loads as 5-D TMA boxes (group, positions, D, KV head, batch) instead of 4-D ones, O and
    LSE stores stay as many (16-byte rows where O is staged), HGMMA present, no spills; the mask's
    position is row // group (a shift), so the main loop grows by a few integer ops at most."""
    from flash_attn_poly.kernels import sass
    kw = dict(d=d, causal=causal, window=window, shape=(2, 8192, 32, 8))
    plain = B.plan(mode, evaluator, **kw, overrides={"fwd.pack_gqa": False})   # some are plan picks now
    packed = B.plan(mode, evaluator, **kw, overrides={"fwd.pack_gqa": True})
    assert packed.fwd.pack_gqa == 4 and plain.fwd.pack_gqa == 1
    fams = sass.families("UTMALDG.4D", "UTMALDG.5D", "STG.E.128", "STG.E", "HGMMA", "STL", "LDL")
    a, b = (sass.count_opcodes(B.fwd(p.fwd).sass, fams) for p in (plain, packed))
    # Q's load: one box per 64 columns (the 128-byte swizzle), each 5-D instead of 4-D
    assert (a["UTMALDG.5D"], b["UTMALDG.5D"], a["UTMALDG.4D"] - b["UTMALDG.4D"]) == (0, d // 64, d // 64), (a, b)
    # packing adds no spill (the non-causal D = 64 sigmoid poly build stages O: SPILL_BOUND's words, both)
    bound = SPILL_BOUND.get((mode, evaluator, d, causal), 0) if window == (-1, -1) else 0
    assert b["HGMMA"] == a["HGMMA"] > 0 and b["STL"] <= bound and b["LDL"] <= bound, b
    assert (b["STG.E.128"], b["STG.E"]) == (a["STG.E.128"], a["STG.E"]), (a, b)


# --------------------------------------------- the second Q buffer (plan rows fwd-q-stages)
@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,head_dim", [("softmax", "native", 128), ("softmax", "native", 64),
                                                     ("sigmoid", "poly", 64)])
def test_second_q_buffer_builds(mode, evaluator, head_dim):
    """Short sequences' default builds (the catalogue's SMALL-shape builds, shared compiles) take two Q
    buffers: no spills, no wgmma serialisation, the loop's GEMMs and MUFU work unchanged; at D = 128
    beside the one-buffer build of the same tiles (the anchor's: only the shape differs)."""
    p = B.plan(mode, evaluator, d=head_dim, shape=B.cat.SMALL)
    assert p.fwd.q_stages == 2 and p.fwd.persistent, p.fwd
    log, n, depbar, _ = _ptxas_report(p)
    assert "0 bytes spill stores" in log and n["STL"] == 0 and n["LDL"] == 0, n
    assert not any(c in log for c in ("C7512", "C7513", "C7514")), log[-800:]
    assert depbar < n["HGMMA"], (depbar, n)
    if head_dim == 128:
        one = B.plan(mode, evaluator, d=head_dim)
        assert one.fwd == dataclasses.replace(p.fwd, q_stages=1), (one.fwd, p.fwd)
        m = B.fwd(one.fwd).counts()
        assert (n["HGMMA"], n["MUFU.EX2"]) == (m["HGMMA"], m["MUFU.EX2"]), (n, m)


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [128, 64])
def test_o_tma_build(head_dim):
    """fwd.o_tma at the short-S default (two Q buffers, O staged): the staged rows leave by one
    UTMASTG per 64 columns instead of 16-byte STGs; the loop's GEMMs unchanged, no spills."""
    base = B.plan("softmax", "native", d=head_dim, shape=B.cat.SMALL)
    p = B.plan("softmax", "native", d=head_dim, shape=B.cat.SMALL, overrides={"fwd.o_tma": True})
    assert p.fwd == dataclasses.replace(base.fwd, o_tma=True)
    log, n, _, sass = _ptxas_report(p)
    m = B.fwd(base.fwd).counts()
    assert "0 bytes spill stores" in log and n["STL"] == 0 and n["LDL"] == 0, n
    assert n["HGMMA"] == m["HGMMA"] and m.get("STG.E.128", 0) > 0 and n.get("STG.E.128", 0) == 0, (n, m)
    assert sum("UTMASTG" in line for line in sass.splitlines()) == head_dim // 64
