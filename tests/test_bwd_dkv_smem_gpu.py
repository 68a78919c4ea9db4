"""GPU tier of the backward's dkv_smem epilogue (BwdConfig.dkv_smem, kernels/bwd_reduce.py
store_tiles_staged): head_loop builds write dK and dV through the CTA's own K / V smem tiles and
store them as 16-byte row chunks instead of packed pairs from the registers.  Both epilogues
round the same FP32 sums (dK times the same FP32 dK scale) once, so dK and dV must be bitwise
equal to the register epilogue's, whatever the shape: key tails (S_k not a multiple of the
128-row key block), key blocks no query sees (S_q < S_k, causal: the zero tiles), D 64 / 128 /
256 (column chunks), MHA and GQA, FP16, the softcap and sigmoid scores, and packed sequences (the varlen head_loop build, each sequence's rows from its own offset).
dQ takes the same path in both builds (FP32 adds in run order): equal to rounding.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_bwd_dkv_smem_gpu.py   (the H200)
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (mode, dtype, B, S_q, S_k, H_q, H_kv, D, causal)
DENSE = [
    ("softmax", "bf16", 2, 1000, 1000, 4, 2, 128, True),     # GQA, key tail (1000 = 7 x 128 + 104)
    ("softmax", "bf16", 1, 517, 900, 4, 4, 128, True),       # MHA, S_q < S_k: key blocks no query sees
    ("softmax", "bf16", 2, 640, 640, 4, 4, 128, False),
    ("softmax", "bf16", 2, 777, 777, 8, 2, 64, True),        # D = 64: the 128-row step, stores per branch
    ("softmax", "bf16", 1, 700, 700, 4, 2, 256, True),       # D = 256: two column chunks
    ("softcap", "bf16", 1, 600, 600, 4, 4, 128, True),
    ("sigmoid", "bf16", 1, 600, 600, 4, 2, 128, False),
    ("softmax", "fp16", 1, 600, 600, 4, 2, 128, True),
]
# the 64-row step at D = 64 (K and V in the 64-byte swizzle, stores once after the loop)
DENSE_TILE64 = ("softmax", "bf16", 2, 777, 777, 8, 2, 64, True)


def _grads(mode, dtype, b, sq, sk, hq, hkv, d, causal, overrides, seed=0):
    import plan_knobs
    from flash_attn_poly.kernels import dispatch
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda s, h, a=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * a).to(dt)
    q, k, v = mk(sq, hq, 4.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv)
    do = mk(sq, hq)
    from builds import CHUNKED_D256
    # D = 256: the chunked build (the swapped one always stores through the K / V tiles)
    knob = plan_knobs.Knob("test", overrides=dict(CHUNKED_D256 if d == 256 else {}, **overrides))
    p = plan_knobs.plan_for(q, k, v, mode, "native", knob, causal=causal,
                            softcap=30.0 if mode == "softcap" else None)
    assert p.bwd.head_loop and p.bwd.dkv_smem == overrides["bwd.dkv_smem"]
    o, lse = dispatch.forward(p, q, k, v)
    return dispatch.backward(p, do, q, k, v, o, lse)


def _assert_same(base, staged):
    (dq0, dk0, dv0), (dq1, dk1, dv1) = base, staged
    assert torch.equal(dk0, dk1), f"dK differs: max |diff| {(dk0.float() - dk1.float()).abs().max().item()}"
    assert torch.equal(dv0, dv1), f"dV differs: max |diff| {(dv0.float() - dv1.float()).abs().max().item()}"
    err = ((dq0.float() - dq1.float()).norm() / dq0.float().norm().clamp_min(1e-30)).item()
    assert err < 1e-2, f"dQ rel L2 {err}"


@pytest.mark.gpu
@pytest.mark.parametrize("shape,extra", [(s, {}) for s in DENSE] + [(DENSE_TILE64, {"bwd.tile_m": 64})],
                         ids=lambda x: "-".join(map(str, x)) if isinstance(x, tuple) else str(x))
def test_dkv_smem_matches_the_register_epilogue(shape, extra):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    base = _grads(*shape, {"bwd.head_loop": True, "bwd.dkv_smem": False, **extra})
    staged = _grads(*shape, {"bwd.head_loop": True, "bwd.dkv_smem": True, **extra})
    _assert_same(base, staged)


@pytest.mark.gpu
@pytest.mark.parametrize("mode,d", [("softmax", 128), ("softcap", 128), ("softmax", 64)])
def test_dkv_smem_varlen_matches_the_register_epilogue(mode, d):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import flash_attn_poly.varlen as fv
    lens_q, lens_k = [300, 1, 517, 128, 900], [300, 129, 517, 0, 901]
    hq, hkv, cap = 4, 2, (30.0 if mode == "softcap" else None)
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda n, h: torch.randn(n, h, d, device="cuda", generator=g).to(torch.bfloat16)
    q, k, v = mk(sum(lens_q), hq), mk(sum(lens_k), hkv), mk(sum(lens_k), hkv)
    do = mk(sum(lens_q), hq)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_q, cu_k = cu(lens_q), cu(lens_k)
    call = fv.validate(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), mode, "native", True, cap, None, None,
                       (-1, -1))
    out, lse = fv._forward(q, k, v, cu_q, cu_k, call, True, "cuda")
    res = [fv._backward(do, q, k, v, cu_q, cu_k, out, lse, call, "cuda",
                        overrides={"bwd.varlen": True, "bwd.head_loop": True, "bwd.dkv_smem": s})
           for s in (False, True)]
    _assert_same(*res)
