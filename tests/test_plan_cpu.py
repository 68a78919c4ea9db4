"""CPU tier: flash_attn_poly.plan, the one place where defaults live.

Each default row of the plan's tables is pinned here by a call that it decides (what the
compile and GPU tiers then build and run), and every override is checked like a default:
a combination the kernels cannot build is a ValueError naming the field, from
kernels.config.check_fwd / check_bwd (or the score spec), before anything is compiled.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

from flash_attn_poly import plan as P

SM = 132                      # the H200's SMs
ANCHOR = (1, 4096, 32, 8)     # (B, S, H_q, H_kv) of the seed's shape
SMALL = (1, 1024, 32, 8)      # a grid too small for the per-KV-head backward
TANH = "softcap_c50_f16_odd"  # the packed tanh program, by name only (no default: plan.poly_outside_rule)


def call(mode="softmax", evaluator="native", *, dtype="bf16", d=128, shape=ANCHOR, seqlen_k=None,
         causal=True, window=(-1, -1), softcap=None, **kw):
    """An AttnCall as interface.validate builds it (softcap defaults to 50 in mode softcap)."""
    b, s, h_q, h_kv = shape
    if mode == "softcap" and softcap is None:
        softcap = 50.0
    return P.AttnCall(mode=mode, evaluator=evaluator, dtype=dtype, head_dim=d, batch=b, seqlen_q=s,
                      seqlen_k=s if seqlen_k is None else seqlen_k, heads_q=h_q, heads_kv=h_kv,
                      causal=causal, window=tuple(window), softmax_scale=d ** -0.5, softcap=softcap, **kw)


def resolve(*args, sm=SM, overrides=None, **kw) -> P.AttnPlan:
    return P.resolve(call(*args, **kw), sm, overrides)


def fields(cfg, names):
    return {n: getattr(cfg, n) for n in names}


# ------------------------------------------------------------------------- program rows
def test_softcap_bf16_cap_up_to_50_resolves_the_exp2_offload():
    """BF16 softcap with 0 < cap <= FIXED_MAX_CAP: the exp2 offload (every tanh on MUFU, a
    native softcap score carrying the exp2_f32 program) under the constant row max, 1 of every
    8 column groups' 2^a on the FMA pipe; its backward is native's (no program)."""
    for cap in (50.0, 30.0, 1.0):
        p = resolve("softcap", "poly", softcap=cap)
        assert p.score.program.name == P.EXP2_PROGRAM == "exp2_f32_d3" and p.score.program.is_exp2
        assert p.score.evaluator == "native" and p.score.kind == "softcap"
        assert p.score.program.coeff_bits        # the coefficients are part of the build's key
        assert (p.score_bwd.evaluator, p.score_bwd.program) == ("native", None)
        assert p.fwd.fixed_max and p.fwd.exp2_fma == 1
    assert P.FIXED_MAX_CAP == 50.0


@pytest.mark.parametrize("kw", [dict(softcap=60.0), dict(softcap=50.5)], ids=["cap60", "cap50.5"])
def test_softcap_without_the_constant_max_resolves_the_f16_tanh_program(kw):
    """BF16 and a cap above 50: the FP16 odd tanh program on 1/8 of the key columns, the value
    grad rule, the online row max; the backward recomputes P with the same spec."""
    p = resolve("softcap", "poly", **kw)
    assert p.score.program.name == "softcap_c50_f16_odd" and p.score.evaluator == "poly"
    assert p.score.poly_split == (1, 8) and p.score.grad_rule == "value"
    assert p.score_bwd == p.score
    assert not p.fwd.fixed_max and p.fwd.exp2_fma == 0


def test_softcap_on_fp16_inputs_runs_native_unless_a_program_is_named():
    """FP16 inputs: no default program (the packed tanh program misses the error rule there:
    plan.poly_outside_rule), so poly resolves the native plan; the named program runs as asked,
    with that reason as a warning."""
    p = resolve("softcap", "poly", dtype="fp16")
    assert p.score.evaluator == "native" and p.score.program is None
    assert p == resolve("softcap", "native", dtype="fp16")
    with pytest.warns(UserWarning, match="FP16 inputs"):
        p = resolve("softcap", "poly", program=TANH, dtype="fp16")
    assert p.score.program.name == TANH and p.score.evaluator == "poly" and p.score.poly_split == (1, 8)


def test_sigmoid_resolves_the_f16_program_on_one_sixteenth():
    p = resolve("sigmoid", "poly")
    assert p.score.program.name == "sigmoid_attn_n4096_f16" and p.score.evaluator == "poly"
    assert p.score.poly_split == (1, 16) and p.score.grad_rule == "product"
    # the product rule's backward recomputes P on MUFU (the native sigmoid build); the surrogate
    # (the coupled value/derivative block) needs the program's P
    assert (p.score_bwd.kind, p.score_bwd.evaluator, p.score_bwd.program) == ("sigmoid", "native", None)
    assert p.bwd.score == p.score_bwd == resolve("sigmoid", "native").score_bwd
    s = resolve("sigmoid", "poly", sigmoid_grad="surrogate", program="sigmoid_attn_n4096")
    assert s.score_bwd == s.score and s.score.grad_rule == "surrogate"
    # the FP16 default program has no coupled block: the plan says so, naming the option
    with pytest.raises(ValueError, match="sigmoid_grad='surrogate' needs a sigmoid program with a coupled"):
        resolve("sigmoid", "poly", sigmoid_grad="surrogate")
    # a sigmoid poly backward spec other than the surrogate's has no kernel path: check_bwd names it
    from flash_attn_poly.kernels.config import check_bwd
    import dataclasses
    with pytest.raises(ValueError, match="surrogate rule's block only"):
        check_bwd(dataclasses.replace(p.bwd, score=p.score))


@pytest.mark.parametrize("seqlen_k,bias,poly", [
    (4096, None, True), (128, None, True), (16384, None, True),    # default bias -ln S_k inside the span
    (1, None, False), (64, None, False), (32768, None, False),     # b + ln 4096 = 8.3, 4.2, -2.1
    (1, -8.0, True), (4096, 0.0, False),                           # the span is of the bias, not of S_k
])
def test_sigmoid_program_outside_its_fitted_span_falls_back_to_native(seqlen_k, bias, poly):
    """A sigmoid_attn program fitted at n = 4096 runs where b + ln n lies in SIGMOID_FIT_SPAN;
    elsewhere (S_k = 1 at the default bias) its error exceeded the FlashAttention rule: native."""
    p = resolve("sigmoid", "poly", seqlen_k=seqlen_k, sigmoid_bias=bias)
    assert (p.score.evaluator == "poly") == poly and p.score_bwd.evaluator == "native"
    assert p.call.evaluator == ("poly" if poly else "native")
    assert p.sigmoid_bias == pytest.approx(bias if bias is not None else -math.log(seqlen_k))
    if not poly:   # the native plan throughout: no program, no ping-pong row for a packed score
        assert p.score.program is None and p == resolve("sigmoid", "native", seqlen_k=seqlen_k, sigmoid_bias=bias)



def test_a_named_sigmoid_program_outside_its_span_warns_and_runs():
    with pytest.warns(UserWarning, match="outside its span"):
        p = resolve("sigmoid", "poly", seqlen_k=1, program="sigmoid_attn_n4096")
    assert p.score.evaluator == "poly" and p.score.program.name == "sigmoid_attn_n4096"


def test_sigmoid_program_on_fp16_inputs_falls_back_to_native():
    """The FP16 D4 sigmoid program misses the error rule on FP16 inputs (torch's FP16 error is
    ~8x smaller than BF16's): the default is native there, a named program warns."""
    p = resolve("sigmoid", "poly", dtype="fp16")
    assert p.score.evaluator == "native" and p == resolve("sigmoid", "native", dtype="fp16")
    with pytest.warns(UserWarning, match="FP16 inputs"):
        assert resolve("sigmoid", "poly", dtype="fp16", program="sigmoid_attn_n4096_f16").score.evaluator == "poly"


@pytest.mark.parametrize("mode", ["softmax", "softcap", "sigmoid"])
def test_native_and_softmax_carry_no_program(mode):
    for ev in ("native", "poly"):
        if mode != "softmax" and ev == "poly":
            continue
        p = resolve(mode, ev)
        assert p.score.program is None and p.score.evaluator == "native" and p.score.kind == mode
        assert p.score_bwd == p.score


def test_a_named_program_replaces_the_program_row_only():
    """program= names the program; every other row still applies: the BF16 softcap program
    under the constant row max (cap 50) takes the fixed max and the three-warpgroup tile, with
    the BF16 program's grad rule ("block") and no exp2 offload."""
    p = resolve("softcap", "poly", program="softcap_c50")
    assert p.score.program.name == "softcap_c50" and p.score.grad_rule == "block"
    assert p.fwd.fixed_max and (p.fwd.tile_m, p.fwd.tile_n) == (192, 64) and p.fwd.exp2_fma == 0
    assert p.score.poly_split == (1, 8)
    from flash_attn_poly.asm import programs
    spec = programs.spec("sigmoid_attn_n4096")
    assert resolve("sigmoid", "poly", program=spec).score.program == spec     # a ProgramSpec as is


# --------------------------------------------------------------------------- split rows
def test_split_is_coarsened_to_the_forward_key_block():
    """The split's period (8k keys) must repeat inside the forward's key block: the D = 256
    forward's 64-key blocks take 1/8 for sigmoid's 1/16 (the silent D = 256 bug was a forward
    on 1/8 and a backward on 1/16); a backward that recomputes P with the program (the
    surrogate rule) shares the one spec."""
    for d, want in ((64, (1, 16)), (128, (1, 16)), (256, (1, 8))):
        p = resolve("sigmoid", "poly", d=d)
        assert p.score.poly_split == want and p.fwd.tile_n % (8 * want[1]) == 0, d
        s = resolve("sigmoid", "poly", d=d, program="sigmoid_attn_n4096", sigmoid_grad="surrogate")
        assert s.score_bwd == s.score and s.score.poly_split == want, d
    p = resolve("sigmoid", "poly", program="sigmoid_attn_n4096", sigmoid_grad="surrogate",
                overrides={"fwd.tile_n": 64})
    assert p.score.poly_split == (1, 8) and p.score_bwd == p.score
    assert resolve("softcap", "poly", d=256, softcap=60.0).score.poly_split == (1, 8)


def test_an_explicit_split_is_taken_as_given_or_refused():
    assert resolve("sigmoid", "poly", overrides={"poly_split": (1, 4)}).score.poly_split == (1, 4)
    with pytest.raises(ValueError, match=r"repeats every 128 keys.*tile_n 64.*k <= 8"):
        resolve("sigmoid", "poly", d=256, overrides={"poly_split": (1, 16)})
    for split in [(1, 8), (1, 1), (0, 16), (16, 16)]:
        resolve("softcap", "poly", d=256, softcap=60.0, overrides={"poly_split": split})
    with pytest.raises(ValueError, match="poly_split"):
        resolve("sigmoid", "poly", overrides={"poly_split": (1, 3)})


# ---------------------------------------------------------------------------- grad rows
def test_grad_rules():
    assert resolve("softcap", "poly", softcap=60.0).score_bwd.grad_rule == "value"        # FP16 program
    assert resolve("softcap", "poly", program="softcap_c50_f16").score_bwd.grad_rule == "value"
    assert resolve("softcap", "poly", program="softcap_c50").score_bwd.grad_rule == "block"  # BF16 program
    p = resolve("sigmoid", "poly")
    assert p.score.grad_rule == "product" and p.score_bwd.evaluator == "native"   # sigmoid-bwd-native-p
    assert resolve("sigmoid", "poly", program="sigmoid_attn_n4096",
                   sigmoid_grad="surrogate").score_bwd.grad_rule == "surrogate"
    o = resolve("sigmoid", "poly", sigmoid_grad="surrogate", overrides={"grad_rule": "product"})
    assert o.score.grad_rule == "product" and o.score_bwd.evaluator == "native"    # the override wins
    for mode in ("softcap", "sigmoid"):
        with pytest.raises(ValueError, match="grad_rule"):
            resolve(mode, "poly", softcap=60.0 if mode == "softcap" else None, overrides={"grad_rule": "exact"})


# ----------------------------------------------------------------------- forward rows
FWD_FIELDS = ("tile_m", "tile_n", "num_stages", "pingpong", "persistent", "row_max_chains",
              "row_sum_carry", "rescale_threshold", "fixed_max", "exp2_fma", "o_smem", "mask_bits", "q_stages", "o_tma",
              "wg_skip")
BASE = dict(tile_m=128, tile_n=128, num_stages=2, pingpong=False, persistent=SM, row_max_chains=1,
            row_sum_carry=False, rescale_threshold=0.0, fixed_max=False, exp2_fma=0, o_smem=False, mask_bits=False,
            q_stages=1, o_tma=False, wg_skip=False)
D64 = dict(tile_m=192, num_stages=3, pingpong=True, mask_bits=True, o_smem=True)   # three warpgroups in turns
FWD_CASES = [
    # softmax: the stale-max threshold everywhere; at D = 128 ping-pong, carried row sum, 4 max chains;
    # D = 128 stages O through smem in every mode
    (dict(mode="softmax", d=128), dict(pingpong=True, row_sum_carry=True, row_max_chains=4, rescale_threshold=8.0,
                                       o_smem=True)),
    (dict(mode="softmax", d=64), dict(D64, rescale_threshold=8.0)),
    (dict(mode="softmax", d=256), dict(tile_n=64, rescale_threshold=8.0, o_smem=True)),
    (dict(mode="softmax", d=256, varlen=True), dict(tile_n=64, rescale_threshold=8.0, o_smem=True)),
    # packed D = 256 stages O as the dense build does (non-causal exp2 offload: 80-key blocks, no staging)
    (dict(mode="softcap", evaluator="poly", d=256, varlen=True), dict(tile_n=64, pingpong=True, row_sum_carry=True,
                                                                      fixed_max=True, exp2_fma=1, o_smem=True)),
    (dict(mode="softcap", evaluator="poly", d=256, varlen=True, causal=False),
     dict(tile_n=80, pingpong=True, row_sum_carry=True, fixed_max=True, exp2_fma=1)),
    (dict(mode="softcap", d=256, varlen=True), dict(tile_n=64, row_sum_carry=True, fixed_max=True, o_smem=True)),
    (dict(mode="softmax", d=128, varlen=True), dict(pingpong=True, row_sum_carry=True, row_max_chains=4,
                                                    rescale_threshold=8.0, o_smem=True)),
    (dict(mode="softcap", d=128, varlen=True), dict(tile_m=192, tile_n=64, num_stages=4, pingpong=True,
                                                    fixed_max=True, o_smem=True)),
    # ... but the windowed varlen softcap build spills with O staging
    (dict(mode="softcap", d=128, varlen=True, window=(63, -1)), dict(tile_m=192, tile_n=64, num_stages=4,
                                                                     pingpong=True, fixed_max=True)),
    (dict(mode="softmax", d=128, dtype="fp16"), dict(pingpong=True, row_sum_carry=True, row_max_chains=4,
                                                     rescale_threshold=8.0, o_smem=True)),
    # softcap BF16 cap <= 50 at D = 128: the constant row max on three consumer warpgroups, 192 x 64, 4 stages,
    # in turns (dense, packed and windowed calls)
    (dict(mode="softcap", d=128), dict(tile_m=192, tile_n=64, num_stages=4, pingpong=True, fixed_max=True,
                                       o_smem=True)),
    (dict(mode="softcap", evaluator="poly", d=128), dict(tile_m=192, tile_n=64, num_stages=4, pingpong=True,
                                                         fixed_max=True, exp2_fma=1, o_smem=True)),
    (dict(mode="softcap", evaluator="poly", d=128, causal=False), dict(tile_m=192, tile_n=64, num_stages=4,
                                                                       pingpong=True, fixed_max=True, exp2_fma=1,
                                                                       o_smem=True)),
    (dict(mode="softcap", evaluator="poly", d=128, window=(256, 0)), dict(tile_m=192, tile_n=64, num_stages=4,
                                                                          pingpong=True, fixed_max=True, exp2_fma=1,
                                                                          o_smem=True)),
    # D = 64: three consumer warpgroups, 192 x 128, 3 stages, in turns, keep-word masks, O through smem
    (dict(mode="softcap", evaluator="poly", d=64), dict(D64, fixed_max=True, exp2_fma=1)),
    (dict(mode="sigmoid", evaluator="poly", d=64), D64),
    # ... but online-max softcap (cap > 50, FP16) keeps the 128-row tile (the 192-row one spills)
    (dict(mode="softcap", d=64, softcap=60.0), {}),
    (dict(mode="softcap", d=64, dtype="fp16"), {}),
    (dict(mode="softcap", evaluator="poly", d=64, softcap=60.0), dict(pingpong=True)),
    # non-causal D = 64: turns and O staging (no masked blocks: no keep words); sigmoid stages O with
    # its warpgroups free-running (the turns on top were slower)
    (dict(mode="softmax", d=64, causal=False), dict(tile_m=192, num_stages=3, pingpong=True, o_smem=True,
                                                    rescale_threshold=8.0)),
    (dict(mode="softcap", evaluator="poly", d=64, causal=False), dict(tile_m=192, num_stages=3, pingpong=True,
                                                                      o_smem=True, fixed_max=True, exp2_fma=1)),
    (dict(mode="sigmoid", evaluator="poly", d=64, causal=False), dict(tile_m=192, num_stages=3, o_smem=True)),
    (dict(mode="sigmoid", d=64, causal=False), dict(tile_m=192, num_stages=3, o_smem=True)),
    # D = 256 stages O through a 128-column tile; the exp2 offload with ping-pong: causal 64-key blocks
    # with O staging, non-causal 80-key blocks (no room for the staging tile); native softcap keeps 64
    (dict(mode="softcap", evaluator="poly", d=256), dict(tile_n=64, pingpong=True, row_sum_carry=True,
                                                         fixed_max=True, exp2_fma=1, o_smem=True)),
    (dict(mode="softcap", evaluator="poly", d=256, causal=False), dict(tile_n=80, pingpong=True, row_sum_carry=True,
                                                                       fixed_max=True, exp2_fma=1)),
    # ... up to 2k keys (SHORT_KEYS) the non-causal offload takes 64-key blocks with O staged; dense only
    (dict(mode="softcap", evaluator="poly", d=256, causal=False, shape=(8, 2048, 16, 8)),
     dict(tile_n=64, pingpong=True, row_sum_carry=True, fixed_max=True, exp2_fma=1, o_smem=True)),
    (dict(mode="softcap", evaluator="poly", d=256, causal=False, shape=(4, 4096, 16, 8)),
     dict(tile_n=80, pingpong=True, row_sum_carry=True, fixed_max=True, exp2_fma=1)),
    (dict(mode="softcap", evaluator="poly", d=256, causal=False, shape=(8, 2048, 16, 8), window=(255, 255)),
     dict(tile_n=80, pingpong=True, row_sum_carry=True, fixed_max=True, exp2_fma=1)),
    (dict(mode="softcap", d=256), dict(tile_n=64, row_sum_carry=True, fixed_max=True, o_smem=True)),
    (dict(mode="softcap", d=256, softcap=60.0), dict(tile_n=64, row_sum_carry=True, o_smem=True)),
    (dict(mode="sigmoid", evaluator="poly", d=256), dict(tile_n=64, pingpong=True, o_smem=True)),
    # the persistent grid at every length (its (batch, head) order keeps short causal tiles balanced)
    # ... and at S <= SHORT_SEQLEN softmax and sigmoid take a second Q buffer (dense, unwindowed)
    (dict(mode="softmax", d=128, shape=SMALL), dict(pingpong=True, row_sum_carry=True, row_max_chains=4,
                                                    rescale_threshold=8.0, o_smem=True, q_stages=2)),
    (dict(mode="sigmoid", evaluator="poly", d=128, shape=SMALL), dict(pingpong=True, o_smem=True, q_stages=2)),
    (dict(mode="softmax", d=128, shape=(8, 2048, 32, 8)), dict(pingpong=True, row_sum_carry=True, row_max_chains=4,
                                                               rescale_threshold=8.0, o_smem=True)),
    (dict(mode="softmax", d=128, shape=SMALL, window=(255, -1)), dict(pingpong=True, row_sum_carry=True,
                                                                      row_max_chains=4, rescale_threshold=8.0,
                                                                      o_smem=True)),
    (dict(mode="softcap", evaluator="poly", d=128, shape=SMALL), dict(tile_m=192, tile_n=64, num_stages=4,
                                                                      pingpong=True, fixed_max=True, exp2_fma=1,
                                                                      o_smem=True)),
    # ... with a KV head per query head up to SHORT_KEYS keys its staged O rows leave by TMA stores, and
    # each warpgroup runs its own rows' key range (not at 4k, not windowed)
    (dict(mode="softcap", evaluator="poly", d=128, shape=(16, 1024, 32, 32)),
     dict(tile_m=192, tile_n=64, num_stages=4, pingpong=True, fixed_max=True, exp2_fma=1, o_smem=True, o_tma=True,
          wg_skip=True)),
    (dict(mode="softcap", d=128, shape=(8, 2048, 32, 32), causal=False),
     dict(tile_m=192, tile_n=64, num_stages=4, pingpong=True, fixed_max=True, o_smem=True, o_tma=True, wg_skip=True)),
    (dict(mode="softcap", evaluator="poly", d=128, shape=(4, 4096, 32, 32)),
     dict(tile_m=192, tile_n=64, num_stages=4, pingpong=True, fixed_max=True, exp2_fma=1, o_smem=True)),
    (dict(mode="softcap", evaluator="poly", d=128, shape=(16, 1024, 32, 32), window=(255, -1)),
     dict(tile_m=192, tile_n=64, num_stages=4, pingpong=True, fixed_max=True, exp2_fma=1, o_smem=True)),
    # short causal D = 64 (S_q, S_k <= SHORT_SEQLEN): two 64-row warpgroups, 2 stages, no turns or
    # keep words, O still staged; not at 2k, not non-causal, not with a longer key side
    # ... softmax and sigmoid there with 3 K / V stages (beside two Q buffers)
    # (softmax's masked blocks by keep words)
    (dict(mode="softmax", d=64, shape=(16, 1024, 32, 8)), dict(tile_m=128, num_stages=3, o_smem=True,
                                                               rescale_threshold=8.0, q_stages=2,
                                                               mask_bits=True)),
    (dict(mode="softcap", evaluator="poly", d=64, shape=(32, 512, 32, 32)), dict(tile_m=128, o_smem=True,
                                                                                 fixed_max=True, exp2_fma=1,
                                                                                 q_stages=2, mask_bits=True)),
    (dict(mode="softcap", evaluator="poly", d=64, shape=(16, 1024, 32, 8)), dict(tile_m=128, o_smem=True,
                                                                                fixed_max=True, exp2_fma=1,
                                                                                mask_bits=False)),
    (dict(mode="sigmoid", evaluator="poly", d=64, shape=(16, 1024, 32, 8)), dict(tile_m=128, num_stages=3,
                                                                                o_smem=True, q_stages=2)),
    # D = 64 softmax / sigmoid: two Q buffers up to SHORT_KEYS keys (softcap: with MHA heads only)
    (dict(mode="softmax", d=64, shape=(8, 2048, 32, 8)), dict(D64, rescale_threshold=8.0, q_stages=2)),
    (dict(mode="softmax", d=64, shape=(4, 4096, 32, 8)), dict(D64, rescale_threshold=8.0)),
    (dict(mode="softcap", evaluator="poly", d=64, shape=(8, 2048, 32, 8)), dict(D64, fixed_max=True, exp2_fma=1)),
    (dict(mode="softcap", evaluator="poly", d=64, shape=(8, 2048, 32, 32)), dict(D64, fixed_max=True, exp2_fma=1,
                                                                                q_stages=2, wg_skip=True)),
    (dict(mode="softcap", evaluator="poly", d=64, shape=(4, 4096, 32, 32)), dict(D64, fixed_max=True, exp2_fma=1)),
    (dict(mode="softmax", d=64, shape=(16, 1024, 32, 8), seqlen_k=2048), dict(D64, rescale_threshold=8.0,
                                                                               q_stages=2)),
    (dict(mode="softmax", d=64, shape=(16, 1024, 32, 8), causal=False),
     dict(tile_m=192, num_stages=3, pingpong=True, o_smem=True, rescale_threshold=8.0, q_stages=2)),
    # non-causal D = 64 sigmoid: O staged, the turns up to SHORT_KEYS keys only
    (dict(mode="sigmoid", evaluator="poly", d=64, shape=(16, 1024, 32, 8), causal=False),
     dict(tile_m=192, num_stages=3, pingpong=True, o_smem=True, q_stages=2)),
    (dict(mode="sigmoid", evaluator="poly", d=64, shape=(4, 4096, 32, 8), causal=False),
     dict(tile_m=192, num_stages=3, o_smem=True)),
    (dict(mode="sigmoid", evaluator="poly", d=64, shape=(16, 1024, 32, 8), causal=False, window=(255, 255)),
     dict(tile_m=192, num_stages=3, o_smem=True, mask_bits=True)),
    (dict(mode="softcap", d=64, softcap=60.0, shape=(16, 1024, 32, 8)), {}),
]


@pytest.mark.parametrize("kw,want", FWD_CASES, ids=lambda x: "-".join(f"{v}" for v in x.values()) or "base")
def test_forward_rows(kw, want):
    kw = dict(kw)
    mode = kw.pop("mode")
    p = resolve(mode, kw.pop("evaluator", "native"), **kw)
    assert fields(p.fwd, FWD_FIELDS) == dict(BASE, **want)


def test_second_q_buffer_only_where_it_builds():
    """The fwd-q-stages rows' second Q buffer: persistent CTAs only (one CTA per tile loads one Q) and
    only where the tiles fit beside it (an override of the tiles drops it); by override it is checked,
    not dropped."""
    short = dict(shape=SMALL)
    assert resolve("softmax", **short).fwd.q_stages == 2
    assert resolve("softmax", **short, overrides={"fwd.persistent": 0}).fwd.q_stages == 1
    assert resolve("softmax", **short, overrides={"fwd.o_smem": False}).fwd.q_stages == 2
    assert resolve("softmax", **short, overrides={"fwd.num_stages": 3, "fwd.o_smem": False}).fwd.q_stages == 1
    assert resolve("softmax", **short, overrides={"fwd.tile_m": 192, "fwd.tile_n": 64,
                                                  "fwd.num_stages": 4}).fwd.q_stages == 1   # 256 KB with two
    assert resolve("softmax", overrides={"fwd.q_stages": 2}).fwd.q_stages == 2   # the anchor, by override
    with pytest.raises(ValueError, match="q_stages must be 1, or 2 with a persistent grid"):
        resolve("softmax", **short, overrides={"fwd.persistent": 0, "fwd.q_stages": 2})
    with pytest.raises(ValueError, match="q_stages must be 1, or 2"):
        resolve("softmax", overrides={"fwd.q_stages": 3})
    with pytest.raises(ValueError, match="shared memory"):
        resolve("softcap", "poly", overrides={"fwd.q_stages": 2})   # 192 x 64, 4 stages, O staged: 272 KB


def test_o_tma_only_where_tma_bounds_clip_the_rows():
    """fwd.o_tma (O by TMA store from the staging tile): an override of dense unpacked calls with O
    staged at D <= 128; refused with the field named where TMA's tensor bounds would not clip a
    tile's rows (packed sequences, packed GQA rows) or O is not staged in one tile."""
    assert resolve("softmax", overrides={"fwd.o_tma": True}).fwd.o_tma
    assert resolve("softmax", d=64, shape=SMALL, overrides={"fwd.o_tma": True}).fwd.o_tma
    assert not resolve("softmax").fwd.o_tma
    for kw in (dict(overrides={"fwd.o_tma": True, "fwd.o_smem": False}),
               dict(d=256, overrides={"fwd.o_tma": True}),
               dict(d=64, overrides={"fwd.o_tma": True}),   # the anchor packs its GQA group at D = 64
               dict(varlen=True, overrides={"fwd.o_tma": True})):
        with pytest.raises(ValueError, match="o_tma"):
            resolve("softmax", **kw)


def test_forward_grid_is_the_devices_sm_count():
    """The persistent grid is as large as the GPU (resolve's sm_count); a plan override of 0
    is one CTA per tile, n > 0 a grid of n CTAs."""
    assert resolve("softmax", sm=114).fwd.persistent == 114
    assert resolve("softmax", overrides={"fwd.persistent": 0}).fwd.persistent == 0
    assert resolve("softmax", overrides={"fwd.persistent": 7}).fwd.persistent == 7
    with pytest.raises(ValueError, match="persistent must be >= 0"):
        resolve("softmax", overrides={"fwd.persistent": -1})


def test_forward_cta_count_balances_the_snake():
    """The persistent forward's runtime CTA count (AttnPlan.fwd_ctas, kernels/tile_scheduler
    .persistent_ctas): where a section of the LPT order holds about two rounds of tiles (causal
    D = 256 MHA, B=4 S=4k: 8 heads x 32 blocks = 256 tiles on 132 SMs) the model takes 128 CTAs
    (two whole rounds per section); at the anchor (sections of 1024 tiles) and on non-causal calls
    (equal tiles) it keeps every SM; varlen calls keep fwd.persistent; fwd_ctas overrides it."""
    assert resolve("softmax", d=256, shape=(4, 4096, 16, 16)).fwd_ctas == 128
    assert resolve("softmax", d=128, shape=(4, 4096, 32, 32)).fwd_ctas == 128
    assert resolve("softmax").fwd_ctas == SM
    assert resolve("softmax", d=256, shape=(4, 4096, 16, 16), causal=False).fwd_ctas == SM
    assert resolve("softmax", overrides={"fwd.persistent": 0}).fwd_ctas == 0
    p = resolve("softmax", d=256, shape=(4, 4096, 16, 16), overrides={"fwd_ctas": 132})
    assert p.fwd_ctas == 132 and p.fwd.persistent == SM
    for bad in (0, SM + 1):
        with pytest.raises(ValueError, match="fwd_ctas"):
            resolve("softmax", overrides={"fwd_ctas": bad})
    with pytest.raises(ValueError, match="fwd_ctas"):
        resolve("softmax", overrides={"fwd.persistent": 0, "fwd_ctas": 4})


def test_interface_plans_with_the_devices_sm_count(monkeypatch):
    """attention() resolves its plan once per (call, SM count) of the tensors' device."""
    torch = pytest.importorskip("torch")
    import flash_attn_poly.interface as fi
    monkeypatch.setattr(fi, "_sm_count", lambda index: 114 + index)
    c = call("softmax")
    p = fi.plan_for(c, torch.device("cuda", 1))
    assert p.fwd.persistent == 115 and p is fi.plan_for(c, torch.device("cuda", 1))
    assert fi.plan_for(c, torch.device("cuda", 0)).fwd.persistent == 114


# ---------------------------------------------------------------------- backward rows
BWD_FIELDS = ("tile_m", "tile_n", "stages", "deterministic", "dq_async", "lpt", "head_loop", "kv_sections",
              "dkv_smem", "swap", "dp_first")


@pytest.mark.parametrize("d,want", [
    (128, dict(tile_m=64, tile_n=128, stages=2, deterministic=False, dq_async=True, lpt=True, head_loop=True)),
    (64, dict(tile_m=128, tile_n=128, stages=2, deterministic=False, dq_async=True, lpt=True, head_loop=True)),
    (256, dict(tile_m=64, tile_n=64, stages=2, deterministic=False, dq_async=False, lpt=True, head_loop=True,
               swap=True)),
])
def test_backward_rows(d, want):
    """D = 64 takes 128 query rows per step; every mode the per-KV-head loop with dK / dV staged
    through smem (sigmoid too: 0.60x its per-query-head build at MHA D = 64 S = 512); GQA keeps
    one LPT section.  D = 256: the swapped build (a CTA per 64 keys and KV head, all columns)."""
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")):
        w = dict(dict(swap=False, dp_first=False), **want, kv_sections=False, dkv_smem=True)
        assert fields(resolve(mode, ev, d=d).bwd, BWD_FIELDS) == w, (mode, ev)


def test_d256_backward_swap_or_chunks():
    """D = 256: dense and packed calls of the built-in scores (causal or not, windows, GQA or MHA,
    every mode and evaluator) take the swapped build on the per-KV-head loop; deterministic and
    user-score calls the chunked build (two 128-column CTAs per key block, one Q / dO stage) with
    dP^T first.  The swapped build is refused with deterministic and the fields it cannot take,
    naming the field."""
    from flash_attn_poly.kernels.config import check_bwd
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("softcap", "native"), ("sigmoid", "poly")):
        for kw in (dict(), dict(causal=False), dict(window=(300, -1)), dict(shape=(1, 1024, 8, 8))):
            b = resolve(mode, ev, d=256, **kw).bwd
            assert (b.swap, b.tile_n, b.stages, b.head_loop, b.dp_first) == (True, 64, 2, True, False), (mode, kw, b)
    chunked = (False, 128, 1, False, True)
    # the swapped grid under one wave and the chunked per-query-head grid over one: chunked, a CTA
    # per query head (B=1 8/4 heads S 1280-2048 measured); not where the chunked grid is one wave too
    for shape, small in (((1, 1280, 8, 4), True), ((1, 2048, 8, 4), True), ((1, 1024, 8, 4), False),
                         ((1, 3072, 8, 4), False), ((1, 2048, 8, 8), False), ((1, 512, 16, 16), False)):
        b = resolve("softcap", "poly", d=256, shape=shape).bwd
        want = (False, 128, 1, False, True) if small else (True, 64, 2, True, False)
        assert (b.swap, b.tile_n, b.stages, b.head_loop, b.dp_first) == want, (shape, b)
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")):
        b = resolve(mode, ev, d=256, varlen=True).bwd   # sigmoid at its default bias too (score.seq_bias)
        assert (b.swap, b.tile_n, b.stages, b.head_loop, b.dp_first) == (True, 64, 2, True, False), (mode, b)
        assert b.varlen and not b.lpt, (mode, b)   # packed: table order
        assert b.score.seq_bias == (mode == "sigmoid"), (mode, b)
    ov = {"bwd.swap": False, "bwd.tile_n": 128, "bwd.stages": 1, "bwd.head_loop": False, "bwd.dp_first": True}
    b = resolve("softmax", d=256, varlen=True, overrides=ov).bwd   # the chunked packed build by override
    assert (b.swap, b.tile_n, b.stages, b.dq_async, b.dp_first) == chunked and b.varlen, b
    b = resolve("softmax", d=256, deterministic=True).bwd   # the turns bound it: S^T first
    assert (b.swap, b.tile_n, b.stages, b.dq_async, b.dp_first) == (False, 128, 1, False, False), b
    b = resolve("softmax", d=256, score_mod=lambda s, *a: s).bwd
    assert (b.swap, b.tile_n, b.stages, b.dq_async, b.dp_first) == chunked, b
    swap = resolve("softmax", d=256).bwd
    for field, value in (("deterministic", True), ("dp_first", True), ("tile_n", 128),
                         ("head_loop", False), ("dq_async", True), ("dkv_smem", False)):
        with pytest.raises(ValueError, match=f"swap .*{field}={value!r}"):
            check_bwd(dataclasses.replace(swap, **{field: value}))


@pytest.mark.parametrize("shape,causal,want", [
    ((1, 32768, 32, 32), False, True), ((4, 4096, 32, 32), False, True), ((16, 1024, 32, 32), False, False),
    ((1, 16384, 32, 32), True, True), ((2, 8192, 32, 32), True, False), ((1, 32768, 32, 8), False, True),
    ((1, 16384, 32, 8), False, False), ((1, 32768, 32, 8), True, False), ((1, 4096, 32, 8), True, False)])
def test_kv_sections_with_long_rows(shape, causal, want):
    """kv_sections (L2-sized sections of KV heads in head_loop's LPT order): MHA from S_k 4k
    non-causal and 16k causal, GQA non-causal from 32k (the measured wins), never causal GQA
    (1.36x the time at B=1 S=4k); dkv_smem with every head_loop build; neither without head_loop
    or in packed calls."""
    p = resolve("softmax", shape=shape, causal=causal)
    assert p.bwd.head_loop and p.bwd.dkv_smem and p.bwd.kv_sections == want, p.bwd
    flat = resolve("softmax", shape=shape, causal=causal, overrides={"bwd.head_loop": False})
    assert not (flat.bwd.kv_sections or flat.bwd.dkv_smem), flat.bwd
    packed = resolve("softmax", shape=shape, causal=causal, varlen=True)
    assert packed.bwd.head_loop and packed.bwd.dkv_smem and not packed.bwd.kv_sections, packed.bwd


def test_dq_halves_rides_the_staged_tile_at_d64_and_d128():
    """dq_halves (per-warpgroup halves of the staged dQ tile) is on wherever the staged tile runs
    at D = 64 (the 128-row step: the warpgroups' rows) and D = 128 (tile_m 64: their columns),
    dense calls, every mode, causal or not, and packed calls at D = 128 on the per-KV-head loop
    (timed on a ragged batch); off at D = 256 (no staged tile), in the deterministic build and on
    packed D = 64 calls (the 128-row step is dense-only) but for the packed stagger's (every mode from
    STEP_ORDER_MIN_SEQLEN_K keys, sigmoid causal only: test_step_order_rows_on_packed_calls); an override
    builds it with any staged tile, not without one."""
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")):
        for causal in (True, False):
            for d, tile_m in ((64, 128), (128, 64)):
                b = resolve(mode, ev, d=d, causal=causal).bwd
                assert b.tile_m == tile_m and b.dq_async and b.dq_halves, (d, b)
    for kw in (dict(d=256), dict(d=64, deterministic=True), dict(d=128, deterministic=True),
               dict(d=64, varlen=True, shape=(8, P.STEP_ORDER_MIN_SEQLEN_K // 2, 32, 8)),
               dict(mode="sigmoid", d=64, varlen=True, causal=False)):
        assert not resolve(**{"mode": "softmax", **kw}).bwd.dq_halves, kw
    for mode, ev in (("softmax", "native"), ("softcap", "poly")):
        b = resolve(mode, ev, d=128, varlen=True).bwd
        assert b.varlen and b.head_loop and b.tile_m == 64 and b.dq_async and b.dq_halves, b
        # a packed call whose grid takes a CTA per query head keeps the one buffer (not timed there)
        b = resolve(mode, ev, d=128, varlen=True, overrides={"bwd.head_loop": False}).bwd
        assert b.varlen and not b.head_loop and not b.dq_halves, b
    assert not resolve("softmax", d=64, overrides={"bwd.dq_halves": False}).bwd.dq_halves
    assert not resolve("softmax", d=128, overrides={"bwd.dq_async": False}).bwd.dq_halves
    cols = resolve("softmax", d=128, shape=SMALL).bwd
    assert cols.tile_m == 64 and cols.dq_async and cols.dq_halves, cols
    with pytest.raises(ValueError, match="dq_halves"):
        resolve("softmax", d=64, deterministic=True, overrides={"bwd.dq_halves": True})
    with pytest.raises(ValueError, match="dq_halves"):
        resolve("softmax", d=256, overrides={"bwd.dq_halves": True})


def test_d64_softcap_program_backward_takes_the_64_row_step():
    """The packed tanh program's D = 64 backward (caps above 50) steps 64 query rows (the 128-row step
    spilled 63-87 words under it), with the staged dQ halves and, from 2k keys, the stagger; caps up
    to 50 (the exp2 offload, a native backward) keep the 128-row step."""
    k = P.STEP_ORDER_MIN_SEQLEN_K
    for causal in (True, False):
        b = resolve("softcap", "poly", d=64, softcap=60.0, causal=causal).bwd
        assert (b.tile_m, b.dq_halves, b.p_turns, b.dq_defer) == (64, True, True, True), b
        b = resolve("softcap", "poly", d=64, softcap=60.0, causal=causal, shape=(8, k // 2, 32, 8)).bwd
        assert (b.tile_m, b.dq_halves, b.p_turns) == (64, True, False), b
    assert resolve("softcap", "poly", d=64, softcap=50.0).bwd.tile_m == 128
    assert resolve("softcap", "native", d=64, softcap=60.0).bwd.tile_m == 128
    assert resolve("sigmoid", "poly", d=64).bwd.tile_m == 128


def test_d64_noncausal_windows_take_keep_words():
    """Non-causal windowed D = 64 forwards mask by keep words (the compare per score spilled 39-97
    words on the 192-row tile); causal calls have them by the turns row, non-causal unwindowed calls
    have no masked blocks and none; packed calls keep the 128-row tile without them."""
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")):
        for w in ((48, 16), (200, -1), (-1, 16)):
            assert resolve(mode, ev, d=64, causal=False, window=w).fwd.mask_bits, (mode, w)
        assert not resolve(mode, ev, d=64, causal=False).fwd.mask_bits
        assert not resolve(mode, ev, d=128, causal=False, window=(48, 16)).fwd.mask_bits
    assert not resolve("softmax", d=64, causal=False, window=(48, 16), varlen=True).fwd.mask_bits


def test_packed_d64_forward_takes_the_dense_tile_where_it_was_timed():
    """Causal packed D = 64 softmax, softcap (constant max) and sigmoid forwards take the dense causal
    D = 64 build (192 x 128, 3 stages, turns, keep words, O staged: 1.06-1.24x the 128-row tile's speed);
    non-causal, short and online-max softcap packed calls keep 128 rows, 2 stages."""
    packed = (8, 4096, 32, 8)
    dense_tile = dict(tile_m=192, num_stages=3, pingpong=True, mask_bits=True, o_smem=True)
    for mode, ev in (("softmax", "native"), ("softmax", "poly"), ("softcap", "poly"), ("softcap", "native"),
                     ("sigmoid", "poly"), ("sigmoid", "native")):
        f = resolve(mode, ev, d=64, shape=packed, varlen=True).fwd
        assert f.varlen and fields(f, dense_tile) == dense_tile, (mode, ev)
        b = resolve(mode, ev, d=64, shape=packed, varlen=True).bwd
        assert (b.tile_m, b.dq_halves, b.p_turns, b.dq_defer) == (128, True, True, True), (mode, ev)
    for kw in (dict(mode="sigmoid", evaluator="poly", causal=False), dict(mode="softmax", causal=False),
               dict(mode="softcap", evaluator="poly", softcap=60.0), dict(mode="softmax", shape=(8, 512, 32, 8))):
        kw = dict(dict(shape=packed), **kw)
        assert (resolve(d=64, varlen=True, **kw).fwd.tile_m, resolve(d=64, varlen=True, **kw).fwd.num_stages) == (128, 2), kw
    # the tanh program keeps the 64-row step (its 128-row step spills)
    assert resolve("softcap", "poly", d=64, softcap=60.0, shape=packed, varlen=True).bwd.tile_m == 64


def test_d64_backward_tile_m128_stays_off_where_it_was_not_run():
    """The 128-row step is the D = 64 default only where it was timed and GPU-tested: not in
    deterministic builds, not for user score functions (check_bwd refuses them), not varlen."""
    assert resolve("softmax", d=64, deterministic=True).bwd.tile_m == 64
    # sigmoid poly's backward score is native: both evaluators share one build
    assert resolve("sigmoid", "native", d=64).bwd == resolve("sigmoid", "poly", d=64).bwd


def test_step_order_rows_stagger_d64_from_2k_keys_and_the_d128_softcap():
    """p_turns + dq_defer (the warpgroups staggered): on for dense D = 64 calls from
    STEP_ORDER_MIN_SEQLEN_K keys in every mode, causal or not (timed 0.886-0.946x; 0.99x at S = 1k,
    1.04x at 512: off there), and for the D = 128 softcap at any length; off for D = 128 softmax
    and sigmoid, D = 256, deterministic, windowed and user-score calls; dq_defer follows the staged
    halves and p_turns follows dq_defer (an override that drops the halves drops both)."""
    on = lambda p: (p.bwd.p_turns, p.bwd.dq_defer)
    k = P.STEP_ORDER_MIN_SEQLEN_K
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")):
        for causal in (True, False):
            assert on(resolve(mode, ev, d=64, causal=causal, shape=(4, k, 32, 8))) == (True, True), mode
            # short keys: in step but for the non-causal softcap exp2 offload (0.90-0.94x at S 512 / 1k)
            short = (True, True) if (mode, causal) == ("softcap", False) else (False, False)
            assert on(resolve(mode, ev, d=64, causal=causal, shape=(8, k // 2, 32, 8))) == short, (mode, causal)
        # ... native softcap and the tanh program (caps above 50) were not timed there
        assert on(resolve("softcap", "native", d=64, causal=False, shape=(8, k // 2, 32, 8))) == (False, False)
        assert on(resolve("softcap", "poly", d=64, softcap=60.0, causal=False,
                          shape=(8, k // 2, 32, 8))) == (False, False)
        assert on(resolve(mode, ev, d=128, shape=SMALL)) == ((True, True) if mode == "softcap" else (False, False))
        assert on(resolve(mode, ev, d=128)) == ((True, True) if mode == "softcap" else (False, False))
        assert on(resolve(mode, ev, d=256)) == (False, False)
    # the key length decides (a short query block over long keys staggers)
    assert on(resolve("softmax", d=64, shape=(1, 512, 32, 8), seqlen_k=k)) == (True, True)
    for kw in (dict(deterministic=True), dict(window=(256, 0))):
        for d, mode in ((64, "softmax"), (128, "softcap")):
            # windows: D = 64 softmax / softcap stagger (0.959x / 0.947x), D = 128 in step (0.996-1.001x)
            want = (True, True) if (d, kw) == (64, dict(window=(256, 0))) else (False, False)
            assert on(resolve(mode, d=d, **kw)) == want, (d, mode, kw)
    assert on(resolve("softcap", "poly", d=64, window=(256, 0))) == (True, True)
    assert on(resolve("sigmoid", "poly", d=64, window=(256, 0))) == (False, False)   # not timed
    assert on(resolve("softmax", d=64, overrides={"bwd.dq_halves": False})) == (False, False)
    assert on(resolve("softcap", "poly", d=128, overrides={"bwd.dq_async": False})) == (False, False)
    assert on(resolve("softmax", d=64, overrides={"bwd.p_turns": False})) == (False, True)


def test_step_order_rows_on_packed_calls():
    """Packed calls stagger where it was timed: softmax and softcap at D = 64 (from
    STEP_ORDER_MIN_SEQLEN_K keys, with the dQ halves the 64-row step takes for it) and D = 128, on the
    per-KV-head loop (the halves' packed build), causal sigmoid at D = 64 (on the 128-row step); not
    sigmoid at D = 128 or non-causal (not timed), windows, D = 256 (the swapped build), nor a CTA per
    query head (no halves there: both off)."""
    on = lambda p: (p.bwd.p_turns, p.bwd.dq_defer, p.bwd.dq_halves)
    k = P.STEP_ORDER_MIN_SEQLEN_K
    packed = (8, 4096, 32, 8)   # max_seqlen; the grid of 8 sequences takes the per-KV-head loop
    for d in (64, 128):
        for mode, ev in (("softmax", "native"), ("softcap", "poly")):
            for causal in (True, False):
                p = resolve(mode, ev, d=d, causal=causal, shape=packed, varlen=True)
                # causal packed D = 64 on the dense 128-row step (1.10-1.21x the 64-row step's speed)
                assert p.bwd.varlen and p.bwd.head_loop and p.bwd.tile_m == (128 if d == 64 and causal else 64)
                assert on(p) == (True, True, True), (d, mode, causal)
            assert on(resolve(mode, ev, d=d, shape=packed, varlen=True, window=(256, 0))) == (False, False, d == 128)
            assert on(resolve(mode, ev, d=d, shape=packed, varlen=True,
                              overrides={"bwd.head_loop": False})) == (False, False, False)
        assert on(resolve("sigmoid", "poly", d=d, shape=packed, varlen=True)) == (d == 64, d == 64, True)
        assert on(resolve("sigmoid", "poly", d=d, shape=packed, varlen=True, causal=False)) == (False, False, d == 128)
    assert on(resolve("softmax", d=64, shape=(8, k // 2, 32, 8), varlen=True)) == (False, False, False)
    assert on(resolve("softmax", d=64, shape=(8, k, 32, 8), varlen=True)) == (True, True, True)
    assert not resolve("softcap", "poly", d=256, shape=packed, varlen=True).bwd.p_turns


def test_deterministic_backward_is_ordered():
    p = resolve("softmax", deterministic=True)
    assert fields(p.bwd, BWD_FIELDS) == dict(tile_m=64, tile_n=128, stages=2, deterministic=True,
                                             dq_async=False, lpt=False, head_loop=False, kv_sections=False,
                                             dkv_smem=False, swap=False, dp_first=False)
    assert not p.zero_dq_in_pre
    assert resolve("softmax").fwd == p.fwd     # the forward does not depend on it


def test_head_loop_where_its_grid_fills_the_gpu():
    """A CTA per (key block, KV head) runs the GQA group where that grid (key blocks x KV heads
    x batch x 128-column chunks) has at least 1.5 CTAs per SM, and always without GQA."""
    assert P.HEAD_LOOP_MIN_CTAS_PER_SM == 1.5
    assert resolve("softmax", shape=ANCHOR).bwd.head_loop                  # 32 x 8 = 256 CTAs >= 198
    assert not resolve("softmax", shape=SMALL).bwd.head_loop               # 8 x 8 = 64 < 198
    assert resolve("softmax", shape=(1, 1024, 8, 8)).bwd.head_loop          # no GQA: always
    assert resolve("softmax", shape=(1, 2048, 32, 8), d=256).bwd.head_loop  # 16 x 8 x 2 chunks = 256
    assert not resolve("softmax", shape=(1, 2048, 32, 8)).bwd.head_loop     # 16 x 8 = 128
    assert resolve("softmax", shape=SMALL, sm=42).bwd.head_loop             # 64 >= 63
    assert not resolve("softmax", shape=SMALL, sm=43).bwd.head_loop         # 64 < 64.5
    assert not resolve("softmax", shape=SMALL, overrides={"bwd.head_loop": False}).zero_dq_in_pre


def test_pre_kernel_zeroes_dq_where_it_runs_anyway():
    """zero_dq_in_pre: the head-loop backward's dQ accumulator is zeroed by the pre kernel in
    the softmax modes (which run it for LSE and D); sigmoid keeps a memset."""
    assert resolve("softmax").zero_dq_in_pre and resolve("softcap", "poly").zero_dq_in_pre
    assert not resolve("sigmoid", "poly").zero_dq_in_pre
    assert not resolve("softmax", shape=SMALL).zero_dq_in_pre


# ------------------------------------------------------------------------ runtime values
def test_runtime_values():
    assert resolve("sigmoid", "poly").sigmoid_bias == pytest.approx(-math.log(4096))
    assert resolve("sigmoid", "poly", seqlen_k=1000).sigmoid_bias == pytest.approx(-math.log(1000))
    assert resolve("sigmoid", sigmoid_bias=-3.0).sigmoid_bias == -3.0
    assert resolve("softmax").sigmoid_bias is None
    p = resolve("softcap", softcap=30.0)
    assert (p.softcap, p.softmax_scale) == (30.0, 128 ** -0.5)


def test_window_sizes_and_flags():
    """The window's sizes are runtime values (plan.window, clamped to S_q + S_k), its bounds
    compile-time flags; causal is right = 0 compiled in, so a right bound adds no build."""
    from flash_attn_poly.kernels.config import window_sizes
    plain = resolve("softmax")
    assert plain.window == (0, 0) and not plain.fwd.window_left and not plain.fwd.window_right
    assert window_sizes((-1, -1), True, 100, 100) == (0, 0)
    p = resolve("softmax", window=(5, 7))
    assert p.window == (5, 0) and (p.fwd.window_left, p.fwd.window_right) == (True, False)
    assert (p.bwd.window_left, p.bwd.window_right) == (True, False)
    assert resolve("softmax", window=(-1, 5)).fwd == plain.fwd and resolve("softmax", window=(-1, 5)).bwd == plain.bwd
    p = resolve("softmax", causal=False, window=(10 ** 9, 3), shape=(1, 100, 4, 4), seqlen_k=50)
    assert p.window == (150, 3) and (p.fwd.window_left, p.fwd.window_right) == (True, True)
    assert window_sizes((10 ** 9, 3), False, 100, 50) == (150, 3)


# ------------------------------------------------------------------------------ overrides
def test_unknown_overrides_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown plan overrides \['tile_n'\]"):
        resolve("softmax", overrides={"tile_n": 64})
    with pytest.raises(ValueError, match="plan overrides.*nope"):
        resolve("softmax", overrides={"fwd.nope": 1})
    with pytest.raises(ValueError, match="plan overrides.*head_loops"):
        resolve("softmax", overrides={"bwd.head_loops": True})


def test_overrides_replace_fields_after_the_rows():
    """An override sets one field and nothing else: tile_n 64 on the three-warpgroup softcap
    build keeps its tile_m 192 (set every field you mean)."""
    p = resolve("softcap", overrides={"fwd.tile_n": 64, "fwd.num_stages": 2})
    assert (p.fwd.tile_m, p.fwd.tile_n, p.fwd.num_stages, p.fwd.fixed_max) == (192, 64, 2, True)
    p = resolve("softcap", overrides={"fwd.tile_m": 128, "fwd.tile_n": 128, "fwd.num_stages": 2})
    assert (p.fwd.tile_m, p.fwd.tile_n, p.fwd.pingpong, p.fwd.fixed_max) == (128, 128, True, True)
    assert resolve("softmax", overrides={"bwd.lpt": False}).fwd == resolve("softmax").fwd


@pytest.mark.parametrize("kw", [dict(mode="softcap", dtype="fp16"), dict(mode="softmax"), dict(mode="sigmoid")],
                         ids=["softcap-fp16", "softmax", "sigmoid"])
def test_fixed_max_override_elsewhere_is_refused(kw):
    """The constant row max needs the softcap score and BF16 P (FP16 P's range is e^-17..e^11)."""
    with pytest.raises(ValueError, match=r"fixed_max \(a constant row max c - 20\) needs mode='softcap', BF16"):
        resolve(**kw, overrides={"fwd.fixed_max": True})
    assert not resolve("softcap", overrides={"fwd.fixed_max": False, "fwd.tile_m": 128}).fwd.fixed_max


def test_fixed_max_override_above_the_cap_is_refused():
    with pytest.raises(ValueError, match="fixed_max"):
        resolve("softcap", softcap=60.0, overrides={"fwd.fixed_max": True})
    with pytest.raises(ValueError, match="k must divide 8"):   # the offload runs groups of 8 out of 8
        resolve("softcap", "poly", d=64, overrides={"poly_split": (1, 16)})


def test_poly_split_override_reaches_the_exp2_offload():
    p = resolve("softcap", "poly", d=64, overrides={"poly_split": (1, 4)})
    assert p.fwd.exp2_fma == 2


def test_tile_choices_are_checked():
    resolve("softmax", overrides={"fwd.tile_m": 192, "fwd.tile_n": 64, "fwd.pingpong": False})
    with pytest.raises(ValueError, match="tile_m must be 128 or 192"):
        resolve("softmax", overrides={"fwd.tile_m": 256, "fwd.tile_n": 64, "fwd.pingpong": False})
    # three consumer warpgroups take their GEMM turns round robin (D = 128 softmax: ping-pong on)
    assert resolve("softmax", overrides={"fwd.tile_m": 192, "fwd.tile_n": 64}).fwd.pingpong
    with pytest.raises(ValueError, match="tile_n must be a multiple of 16"):
        resolve("softmax", overrides={"fwd.tile_n": 72})
    with pytest.raises(ValueError, match="num_stages must be >= 1"):
        resolve("softmax", overrides={"fwd.num_stages": 0})
    with pytest.raises(ValueError, match="row_max_chains"):
        resolve("softmax", overrides={"fwd.row_max_chains": 3})


def test_forward_refuses_configs_over_shared_memory():
    """A config that cannot fit sm_90's 227 KB is a ValueError naming the sizes, not a launch
    failure; the defaults and the largest measured knob (3 K/V stages at D = 128) fit."""
    for d, ov in [(128, {}), (256, {}), (64, {}), (128, {"fwd.num_stages": 3, "fwd.o_smem": False}),
                  (128, {"fwd.tile_n": 64, "fwd.num_stages": 4}), (256, {"fwd.o_smem": True})]:
        resolve("softmax", d=d, overrides=ov)
    for d, ov in [(256, {"fwd.tile_n": 128}), (128, {"fwd.num_stages": 4}), (256, {"fwd.num_stages": 3}),
                  (128, {"fwd.num_stages": 3}),   # O's staging tile beside 3 stages
                  (256, {"fwd.tile_n": 80, "fwd.o_smem": True})]:   # its 128-column tile beside 80-key stages
        with pytest.raises(ValueError, match="bytes of shared memory"):
            resolve("softmax", d=d, overrides=ov)


def test_rescale_threshold_range_is_checked():
    resolve("softmax", overrides={"fwd.rescale_threshold": 16.0})
    for t in (-1.0, 17.0):
        with pytest.raises(ValueError, match="rescale_threshold"):
            resolve("softmax", overrides={"fwd.rescale_threshold": t})


def test_exp2_fma_needs_the_exp2_program_under_the_constant_max():
    """FwdConfig.exp2_fma: 0..8 column groups of 8, only with the fixed max (a bounded exp2
    argument); its block is FwdConfig.exp2_program, an exp2_f32 program: the score's own in the
    exp2 offload; beside a score without one (native, a tanh program) only when named by
    override, else a clear error."""
    from flash_attn_poly import plan
    p = resolve("softcap", "poly", overrides={"fwd.exp2_fma": 2})
    assert p.fwd.exp2_fma == 2 and p.fwd.exp2_program is p.score.program and p.score.program.is_exp2
    assert resolve("softcap", "poly").fwd.exp2_program is p.score.program
    for ev, prog in (("native", None), ("poly", "softcap_c50_f16_odd")):
        with pytest.raises(ValueError, match="fwd.exp2_fma: its block is the score's exp2 program"):
            resolve("softcap", ev, program=prog, overrides={"fwd.exp2_fma": 1})
        q = resolve("softcap", ev, program=prog, overrides={"fwd.exp2_fma": 1,
                                                           "fwd.exp2_program": P._program_spec(plan.EXP2_PROGRAM)})
        assert q.fwd.exp2_fma == 1 and q.fwd.exp2_program.name == plan.EXP2_PROGRAM, (ev, q.fwd)
        assert (q.score.program and q.score.program.name) == prog
        assert resolve("softcap", ev, program=prog).fwd.exp2_program is None
    for ov in ({"fwd.exp2_fma": 9}, {"fwd.exp2_fma": -1},
               {"fwd.fixed_max": False, "fwd.tile_m": 128, "fwd.tile_n": 128, "fwd.num_stages": 2}):
        with pytest.raises(ValueError, match="exp2_fma"):
            resolve("softcap", "poly", overrides=ov)
    with pytest.raises(ValueError, match="exp2_fma"):   # no constant max, no bounded argument
        resolve("softmax", overrides={"fwd.exp2_fma": 2})
    with pytest.raises(ValueError, match="exp2_fma .* needs 0..8, an exp2_f32 program"):   # an override is kept
        resolve("softcap", "native", overrides={"fwd.exp2_fma": 1,
                                                "fwd.exp2_program": P._program_spec("softcap_c50_f16_odd")})
    with pytest.raises(ValueError, match="exp2_program is exp2_fma's block"):
        resolve("softcap", "native", overrides={"fwd.exp2_program": p.score.program})


def test_backward_overrides_are_checked():
    resolve("softmax", overrides={"bwd.dq_async": False, "bwd.lpt": False, "bwd.head_loop": False})
    with pytest.raises(ValueError, match="dq_async: not with deterministic"):
        resolve("softmax", deterministic=True, overrides={"bwd.dq_async": True})
    with pytest.raises(ValueError, match="dq_async: the staged dQ tile does not fit"):
        resolve("softmax", d=256, varlen=True, overrides={"bwd.swap": False, "bwd.tile_n": 128, "bwd.stages": 1,
                                                         "bwd.head_loop": False, "bwd.dq_async": True,
                                                         "bwd.dp_first": False})
    with pytest.raises(ValueError, match="lpt: not with deterministic"):
        resolve("softmax", deterministic=True, overrides={"bwd.lpt": True})
    with pytest.raises(ValueError, match="head_loop: not with deterministic"):
        resolve("softmax", deterministic=True, overrides={"bwd.head_loop": True})
    with pytest.raises(ValueError, match="kv_sections: sections of head_loop's LPT order"):
        resolve("softmax", overrides={"bwd.kv_sections": True, "bwd.head_loop": False})
    with pytest.raises(ValueError, match="stages must be >= 1"):
        resolve("softmax", overrides={"bwd.stages": 0})


def test_pack_gqa_rows():
    """fwd.pack_gqa (the GQA group's heads packed into the forward's M tile) where it was timed
    faster: D = 64 softmax (not short, unwindowed), D = 64 causal softcap under the constant max,
    D = 128 softcap under the constant max, causal D = 64 sigmoid up to PACK_GQA_MAX_KEYS keys; not the
    non-causal or longer sigmoid, D = 128 softmax, D = 256, windows, short D = 64 calls, the online-max
    softcap, MHA, groups that are no power of two; packed sequences where they were timed: causal D = 64
    softmax and softcap (constant max), not D = 128, windows or sigmoid."""
    on = lambda *a, **k: resolve(*a, **k).fwd.pack_gqa
    gqa = (2, 8192, 32, 8)
    assert on("softmax", d=64, shape=gqa) == on("softmax", "poly", d=64, shape=gqa, causal=False) == 4
    assert on("softmax", d=64, shape=(1, 32768, 64, 8)) == 8
    assert on("softcap", "poly", d=64, shape=gqa) == on("softcap", "native", d=64, shape=gqa) == 4
    assert on("softcap", "poly", d=128, shape=gqa) == on("softcap", "poly", d=128, causal=False) == 4
    assert on("softcap", "poly", d=128, shape=(16, 1024, 32, 8)) == 4
    assert on("sigmoid", "poly", d=64, shape=gqa) == on("sigmoid", "native", d=64, shape=(8, 2048, 32, 8)) == 4
    for kw in (dict(mode="sigmoid", evaluator="poly", d=64, shape=(1, 16384, 32, 8)),
               dict(mode="sigmoid", evaluator="poly", d=64, causal=False), dict(mode="softmax", d=128), dict(mode="softmax", d=256),
               dict(mode="softcap", evaluator="poly", d=256), dict(mode="softcap", evaluator="poly", d=64, causal=False),
               dict(mode="softcap", evaluator="poly", d=64, softcap=60.0), dict(mode="softmax", d=64, window=(256, 0)),
               dict(mode="softmax", d=64, shape=(16, 1024, 32, 8)), dict(mode="softmax", d=64, shape=(2, 8192, 32, 32)),
               dict(mode="softmax", d=64, shape=(2, 8192, 24, 8)), dict(mode="softcap", d=128, window=(256, 0)),
               dict(mode="softmax", d=128, shape=(8, 4096, 32, 8), varlen=True),
               dict(mode="softcap", evaluator="poly", d=128, shape=(8, 4096, 32, 8), varlen=True),
               dict(mode="softmax", d=64, shape=(8, 4096, 32, 8), varlen=True, window=(256, 0)),
               dict(mode="softmax", d=64, shape=(8, 4096, 32, 8), varlen=True, causal=False),
               dict(mode="sigmoid", evaluator="poly", d=64, shape=(8, 4096, 32, 8), varlen=True)):
        kw = dict(dict(shape=gqa), **kw)
        assert on(**kw) == 1, kw
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("softcap", "native")):
        for ragged in (False, True):
            assert on(mode, ev, d=64, shape=(8, 4096, 32, 8), varlen=True, varlen_ragged=ragged) == 4, (mode, ragged)
    # the plan's packed builds pass check_fwd (a group of 3 is not packed)
    assert on("softmax", d=64, shape=(2, 8192, 24, 8)) == 1


def test_pack_gqa_resolves_to_the_call_group():
    """True resolves to H_q / H_kv, 1 / False to off, an MHA call to 1; another integer is refused
    naming the field; user scores cannot take it, packed calls within the compact order's table."""
    assert resolve("softmax", d=64, shape=(2, 8192, 32, 8), overrides={"fwd.pack_gqa": True}).fwd.pack_gqa == 4
    assert resolve("softmax", d=64, shape=(2, 8192, 32, 8), overrides={"fwd.pack_gqa": 4}).fwd.pack_gqa == 4
    assert resolve("softmax", d=64, shape=(2, 8192, 32, 8), overrides={"fwd.pack_gqa": 1}).fwd.pack_gqa == 1
    assert resolve("softmax", d=64, shape=(1, 4096, 16, 16), overrides={"fwd.pack_gqa": True}).fwd.pack_gqa == 1
    with pytest.raises(ValueError, match="pack_gqa.*group H_q / H_kv = 4, got 2"):
        resolve("softmax", d=64, shape=(2, 8192, 32, 8), overrides={"fwd.pack_gqa": 2})
    with pytest.raises(ValueError, match="pack_gqa.*power of two"):   # a group of 3
        resolve("softmax", d=64, shape=(2, 8192, 24, 8), overrides={"fwd.pack_gqa": True})
    # packed sequences pack where their rows say (causal D = 64 softmax / softcap) or by override, within
    # the compact table's tile count
    assert resolve("softmax", d=64, shape=(8, 4096, 32, 8), varlen=True, overrides={"fwd.pack_gqa": True}).fwd.pack_gqa == 4
    with pytest.raises(ValueError, match=r"pack_gqa \(the compact order\): at most .* got 2 and 8193"):
        resolve("softmax", d=128, shape=(2, 131088, 64, 8), varlen=True, varlen_ragged=True,
                overrides={"fwd.pack_gqa": True})
    with pytest.raises(ValueError, match="pack_gqa: built-in scores only"):
        resolve("softmax", d=128, score_mod=lambda s, *a: s, overrides={"fwd.pack_gqa": True})


def test_pack_gqa_balances_its_own_tiles():
    """The persistent forward's CTA count under packed GQA models the packed tiles (tile_m / g
    positions of g heads, units per KV head): at causal MHA-sized grids the count is the model's,
    not the unpacked plan's, and a packed plan's count stays within the SM count."""
    for shape in ((4, 4096, 32, 8), (1, 16384, 32, 8), (16, 1024, 32, 4)):
        p = resolve("softmax", d=128, shape=shape, overrides={"fwd.pack_gqa": True})
        assert p.fwd.pack_gqa > 1 and 0 < p.fwd_ctas <= SM
        from flash_attn_poly.kernels.tile_scheduler import persistent_ctas, heads_per_section, TILE_FIXED_KEYS
        from flash_attn_poly.kernels.mask import key_block_range
        b, s, hq, hkv = shape
        g, tm, tn = hq // hkv, p.fwd.tile_m, p.fwd.tile_n
        blocks = -(-(g * s) // tm)
        cost = [(lambda r: max(r[1] - r[0], 0))(key_block_range(m, s, s, tm // g, tn, True)) * tn + TILE_FIXED_KEYS
                for m in range(blocks)]
        units = hkv * b
        assert p.fwd_ctas == persistent_ctas(p.fwd.persistent, blocks, units,
                                             heads_per_section(units, s, 128 * 4, 1), cost, True)


def test_varlen_backward_table_order_is_a_plan_choice():
    """The packed backward's CTA table order (kernels/tile_scheduler.varlen_bwd_table) is the plan's
    `varlen_bwd_order`: the block order where the query lengths are equal (total_q = batch x
    max_seqlen_q), the unit order on ragged batches, either by the bwd.varlen_order override;
    it is no BwdConfig field (the kernel reads whatever table it is given: the build is the same),
    and dense calls have none;
    an unknown order is refused by name."""
    p = resolve("softmax", varlen=True, varlen_ragged=True)
    assert p.varlen_bwd_order == "unit" and not hasattr(p.bwd, "varlen_order")
    q = resolve("softmax", varlen=True, varlen_ragged=True, overrides={"bwd.varlen_order": "block"})
    assert q.varlen_bwd_order == "block" and q.bwd == p.bwd
    for mode, ev, d in (("softmax", "native", 64), ("softcap", "poly", 128), ("sigmoid", "poly", 64)):
        assert resolve(mode, ev, d=d, varlen=True).varlen_bwd_order == "block", (mode, d)
        assert resolve(mode, ev, d=d, varlen=True, varlen_ragged=True).varlen_bwd_order == "unit", (mode, d)
    assert resolve("softmax", varlen=True, overrides={"bwd.varlen_order": "unit"}).varlen_bwd_order == "unit"
    assert resolve("softmax").varlen_bwd_order is None   # dense calls have no table
    with pytest.raises(ValueError, match="bwd.varlen_order"):
        resolve("softmax", varlen=True, overrides={"bwd.varlen_order": "lpt"})


def test_l2_section_rows_and_their_cta_counts():
    """Short MHA softmax / sigmoid calls take smaller L2 sections: non-causal up to L2_SECTION_MAX_KEYS
    keys 16 MB on every SM; causal at S <= SHORT_SEQLEN 8 MB on a CTA count that divides every
    section's tiles (128 here: 32 heads x 4 blocks at D = 128 S = 512, 64 x 4 at D = 64).  Causal
    at 2k, GQA, softcap, packed sequences and windows keep 32 MB; an override of the field reaches
    the CTA model, and a size outside [1, 1024] MB is refused naming the field."""
    from flash_attn_poly.plan import L2_SECTION_MAX_KEYS
    from flash_attn_poly.kernels.tile_scheduler import heads_per_section, section_ctas
    for mode, ev in (("softmax", "native"), ("sigmoid", "poly")):
        for d in (64, 128):
            p = resolve(mode, ev, d=d, shape=(32, 512, 32, 32), causal=False)
            assert (p.l2_section_mb, p.fwd_ctas) == (16, SM)
            assert resolve(mode, ev, d=d, shape=(32, 512, 32, 32), causal=False,
                           seqlen_k=L2_SECTION_MAX_KEYS + 128).l2_section_mb == 32
            assert resolve(mode, ev, d=d, shape=(32, 512, 32, 32), causal=False,
                           window=(255, 255)).l2_section_mb == 32   # windows: untimed, the default
            for shape in ((32, 512, 32, 32), (16, 1024, 32, 32)):
                p = resolve(mode, ev, d=d, shape=shape)
                assert (p.l2_section_mb, p.fwd_ctas) == (8, 128), (mode, d, shape)
            for kw in (dict(shape=(8, 2048, 32, 32)), dict(shape=(32, 512, 32, 8)),
                       dict(shape=(32, 512, 32, 32), window=(255, -1)), dict(shape=(32, 512, 32, 32), varlen=True)):
                assert resolve(mode, ev, d=d, **kw).l2_section_mb == 32, (mode, d, kw)
    # softcap D = 128 (192 x 64 tile, every SM): 16 MB up to SHORT_KEYS keys, MHA or GQA, causal or not
    for shape, causal in (((32, 512, 32, 32), True), ((16, 1024, 32, 8), True), ((8, 2048, 32, 32), False)):
        for ev in ("poly", "native"):
            p = resolve("softcap", ev, d=128, shape=shape, causal=causal)
            assert (p.l2_section_mb, p.fwd_ctas) == (16, SM), (ev, shape, causal)
    for kw in (dict(shape=(4, 4096, 32, 32)), dict(shape=(16, 1024, 32, 32), window=(255, -1)),
               dict(shape=(16, 1024, 32, 32), varlen=True), dict(shape=(16, 1024, 32, 32), softcap=60.0)):
        assert resolve("softcap", "poly", d=128, **kw).l2_section_mb == 32, kw
    # softcap D = 64 causal MHA from 513 keys to SHORT_SEQLEN: 32 MB sections walked whole on 128 CTAs
    p = resolve("softcap", "poly", d=64, shape=(16, 1024, 32, 32))
    assert (p.fwd.tile_m, p.l2_section_mb, p.fwd_ctas) == (128, 32, 128)
    for kw in (dict(shape=(32, 512, 32, 32)), dict(shape=(16, 1024, 32, 8)), dict(shape=(8, 2048, 32, 32)),
               dict(shape=(16, 1024, 32, 32), causal=False)):
        assert resolve("softcap", "poly", d=64, **kw).fwd_ctas == SM, kw
    # D = 256 MHA and GQA 2 at S <= 1k (softmax, fixed-max softcap), causal and not: 8 MB sections of 16
    # heads x 4 blocks (S = 512) or 8 x 8 (1k) = 64 tiles, two whole sections per round on 128 CTAs;
    # sigmoid non-causal MHA only
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")):
        for shape in ((32, 512, 16, 16), (16, 1024, 16, 16), (32, 512, 16, 8), (16, 1024, 16, 8)):
            for causal in (True, False):
                p = resolve(mode, ev, d=256, shape=shape, causal=causal)
                taken = mode != "sigmoid" or (shape[2] == shape[3] and not causal)
                assert (p.l2_section_mb == 8) == taken, (mode, shape, causal)
                if taken:
                    assert p.fwd_ctas == 128, (mode, shape, causal)
        for kw in (dict(shape=(8, 2048, 16, 16)), dict(shape=(32, 512, 16, 4)),
                   dict(shape=(32, 512, 16, 16), window=(255, -1)), dict(shape=(32, 512, 16, 16), varlen=True)):
            assert resolve(mode, ev, d=256, **kw).l2_section_mb == 32, (mode, kw)
    assert heads_per_section(32 * 16, 512, 256 * 4, 1, 8 << 20) == 16
    assert section_ctas(SM, 4, 32 * 16, 16) == 128 and section_ctas(SM, 4, 32 * 16 + 4, 16) == 128   # a multiple
    assert section_ctas(SM, 4, 32 * 16, 40) == 0   # 160 tiles a section: neither divisor nor multiple in [PERSISTENT_MIN_SHARE * SM, SM]
    # the aligned count: 8 MB over 512 rows of 512 B (D = 128) = 32 heads, 4 blocks each: 128 tiles a section
    assert heads_per_section(32 * 32, 512, 128 * 4, 1, 8 << 20) == 32
    assert section_ctas(SM, 4, 32 * 32, 32) == 128
    # a last section of 32 tiles: 128 still walks every whole section in its own round (the partial one is last)
    assert section_ctas(SM, 4, 32 * 32 + 8, 32) == 128 and section_ctas(SM, 2, 32 * 32 + 8, 33) == 132
    # an override reaches the balance model (GQA rows keep the model's count, not the aligned one)
    from flash_attn_poly.kernels.tile_scheduler import persistent_ctas, TILE_FIXED_KEYS
    p8 = resolve("softmax", d=128, shape=(32, 512, 32, 8), overrides={"l2_section_mb": 8})
    cost = [(m + 1) * 128 + TILE_FIXED_KEYS for m in range(4)]
    assert p8.l2_section_mb == 8 and p8.fwd_ctas == persistent_ctas(
        SM, 4, 32 * 32, heads_per_section(32 * 32, 512, 128 * 4, 4, 8 << 20), cost, True)
    with pytest.raises(ValueError, match="l2_section_mb"):
        resolve("softmax", d=128, overrides={"l2_section_mb": 0})
    with pytest.raises(ValueError, match="override 'l2_section_mb'"):
        resolve("softmax", d=128, overrides={"fwd.l2_section_mb": 8})
    # the section size is a launch argument: a 16 MB row and the 32 MB default share one compiled forward
    short, long_ = (resolve("softcap", "poly", d=128, shape=(16384 // s, s, 32, 8)) for s in (1024, 4096))
    assert (short.l2_section_mb, long_.l2_section_mb) == (16, 32) and short.fwd == long_.fwd


def test_wg_skip_rows():
    """fwd.wg_skip (each consumer warpgroup on its own rows' key range) where it was timed faster: softcap
    D = 128 under the constant max and D = 64 softmax / fixed-max softcap, MHA up to SHORT_KEYS keys, but not
    the short causal D = 64 128 x 128 tile (nothing to pass); causal D = 256 softmax MHA at S <= SHORT_SEQLEN;
    dense unwindowed calls."""
    on = [("softcap", "poly", 128, (32, 512, 32, 32), True), ("softcap", "native", 128, (8, 2048, 32, 32), True),
          ("softcap", "poly", 128, (32, 512, 32, 32), False), ("softmax", "native", 64, (8, 2048, 32, 32), True),
          ("softmax", "native", 64, (32, 512, 32, 32), False), ("softcap", "poly", 64, (32, 512, 32, 32), False),
          ("softmax", "native", 256, (32, 512, 16, 16), True), ("softmax", "native", 256, (16, 1024, 16, 16), True)]
    off = [("softcap", "poly", 128, (4, 4096, 32, 32), True), ("softcap", "poly", 128, (16, 1024, 32, 8), True),
           ("softmax", "native", 128, (32, 512, 32, 32), True), ("sigmoid", "poly", 64, (32, 512, 32, 32), False),
           ("softmax", "native", 64, (32, 512, 32, 32), True), ("softcap", "poly", 64, (16, 1024, 32, 32), True),
           ("softmax", "native", 64, (8, 2048, 32, 8), True), ("softmax", "native", 64, (4, 4096, 32, 32), True),
           ("softcap", "poly", 256, (32, 512, 16, 16), True), ("softmax", "native", 256, (32, 512, 16, 16), False),
           ("softmax", "native", 256, (8, 2048, 16, 16), True)]
    for mode, ev, d, shape, causal in on:
        assert resolve(mode, ev, d=d, shape=shape, causal=causal).fwd.wg_skip, (mode, ev, d, shape, causal)
    for mode, ev, d, shape, causal in off:
        assert not resolve(mode, ev, d=d, shape=shape, causal=causal).fwd.wg_skip, (mode, ev, d, shape, causal)
    for kw in (dict(varlen=True), dict(window=(255, -1))):
        assert not resolve("softcap", "poly", d=128, shape=(32, 512, 32, 32), **kw).fwd.wg_skip, kw


def test_q_bottom_rows():
    """fwd.q_bottom (causal query tiles aligned to S_q's end) where it was timed faster: softcap D = 128 under
    the constant max, causal unwindowed (dense MHA, packed GQA and varlen) or with a left window (dense, a KV
    head per several query heads), past Q_BOTTOM_MIN_SEQLEN_Q query rows; D = 64 causal dense past
    SHORT_SEQLEN (user score functions too), but not softcap with its group packed nor sigmoid past
    Q_BOTTOM_MAX_KEYS; never non-causal (check_fwd refuses it) nor on the 128 x 128 tiles (no run took it
    there)."""
    on = [("softcap", "poly", 128, (16, 1024, 32, 32), {}), ("softcap", "native", 128, (4, 4096, 32, 8), {}),
          ("softcap", "poly", 128, (16, 1024, 32, 32), dict(varlen=True)),
          ("softmax", "native", 64, (4, 4096, 32, 32), {}), ("softmax", "native", 64, (2, 8192, 32, 8), {}),
          ("softcap", "poly", 64, (8, 2048, 32, 32), {}), ("sigmoid", "poly", 64, (4, 4096, 32, 8), {}),
          ("softmax", "native", 64, (4, 4096, 32, 32), dict(score_mod=lambda s, *a: s)),
          ("softcap", "poly", 128, (1, 8192, 32, 16), dict(window=(4095, 0))),
          ("softcap", "native", 128, (1, 8192, 32, 16), dict(window=(1023, 0)))]
    off = [("softcap", "poly", 128, (1, 8192, 32, 32), dict(window=(4095, 0))),
           ("softcap", "poly", 128, (1, 8192, 32, 16), dict(window=(4095, 0), varlen=True)),
           ("softcap", "poly", 128, (1, 8192, 32, 16), dict(window=(4095, 0), causal=False)),
           ("softcap", "poly", 128, (1, 512, 32, 16), dict(window=(255, 0))),
           ("softcap", "poly", 128, (16, 1024, 32, 32), dict(causal=False)),
           ("softcap", "poly", 128, (16, 1024, 32, 32), dict(window=(255, -1))),
           ("softmax", "native", 128, (16, 1024, 32, 8), {}), ("sigmoid", "poly", 128, (4, 4096, 32, 32), {}),
           ("softmax", "native", 64, (16, 1024, 32, 32), {}), ("softmax", "native", 64, (4, 4096, 32, 32), dict(varlen=True)),
           ("softcap", "poly", 64, (4, 4096, 32, 8), {}), ("sigmoid", "poly", 64, (2, 8192, 32, 32), {}),
           ("softmax", "native", 256, (4, 4096, 16, 16), {}),
           ("softcap", "poly", 128, (32, 512, 32, 32), {}), ("softcap", "native", 128, (32, 500, 32, 8), {})]
    for mode, ev, d, shape, kw in on:
        assert resolve(mode, ev, d=d, shape=shape, **kw).fwd.q_bottom, (mode, ev, d, shape, kw)
    for mode, ev, d, shape, kw in off:
        assert not resolve(mode, ev, d=d, shape=shape, **kw).fwd.q_bottom, (mode, ev, d, shape, kw)


def test_q_bottom_override_takes_causal_windows_only():
    """fwd.q_bottom by override: a causal call with a left window builds (the window's bounds move with
    the shifted rows as the causal bound does); a non-causal call, windowed or not, is refused by
    check_fwd, naming q_bottom."""
    p = resolve("softcap", "native", d=128, shape=(1, 8192, 32, 16), window=(4095, 0),
                overrides={"fwd.q_bottom": True})
    assert p.fwd.q_bottom and p.fwd.causal and p.fwd.window_left and not p.fwd.window_right
    for kw in (dict(causal=False), dict(causal=False, window=(255, 127))):
        with pytest.raises(ValueError, match="q_bottom"):
            resolve("softcap", "native", d=128, shape=(1, 8192, 32, 16), overrides={"fwd.q_bottom": True}, **kw)


def test_sigmoid_poly_forward_takes_the_mufu_threshold():
    """The sigmoid block runs only below x' = SIGMOID_MUFU_ABOVE (the forward's MUFU branch above it);
    the product rule's backward and the other scores carry no threshold, and ScoreSpec refuses one."""
    from flash_attn_poly.kernels.scores import ScoreSpec
    p = resolve("sigmoid", "poly")
    assert p.score.mufu_above == P.SIGMOID_MUFU_ABOVE < float(p.score.program.param("hi"))
    assert p.score_bwd.mufu_above is None
    for mode, ev in (("sigmoid", "native"), ("softcap", "poly"), ("softmax", "native")):
        assert resolve(mode, ev).score.mufu_above is None
    with pytest.raises(ValueError, match="mufu_above"):
        ScoreSpec(kind="sigmoid", evaluator="native", mufu_above=4.0)
