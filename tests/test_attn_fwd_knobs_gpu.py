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
@pytest.mark.parametrize("pingpong", [False, True], ids=["turns_free", "round_robin"])
@pytest.mark.parametrize("persistent", [None, 0], ids=["persistent", "single_tile"])   # None: the plan's SM count
@pytest.mark.parametrize("case", WG3_CASES, ids=lambda c: "-".join(map(str, c)))
def test_three_warpgroups_against_reference(case, persistent, pingpong):
    """pingpong on three warpgroups: their GEMM issue in turns 0, 1, 2 (named barriers round
    robin); a wrong handshake hangs or races, the reference check catches a wrong O."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_attn_fwd_gpu import run_case

    over = {**WG3, "fwd.pingpong": pingpong}
    run_case(*case, overrides=over if persistent is None else {**over, "fwd.persistent": persistent},
             program=_program(case))


# o_smem (the epilogue stages O through shared memory and stores 16-byte row chunks): the same
# values cast the same way, so O and LSE must equal the register epilogue's bit for bit, written
# into NaN-poisoned buffers (a row it skips stays NaN).  Tails (S_q not a multiple of the tile),
# tiles that see no key (causal S_q > S_k: O = 0), GQA, D = 64's three warpgroups, FP16, one CTA
# per tile and the varlen build; D = 256 (two passes through a 128-column tile).
O_SMEM_CASES = [("softmax", "native", "bf16", 2, 333, 517, 8, 2, 128, True),
                ("softmax", "native", "bf16", 1, 517, 200, 4, 1, 128, True),
                ("softmax", "native", "fp16", 1, 200, 517, 8, 8, 128, False),
                ("softmax", "native", "bf16", 2, 333, 517, 8, 2, 64, True),
                ("softcap", "poly", "bf16", 1, 300, 411, 4, 4, 64, False),
                ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 128, True),
                ("softmax", "native", "bf16", 2, 333, 517, 8, 2, 256, True),
                ("softmax", "native", "fp16", 1, 200, 517, 4, 4, 256, False),
                ("softcap", "native", "bf16", 1, 517, 200, 4, 2, 256, True),
                ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 256, False)]


# the launch grids the bit-for-bit knob tests run: the plan's persistent grid, 3 persistent CTAs (each walks
# many tiles: the pipeline states run on across them) and one CTA per tile
GRIDS = {"plan": {}, "ctas3": {"fwd_ctas": 3}, "single_tile": {"fwd.persistent": 0}}


def _bitwise_as_default(case, knob: str, extra: dict, window=(-1, -1), values=(False, True), q_scale=1.0):
    """O and LSE of the plan with fwd.<knob> = values[1] equal those with fwd.<knob> = values[0] bit
    for bit (the plan's default may be either), both written into NaN-poisoned buffers (a row a build
    skips stays NaN); returns the values[1] plan.  q_scale multiplies q (the scores' spread)."""
    from flash_attn_poly import testing
    mode, evaluator, dtype, b, s_q, s_k, h_q, h_kv, d, causal = case
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(s_q * 1000 + s_k)
    q = torch.randn(b, s_q, h_q, d, device="cuda", dtype=dt, generator=g) * q_scale
    k, v = (torch.randn(b, s_k, h_kv, d, device="cuda", dtype=dt, generator=g) for _ in range(2))
    kw = dict(causal=causal, softcap=50.0 if mode == "softcap" else None, window_size=window)
    off, on = values
    o_ref, lse_ref, p_ref = testing.run_forward(q, k, v, mode, evaluator, {**extra, f"fwd.{knob}": off},
                                                poison=True, **kw)
    o, lse, p = testing.run_forward(q, k, v, mode, evaluator, {**extra, f"fwd.{knob}": on}, poison=True, **kw)
    assert getattr(p.fwd, knob) == on and getattr(p_ref.fwd, knob) == off
    assert torch.equal(o, o_ref), (o.float() - o_ref.float()).abs().nan_to_num(1e9).max()
    assert not o.isnan().any()
    if lse_ref is not None:
        assert torch.equal(lse, lse_ref)
    return p


def _varlen_outputs_equal(head_dim: int, lens: list, seed: int, overrides: tuple):
    """The varlen softmax forward (causal, 8 / 2 heads, BF16) on a packed batch of these lengths gives
    the same O and LSE bit for bit under each plan override set of `overrides`."""
    from flash_attn_poly import varlen as fv
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(total, 8, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    call = fv.validate(q, k, v, cu, cu, max(lens), max(lens), "softmax", "native", True, None, None, None, (-1, -1))
    outs = []
    for ov in overrides:
        with torch.no_grad():
            outs.append(fv._forward(q, k, v, cu, cu, call, True, "cuda", overrides=ov))
    for o, lse in outs[1:]:
        assert torch.equal(outs[0][0], o) and torch.equal(outs[0][1], lse)


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [None, 0], ids=["persistent", "single_tile"])
@pytest.mark.parametrize("case", O_SMEM_CASES, ids=lambda c: "-".join(map(str, c)))
def test_o_smem_equals_register_epilogue(case, persistent):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _bitwise_as_default(case, "o_smem", {} if persistent is None else {"fwd.persistent": persistent})


# mask_bits (a keep word per row instead of a compare per score): the same scores masked, so the
# same O and LSE bit for bit; causal with S_q != S_k, key tails, left / right / two-sided windows,
# D = 64 / 128 / 256, every mode
MASK_BITS_CASES = [(("softmax", "native", "bf16", 2, 333, 517, 8, 2, 128, True), (-1, -1)),
                   (("softmax", "native", "bf16", 1, 517, 200, 4, 1, 64, True), (-1, -1)),
                   (("softmax", "native", "fp16", 1, 200, 517, 8, 8, 128, False), (-1, -1)),
                   (("softmax", "native", "bf16", 1, 300, 411, 4, 2, 128, False), (100, 37)),
                   (("softmax", "native", "bf16", 1, 300, 411, 4, 2, 64, True), (200, -1)),
                   (("softcap", "poly", "bf16", 1, 300, 411, 4, 4, 256, True), (-1, -1)),
                   # right-only ((-1, 0) alone is causal since the canonical windows)
                   (("softcap", "native", "bf16", 1, 411, 300, 4, 2, 128, False), (-1, 7)),
                   (("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 64, True), (-1, -1)),
                   # non-causal windows at D = 64 (keep words the default there: plan fwd-d64-window-keep-words)
                   (("softmax", "native", "bf16", 1, 300, 411, 4, 2, 64, False), (100, 37)),
                   (("sigmoid", "poly", "bf16", 1, 411, 300, 4, 2, 64, False), (200, -1))]


@pytest.mark.gpu
@pytest.mark.parametrize("case,window", MASK_BITS_CASES, ids=lambda c: "-".join(map(str, c)))
def test_mask_bits_equals_compare_mask(case, window):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _bitwise_as_default(case, "mask_bits", {}, window)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [128, 256])
def test_o_smem_varlen_equals_register_epilogue(head_dim):
    """The varlen build: rows past a sequence's end belong to the next sequence and must not be
    written (the row bound is the sequence's); at D = 256 O leaves in two 128-column passes."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _varlen_outputs_equal(head_dim, [300, 1, 0, 517, 129], 7,
                          tuple({"fwd.varlen": True, "fwd.o_smem": o_smem} for o_smem in (False, True)))


# q_stages (two Q buffers: a persistent CTA loads its next tile's Q while the current tile reads its
# own; plan rows fwd-q-stages): the same arithmetic, so the same O and LSE bit for bit as one buffer,
# written into NaN-poisoned buffers; a grid of 3 CTAs (fwd_ctas) walks many tiles each, so the two
# buffers alternate many times.  Tails, causal S_q > S_k (tiles that see no key), GQA, FP16, D = 64's
# 128- and 192-row tiles, packed GQA (D = 64 softmax past SHORT_SEQLEN), and scores no row gives it.
Q_STAGES_CASES = [("softmax", "native", "bf16", 2, 333, 517, 8, 2, 128, True),
                  ("softmax", "native", "bf16", 1, 517, 200, 4, 1, 128, True),
                  ("softmax", "native", "fp16", 1, 200, 517, 8, 8, 64, False),
                  ("softmax", "native", "bf16", 2, 1300, 1300, 8, 2, 64, True),
                  ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 128, True),
                  ("sigmoid", "poly", "bf16", 2, 333, 517, 8, 2, 64, True),
                  ("softcap", "poly", "bf16", 1, 300, 411, 4, 4, 64, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("ctas", [None, 3], ids=["grid", "ctas3"])
@pytest.mark.parametrize("case", Q_STAGES_CASES, ids=lambda c: "-".join(map(str, c)))
def test_two_q_buffers_equal_one(case, ctas):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    p = _bitwise_as_default(case, "q_stages", {} if ctas is None else {"fwd_ctas": ctas}, values=(1, 2))
    assert p.fwd.persistent


@pytest.mark.gpu
def test_two_q_buffers_varlen_equal_one():
    """The varlen build (persistent, tiles past a sequence's end skipped without a pipeline step):
    two Q buffers give one buffer's O and LSE bit for bit on a ragged batch with empty sequences."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _varlen_outputs_equal(128, [300, 1, 0, 517, 129, 1024], 11,
                          tuple({"fwd.varlen": True, "fwd.q_stages": n, "fwd_ctas": 3} for n in (1, 2)))


# o_tma (each warpgroup's staged O rows leave by TMA stores; rows past S_q are clipped by O's
# tensor bounds): the same bytes as the 16-byte row stores, bit for bit into NaN-poisoned buffers.
# Tails (S_q not a multiple of 64), causal S_q > S_k (tiles that see no key write zeros), GQA, FP16,
# D = 64 on its 128- and 192-row tiles, one and two Q buffers, the persistent grid, 3 CTAs and one
# CTA per tile (the last store waited for before the CTA exits).
O_TMA_CASES = [("softmax", "native", "bf16", 2, 333, 517, 8, 2, 128, True),
               ("softmax", "native", "bf16", 1, 517, 200, 4, 1, 128, True),
               ("softmax", "native", "fp16", 1, 200, 517, 8, 8, 64, False),
               ("softmax", "native", "bf16", 2, 1300, 1300, 8, 8, 64, True),
               ("softcap", "poly", "bf16", 1, 300, 411, 4, 4, 128, True),
               ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 64, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("grid", list(GRIDS))
@pytest.mark.parametrize("case", O_TMA_CASES, ids=lambda c: "-".join(map(str, c)))
def test_o_tma_equals_row_stores(case, grid):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    extra = GRIDS[grid]
    _bitwise_as_default(case, "o_tma", extra)


# l2_section_mb (the LPT order's section size, a launch argument: the host entry turns it into the
# section width the kernel takes): the order only, so the same O and LSE bit for bit at 1 MB (a few
# heads per section, a partial last one), the default and 1024 MB (one section), from one compiled
# forward; the persistent grid, 3 CTAs and one CTA per tile, GQA with tails, MHA, D = 64 / 128.
L2_SECTION_CASES = [("softmax", "native", "bf16", 2, 517, 517, 8, 2, 128, True),
                    ("softcap", "poly", "bf16", 3, 300, 411, 4, 4, 64, False),
                    ("sigmoid", "poly", "bf16", 2, 333, 517, 8, 8, 128, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("grid", list(GRIDS))
@pytest.mark.parametrize("case", L2_SECTION_CASES, ids=lambda c: "-".join(map(str, c)))
def test_l2_section_size_keeps_outputs(case, grid):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from flash_attn_poly import testing
    mode, evaluator, dtype, b, s_q, s_k, h_q, h_kv, d, causal = case
    g = torch.Generator(device="cuda").manual_seed(s_q * 7 + s_k)
    q = torch.randn(b, s_q, h_q, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, s_k, h_kv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    extra = GRIDS[grid]
    runs = [testing.run_forward(q, k, v, mode, evaluator, {**extra, "l2_section_mb": mb}, poison=True,
                                causal=causal, softcap=50.0 if mode == "softcap" else None)
            for mb in (1, 32, 1024)]
    (o_ref, lse_ref, p_ref) = runs[1]
    assert not o_ref.isnan().any()
    for o, lse, p in (runs[0], runs[2]):
        assert p.fwd == p_ref.fwd and p.l2_section_mb != p_ref.l2_section_mb   # one build, another order
        assert torch.equal(o, o_ref), (o.float() - o_ref.float()).abs().nan_to_num(1e9).max()
        if lse_ref is not None:
            assert torch.equal(lse, lse_ref)


@pytest.mark.gpu
def test_l2_section_size_varlen_keeps_outputs():
    """The varlen build's sections over (sequence, head) units of the longest sequence's rows."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _varlen_outputs_equal(128, [300, 1, 0, 517, 129, 1024], 13,
                          tuple({"fwd.varlen": True, "l2_section_mb": mb} for mb in (1, 32, 1024)))


# wg_skip (each consumer warpgroup runs only the key blocks its own rows see; a warpgroup whose rows
# are all past S_q runs none): the blocks it passes are fully masked for its rows, so the same O and LSE
# bit for bit where the masked blocks' arithmetic does not depend on the tile: 192-row tiles ending past
# S_q (300 / 1000 rows), causal S_q > S_k (rows with no key), packed GQA, a right window, FP16, D = 64 /
# 128 / 256, turns and free-running warpgroups, the persistent grid, 3 CTAs and one CTA per tile.
WG_SKIP_CASES = [(("softmax", "native", "bf16", 2, 300, 517, 8, 2, 128, True), {}),
                 (("softmax", "native", "bf16", 1, 300, 411, 8, 2, 128, True), WG3),
                 (("softmax", "native", "bf16", 1, 517, 200, 4, 1, 128, True), WG3),
                 (("softmax", "native", "fp16", 2, 1000, 1000, 8, 8, 64, True), {}),
                 (("softcap", "native", "bf16", 2, 1000, 1000, 4, 4, 128, True), {}),
                 (("softcap", "native", "bf16", 1, 1000, 1000, 8, 2, 128, True), {}),
                 (("softcap", "native", "bf16", 2, 300, 411, 4, 4, 128, False), {}),
                 (("sigmoid", "poly", "bf16", 1, 1300, 1300, 8, 8, 64, True), {}),
                 (("softmax", "native", "bf16", 1, 300, 300, 4, 4, 256, True), {})]


@pytest.mark.gpu
@pytest.mark.parametrize("grid", list(GRIDS))
@pytest.mark.parametrize("case", WG_SKIP_CASES, ids=lambda c: "-".join(map(str, c[0])) + ("-wg3" if c[1] else ""))
def test_wg_skip_equals_tile_range(case, grid):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    shape, over = case
    extra = GRIDS[grid]
    _bitwise_as_default(shape, "wg_skip", {**over, **extra})


@pytest.mark.gpu
def test_wg_skip_right_window_equals_tile_range():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _bitwise_as_default(("softmax", "native", "bf16", 1, 300, 411, 8, 2, 128, False), "wg_skip", WG3,
                        window=(100, 37))


@pytest.mark.gpu
def test_wg_skip_varlen_equals_tile_range():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _varlen_outputs_equal(128, [300, 1, 0, 517, 129, 1024], 17,
                          ({"fwd.varlen": True}, {"fwd.varlen": True, "fwd.wg_skip": True}))
    _varlen_outputs_equal(128, [300, 1, 0, 517, 129, 1024], 19,
                          ({"fwd.varlen": True, **WG3}, {"fwd.varlen": True, "fwd.wg_skip": True, **WG3}))


@pytest.mark.gpu
@pytest.mark.parametrize("case", [("softcap", "poly", "bf16", 2, 1000, 1000, 4, 4, 128, True),
                                  ("softcap", "poly", "bf16", 1, 1000, 1000, 8, 2, 128, True),
                                  ("softcap", "poly", "bf16", 1, 300, 411, 4, 4, 64, True)],
                         ids=lambda c: "-".join(map(str, c)))
def test_wg_skip_exp2_offload_against_reference(case):
    """softcap poly at BF16 cap 50 (the exp2 offload on the FMA pipe in mask-free blocks only): a
    warpgroup's own mask-free range is longer than its tile's, so other blocks take the FMA 2^a (1 BF16
    ulp apart): judged by the rule against the reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_attn_fwd_gpu import run_case
    run_case(*case, overrides={"fwd.wg_skip": True})


# q_bottom (causal query tiles aligned to S_q's end: the partial tile is the first): every row sees
# the same keys and its key blocks run in the same order, only the fully masked ones a row skips or
# passes change, so O and LSE equal the top-aligned tiles' bit for bit, written into NaN-poisoned
# buffers: a row before a sequence's first that a build stored would land in the previous batch
# entry's (or sequence's) rows and break the equality.  192-row tiles (S_q = 300, 1000: shifts of
# 84 and 152 rows; 1152: none), the 128 x 128 tile (1000: 24), S_q != S_k (rows with no key, keys
# before the first row), wg_skip
# on and off, O by TMA store, O from registers, FP16, packed GQA (shift in positions), D = 64's
# 192 x 128 tile, the persistent grid, 3 CTAs and one CTA per tile.
Q_BOTTOM_CASES = [(("softmax", "native", "bf16", 2, 300, 517, 8, 2, 128, True), {**WG3, "fwd.o_smem": False}),
                  (("softmax", "native", "bf16", 2, 1000, 1000, 4, 4, 128, True), {**WG3, "fwd.wg_skip": True}),
                  (("softmax", "native", "bf16", 1, 517, 200, 4, 1, 128, True), {**WG3, "fwd.wg_skip": True}),
                  (("softmax", "native", "fp16", 2, 1300, 1300, 8, 8, 64, True), {}),
                  (("softmax", "native", "bf16", 2, 1000, 1000, 8, 2, 128, True), {}),
                  (("softmax", "native", "bf16", 2, 1152, 1152, 8, 8, 64, True), {}),
                  (("softcap", "native", "bf16", 2, 1000, 1000, 4, 4, 128, True), {}),
                  (("softcap", "native", "bf16", 2, 300, 300, 4, 4, 128, True), {"fwd.o_tma": False}),
                  (("softcap", "native", "bf16", 2, 1000, 1000, 8, 2, 128, True), {}),
                  (("sigmoid", "poly", "bf16", 2, 1300, 1300, 8, 8, 64, True), {"fwd.wg_skip": True})]


@pytest.mark.gpu
@pytest.mark.parametrize("grid", list(GRIDS))
@pytest.mark.parametrize("case", Q_BOTTOM_CASES, ids=lambda c: "-".join(map(str, c[0])) + ("-over" if c[1] else ""))
def test_q_bottom_equals_top_aligned(case, grid):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    shape, over = case
    extra = GRIDS[grid]
    _bitwise_as_default(shape, "q_bottom", {**over, **extra})


# sigmoid poly with scores spread 4x (q * 4): most thread rows' key blocks take the forward's MUFU branch
# (kernels/scores/sigmoid.py _above_clamp), in masked and unmasked blocks alike, so a row's P must not depend
# on the row sharing its thread nor on which route (masked block or overlapped loop) its block takes; at the
# default spread the branch fires in a handful of rows
@pytest.mark.gpu
@pytest.mark.parametrize("case", [(("sigmoid", "poly", "bf16", 2, 1300, 1300, 8, 2, 64, True), {}),
                                  (("sigmoid", "poly", "bf16", 2, 1000, 1000, 8, 8, 128, True), WG3)],
                         ids=["d64", "d128_wg3"])
def test_q_bottom_equals_top_aligned_sigmoid_branch_hot(case):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    shape, over = case
    _bitwise_as_default(shape, "q_bottom", over, q_scale=4.0)


# causal calls with a left window: the window's bound (row - S_q + S_k - left) moves with the shifted rows
# as the causal bound does; tiles whose first blocks are the left edge's (masked), S_q < S_k and S_q > S_k,
# a window narrower than a key block, D = 64's 192 x 128 tile, packed GQA
Q_BOTTOM_WINDOW_CASES = [(("softcap", "native", "bf16", 2, 1000, 1000, 4, 4, 128, True), (300, 0), {}),
                         (("softcap", "native", "bf16", 1, 1000, 1000, 8, 2, 128, True), (47, 0), {"fwd.pack_gqa": 4}),
                         (("softmax", "native", "bf16", 2, 300, 517, 8, 2, 128, True), (129, 0), WG3),
                         (("softmax", "native", "bf16", 1, 1300, 700, 4, 4, 64, True), (200, 0), {}),
                         (("sigmoid", "poly", "bf16", 2, 1300, 1300, 8, 8, 64, True), (511, 0), {})]


@pytest.mark.gpu
@pytest.mark.parametrize("case", Q_BOTTOM_WINDOW_CASES,
                         ids=lambda c: "-".join(map(str, c[0])) + f"-w{c[1][0]}")
def test_q_bottom_causal_window_equals_top_aligned(case):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    shape, window, over = case
    p = _bitwise_as_default(shape, "q_bottom", over, window=window)
    assert p.fwd.window_left and p.fwd.causal


@pytest.mark.gpu
def test_q_bottom_varlen_equals_top_aligned():
    """Each packed sequence its own shift; the rows in front of a sequence are the previous one's."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    lens = [300, 1, 0, 517, 129, 1024, 191, 193]
    _varlen_outputs_equal(128, lens, 23, ({"fwd.varlen": True, **WG3},
                                          {"fwd.varlen": True, "fwd.q_bottom": True, **WG3},
                                          {"fwd.varlen": True, "fwd.q_bottom": True, "fwd.wg_skip": True, **WG3}))
    _varlen_outputs_equal(64, lens, 29, ({"fwd.varlen": True, **WG3},
                                         {"fwd.varlen": True, "fwd.q_bottom": True, **WG3}))


@pytest.mark.gpu
@pytest.mark.parametrize("case", [("softcap", "poly", "bf16", 2, 1000, 1000, 4, 4, 128, True),
                                  ("softcap", "poly", "bf16", 1, 1000, 1000, 8, 2, 128, True),
                                  ("softcap", "poly", "bf16", 2, 300, 411, 4, 4, 64, True)],
                         ids=lambda c: "-".join(map(str, c)))
def test_q_bottom_exp2_offload_against_reference(case):
    """softcap poly at BF16 cap 50: a tile's mask-free range moves with its rows, so blocks switch
    between the FMA and MUFU 2^a (1 BF16 ulp apart): judged by the rule against the reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_attn_fwd_gpu import run_case
    run_case(*case, overrides={"fwd.q_bottom": True})
