"""GPU tier of the backward's dq_halves (BwdConfig.dq_halves, kernels/bwd_reduce.py): in the
128-row D = 64 step each MMA warpgroup stages its own 64 rows of dQ and warp 1 adds each half
with its own bulk reduction behind its own barrier pair.  The same FP32 values reach the same
accumulator rows as with one buffer, in a possibly different order across CTAs, so dQ equals
the one-buffer build's to FP32 reordering (rounded to the input dtype: rel L2 well under 1e-3;
a half lost or added twice is ~0.5-0.7).  dK / dV's path is untouched: bitwise equal where each
CTA stores its KV head's sums (head_loop) or at most two query heads add into the FP32
accumulator (two adds onto zero commute); a CTA per query head of a larger group adds in
arrival order, so there they equal to FP32 reordering.  Shapes: query tails (S_q not a multiple of 128: the padding rows of the last
block), key tails, S_q < S_k causal (key blocks no query sees), non-causal, GQA (the per-KV-head
loop: the halves alternate through the group's heads) and MHA, FP16, every score.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_bwd_dq_halves_gpu.py   (the H200)
"""
import pytest

torch = pytest.importorskip("torch")

# (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, causal); D appended below
SHAPES = [
    ("softmax", "native", "bf16", 2, 777, 777, 8, 2, True),     # GQA, query and key tails (a CTA per query head)
    ("softmax", "native", "bf16", 8, 1000, 1000, 16, 4, True),  # GQA on the per-KV-head loop (4 heads per CTA)
    ("softmax", "native", "bf16", 1, 517, 900, 4, 4, True),     # MHA, S_q < S_k
    ("softmax", "native", "bf16", 2, 640, 640, 4, 4, False),
    ("softmax", "native", "fp16", 1, 600, 600, 4, 2, True),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, True),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, False),
]
# tile_m 64 (D = 128, a plan override): the halves are the warpgroups' columns, a bulk add per band
SHAPES_D128 = [
    ("softmax", "native", "bf16", 2, 777, 777, 8, 2, True),
    ("softmax", "native", "bf16", 1, 517, 900, 4, 4, True),
    ("softcap", "poly", "bf16", 1, 600, 600, 4, 2, False),
    ("sigmoid", "poly", "bf16", 1, 600, 700, 4, 2, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [s + (64,) for s in SHAPES] + [s + (128,) for s in SHAPES_D128],
                         ids=lambda x: "-".join(map(str, x)))
def test_dq_halves_matches_one_buffer(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import bwd_pairs
    (g0, c0, ordered), (g1, c1, _) = (bwd_pairs.grads(shape, {"bwd.dq_halves": h}) for h in (False, True))
    for c, h in ((c0, False), (c1, True)):
        assert c.tile_m == (128 if shape[-1] == 64 else 64) and c.dq_async and c.dq_halves == h, c
    bwd_pairs.assert_same_sums(g0, g1, ordered)
