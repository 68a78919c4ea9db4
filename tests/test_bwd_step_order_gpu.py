"""GPU tier of the backward's step-order knobs (kernels/attn_bwd_sm90.py): p_turns (the two MMA
warpgroups run their P blocks in turns, named barriers P_TURN + w), dq_defer (each warpgroup's
dQ of a query block issued in the next step after its dK, the dS buffers behind mbarriers
DS_FULL / DS_FREE instead of the DS_READY barrier), alone and together, each against the build
with both off (the plan turns both on for D = 64 from 2k keys and for the D = 128 softcap, and for
packed softmax / softcap calls: tests/test_varlen_gpu.py test_varlen_kernel_backward_step_order).  Only the order in time changes: every GEMM, every score and every dQ tile is the same arithmetic in the same order per
warpgroup, and warp 1 adds the staged dQ halves in the same order, so dK / dV equal the default
build's bitwise where each CTA stores its own sums (head_loop, or at most two query heads adding
onto zero), and dQ to FP32 reordering across CTAs (rel L2 well under 1e-3; tests/bwd_pairs.py).  A
barrier phase left open, a turn missed or a wrong mbarrier parity hangs the kernel (the test's
timeout catches it) or reads a dS buffer before or after its step (dQ off by a tile: rel L2 ~0.5):
shapes with key blocks that no query sees (S_q < S_k causal: no step, no turn, no deferred dQ),
one query block per CTA (only the dQ after the loop), query and key tails, GQA on the per-KV-head
loop and a CTA per query head, MHA, non-causal, FP16, sliding windows (causal and two-sided, whose
key blocks start and end their query ranges anywhere), every score, D 64 (the 128-row step) and 128.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_bwd_step_order_gpu.py   (the H200)
"""
import pytest

torch = pytest.importorskip("torch")

# (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, causal, D[, window])
SHAPES = [
    ("softmax", "native", "bf16", 2, 777, 777, 8, 2, True, 64),     # GQA, query and key tails
    ("softmax", "native", "bf16", 8, 1000, 1000, 16, 4, True, 64),  # the per-KV-head loop
    ("softmax", "native", "bf16", 1, 517, 900, 4, 4, True, 64),     # MHA, S_q < S_k
    ("softmax", "native", "fp16", 2, 640, 640, 4, 4, False, 64),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, True, 64),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, False, 64),
    ("softmax", "native", "bf16", 2, 777, 777, 8, 2, True, 128),
    ("softmax", "native", "bf16", 1, 517, 900, 4, 4, True, 128),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, False, 128),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, True, 128),
    # windows: key blocks whose query range starts late and ends early (a local causal window,
    # S_q < S_k bottom-right, and a two-sided band that leaves whole key blocks without a step)
    ("softmax", "native", "bf16", 2, 1000, 1000, 8, 2, True, 64, (256, 0)),
    ("softcap", "poly", "bf16", 1, 517, 900, 4, 4, True, 64, (200, 0)),
    ("softcap", "poly", "bf16", 1, 900, 900, 4, 2, False, 128, (128, 64)),
]
# dq_defer alone (the replay's worst order, built for the contrast): fewer shapes; one query block
# per CTA (S = 100: the loop's one step, then the dQ after it)
SHAPES_DEFER = [SHAPES[0], SHAPES[2], SHAPES[8], ("softmax", "native", "bf16", 2, 100, 100, 4, 4, True, 64)]
BASE = {"bwd.p_turns": False, "bwd.dq_defer": False}
KNOBS = {"p_turns": {"bwd.p_turns": True, "bwd.dq_defer": False},
         "dq_defer": {"bwd.p_turns": False, "bwd.dq_defer": True},
         "p_turns+dq_defer": {"bwd.p_turns": True, "bwd.dq_defer": True}}
CASES = ([("p_turns", s) for s in SHAPES] + [("p_turns+dq_defer", s) for s in SHAPES + SHAPES_DEFER[3:]]
         + [("dq_defer", s) for s in SHAPES_DEFER])


@pytest.mark.gpu
@pytest.mark.parametrize("knob,shape", CASES, ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x)))
def test_step_order_knob_matches_the_default_build(knob, shape):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import bwd_pairs
    (g0, c0, ordered), (g1, c1, _) = bwd_pairs.grads(shape, BASE), bwd_pairs.grads(shape, KNOBS[knob])
    assert not (c0.p_turns or c0.dq_defer) and not c1.swap, c0
    assert (c1.p_turns, c1.dq_defer) == ("p_turns" in knob, "dq_defer" in knob), c1
    bwd_pairs.assert_same_sums(g0, g1, ordered)
