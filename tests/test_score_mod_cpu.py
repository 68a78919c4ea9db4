"""User score functions on the CPU: argument checks at call time, and the reference backend
running a ScoreMod's torch reference (ALiBi, softcap) against the same math written out."""
import math

import pytest
import torch

import flash_attn_poly
from flash_attn_poly import score_mod as sm
from flash_attn_poly.reference import attention_ref


def _qkv(b=2, s_q=33, s_k=40, h_q=4, h_kv=2, d=32, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mk = lambda s, h: torch.randn(b, s, h, d, generator=g, dtype=dtype)
    return mk(s_q, h_q), mk(s_k, h_kv), mk(s_k, h_kv)


def _alibi_ref(q, k, v, slopes, causal=True):
    """ALiBi written out: softmax(scale q.k + slope_h (j - i)) v over the causal mask."""
    b, s_q, h_q, d = q.shape
    i = torch.arange(s_q).view(1, 1, s_q, 1)
    j = torch.arange(k.shape[1]).view(1, 1, 1, -1)
    bias = slopes.view(1, h_q, 1, 1) * (j - i).double()
    return attention_ref(q, k, v, "softmax", causal=causal, score_fn=lambda x: x + bias)[0]


def test_alibi_reference_forward_and_backward():
    q, k, v = _qkv()
    slopes = sm.alibi_slopes(q.shape[2])
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out = flash_attn_poly.attention(qr, kr, vr, score_mod=sm.alibi(), aux_tensors=[slopes], backend="reference")
    torch.testing.assert_close(out.double(), _alibi_ref(q, k, v, slopes), atol=1e-5, rtol=1e-5)
    # gradients of the API's explicit backward vs autograd through the written-out reference
    g = torch.randn_like(out)
    out.backward(g)
    qa, ka, va = (t.double().requires_grad_() for t in (q, k, v))
    _alibi_ref(qa, ka, va, slopes).backward(g.double())
    for name, got, want in (("dq", qr.grad, qa.grad), ("dk", kr.grad, ka.grad), ("dv", vr.grad, va.grad)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4, msg=name)


def test_alibi_changes_the_output():
    """The bias matters (a score_mod that the path ignored would pass the test above only
    if the reference ignored it too)."""
    q, k, v = _qkv()
    slopes = sm.alibi_slopes(q.shape[2]) * 4
    plain = flash_attn_poly.attention(q, k, v, backend="reference")
    biased = flash_attn_poly.attention(q, k, v, score_mod=sm.alibi(), aux_tensors=[slopes], backend="reference")
    assert (plain - biased).abs().max() > 1e-2


def test_softcap_score_mod_equals_softcap_mode():
    q, k, v = _qkv()
    q, k = q * 6, k * 6
    mode_out = flash_attn_poly.attention(q, k, v, "softcap", softcap=30.0, backend="reference")
    mod_out = flash_attn_poly.attention(q, k, v, score_mod=sm.softcap(30.0), backend="reference")
    torch.testing.assert_close(mod_out, mode_out, atol=1e-5, rtol=1e-5)


def test_same_functions_give_the_same_score_mod():
    """Plain functions are wrapped once: a new wrapper per call would compile per call."""
    def f(scores, b, h, q, kv, info, aux):
        return scores

    def fb(grad, scores, b, h, q, kv, info, aux):
        return grad

    assert sm.as_score_mod(f, fb) is sm.as_score_mod(f, fb)
    assert sm.as_score_mod(f, fb).key != sm.as_score_mod(f, None).key


@pytest.mark.parametrize("bad, match", [
    (lambda scores, b: scores, "score_mod must take 7 arguments"),
    ("not a function", "score_mod must be a callable"),
])
def test_bad_score_mod_is_a_clear_error(bad, match):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=match):
        flash_attn_poly.attention(q, k, v, score_mod=bad, backend="reference")


def test_score_mod_checks_at_call_time():
    q, k, v = _qkv()
    mod = sm.alibi()
    slopes = sm.alibi_slopes(q.shape[2])
    with pytest.raises(ValueError, match="needs mode='softmax'"):
        flash_attn_poly.attention(q, k, v, "softcap", softcap=30.0, score_mod=mod, aux_tensors=[slopes],
                                  backend="reference")
    with pytest.raises(ValueError, match="aux_tensors are read by a score_mod"):
        flash_attn_poly.attention(q, k, v, aux_tensors=[slopes], backend="reference")
    with pytest.raises(TypeError, match=r"aux_tensors\[0\] must be a torch.Tensor"):
        flash_attn_poly.attention(q, k, v, score_mod=mod, aux_tensors=[[1.0]], backend="reference")
    no_bwd = sm.ScoreMod(mod.fwd, None, mod.reference, "alibi_fwd_only")
    qg = q.clone().requires_grad_()
    with pytest.raises(ValueError, match="has no derivative and gradients are needed"):
        flash_attn_poly.attention(qg, k, v, score_mod=no_bwd, aux_tensors=[slopes], backend="reference")
    with torch.no_grad():   # no gradients needed: fine
        flash_attn_poly.attention(qg, k, v, score_mod=no_bwd, aux_tensors=[slopes], backend="reference")
    cute_only = sm.ScoreMod(mod.fwd, mod.bwd, None, "alibi_cute_only")
    with pytest.raises(ValueError, match="backend='reference' needs a torch"):
        flash_attn_poly.attention(q, k, v, score_mod=cute_only, aux_tensors=[slopes], backend="reference")


def test_softcap_example_checks_its_cap():
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="softcap cap"):
            sm.softcap(bad)
