"""Compile-only tier: the attention backward builds for sm_90a on a CPU machine; SASS checks.
CPU tier: the backward's score side follows the forward's poly_split rule (one plan, one spec).

Each build is named by the call that picks it (tests/builds.py: the plan of attention()'s
arguments at the catalogue's anchor shape) with backward overrides, and compiled once per
session, shared with the other compile tests."""
import math

import pytest

pytest.importorskip("cutlass")

import builds as B  # noqa: E402
from flash_attn_poly.kernels import attn_bwd_sm90 as K  # noqa: E402
from flash_attn_poly.kernels import dispatch, sass, scores  # noqa: E402

# scores per MMA thread per query block at D=128 (tile 128 keys x 64 queries, 256 threads)
SCORES_D128 = 128 * 64 // 256


# the seed's packed-BF16 programs (the poly default is FP16: the plan's program rows)
BF16 = {"softcap": "softcap_c50", "sigmoid": "sigmoid_attn_n4096"}
# softcap cap of these builds: above plan.FIXED_MAX_CAP, so the poly evaluator runs the FP16 tanh
# program in the backward too (BF16 cap <= 50 resolves the exp2 offload, whose backward is native)
ONLINE = 60.0
# The default softcap poly side (k >= 4 compiles both row paths, the evaluator of a key row
# depends on the warp) may spill a few words.  The odd_u2 program at 1/16 with the value rule
# (CPU SASS 2026-11-30): 2 STL in the plain build, 1 with head_loop + dq_async + LPT (the
# deployed build), at D = 256 3 plain and 0 with head_loop.  (The one-region odd-form program:
# 4 plain, 0 deployed, 1 deterministic, 1 at D = 256; the two-region program: 7 with head_loop,
# 3 without, 5 deterministic, 7 windowed, 7 at D = 256.)
# The bound catches a regression.
SOFTCAP_POLY_BWD_STL = 4


def _pipe_model():
    """bench/tools/pipe_model.py (the loop reader of the step-order tests)."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tools"))
    import pipe_model
    return pipe_model


def _loop(cfg, causal=None):
    """The consumer loop's SASS lines (pipe_model.consumer_loop: the mask-free copy) of the backward
    built from `cfg`, with causal overridden when given (non-causal: one step body, no mask copy)."""
    import dataclasses
    if causal is not None:
        cfg = dataclasses.replace(cfg, causal=causal)
    return _pipe_model().consumer_loop(B.bwd(cfg).sass)


def _stl_bound(mode, evaluator) -> int:
    return SOFTCAP_POLY_BWD_STL if (mode, evaluator) == ("softcap", "poly") else 0


def _plan(mode, evaluator="native", d=128, causal=True, dtype="bf16", poly_split=None, window=False,
          deterministic=False, dq_async=False, lpt=False, head_loop=False, program=None, grad_rule=None,
          tile_m=None, dkv_smem=None, dq_halves=False):
    """The plan of attention(mode, evaluator, ...) with the backward's knobs as given (default
    here: the plain build, no dQ staging (one staged tile with dq_async, not the D = 64 default's
    halves), no LPT order, a CTA per query head; dkv_smem None: the plan's rule, staged with
    head_loop); window: left and
    (non-causal) right bounds compiled in; poly_split None: the plan's split for d."""
    ov = {"bwd.dq_async": dq_async, "bwd.lpt": lpt, "bwd.head_loop": head_loop, "bwd.dq_halves": dq_halves}
    if d == 256:   # the chunked build (the swapped one has tests/test_bwd_swap_compile.py)
        ov.update(B.CHUNKED_D256)
    if tile_m is not None:
        ov["bwd.tile_m"] = tile_m
    if dkv_smem is not None:
        ov["bwd.dkv_smem"] = dkv_smem
    if poly_split is not None:
        ov["poly_split"] = poly_split
    if grad_rule is not None:
        ov["grad_rule"] = grad_rule
    win = ((512, 0) if causal else (512, 64)) if window else (-1, -1)
    return B.plan(mode, evaluator, d=d, causal=causal, dtype=dtype, window=win, deterministic=deterministic,
                  program=program, softcap=ONLINE if mode == "softcap" else None, overrides=ov)


def _sass(*args, **kw):
    """Opcode counts (sass.FAMILIES and TURN_OPS) of the backward build of _plan(*args, **kw)."""
    return B.bwd(_plan(*args, **kw).bwd).counts(dict(sass.FAMILIES, **TURN_OPS))


# the deterministic build's turn protocol: acquire loads, release fences, counter increments
TURN_OPS = {"LDG.STRONG.GPU": r"LDG\.E\.STRONG\.GPU", "MEMBAR.GPU": r"MEMBAR\.ALL\.GPU",
            "RED.S32": r"REDG?\.E\.ADD\.S32(\..*)?",
            # dQ paths: red.global.add.v2.f32 from the MMA threads, or bulk reductions (dq_async)
            "RED.F32": r"REDG?\.E\.ADD\.F32.*", "UBLKRED": r"UBLKRED.*", "STS.128": r"STS\.128",
            # head_loop: dK / dV stored as packed 16-bit pairs
            "STG.32": r"STG\.E"}


# ------------------------------------------------------------------------------ CPU
@pytest.mark.parametrize("mode", ["softcap", "sigmoid"])
@pytest.mark.parametrize("split", [None, (1, 1), (1, 2), (1, 4), (3, 4), (0, 2)])
def test_bwd_side_follows_forward_split(mode, split):
    """The plan hands a poly backward the forward's score spec: same program, split and rule per
    key column group (sigmoid: the surrogate rule's, its only poly backward)."""
    kw = dict(program=BF16["sigmoid"], grad_rule="surrogate") if mode == "sigmoid" else {}
    p = _plan(mode, "poly", poly_split=split, **kw)
    fwd, bwd = scores.device(p.score), scores.device(p.score_bwd)
    assert p.score_bwd == p.score and bwd.poly_split == fwd.poly_split
    assert [bwd.uses_block(g) for g in range(64)] == [fwd.poly_pair(g) for g in range(64)]


def test_bwd_side_program_facts_and_args():
    surrogate = dict(program=BF16["sigmoid"], grad_rule="surrogate")
    sc, fc = (scores.device(getattr(_plan("softcap", "poly"), side)) for side in ("score_bwd", "score"))
    sg, fg = (scores.device(getattr(_plan("sigmoid", "poly", **surrogate), side)) for side in ("score_bwd", "score"))
    assert sc.clamp_l == fc.clamp_l > 0 and sg.program_n == fg.program_n == 4096
    # the product rule (the default): the backward is the native build, no block
    assert _plan("sigmoid", "poly").score_bwd == _plan("sigmoid").score_bwd
    # MUFU columns of a sigmoid poly score: 0.5*arg0 and arg2 are the forward's params 2, 3
    a, p = sg.bwd_scalars(0.125, None, -3.0), fg.fwd_scalars(0.125, None, -3.0)
    assert (0.5 * a[0], a[1], a[2]) == (p[2], p[1], p[3])
    # native sigmoid: the forward's tanh form (0.5 scale, 0.5 b)
    nat = scores.device(_plan("sigmoid").score_bwd)
    assert nat.bwd_scalars(0.125, None, -3.0)[:2] == nat.fwd_scalars(0.125, None, -3.0)[:2]
    assert not any(scores.device(_plan(m).score_bwd).uses_block(0) for m in ("softmax", "softcap", "sigmoid"))
    # the exp2 offload (BF16 softcap, cap 50): a native backward, no block
    p50 = B.plan("softcap", "poly")
    assert p50.score_bwd.evaluator == "native" and p50.score_bwd.program is None
    assert not any(scores.device(p50.score_bwd).uses_block(g) for g in range(64))


# ------------------------------------------------------------------------------ compile
@pytest.mark.compile
@pytest.mark.parametrize("d,causal,dtype", [(128, True, "bf16"), (128, False, "fp16"), (64, True, "bf16"),
                                            (64, False, "fp16")])
def test_softmax_bwd_builds_hgmma_no_spills(d, causal, dtype):
    n = _sass("softmax", d=d, causal=causal, dtype=dtype)
    assert n["HGMMA"] > 0
    assert n["STL"] == 0 and n["LDL"] == 0, n


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
                                            ("sigmoid", "native"), ("sigmoid", "poly")])
def test_d256_bwd_builds(mode, evaluator):
    """D = 256 (one 128-column chunk per CTA, S and dP over the full D): the S/dP products
    take 16 k-blocks instead of 8, so 48 HGMMA vs 32 at D = 128; the score stage is the
    D = 128 one (same MUFU counts).  ptxas spills one or two loop-invariant words (measured
    softmax/native 2 STL + 2 LDL, softcap/poly (one-region residual program, value rule, the
    default) 1 + 1, 7 + 7 with the two-region program; CPU SASS 2026-11-30; since the dQ
    accumulator's fragment order and its red.global.add.v4 adds softmax/native 4 + 4, words
    reloaded once per query block, 2026-12-03); more would mean the chunk bookkeeping costs
    registers in the loop.  Both builds take D = 256's default split
    (1/8 for poly: the forward's 64-key blocks, the plan's split row coarsened)."""
    split = _plan(mode, evaluator, d=256).score.poly_split if evaluator == "poly" else None
    n, n128 = _sass(mode, evaluator, d=256), _sass(mode, evaluator, d=128, poly_split=split)
    assert n["HGMMA"] == 48 and n128["HGMMA"] == 32, (n, n128)
    for op in ("MUFU.EX2", "MUFU.TANH", "HFMA2"):
        assert n[op] == n128[op], (op, n, n128)
    assert n["STL"] <= 4 and n["LDL"] <= 4, n


# ------------------------------------------------------------------------------ D = 64
def _hgmma_shapes(text: str) -> dict:
    """{"MxNxK": count} of the HGMMA instructions of a SASS text (the opcode families stop at
    the shape's lower-case x)."""
    import collections
    import re
    return dict(collections.Counter(re.findall(r"HGMMA\.(\d+x\d+x\d+)\.", text)))


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "native"), ("sigmoid", "native"),
                                            ("sigmoid", "poly")])
def test_d64_bwd_tile_64x128_no_spills(mode, evaluator):
    """D = 64 at the 64-row step (the plan's in deterministic, varlen and user-score builds; the
    others take 128 rows, test_d64_bwd_tile_128), with dq_async, LPT, head_loop: per query block 4 + 4 + 4 + 4 HGMMA.64x64x16 (S^T, dP^T, dV, dK: K = 64 head
    columns or 64 query rows) and 8 HGMMA.64x32x16 (dQ: each warpgroup 32 of the 64 columns,
    K = 128 keys, B = K^T in the 64-byte swizzle); no spills and the wgmma groups pipelined (a
    handful of WARPGROUP.DEPBAR, as at D = 128).  The 128 x 128 tile spilled 14-161 words here
    and ptxas serialised all 32 of its HGMMA (one DEPBAR each; CPU SASS 2026-12-01)."""
    p = B.plan(mode, evaluator, d=64, overrides={"bwd.tile_m": 64, "bwd.head_loop": True, "bwd.p_turns": False,
                                                 "bwd.dq_defer": False})   # as those builds: in step
    assert (p.bwd.tile_m, p.bwd.tile_n) == (64, 128) and p.bwd.dq_async and p.bwd.head_loop, p.bwd
    b = B.bwd(p.bwd)
    n = b.counts()
    assert _hgmma_shapes(b.sass) == {"64x64x16": 16, "64x32x16": 8} and n["HGMMA"] == 24, n
    assert n["STL"] == 0 and n["LDL"] == 0, n
    assert b.depbar() <= 4, b.depbar()


@pytest.mark.compile
@pytest.mark.parametrize("stagger", [False, True], ids=["in_step", "stagger"])
@pytest.mark.parametrize("mode,head_loop,stl", [("softmax", False, (0, 0)), ("softcap", False, (1, 6)),
                                               ("sigmoid", False, (0, 0)), ("softmax", True, (0, 0)),
                                               ("softcap", True, (13, 5)), ("sigmoid", True, (0, 0))])
def test_d64_bwd_tile_128(mode, head_loop, stl, stagger):
    """D = 64, override bwd.tile_m=128 without head_loop: dQ split by rows (8 HGMMA.64x64x16
    per warpgroup, each its own 64 dS rows) and pipelined wgmma (a handful of DEPBAR, not one
    per HGMMA).  Softmax: dV issued after the dS math, packed P^T / dS^T written pair by pair in
    it (dscores_pack): no spills (CPU SASS 2026-12-02: 32 HGMMA, 4 DEPBAR, 704 loop instructions;
    before: 10 STL and one DEPBAR per HGMMA).  Softcap / sigmoid: the dS factor packed to FP16
    pairs in the probs pass (f_packed), so the FP32 S^T tile is dead before the dP^T wait
    (before: 12 / 16 STL, every wgmma serialised; now softcap 1 word stored once per query
    block, sigmoid none).  head_loop builds store dK / dV in each branch of the query-block
    check (store_in_branch): with one store after it ptxas kept the dK / dV accumulators in local
    memory (160 STL, every wgmma serialised); softcap's 13 words are its bookkeeping's.
    stagger (p_turns + dq_defer, the plan's D = 64 row from 2k keys): one dQ group more (the last
    step's, after the loop), softcap's spills 6 / 5 words (timed with them: docs/MEASURED.md
    bwd-step-order)."""
    p = B.plan(mode, "native", d=64, overrides={"bwd.tile_m": 128, "bwd.head_loop": head_loop,
                                                "bwd.p_turns": stagger, "bwd.dq_defer": stagger})
    b = B.bwd(p.bwd)
    n = b.counts()
    dq = 8 if stagger else 0
    assert _hgmma_shapes(b.sass) == {"64x128x16": 8, "64x64x16": 24 + dq} and n["HGMMA"] == 32 + dq, n
    assert n["STL"] <= stl[stagger] and n["LDL"] <= stl[stagger], n
    assert b.depbar() <= 5 + stagger, b.depbar()


def test_bwd_tile_is_checked():
    for d, tile_m in ((64, 96), (128, 128), (256, 128)):
        with pytest.raises(ValueError, match=f"tile_m={tile_m}, tile_n=128, D={d}"):
            B.plan("softmax", "native", d=d, overrides=dict(B.CHUNKED_D256 if d == 256 else {}, **{"bwd.tile_m": tile_m}))
    assert B.plan("softmax", "native", d=64, overrides={"bwd.tile_m": 128}).bwd.head_loop
    # the 128-row step keeps a non-softmax dS factor in FP16: not a user function's
    import dataclasses
    from flash_attn_poly.kernels.config import check_bwd
    from flash_attn_poly.kernels.scores import ScoreSpec
    p = B.plan("softmax", "native", d=64, overrides={"bwd.tile_m": 128, "bwd.head_loop": False})
    check_bwd(p.bwd)
    with pytest.raises(ValueError, match="tile_m=128: not with a user score function"):
        check_bwd(dataclasses.replace(p.bwd, score=ScoreSpec(kind="user", evaluator="native", user=object())))


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,d", [("softmax", "native", 128), ("softcap", "poly", 128),
                                              ("softmax", "native", 256)])
def test_lpt_bwd_changes_only_the_prologue(mode, evaluator, d):
    """BwdConfig.lpt: the SectionLptScheduler decode adds integer-divide RCPs once per CTA; the
    loop is the single-tile build's.  D = 256 spills 2 words more (4 STL, loop-invariant)."""
    kw = dict(d=d, dq_async=d <= 128)
    a = _sass(mode, evaluator, **kw, lpt=True)
    b = _sass(mode, evaluator, **kw)
    assert a["MUFU.RCP"] > b["MUFU.RCP"], (a, b)
    for op in ("HGMMA", "MUFU.EX2", "MUFU.TANH", "HFMA2", "UBLKRED"):
        assert a[op] == b[op], (op, a, b)
    assert a["STL"] <= (4 if d == 256 else _stl_bound(mode, evaluator)), a


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,d", [("softmax", "native", 128), ("softmax", "native", 64),
                                              ("softcap", "poly", 128), ("sigmoid", "poly", 128)])
def test_dq_async_bwd_builds(mode, evaluator, d):
    """dq_async: the MMA threads stage dQ with STS.128 (one per four C-fragment registers: rows r
    and r + 8 x a column pair, the accumulator's order) instead of red.global.add.v2 (one per
    pair); one lane of warp 1 adds the staged tile with one bulk reduction per
    query block (a block's rows are contiguous in the dQ accumulator; one per row was 4 loops of
    UBLKRED over the lanes at D = 64); the score stage and GEMMs are those of the atomic build."""
    n, ref = _sass(mode, evaluator, d=d, dq_async=True), _sass(mode, evaluator, d=d)
    tile_m = _plan(mode, evaluator, d=d).bwd.tile_m
    pairs = tile_m * d // 256 // 2      # dQ fragment of one MMA thread, in FP32 pairs
    assert n["UBLKRED"] == 1 and ref["UBLKRED"] == 0, (n, ref)
    # dK/dV keep their red.global.add.v2 epilogue; the dQ quads (red.global.add.v4, four adjacent
    # words of the accumulator's fragment order) become smem stores
    assert n["RED.F32"] == ref["RED.F32"] - pairs // 2 and n["STS.128"] == pairs // 2, (n, ref)
    for op in ("HGMMA", "MUFU.EX2", "MUFU.TANH", "HFMA2"):
        assert n[op] == ref[op], (op, n, ref)
    assert n["STL"] <= ref["STL"], (n, ref)


@pytest.mark.compile
@pytest.mark.parametrize("mode", ["softcap", "sigmoid"])
def test_native_stage_bwd_builds(mode):
    n = _sass(mode)
    assert n["HGMMA"] > 0 and n["STL"] == 0 and n["LDL"] == 0, n
    # one MUFU.TANH per score (the forward's formulas); sigmoid has no EX2 (not 1/(1+2^-x))
    assert n["MUFU.TANH"] == SCORES_D128, n
    assert n["MUFU.EX2"] == (SCORES_D128 if mode == "softcap" else 0), n


@pytest.mark.compile
@pytest.mark.parametrize("mode,split", [("softcap", (1, 1)), ("softcap", (1, 2)), ("sigmoid", (1, 1)),
                                        ("sigmoid", (1, 2)), ("sigmoid", (1, 4))])
def test_poly_stage_bwd_sfu_counts(mode, split):
    """BF16 programs.  Static splits (k <= 2; sigmoid 1/4 via its row rule below): block
    columns have no TANH; softcap keeps one EX2 per score, sigmoid has none.  The 2 MUFU.RCP
    of every variant are the once-per-CTA integer division head // (H_q / H_kv).  (softcap
    1/4: test_softcap_poly_bwd_quarter_split_no_spills.)  The plain build (red.global dQ, no
    head loop: no default picks it with these programs) spills up to 4 loop-invariant words since
    the dQ accumulator's fragment order (CPU SASS 2026-12-03: 0 before; the atomic adds keep a
    per-thread word base beside the row guard)."""
    n = _sass(mode, "poly", poly_split=split, program=BF16[mode],
              grad_rule="block" if mode == "softcap" else "surrogate")   # the seed's derivative blocks
    j, k = _plan(mode, "poly", poly_split=split, program=BF16[mode],
                 grad_rule="block" if mode == "softcap" else "surrogate").score_bwd.poly_split
    assert n["HFMA2.BF16"] > 0 and n["STL"] <= 4 and n["LDL"] <= 4, n
    if k <= 2:
        assert n["MUFU.TANH"] == SCORES_D128 * (k - j) // k, n
        assert n["MUFU.EX2"] == (SCORES_D128 if mode == "softcap" else 0), n
    else:
        # k >= 4: the evaluator of a key row depends on the warp, both paths are compiled
        # (warp-uniform branch per row): the MUFU path's TANH count appears once
        assert n["MUFU.TANH"] == SCORES_D128, n
        assert n["MUFU.EX2"] == (2 * SCORES_D128 if mode == "softcap" else 0), n


@pytest.mark.compile
@pytest.mark.xfail(reason="softcap poly k=4: both row paths compiled, 3-4 STL", strict=True)
@pytest.mark.parametrize("program", ["softcap_c50", "softcap_c50_f16"])
def test_softcap_poly_bwd_quarter_split_no_spills(program):
    n = _sass("softcap", "poly", poly_split=(1, 4), program=program)
    assert n["STL"] == 0, n


# ------------------------------------------------------------------------------ sliding window
@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,causal", [
    ("softmax", "native", True), ("softcap", "native", False), ("softcap", "poly", True),
    ("sigmoid", "poly", False)])
def test_window_bwd_builds_hgmma_no_spills(mode, evaluator, causal):
    """Window bounds compiled in (sizes runtime; left, and right where not causal): HGMMA, no
    spills, the same SFU work per score as the unwindowed build (masking is integer compares +
    selects)."""
    n = _sass(mode, evaluator, causal=causal, window=True)
    base = _sass(mode, evaluator, causal=causal)
    assert n["HGMMA"] == base["HGMMA"] and n["STL"] <= _stl_bound(mode, evaluator), n
    assert n["MUFU.TANH"] == base["MUFU.TANH"] and n["MUFU.EX2"] == base["MUFU.EX2"], (n, base)


# ------------------------------------------------------------------------------ deterministic
@pytest.mark.compile
@pytest.mark.parametrize("d,causal,dtype,window", [
    (128, True, "bf16", False), (128, False, "fp16", False), (128, True, "bf16", True),
    (64, True, "bf16", False)])
def test_deterministic_bwd_builds_hgmma_no_spills(d, causal, dtype, window):
    """The ordered-add build keeps the MMA work (same HGMMA and SFU counts), adds the turn
    protocol (one counter increment for dQ, one for dK/dV) and does not spill; the default
    build carries none of it."""
    det = _sass("softmax", d=d, causal=causal, dtype=dtype, window=window, deterministic=True)
    # D = 64: the deterministic build keeps the 64-row step (the 128-row row was not run there)
    base = _sass("softmax", d=d, causal=causal, dtype=dtype, window=window, tile_m=64 if d == 64 else None)
    assert det["HGMMA"] == base["HGMMA"] > 0 and det["MUFU"] == base["MUFU"], (det, base)
    assert det["RED.S32"] == 2 and det["MEMBAR.GPU"] == 2 and det["LDG.STRONG.GPU"] > 0, det
    assert base["RED.S32"] == base["MEMBAR.GPU"] == base["LDG.STRONG.GPU"] == 0, base
    assert det["STL"] == 0 and det["LDL"] == 0, det


@pytest.mark.compile
def test_deterministic_bwd_poly_stage_builds():
    det = _sass("softcap", "poly", deterministic=True)
    base = _sass("softcap", "poly")
    assert det["HGMMA"] == base["HGMMA"] and det["HFMA2"] == base["HFMA2"], (det, base)
    assert det["STL"] <= SOFTCAP_POLY_BWD_STL, det


def test_turn_counter_count():
    """One counter per dQ tile (query block, query head, batch) and per dK/dV tile (key
    block, KV head, batch); e.g. B=2 S=1000 H_q=8 H_kv=2 D=128: tiles 64 x 128."""
    cfg = _plan("softmax", deterministic=True).bwd
    assert (cfg.tile_m, cfg.tile_n) == (64, 128)
    assert dispatch.turn_counters(cfg, 2, 1000, 1000, 8, 2) == 2 * 8 * 16 + 2 * 2 * 8
    # D = 256: one set of counters per 128-column chunk
    cfg256 = _plan("softmax", d=256, deterministic=True).bwd
    assert dispatch.turn_counters(cfg256, 2, 1000, 1000, 8, 2) == 2 * (2 * 8 * 16 + 2 * 2 * 8)


# ------------------------------------------------------------------------------ CPU (host JIT)
@K.cute.jit
def _turn_table(out: K.cute.Tensor, seqlen_q: K.Int32, seqlen_k: K.Int32, win_left: K.Int32, win_right: K.Int32,
                tile_m: K.cutlass.Constexpr, tile_n: K.cutlass.Constexpr, causal: K.cutlass.Constexpr,
                has_left: K.cutlass.Constexpr, has_right: K.cutlass.Constexpr):
    """out[n, m] = dq_rank for every query block m that key block n visits, else -1 (as filled)."""
    for n in K.cutlass.range(K.cute.ceil_div(seqlen_k, tile_n), unroll=1):
        m_min, m_max = K.mask_mod.query_block_range(n, seqlen_q, seqlen_k, tile_m, tile_n, causal,
                                                    has_left, has_right, win_left, win_right)
        for m in K.cutlass.range(m_min, m_max, unroll=1):
            out[n, m] = K.dq_rank(n, m, seqlen_q, seqlen_k, tile_m, tile_n, causal, has_left, has_right, win_right)


@pytest.mark.parametrize("tile", [(64, 128), (128, 128)])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (True, (200, -1)),
                                           (True, (64, 0)), (False, (100, 37)), (False, (-1, 50)),
                                           (False, (0, 0)), (True, (129, -1))])
def test_dq_turns_are_a_descending_permutation(tile, causal, window):
    """The kernel's own range and rank functions, run on the host: for every query block, the
    key blocks that visit it get turns 0..k-1, the highest key block first.  So every turn is
    taken (no CTA waits for a turn nobody holds) and turn r waits only on higher key blocks,
    i.e. earlier CTAs in the deterministic build's reversed launch order."""
    import torch
    from cutlass.cute.runtime import from_dlpack
    from flash_attn_poly.kernels.config import window_sizes
    has_l, has_r = window[0] >= 0, window[1] >= 0 and not causal   # the plan's compile-time flags
    for s_q, s_k in [(1000, 1000), (411, 300), (300, 411), (128, 128), (517, 517), (1, 700), (2047, 2047)]:
        wl, wr = window_sizes(window, causal, s_q, s_k)
        n_blocks, m_blocks = -(-s_k // tile[1]), -(-s_q // tile[0])
        table = torch.full((n_blocks, m_blocks), -1, dtype=torch.int32)
        _turn_table(from_dlpack(table), s_q, s_k, wl, wr, tile[0], tile[1], causal, has_l, has_r)
        for m in range(m_blocks):
            visitors = [n for n in range(n_blocks) if table[n, m] >= 0]
            assert visitors == list(range(visitors[0], visitors[-1] + 1)) if visitors else True, (s_q, s_k, m)
            assert [int(table[n, m]) for n in reversed(visitors)] == list(range(len(visitors))), \
                (s_q, s_k, m, table[:, m].tolist())


@pytest.mark.compile
def test_bwd_over_shared_memory_fails_at_build_naming_the_config():
    """4 Q/dO stages at D = 128 need 265216 bytes: the build refuses with the numbers instead of a
    CUDA_LAUNCH_INVALID_CONFIG at run time.  (3 stages needed 233472 bytes with the staged dQ
    tile's padding words, H200 launch log round_stages_9ec9032; without them they fit.)"""
    p = B.plan("softmax", overrides={"bwd.stages": 4, "bwd.head_loop": False})
    assert p.bwd.dq_async and p.bwd.lpt
    with pytest.raises(ValueError, match=r"4 Q/dO stages at D = 128 needs 265216 bytes"):
        B.bwd(p.bwd)


def test_sigmoid_grad_rule_default_matches_the_reference():
    import poly_reference as PR
    assert _plan("sigmoid", "poly").score.grad_rule == PR.SIGMOID_GRAD_RULE == "product"
    with pytest.raises(ValueError, match="grad_rule"):
        _plan("sigmoid", "poly", grad_rule="exact")


@pytest.mark.parametrize("program,rule", [(None, "value"), ("softcap_c50_f16_tail", "value"),
                                          ("softcap_c50_f16", "value"), ("softcap_c50", "block")])
def test_softcap_grad_rule_default_matches_the_reference(program, rule):
    """The softcap poly side's default d logit/dx rule ("value" for FP16 programs, "block" for
    the seed's BF16 B2) is the one the reference replays by default."""
    import torch
    import poly_reference as PR
    side = _plan("softcap", "poly", program=program).score_bwd
    assert side.grad_rule == rule
    x = torch.linspace(-120, 120, 2001, dtype=torch.float64)
    _, g_default = PR.softcap_fns(50.0, side.program)
    _, g_rule = PR.softcap_fns(50.0, side.program, rule)
    assert torch.equal(g_default(x), g_rule(x))
    with pytest.raises(ValueError, match="grad_rule"):
        _plan("softcap", "poly", program=program, grad_rule="exact")


def _sass_program(mode, program):
    """Opcode counts of the D = 128 causal BF16 poly build (dQ async, LPT) with the poly
    side's table `program`, at the BF16 program's former default split (softcap 1/2) for
    comparison with it."""
    return _sass(mode, "poly", poly_split={"softcap": (1, 2)}[mode], program=program, dq_async=True, lpt=True)


@pytest.mark.compile
def test_softcap_f16_program_bwd_builds():
    """program="softcap_c50_f16" (FP16 D5 blocks): f16x2 FMAs replace the bf16x2 ones, rho and
    its derivative unpack with HADD2.F32, the MUFU counts stay.  Spills are the toolchain's
    choice: at this 1/2 split the CUDA 13 flavour (the device's) spills 10 words, the CUDA 12 one
    1 (docs/MEASURED.md "toolchain"); more would mean the blocks cost registers.  The build a
    user gets by name (the plan's 1/8 split, value rule) spills 4 with CUDA 13."""
    n = _sass_program("softcap", "softcap_c50_f16")
    base = _sass("softcap", "poly", poly_split=(1, 2), dq_async=True, lpt=True, program=BF16["softcap"])
    assert n["HGMMA"] == base["HGMMA"] and n["MUFU.TANH"] == base["MUFU.TANH"], (n, base)
    assert n["HFMA2.BF16"] == 0 < base["HFMA2.BF16"] and n["STL"] <= 10, n


def test_softcap_program_without_blocks_is_refused():
    """A softcap score needs a softcap program's blocks (attention() refuses other programs by
    name before the plan: tests/test_interface_cpu.py::test_rejects_bad_programs)."""
    from flash_attn_poly.asm import programs
    spec = scores.ScoreSpec(kind="softcap", evaluator="poly", program=programs.spec("tanh_d4"),
                            poly_split=(1, 8), grad_rule="value")
    with pytest.raises(ValueError, match="softcap program 'tanh_d4' has no forward block"):
        scores.device(spec)


def test_sigmoid_f16_program_refuses_surrogate():
    """The FP16 sigmoid program has no coupled derivative block: the plan refuses the surrogate
    rule by name (the option and the program that has the block), and the kernel's score object
    built from such a spec directly refuses it too."""
    import dataclasses
    with pytest.raises(ValueError, match="sigmoid_grad='surrogate' needs a sigmoid program with a coupled"):
        _plan("sigmoid", "poly", grad_rule="surrogate")
    p = _plan("sigmoid", "poly")
    assert p.score.program.name == "sigmoid_attn_n4096_f16"
    with pytest.raises(ValueError, match="derivative surrogate needs a _grad entry"):
        scores.device(dataclasses.replace(p.score, grad_rule="surrogate"))


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,d,dq_async", [
    ("softmax", "native", 128, True), ("softcap", "poly", 128, True), ("sigmoid", "poly", 128, True),
    ("softcap", "native", 256, False), ("softmax", "native", 128, False)])
def test_head_loop_bwd_stores_dkv_without_atomics(mode, evaluator, d, dq_async):
    """head_loop with the register epilogue (dkv_smem off): dK and dV leave as 32 + 32
    packed-pair stores per thread (a CTA's 128 keys x 128 columns, D = 256 one 128-column chunk
    per CTA) instead of 64 red.global.add.v2.f32; the dQ path, HGMMA and MUFU counts are the
    per-query-head build's; no spills."""
    c = _sass(mode, evaluator, d, dq_async=dq_async, lpt=True, head_loop=True, dkv_smem=False)
    base = _sass(mode, evaluator, d, dq_async=dq_async, lpt=True)
    assert c["HGMMA"] == base["HGMMA"] > 0
    assert c.get("STL", 0) <= _stl_bound(mode, evaluator), c
    assert c["STG.32"] == 64 and base.get("STG.32", 0) == 0
    # dK + dV: 64 red.v2 per thread leave the build; dQ's path is unchanged
    assert base.get("RED.F32", 0) - c.get("RED.F32", 0) == 64
    assert c.get("UBLKRED", 0) == base.get("UBLKRED", 0)
    for fam in ("MUFU.EX2", "MUFU.TANH"):
        assert c.get(fam, 0) == base.get(fam, 0), fam


@pytest.mark.compile
def test_sigmoid_poly_fp16_inputs_build_and_bf16_program_is_refused():
    """FP16 inputs with the FP16 sigmoid program: the block's f16x2 P feeds PV as is (16 fewer
    F2FP per thread than the BF16-input build's conversions in the forward, none spilled; the
    backward is the native build); the BF16 program is refused by name for FP16 inputs, forward
    and backward (its surrogate)."""
    from flash_attn_poly.kernels import attn_fwd_sm90 as A
    counts = {dt: B.fwd(B.plan("sigmoid", "poly", dtype=dt).fwd).counts() for dt in ("bf16", "fp16")}
    assert counts["fp16"]["HGMMA"] == counts["bf16"]["HGMMA"] and counts["fp16"]["STL"] == 0, counts
    assert counts["fp16"]["F2FP"] < counts["bf16"]["F2FP"], counts
    bad = _plan("sigmoid", "poly", dtype="fp16", program=BF16["sigmoid"], grad_rule="surrogate")
    with pytest.raises(ValueError, match="BF16 inputs only"):   # attention() refuses it first
        A.kernel_for(bad.fwd)
    with pytest.raises(ValueError, match="BF16 inputs only"):
        K.kernel_for(bad.bwd)


@pytest.mark.compile
@pytest.mark.parametrize("split,rule,stl_max", [(None, "value", 7), (None, "block", 18), ((1, 1), "block", 8)],
                         ids=["default", "block-rule", "all-block-block-rule"])
def test_softcap_tail_program_bwd_builds(split, rule, stl_max):
    """program="softcap_c50_f16_tail" (the default for part of 2026-11-30): the backward recomputes the
    forward's two-region logits (kernels/scores/softcap.softcap_combine) and takes d logit/dx as
    1 - (logit/c)^2 ("value", default) or from softcap_bwd_f16x2_tail ("block").  Measured
    (D=128 causal BF16, head_loop, dQ async, LPT, CPU SASS): default split, value 7 STL, block
    16 (both row paths per warp; the one-region residual program's build: 1), all-block 8;
    no MUFU.TANH all-block.  With dK / dV staged through smem (dkv_smem, on with head_loop
    since 2026-12-03) block is 18, the others unchanged."""
    n = _sass("softcap", "poly", poly_split=split, dq_async=True, lpt=True, head_loop=True,
              program="softcap_c50_f16_tail", grad_rule=rule)
    assert n["HGMMA"] > 0 and (n["MUFU.TANH"] == 0) == (split == (1, 1)), n
    assert n["STL"] <= stl_max, n


# ------------------------------------------------------------------------------ odd_u2 program
def test_softcap_odd_program_side():
    """The odd_u2 program has no derivative block: the value rule by default, "block" refused;
    its host scalars are (scale/c, c, c log2e) (MUFU columns cost what native's do)."""
    p = _plan("softcap", "poly", poly_split=(1, 16), program="softcap_c50_f16_odd")
    side = scores.device(p.score_bwd)
    assert p.score_bwd.grad_rule == side.grad_rule == "value" and side.u2
    assert side.bwd_scalars(0.125, 50.0, None) == (0.125 / 50.0, 50.0, 50.0 * math.log2(math.e))
    p = _plan("softcap", "poly", poly_split=(1, 16), program="softcap_c50_f16_odd", grad_rule="block")
    with pytest.raises(ValueError, match="grad_rule='value'"):
        scores.device(p.score_bwd)


@pytest.mark.compile
@pytest.mark.parametrize("d", [128, 256])
def test_softcap_odd_program_bwd_compiles(d):
    """Built as deployed (head_loop, LPT; dq_async at D = 128): HGMMA, spills within the
    softcap poly bound (CPU SASS 2026-11-30: 1 word at D = 128, 0 at D = 256).  The head dim's
    default split: 1/16 at D = 128, 1/8 at D = 256."""
    n = _sass("softcap", "poly", d=d, program="softcap_c50_f16_odd",
              head_loop=True, dq_async=d == 128, lpt=True)
    assert n["HGMMA"] > 0
    assert n["STL"] <= SOFTCAP_POLY_BWD_STL


@pytest.mark.compile
def test_softcap_program_d64_bwd_takes_the_64_row_step():
    """The packed tanh program's D = 64 backward (caps above 50) takes the 64-row step: on the
    128-row step its FP16 dS factor beside the program's derivative spilled 63-87 words (plan
    row bwd-d64-softcap-program); here none, with the stagger from 2k keys (one dQ group more)."""
    p = B.plan("softcap", "poly", d=64, softcap=60.0)
    assert p.score_bwd.program is not None and p.bwd.tile_m == 64 and p.bwd.p_turns and p.bwd.dq_defer, p.bwd
    n = B.bwd(p.bwd).counts()
    assert n["STL"] == n["LDL"] == 0 and n["HGMMA"] == 32, n


@pytest.mark.compile
def test_dkv_smem_stores_dkv_as_16_byte_row_chunks():
    """dkv_smem (head_loop's dK / dV staged through the K / V smem tiles): the 64 packed-pair
    stores per thread become 16 STG.128 (a CTA's 2 x 128 keys x 128 columns x 2 bytes over 256
    threads, 16 bytes each) after 16 stmatrix (8 per tile) and 16 LDS.128; the loop (HGMMA, MUFU,
    the dQ bulk reductions) is the default's; no spills."""
    fams = dict(sass.FAMILIES, **TURN_OPS, **{"STG.128": r"STG\.E\.128", "STSM": r"STSM(\..*)?",
                                             "LDS.128": r"LDS\.128"})
    base = B.bwd(B.plan("softmax", "native", overrides={"bwd.dkv_smem": False}).bwd).counts(fams)
    staged = B.bwd(B.plan("softmax", "native").bwd).counts(fams)
    assert base["STG.32"] == 64 and base.get("STG.128", 0) == 0, base
    assert staged["STG.32"] == 0 and staged["STG.128"] == 16, staged
    assert staged["STSM"] - base["STSM"] == 16 and staged["LDS.128"] - base.get("LDS.128", 0) == 16, (base, staged)
    for fam in ("HGMMA", "MUFU.EX2", "UBLKRED"):
        assert staged.get(fam, 0) == base.get(fam, 0) > 0, fam
    assert staged.get("STL", 0) == 0


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("sigmoid", "poly")])
def test_dq_halves_hands_each_warpgroup_its_own_rows(mode, evaluator):
    """dq_halves (the D = 64 default, the 128-row step: the staged dQ tile as two warpgroup halves): warp 1
    adds each half with its own bulk reduction (2 UBLKRED per block instead of 1) behind its own
    barrier pair of 160 threads (ids 9 / 10 full, 11 / 12 empty; the MMA threads' ids are
    computed from the warpgroup), the whole tile's 288-thread pair (3 / 4) is gone; the GEMMs and
    exponentials are the default's and nothing new spills."""
    import re
    fams = dict(sass.FAMILIES, **TURN_OPS)
    in_step = {"bwd.p_turns": False, "bwd.dq_defer": False}   # the halves' own barriers, not the stagger's
    base_b = B.bwd(B.plan(mode, evaluator, d=64, overrides=dict(in_step, **{"bwd.dq_halves": False})).bwd)
    halves_b = B.bwd(B.plan(mode, evaluator, d=64, overrides=in_step).bwd)
    assert B.plan(mode, evaluator, d=64).bwd.dq_halves
    base, halves = base_b.counts(fams), halves_b.counts(fams)
    assert base["UBLKRED"] == 1 and halves["UBLKRED"] == 2, (base, halves)
    assert halves["HGMMA"] == base["HGMMA"] > 0
    for fam in (f for f in base if f.startswith("MUFU")):
        assert halves.get(fam, 0) == base[fam], fam
    assert halves.get("STL", 0) <= base.get("STL", 0)
    bars = lambda b: re.findall(r"BAR\.(?:SYNC\.DEFER_BLOCKING|ARV) (\w+), (0x\w+)", b.sass)
    assert ("0x3", "0x120") in bars(base_b) and ("0x4", "0x120") in bars(base_b)
    hb = bars(halves_b)
    assert not [b for b in hb if b[1] == "0x120"], hb
    for ident in ("0x9", "0xa", "0xb", "0xc"):          # warp 1: each half's full (sync) and empty (arrive)
        assert (ident, "0xa0") in hb, (ident, hb)
    assert sum(1 for b in hb if b[1] == "0xa0" and b[0].startswith("R")) == 2, hb   # the MMA side's pair


@pytest.mark.compile
def test_dq_halves_at_64_rows_adds_each_warpgroups_columns_per_band():
    """dq_halves at tile_m 64 (the D = 128 default): the warpgroups split dQ's columns, so a half is
    the same half of each 16-row band of the staged tile (the accumulator's fragment order): 4 bulk
    reductions per half (8 UBLKRED instead of the one buffer's 1), the 160-thread pairs instead of
    the 288-thread one, the GEMMs, exponentials and dQ stores of the one-buffer build, no spills."""
    import re
    fams = dict(sass.FAMILIES, **TURN_OPS)
    base_b = B.bwd(B.plan("softmax", d=128, overrides={"bwd.dq_halves": False}).bwd)
    p = B.plan("softmax", d=128)
    assert p.bwd.tile_m == 64 and p.bwd.dq_halves
    halves_b = B.bwd(p.bwd)
    base, halves = base_b.counts(fams), halves_b.counts(fams)
    assert base["UBLKRED"] == 1 and halves["UBLKRED"] == 8, (base, halves)
    for fam in ("HGMMA", "STS.128", "MUFU.EX2"):
        assert halves[fam] == base[fam] > 0, fam
    assert halves["STL"] == 0 and halves["LDL"] == 0, halves
    hb = re.findall(r"BAR\.(?:SYNC\.DEFER_BLOCKING|ARV) (\w+), (0x\w+)", halves_b.sass)
    assert not [b for b in hb if b[1] == "0x120"] and ("0x9", "0xa0") in hb and ("0xc", "0xa0") in hb, hb


@pytest.mark.compile
def test_kv_sections_changes_only_the_cta_order():
    """kv_sections (head_loop's LPT order in L2-sized sections of KV heads) builds: the CTA's
    decode gains the section arithmetic, the loop is the default's (HGMMA, MUFU, dQ reductions,
    stores), no spills."""
    fams = dict(sass.FAMILIES, **TURN_OPS, **{"STG.128": r"STG\.E\.128"})
    base = B.bwd(B.plan("softmax", "native").bwd)     # GQA: one section
    sect = B.bwd(B.plan("softmax", "native", overrides={"bwd.kv_sections": True}).bwd)
    assert sect.sass != base.sass
    b, s = base.counts(fams), sect.counts(fams)
    for fam in ("HGMMA", "MUFU.EX2", "UBLKRED", "STG.128"):
        assert s.get(fam, 0) == b.get(fam, 0) > 0, fam
    assert s.get("STL", 0) == 0


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,d", [("softmax", "native", 64), ("softcap", "poly", 128)])
def test_bwd_p_turns_takes_the_p_blocks_in_turns(mode, evaluator, d):
    """bwd.p_turns: in the mask-free step every MUFU of the P block lies between this warpgroup's
    turn (BAR.SYNC on P_TURN + w, before the S^T wait that releases the accumulator the P block
    reads) and the hand-over (BAR.ARV on P_TURN + 1 - w); ptxas does not keep register work below
    a named barrier alone, so this is the order the knob exists for.  Two more BAR.SYNC (the turn,
    warpgroup 0's closing wait) and BAR.ARV (the hand-over, warpgroup 1's opening one) than the
    default, the HGMMA / MUFU counts the default's, no spills; check_bwd refuses it where the
    warpgroups do not run the same step (swapped, deterministic builds)."""
    base = B.plan(mode, evaluator, d=d, overrides={"bwd.p_turns": False, "bwd.dq_defer": False})
    p = B.plan(mode, evaluator, d=d, overrides={"bwd.p_turns": True, "bwd.dq_defer": False})
    assert not base.bwd.p_turns and p.bwd.p_turns
    b0, b1 = B.bwd(base.bwd), B.bwd(p.bwd)
    c0, c1 = b0.counts(), b1.counts()
    assert c1["STL"] == 0 and c1["LDL"] == 0 and c1["HGMMA"] == c0["HGMMA"] and c1["MUFU"] == c0["MUFU"], c1
    ops = lambda b, op: sum(o == op for o in sass.opcodes(b.sass))
    assert ops(b1, "BAR.SYNC.DEFER_BLOCKING") - ops(b0, "BAR.SYNC.DEFER_BLOCKING") == 2
    assert ops(b1, "BAR.ARV") - ops(b0, "BAR.ARV") == 2
    body = _loop(p.bwd, causal=False)
    turn = [i for i, x in enumerate(body) if x.startswith("BAR.SYNC") and x.split()[1].startswith("R")
            and x.endswith("0x100")]
    hand = [i for i, x in enumerate(body) if x.startswith("BAR.ARV") and x.endswith("0x100")]
    mufu = [i for i, x in enumerate(body) if x.startswith("MUFU")]
    assert len(turn) == 1 and len(hand) == 1 and mufu, (turn, hand)
    assert turn[0] < mufu[0] and mufu[-1] < hand[0], (turn, hand, mufu[0], mufu[-1])
    assert body[turn[0] + 1].startswith("WARPGROUP.DEPBAR"), body[turn[0] + 1]
    with pytest.raises(ValueError, match="p_turns"):
        B.plan(mode, evaluator, d=d, deterministic=True, overrides={"bwd.p_turns": True})
    assert not B.plan(mode, evaluator, d=d, deterministic=True).bwd.p_turns   # the rows skip it
    with pytest.raises(ValueError, match="p_turns"):
        B.plan("softmax", d=256, overrides={"bwd.p_turns": True})   # the swapped D = 256 build


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,d", [("softmax", "native", 64), ("softcap", "poly", 128)])
def test_bwd_dq_defer_issues_dq_a_step_late_behind_the_ds_mbarriers(mode, evaluator, d):
    """bwd.dq_defer (with p_turns: the plan's D = 64 and D = 128 softcap rows): the mask-free step has no
    DS_READY barrier; after the P block's hand-over it waits for the dS buffer's last readers
    (DS_FREE), writes dS (STSM), arrives at DS_FULL (every thread, unpredicated: the pipelines'
    releases are one predicated arrival per warp), issues dK, waits for the previous step's whole dS
    (DS_FULL of the other buffer), issues that step's dQ, waits dK then dQ, arrives at DS_FREE and
    only then stages the dQ half (STS.128).  One dQ group more than the default in the kernel (the
    last step's, after the loop), the default's MUFU count, no spills; check_bwd refuses it without
    the staged halves (dq_halves: one shared staged tile would put the warpgroups back in step)."""
    pipe_model = _pipe_model()
    base = B.plan(mode, evaluator, d=d, overrides={"bwd.p_turns": False, "bwd.dq_defer": False})
    p = B.plan(mode, evaluator, d=d, overrides={"bwd.p_turns": True, "bwd.dq_defer": True})
    assert not base.bwd.dq_defer and p.bwd.dq_defer and p.bwd.dq_halves
    assert B.plan(mode, evaluator, d=d).bwd == p.bwd   # the plan's row at the anchor shape
    c0, c1 = B.bwd(base.bwd).counts(), B.bwd(p.bwd).counts()
    assert c1["STL"] == 0 and c1["LDL"] == 0 and c1["MUFU"] == c0["MUFU"], c1
    dq_group = p.bwd.tile_n // 16   # dQ = dS K: one HGMMA per 16 keys
    assert c1["HGMMA"] - c0["HGMMA"] == dq_group, (c0["HGMMA"], c1["HGMMA"], dq_group)
    body = _loop(p.bwd, causal=False)
    base_body = _loop(base.bwd, causal=False)
    kinds = lambda b: [e[0] for e in pipe_model.step_events(b) if e[0] not in ("work", "wait")]
    assert "ds_barrier" in kinds(base_body)
    k = kinds(body)
    assert "ds_barrier" not in k and k[k.index("turn_pass"):] == [
        "turn_pass", "gemm", "ds_free", "ds_full", "gemm", "ds_wait_prev", "gemm", "dq_done"], k
    at = lambda pred: [i for i, x in enumerate(body) if pred(x)]
    waits = at(lambda x: x.startswith("SYNCS.PHASECHK"))
    arrives = at(lambda x: x.startswith("SYNCS.ARRIVE"))   # unpredicated: every thread's
    stsm, sts = at(lambda x: x.startswith("STSM")), at(lambda x: x.startswith("STS.128"))
    free_wait, full_wait = waits[-2], waits[-1]
    full_arrive, free_arrive = arrives[-2], arrives[-1]
    assert free_wait < min(stsm) and max(stsm) < full_arrive < full_wait < free_arrive < min(sts), (
        free_wait, stsm, full_arrive, full_wait, free_arrive, sts)
    with pytest.raises(ValueError, match="dq_defer"):
        B.plan(mode, evaluator, d=d, overrides={"bwd.dq_defer": True, "bwd.dq_halves": False})
