"""GPU tests of the packed-GQA forward (FwdConfig.pack_gqa; the plan's rows fwd-pack-gqa pick it for
D = 64 softmax and the constant-max softcap at D = 64 / 128; here by override "fwd.pack_gqa": True):
the query heads of a KV head packed into the M tile, row m = position m // g of query head
h_kv * g + m % g (kernels/attn_fwd_sm90.py _pack_rows; the mask's position is row // g,
kernels/mask.py).

- By the FlashAttention rule against the FP64 reference (tests/test_attn_fwd_gpu.run_case): GQA
  groups 2 to 16, D 64 / 128 / 256, causal with S_q != S_k (rows that see no key), query and key
  tails, every mode, the persistent grid and one CTA per tile.
- Bit for bit against the unpacked build (both into NaN-poisoned O and LSE): a row's arithmetic is
  the unpacked row's (the blocks a packed tile adds for a row are masked whole for it and add exact
  zeros), so any difference is an indexing error: windows (left, right, two-sided), keep words,
  O staging, and strided inputs (a padded head dimension, a (B, H, S, D) tensor transposed).
  Not the D = 128 softcap exp2 offload: it takes 2^a on the FMA pipe in mask-free blocks only, and
  which of a row's blocks are mask-free depends on the tile it sits in (packed O differed by 1 BF16
  ulp, 0.002, on the H100; judged by the rule above instead).

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_pack_gqa_gpu.py
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PACK = {"fwd.pack_gqa": True}

# (mode, evaluator, dtype, b, s_q, s_k, h_q, h_kv, d, causal)
RULE_CASES = [("softmax", "native", "bf16", 2, 333, 517, 8, 2, 64, True),     # g 4, the 192-row tile
              ("softmax", "native", "bf16", 1, 517, 200, 8, 1, 128, True),    # g 8, rows with no key
              ("softmax", "native", "fp16", 1, 200, 517, 8, 4, 128, False),   # g 2
              ("softmax", "native", "bf16", 1, 1000, 1000, 32, 8, 64, True),
              ("softmax", "native", "bf16", 1, 150, 150, 32, 2, 64, True),    # g 16: 12 positions a tile
              ("softcap", "poly", "bf16", 1, 300, 411, 8, 2, 64, True),       # the exp2 offload, constant max
              ("softcap", "native", "bf16", 2, 333, 333, 16, 8, 256, True),   # g 2 at D = 256
              ("sigmoid", "poly", "bf16", 1, 300, 411, 8, 2, 64, False),
              ("sigmoid", "native", "bf16", 1, 411, 300, 8, 2, 128, True),
              ("softcap", "poly", "bf16", 2, 333, 517, 8, 2, 128, True),      # the 192 x 64 tile, exp2 offload
              ("softcap", "native", "bf16", 1, 517, 333, 32, 8, 128, False)]


def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [None, 0], ids=["persistent", "single_tile"])   # None: the plan's
@pytest.mark.parametrize("case", RULE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_pack_gqa_against_reference(case, persistent):
    _need_cuda()
    from test_attn_fwd_gpu import run_case

    over = dict(PACK) if persistent is None else {**PACK, "fwd.persistent": persistent}
    run_case(*case, overrides=over)


# (case, window, layout): layout "dense" (contiguous), "padded" (head dim padded by 8 elements)
# or "bhsd" (a (B, H, S, D) tensor transposed to (B, S, H, D)), "hot" (dense, q * 4: scores spread 4x)
BITWISE_CASES = [
    (("softmax", "native", "bf16", 2, 333, 517, 8, 2, 64, True), (-1, -1), "dense"),
    (("softmax", "native", "bf16", 1, 300, 411, 8, 2, 64, False), (100, 37), "dense"),
    (("softmax", "native", "bf16", 1, 411, 300, 8, 2, 128, True), (200, -1), "dense"),
    (("softmax", "native", "bf16", 1, 300, 411, 16, 4, 64, False), (-1, 7), "dense"),   # right-only ((-1, 0) is causal)
    (("softcap", "poly", "bf16", 1, 517, 517, 8, 2, 64, True), (-1, -1), "dense"),
    (("sigmoid", "poly", "bf16", 1, 300, 411, 8, 2, 64, True), (-1, -1), "dense"),
    (("softmax", "native", "bf16", 1, 333, 517, 8, 2, 64, True), (-1, -1), "padded"),
    (("softmax", "native", "bf16", 2, 333, 333, 8, 4, 128, True), (-1, -1), "bhsd"),
    (("softcap", "native", "bf16", 1, 333, 333, 16, 8, 256, False), (64, 64), "dense"),
    (("softcap", "native", "bf16", 1, 411, 300, 8, 2, 128, True), (-1, -1), "dense"),   # the 192 x 64 tile
    (("softcap", "native", "bf16", 1, 300, 411, 8, 2, 128, False), (100, 37), "dense"),
    # q * 4: most rows' key blocks take the sigmoid block's MUFU branch (per thread row, one route)
    (("sigmoid", "poly", "bf16", 2, 517, 517, 8, 2, 64, True), (-1, -1), "hot"),
]


def _inputs(case, layout):
    mode, evaluator, dtype, b, s_q, s_k, h_q, h_kv, d, causal = case
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(s_q * 1000 + s_k + h_q)

    def make(s, h):
        if layout == "padded":
            return torch.randn(b, s, h, d + 8, device="cuda", dtype=dt, generator=g)[..., :d]
        if layout == "bhsd":
            return torch.randn(b, h, s, d, device="cuda", dtype=dt, generator=g).transpose(1, 2)
        return torch.randn(b, s, h, d, device="cuda", dtype=dt, generator=g)
    return make(s_q, h_q) * (4.0 if layout == "hot" else 1.0), make(s_k, h_kv), make(s_k, h_kv)


@pytest.mark.gpu
@pytest.mark.parametrize("case,window,layout", BITWISE_CASES,
                         ids=lambda c: "-".join(map(str, c)) if isinstance(c, tuple) else str(c))
def test_pack_gqa_equals_unpacked(case, window, layout):
    _need_cuda()
    from flash_attn_poly import testing
    mode, evaluator = case[:2]
    q, k, v = _inputs(case, layout)
    kw = dict(causal=case[9], softcap=50.0 if mode == "softcap" else None, window_size=window)
    o_ref, lse_ref, p_ref = testing.run_forward(q, k, v, mode, evaluator, {"fwd.pack_gqa": False}, poison=True, **kw)
    o, lse, p = testing.run_forward(q, k, v, mode, evaluator, PACK, poison=True, **kw)
    assert p.fwd.pack_gqa == case[6] // case[7] and p_ref.fwd.pack_gqa == 1
    assert not o.isnan().any()
    assert torch.equal(o, o_ref), (o.float() - o_ref.float()).abs().nan_to_num(1e9).max()
    if lse_ref is not None:
        assert torch.equal(lse, lse_ref)
