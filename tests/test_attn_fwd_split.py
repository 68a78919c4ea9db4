"""Poly split (kernels.scores, "Poly split"): CPU unit tests of the per-key-column rule that a
poly score's forward and backward share, and of the exp2 offload's FP32 block.

(The device driver that timed the split x ping-pong x K/V-stage variants of the seed's loop
lived here; bench/tools/poly_split.py and bench/tools/fwd_tuning.py time splits and forward
configs now, with plan overrides.)
"""
from __future__ import annotations

import pytest

from flash_attn_poly import plan as P

SM = 132
ANCHOR = (1, 4096, 32, 8)


def _plan(mode, evaluator="poly", d=128, dtype="bf16", softcap=None, program=None, overrides=None,
          sigmoid_grad=None):
    b, s, h_q, h_kv = ANCHOR
    c = P.AttnCall(mode=mode, evaluator=evaluator, dtype=dtype, head_dim=d, batch=b, seqlen_q=s, seqlen_k=s,
                   heads_q=h_q, heads_kv=h_kv, causal=True, window=(-1, -1), softmax_scale=d ** -0.5,
                   softcap=(softcap or 50.0) if mode == "softcap" else None, program=program,
                   sigmoid_grad=sigmoid_grad)
    return P.resolve(c, SM, overrides)


# ------------------------------------------------------------------------------ CPU tests
def test_softcap_clamp_from_table():
    """A poly softcap score's clamp L_c is its program's (no second source of truth)."""
    pytest.importorskip("cutlass")
    from flash_attn_poly.asm import programs
    from flash_attn_poly.kernels import scores
    for prog in ("softcap_c50", "softcap_c50_f16", None):   # None: the default program (cap > 50)
        spec = _plan("softcap", softcap=60.0, program=prog).score
        assert spec.program.name == (prog or "softcap_c50_f16_odd")
        assert scores.device(spec).clamp_l == programs.entry(spec.program.name)["L_c"]
    with pytest.raises(TypeError):
        scores.ScoreSpec(kind="softcap", evaluator="poly", clamp_l=3.25)   # the spec holds no clamp


def test_split_rule():
    from flash_attn_poly.kernels import scores
    spec = _plan("sigmoid", overrides={"poly_split": (1, 4)}).score
    assert [scores.poly_pair(spec.poly_split, g) for g in range(8)] == [True, False, False, False] * 2
    native = _plan("sigmoid", "native").score
    assert native.evaluator == "native" and native.program is None
    with pytest.raises(ValueError, match="poly_split"):
        _plan("softcap", softcap=60.0, overrides={"poly_split": (1, 3)})
    cutlass = pytest.importorskip("cutlass")  # noqa: F841 - the device objects import it
    dev = scores.device(spec)
    assert [dev.poly_pair(g) for g in range(8)] == [True, False, False, False] * 2
    assert [dev.uses_block(g) for g in range(8)] == [True, False, False, False] * 2
    assert not any(scores.device(native).poly_pair(g) for g in range(8))


@pytest.mark.parametrize("mode", ["softcap", "sigmoid"])
@pytest.mark.parametrize("d,overrides", [(64, {}), (128, {}), (256, {}), (128, {"fwd.tile_m": 128, "fwd.tile_n": 64})],
                         ids=["d64", "d128", "d256", "d128-tile64"])
def test_forward_split_is_the_backward_rule(mode, d, overrides):
    """The forward decides block or MUFU per column group g of its key block (compile time);
    the backward per global key group (key // 8).  For the plan of every head dim (softcap:
    the FP16 tanh program under the constant row max, BF16 cap 50; or with a 64-key block as
    an override; sigmoid: the surrogate rule, its poly backward) the two agree on every key of
    several blocks, because the plan coarsens the split to the forward's key block and hands the
    backward the same spec (D = 256: 1/8, the 64-key block's finest)."""
    from flash_attn_poly.kernels import scores
    program = "softcap_c50_f16_odd" if mode == "softcap" else "sigmoid_attn_n4096"
    p = _plan(mode, d=d, program=program, overrides=overrides,
              sigmoid_grad="surrogate" if mode == "sigmoid" else None)
    spec, tile_n = p.score, p.fwd.tile_n
    assert p.score_bwd == spec
    j, k = spec.poly_split
    assert 0 < j < k
    for key in range(4 * tile_n):
        assert scores.poly_pair(spec.poly_split, (key % tile_n) // 8) == \
            scores.poly_pair(p.score_bwd.poly_split, key // 8), key
    assert spec.poly_split == ((1, 16) if (mode, tile_n) == ("sigmoid", 128) else (1, 8))
    # softcap at D = 128: the three-warpgroup tile 192 x 64 unless an override sets the tile;
    # D = 64: 192 x 128 for every score
    want = {("softcap", 128): (192, 64), ("softcap", 64): (192, 128), ("sigmoid", 64): (192, 128)}
    want = (128, 64) if overrides else want.get((mode, d), (128, 64 if d == 256 else 128))
    assert (p.fwd.tile_m, tile_n) == want


def test_forward_refuses_a_split_longer_than_its_key_block():
    """1/16 repeats every 128 keys: a 64-key forward block cannot apply it at compile time
    (it would send group 0 of every block through the polynomial, the backward only that of
    even blocks), so the plan refuses it, naming the limit; 1/8, all and none are fine.  An
    explicit split is taken as given (the defaults are coarsened: sigmoid 1/16 -> 1/8)."""
    bad = {"poly_split": (1, 16)}
    with pytest.raises(ValueError, match=r"repeats every 128 keys.*tile_n 64.*k <= 8"):
        _plan("softcap", d=256, softcap=60.0, overrides=bad)
    with pytest.raises(ValueError, match="repeats every 128 keys"):
        _plan("softcap", softcap=60.0, overrides=dict(bad, **{"fwd.tile_n": 64}))
    for split in [(1, 8), (1, 1), (0, 16), (16, 16)]:
        _plan("softcap", d=256, softcap=60.0, overrides={"poly_split": split})
    assert _plan("sigmoid").score.poly_split == (1, 16) and _plan("sigmoid", d=256).score.poly_split == (1, 8)
    assert _plan("sigmoid", overrides={"fwd.tile_n": 64}).score.poly_split == (1, 8)
    # 1/16 at D = 128 under the constant row max (BF16 softcap, cap 50: the 64-key three-warpgroup
    # tile) is refused too; it runs on a 128-key tile when the override says so
    with pytest.raises(ValueError, match="repeats every 128 keys"):
        _plan("softcap", program="softcap_c50_f16_odd", overrides=bad)
    p = _plan("softcap", program="softcap_c50_f16_odd",
              overrides=dict(bad, **{"fwd.tile_m": 128, "fwd.tile_n": 128, "fwd.num_stages": 2}))
    assert (p.fwd.tile_m, p.fwd.tile_n, p.score.poly_split) == (128, 128, (1, 16))


def test_exp2_fma_block_replay_error():
    """The exp2_f32 block that kernels/scores/common.exp2_fma inlines, run by the PTX emulator: bit-exact
    with fit/exp2.replay (the program's FP32 order) and within 7.6e-5 relative of 2^a over the
    fixed-max argument range and the block's limits [-125, 127] (half-integers included: the
    round-to-nearest of the 1.5 * 2^23 add)."""
    import numpy as np
    from flash_attn_poly.asm import blocks as B, emulator as E, programs as PG
    from flash_attn_poly.fit import exp2 as X
    a = np.concatenate([np.linspace(-125, 127, 400001), np.arange(-125, 128) + 0.5]).astype(np.float32)
    (bits,) = E.run_block(B.get_block("exp2_f32"), a)
    got = bits.view(np.float32).astype(np.float64)
    assert np.array_equal(got, X.replay(PG.entry(X.NAME), a.astype(np.float64)))
    rel = np.abs(got / np.exp2(a.astype(np.float64)) - 1)
    assert rel.max() <= 7.6e-5, rel.max()


def test_exp2_program_fit_reproduces_the_table():
    """`python -m flash_attn_poly.fit exp2` rebuilds the committed entry bit for bit."""
    from flash_attn_poly.asm import programs as PG
    from flash_attn_poly.fit import exp2 as X
    assert X.make()["coeffs_bits"] == PG.entry(X.NAME)["coeffs_bits"]


def test_exp2_fma_follows_the_split_row():
    """The exp2 offload's FwdConfig.exp2_fma: 8 j / k column groups of 8 for the softcap split
    row (1/8 -> 1 group) where the constant row max bounds the exp2 argument (BF16, cap <= 50);
    none elsewhere (the range and fixed-max checks: tests/test_plan_cpu.py)."""
    for d in (64, 128, 256):
        p = _plan("softcap", d=d)
        assert p.score.program.is_exp2 and p.fwd.fixed_max and p.fwd.exp2_fma == 1, d
    assert _plan("softcap", dtype="fp16").fwd.exp2_fma == 0
    assert _plan("softcap", program="softcap_c50_f16_odd").fwd.exp2_fma == 0


def test_frag_a_col_group():
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels.scores.common import frag_a_col_group
    # ((2 cols, 2 rows, 2 groups), M=1, (N/16=8, 1)): element 4 is group 1, element 8 group 2
    shape = ((2, 2, 2), 1, (8, 1))
    assert [frag_a_col_group(shape, e) for e in (0, 2, 4, 6, 8, 12, 60)] == [0, 0, 1, 1, 2, 3, 15]


def test_frag_a_row():
    """The thread row of a PV A-fragment element (the sigmoid MUFU branch's unit): rows r and r + 8
    alternate every two elements; a second 64-row atom (M = 2) adds two rows."""
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels.scores.common import frag_a_col_group, frag_a_row
    shape = ((2, 2, 2), 1, (8, 1))
    assert [frag_a_row(shape, e) for e in (0, 1, 2, 3, 4, 6, 8, 62)] == [0, 0, 1, 1, 0, 1, 0, 1]
    shape2 = ((2, 2, 2), 2, (8, 1))
    assert [frag_a_row(shape2, e) for e in (0, 2, 8, 10, 16)] == [0, 1, 2, 3, 0]
    # the 64 pairs are the 4 rows x 16 column groups, each once
    pairs = [(frag_a_row(shape2, e), frag_a_col_group(shape2, e)) for e in range(0, 2 * 2 * 2 * 2 * 8, 2)]
    assert len(set(pairs)) == len(pairs) == 4 * 16


def split_score_fn(mode, score, s_k, softcap=50.0):
    """Per-key-column reference of a poly score (poly_reference.split_fns; score: the plan's
    ScoreSpec): key columns n whose group n // 8 the spec's poly_split sends through the block
    get the program replay, the others the exact function."""
    import poly_reference as PR
    return PR.split_fns(mode, score, s_k, softcap)[0]
