"""The packed-GQA forward on packed sequences (plan override "fwd.pack_gqa": True on the varlen
forward), by the FlashAttention rule (the body of tests/test_varlen_gpu.py: per-sequence FP64
references, torch at the input precision as the yardstick, lengths with 0s and 1s; 4 query heads
over 2 KV heads, a group of 2): each sequence's rows are ((2, S_b), ...) from its offset, its query
tiles tile_m / 2 positions of both heads (the compact order's table counts them so), the row bound
2 S_b.  Both orders (compact and slot), D 64 / 128 / 256, causal or not, a window, every mode.
No plan row takes it yet (not timed on packed batches: docs/MEASURED.md fwd-pack-gqa).

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_varlen_pack_gqa_gpu.py
"""
import pytest

torch = pytest.importorskip("torch")

import test_varlen_gpu as V  # noqa: E402

PACK = {"fwd.pack_gqa": True}

# (mode, evaluator, dtype, head_dim, causal, window, softcap)
VARIANTS = [
    ("softmax", "native", "bf16", 64, True, (-1, -1), None),      # the 192-row tile: 96 positions
    ("softcap", "poly", "bf16", 64, True, (-1, -1), 30.0),
    ("softmax", "native", "bf16", 128, False, (48, 16), None),
    ("softcap", "poly", "bf16", 128, True, (-1, -1), 30.0),       # the 192 x 64 tile, exp2 offload
    ("sigmoid", "poly", "bf16", 128, True, (-1, -1), None),
    ("softmax", "native", "fp16", 256, True, (-1, -1), None),
]


def cases(count=2):
    fixed = [pytest.param(VARIANTS[0], [1, 0, 700, 385, 0, 193], [1, 3, 700, 0, 130, 193], 7, id="softmax-fixed")]
    return V.drawn_cases(VARIANTS, V.FUZZ_SEED + 2, count, fixed)


@pytest.mark.gpu
@pytest.mark.parametrize("compact", [True, False], ids=["compact", "slot"])
@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases())
def test_varlen_pack_gqa_forward(var, lens_q, lens_k, seed, compact):
    """O and LSE of the packed-GQA varlen forward."""
    V._assert_ok(V.run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel=True, compact=compact,
                                 fwd_extra=PACK))
