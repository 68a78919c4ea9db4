"""Packed D = 64 calls on the dense calls' D = 64 tiles, by the FlashAttention rule (the body of
tests/test_varlen_gpu.py: per-sequence FP64 references, torch at the input precision as the
yardstick, lengths with 0s and 1s): the varlen forward on the 192-row tile of three consumer
warpgroups (3 K/V stages, GEMMs in turns, keep-word masks and O staged where the dense rows take
them) and the varlen backward on the 128-row step with its dQ halves and the stagger (p_turns +
dq_defer).  The plan picks both for causal packed softmax, softcap (constant max) and sigmoid calls
since they passed here and were timed (plan rows varlen-d64-tiles: bench/results/varlen_d64_tiles.md,
varlen_d64_sigmoid_tiles.md); the non-causal and windowed variants run them by override; both builds compile without spills
on the CPU (the window with keep words).  Its own file: ten builds, compiled in a process beside
tests/test_varlen_gpu.py's.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_varlen_d64_gpu.py   (the H200)
"""
import pytest

torch = pytest.importorskip("torch")

import test_varlen_gpu as V  # noqa: E402

# (mode, evaluator, dtype, head_dim, causal, window, softcap)
VARIANTS = [
    ("softmax", "native", "bf16", 64, True, (-1, -1), None),
    ("softcap", "poly", "bf16", 64, True, (-1, -1), 30.0),
    ("sigmoid", "poly", "bf16", 64, False, (-1, -1), None),
    ("softmax", "native", "bf16", 64, False, (48, 16), None),   # a band: keep words for both bounds
    ("sigmoid", "poly", "bf16", 64, True, (-1, -1), None),      # one bias: the program on the 192-row tile
]


def fwd_tile(var) -> dict:
    """The dense D = 64 forward rows' build for the variant (plan FWD_ROWS fwd-d64-tile, fwd-d64-turns,
    fwd-d64-window-keep-words): causal: turns, keep words, O staged; non-causal: turns and O staged,
    but not sigmoid; keep words under a window (without them the packed 192-row build spills too)."""
    over = {"fwd.tile_m": 192, "fwd.num_stages": 3}
    if var[4]:
        over.update({"fwd.pingpong": True, "fwd.mask_bits": True, "fwd.o_smem": True})
    elif var[0] != "sigmoid":
        over.update({"fwd.pingpong": True, "fwd.o_smem": True})
    if var[5] != (-1, -1):
        over["fwd.mask_bits"] = True
    return over


BWD_STEP = {"bwd.tile_m": 128, "bwd.p_turns": True, "bwd.dq_defer": True}   # dq_halves: run_and_judge's


def cases(count=3):
    fixed = [pytest.param(VARIANTS[0], [1, 0, 700, 385, 0, 193], [1, 3, 700, 0, 130, 193], 11,
                          id="softmax-fixed-tiles")]
    return V.drawn_cases(VARIANTS, V.FUZZ_SEED + 64, count, fixed)


@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases())
def test_varlen_d64_forward_192_rows(var, lens_q, lens_k, seed):
    """The varlen forward (compact order, the ragged batches' pick) on the 192-row tile: O and LSE."""
    V._assert_ok(V.run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel=True, compact=True,
                                 fwd_extra=fwd_tile(var)))


@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases()[:4])
def test_varlen_d64_forward_192_rows_slot_order(var, lens_q, lens_k, seed):
    """... and in the slot order (equal-length batches' pick), softmax."""
    V._assert_ok(V.run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel=True, compact=False,
                                 fwd_extra=fwd_tile(var)))


@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases())
def test_varlen_d64_backward_128_rows(var, lens_q, lens_k, seed):
    """The varlen backward on the 128-row step (P^T / dS^T packed to FP16 pairs, dQ's rows split by
    warpgroup), staged dQ halves and the stagger, per-KV-head loop: dQ, dK, dV."""
    V._assert_ok(V.run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel_bwd=True, head_loop=True,
                                 dq_halves=True, bwd_extra=BWD_STEP))


@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases()[:4])
def test_varlen_d64_backward_128_rows_per_head(var, lens_q, lens_k, seed):
    """... on a CTA per query head (small packed grids), softmax."""
    V._assert_ok(V.run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel_bwd=True, head_loop=False,
                                 dq_halves=True, bwd_extra=BWD_STEP))


@pytest.mark.gpu
def test_varlen_d64_sigmoid_default_bias_on_the_dense_tiles():
    """The public packed sigmoid call at its default bias (each sequence's -ln S_k added in the kernels)
    with a sequence past the short rows and STEP_ORDER_MIN_SEQLEN_K keys: the plan's 192-row forward in
    turns and the staggered 128-row backward step, by the rule against per-sequence references."""
    from flash_attn_poly import varlen as fv
    var = ("sigmoid", "poly", "bf16", 64, True, (-1, -1), None)
    lens_q, lens_k = [37, 0, 1, 2100, 5, 129], [37, 3, 1, 2100, 250, 129]
    dev = torch.device("cuda")
    q = torch.empty(sum(lens_q), 4, 64, device=dev, dtype=torch.bfloat16)
    k = torch.empty(sum(lens_k), 2, 64, device=dev, dtype=torch.bfloat16)
    call = fv.validate(q, k, k, V._cu(lens_q, dev), V._cu(lens_k, dev), max(lens_q), max(lens_k), "sigmoid", "poly",
                       True, None, None)
    vp = fv._varlen_plan(call, dev)
    assert vp.score.seq_bias and (vp.fwd.tile_m, vp.fwd.pingpong, vp.fwd.o_smem) == (192, True, True)
    assert (vp.bwd.tile_m, vp.bwd.p_turns, vp.bwd.dq_defer) == (128, True, True)
    V._assert_ok(V.run_and_judge(var, lens_q, lens_k, 7, "cuda", "cuda"))
