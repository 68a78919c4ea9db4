"""The torch references themselves, checked against a naive per-head loop."""
import math

import pytest
import torch

from flash_attn_poly.reference import attention_ref, attention_ref_lowprec, causal_mask, window_mask
from flash_attn_poly.testing import assert_close_rule


def _naive(q, k, v, mode, causal, softcap=None, bias=None):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, hq, d, dtype=torch.float64)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(sq):
                x = (q[bi, i, h].double() @ k[bi, :, kh].double().T) / math.sqrt(d)
                ok = torch.ones(sk, dtype=torch.bool)
                if causal:
                    ok = torch.arange(sk) <= i + sk - sq
                if mode == "sigmoid":
                    p = torch.sigmoid(x + (-math.log(sk) if bias is None else bias)) * ok
                else:
                    if mode == "softcap":
                        x = softcap * torch.tanh(x / softcap)
                    x = x.masked_fill(~ok, -math.inf)
                    p = torch.softmax(x, 0).nan_to_num(0.0) if ok.any() else torch.zeros(sk, dtype=torch.float64)
                out[bi, i, h] = p @ v[bi, :, kh].double()
    return out


@pytest.mark.parametrize("mode", ["softmax", "softcap", "sigmoid"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq, sk", [(7, 7), (5, 9), (9, 5)])
def test_reference_matches_naive_loop(mode, causal, sq, sk):
    g = torch.Generator().manual_seed(sq * 100 + sk)
    q = torch.randn(2, sq, 4, 16, generator=g)
    k = torch.randn(2, sk, 2, 16, generator=g)
    v = torch.randn(2, sk, 2, 16, generator=g)
    out, _ = attention_ref(q, k, v, mode, causal=causal, softcap=2.0 if mode == "softcap" else None)
    exp = _naive(q, k, v, mode, causal, softcap=2.0)
    assert torch.allclose(out, exp, atol=1e-10), (out - exp).abs().max()


def test_masks():
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert window_mask(3, 3, 1, 0).tolist() == [[True, False, False], [True, True, False], [False, True, True]]


def test_tolerance_rule_rejects_nan_and_large_errors():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 32, generator=g).bfloat16() for _ in range(3))
    ref, _ = attention_ref(q, k, v)
    low, _ = attention_ref_lowprec(q, k, v)
    assert_close_rule(low, ref, low)  # the low-precision result passes its own rule
    bad = low.clone()
    bad[0, 3, 1, 5] = float("nan")
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close_rule(bad, ref, low)
    with pytest.raises(AssertionError, match="max abs error"):
        assert_close_rule(low + 0.05, ref, low)


@pytest.mark.parametrize("mode", ["softmax", "softcap", "sigmoid"])
@pytest.mark.parametrize("causal, sq, sk", [(True, 6, 6), (True, 4, 7), (False, 7, 4)])
def test_reference_backward_matches_autograd(mode, causal, sq, sk):
    from flash_attn_poly.reference import attention_ref_backward
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, sq, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, sk, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, sk, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    kw = dict(causal=causal, softcap=1.5 if mode == "softcap" else None)
    out, _ = attention_ref(q, k, v, mode, **kw)
    do = torch.randn_like(out)
    exp = torch.autograd.grad(out, (q, k, v), do)
    got = attention_ref_backward(do, q.detach(), k.detach(), v.detach(), mode, **kw)
    for e, t in zip(exp, got):
        assert torch.allclose(e, t, atol=1e-10), (e - t).abs().max()


def test_sigmoid_f16_reference_rounds_p_to_bf16():
    """poly_reference.sigmoid_fns with the FP16 program: P is the BF16 rounding of the f16
    block value (the kernels' PV operand for BF16 inputs; FP16 inputs keep the f16 value),
    sigma' = p (1 - p) of the f16 value."""
    import math

    import numpy as np

    import poly_reference as PR
    from flash_attn_poly.fit import runtime as rt
    from flash_attn_poly.asm import programs

    prog = programs.entry("sigmoid_attn_n4096_f16")
    fn, gfn = PR.sigmoid_fns(-math.log(4096), program="sigmoid_attn_n4096_f16", forward=False)
    x = torch.linspace(-4, 10, 1001, dtype=torch.float64)
    p16 = rt.replay(prog, x.numpy(), "fused")
    assert np.array_equal(fn(x).numpy(), rt.round_to(p16, "bf16"))
    assert np.allclose(gfn(x).numpy(), p16 - p16 * p16)
    fn16, _ = PR.sigmoid_fns(-math.log(4096), program="sigmoid_attn_n4096_f16", io_dtype="f16", forward=False)
    assert np.array_equal(fn16(x).numpy(), p16)          # FP16 inputs: the f16 P as is
    assert not np.array_equal(fn16(x).numpy(), fn(x).numpy())
    import pytest as _pt
    with _pt.raises(ValueError):
        PR.sigmoid_fns(0.0, grad_rule="surrogate", program="sigmoid_attn_n4096_f16")


def test_softcap_value_grad_rule():
    """softcap_fns(grad_rule="value"): d logit/dx = 1 - t^2 of the program's own logit t*c
    (ScoreSpec.grad_rule "value", kernels/scores/softcap.py).  With the two-region FP16 program it is
    within 7.3e-4 of 1 - tanh^2(x/c) up to the 150-logit clamp (the derivative block: 3.4e-3);
    with the residual FP16 program within 8.4e-3 up to 100 logits (its block: 3.7e-2)."""
    import numpy as np
    import poly_reference as PR
    x = torch.linspace(-150, 150, 30001, dtype=torch.float64)
    exact = 1 - torch.tanh(x / 50) ** 2
    with pytest.raises(ValueError, match="grad_rule"):
        PR.softcap_fns(50.0, "softcap_c50_f16", "exact")
    for prog, lim, bound in [("softcap_c50_f16_tail", 150, 1e-3), ("softcap_c50_f16", 100, 1e-2)]:
        fn, g_val = PR.softcap_fns(50.0, prog, "value")
        _, g_blk = PR.softcap_fns(50.0, prog, "block")
        t = fn(x) * float(np.float32(1 / 50))
        assert torch.allclose(g_val(x), 1 - t * t, atol=1e-6)   # the rule, up to FP32 rounding
        m = x.abs() <= lim
        e_val, e_blk = [(g(x) - exact)[m].abs().max().item() for g in (g_val, g_blk)]
        assert e_val < bound and e_val < e_blk / 3, (prog, e_val, e_blk)


def test_lowprec_fixed_max_models_the_constant_row_max():
    """attention_ref_lowprec(fixed_max=m0): p = exp(logit - m0) rounded to BF16 for PV and for the
    row sum.  With window (0, 0) each row sees one key: both pipelines return v exactly (an FP32
    sum of the unrounded p would not: v * bf16(p) / p, up to one BF16 ulp off)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 64, 2, 32, generator=g).to(torch.bfloat16) * s for s in (4.0, 4.0, 1.0))
    kw = dict(causal=False, softcap=50.0, window_size=(0, 0))
    plain, _ = attention_ref_lowprec(q, k, v, "softcap", **kw)
    fixed, _ = attention_ref_lowprec(q, k, v, "softcap", fixed_max=30.0, **kw)
    assert torch.equal(plain, v) and torch.equal(fixed, v)
    # the unrounded FP32 sum this replaces is off on some row: the model would notice a regression
    x = (q.float() * 32 ** -0.5 * k.float()).sum(-1)
    p = torch.exp(50.0 * torch.tanh(x / 50.0) - 30.0)
    assert (p.bfloat16().float() != p).any()
    # the causal problem: fixed-max pipeline error of the same order as the row-max one's
    ref, _ = attention_ref(q, k, v, "softcap", causal=True, softcap=50.0)
    e_plain = (attention_ref_lowprec(q, k, v, "softcap", causal=True, softcap=50.0)[0].double() - ref).abs().max()
    e_fixed = (attention_ref_lowprec(q, k, v, "softcap", causal=True, softcap=50.0, fixed_max=30.0)[0].double()
               - ref).abs().max()
    assert 0 < e_fixed < 2 * e_plain, (e_fixed, e_plain)


def test_ref_backward_takes_d_from_a_given_output():
    """attention_ref_backward(out=O): D = rowsum(dO o O) from that O, as a backward kernel
    takes it; the exact O gives the same gradients, a perturbed one moves dq/dk, not dv."""
    from flash_attn_poly.reference import attention_ref_backward
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 40, 2, 16, generator=g, dtype=torch.float64) for _ in range(4))
    kw = dict(causal=True, softcap=50.0)
    o, _ = attention_ref(q, k, v, "softcap", **kw)
    base = attention_ref_backward(do, q, k, v, "softcap", **kw)
    same = attention_ref_backward(do, q, k, v, "softcap", out=o, **kw)
    moved = attention_ref_backward(do, q, k, v, "softcap", out=o * (1 + 2 ** -9), **kw)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(base, same))
    assert not torch.allclose(moved[0], base[0], atol=1e-9) and torch.equal(moved[2], base[2])
