"""attention(backend="fa4") on the CPU: the plan (plan.resolve_fa4), the backend choice
(interface._pick_backend / _fa4_refusal), and the plumbing into flash_attn_func with a recording
stand-in for FA4 (the CUDA launch is tests/test_fa4_backend_gpu.py's).  The stand-in computes
what FA4 computes for the arguments it gets, in torch (softmax of the score function's output,
natural-log LSE), from the torch reference of the score function the plan names, so the
sigmoid path's O * exp(LSE) identity and the layouts are checked end to end."""
import math
import warnings

import pytest
import torch

from flash_attn_poly import fa4, interface, plan as plan_mod
from flash_attn_poly.reference import attention_ref


def _qkv(s=64, hq=4, hkv=2, d=128, dtype=torch.bfloat16, amp=1.0):
    g = torch.Generator().manual_seed(0)
    mk = lambda h, a: (torch.randn(1, s, h, d, generator=g) * a).to(dtype)
    return mk(hq, amp), mk(hkv, amp), mk(hkv, 1.0)


def _call(mode="softcap", evaluator="poly", **kw):
    q, k, v = _qkv()
    cap = kw.pop("softcap", 50.0 if mode == "softcap" else None)
    return interface.validate(q, k, v, mode, evaluator, True, cap, **kw)


# ------------------------------------------------------------------------------ the plan
def test_plan_rows():
    p = plan_mod.resolve_fa4(_call("softcap", "poly"))
    assert (p.score, p.program.name, p.grad_rule) == ("softcap", "softcap_c50_f16_odd", "value")
    p = plan_mod.resolve_fa4(_call("softcap", "poly", program="softcap_c50"))
    assert (p.program.name, p.grad_rule) == ("softcap_c50", "block")   # the seed's B2 derivative block
    p = plan_mod.resolve_fa4(_call("softcap", "native"))
    assert (p.score, p.program, p.softcap) == ("softcap", None, 50.0)
    q, k, v = _qkv(s=256)
    p = plan_mod.resolve_fa4(interface.validate(q, k, v, "sigmoid", "poly"))
    assert (p.score, p.program.name) == ("sigmoid", "sigmoid_attn_n4096_f16")
    assert p.sigmoid_bias == pytest.approx(-math.log(256))
    # S_k = 64: b + ln 4096 = ln 64 is outside the program's fitted span: native, as plan.resolve
    p = plan_mod.resolve_fa4(_call("sigmoid", "poly"))
    assert (p.score, p.program, p.sigmoid_bias) == ("sigmoid", None, pytest.approx(-math.log(64)))
    with pytest.warns(UserWarning, match="outside its span"):
        assert plan_mod.resolve_fa4(_call("sigmoid", "poly", program="sigmoid_attn_n4096")).program is None
    assert plan_mod.resolve_fa4(_call("sigmoid", "native", sigmoid_bias=-2.0)).sigmoid_bias == -2.0
    assert plan_mod.resolve_fa4(_call("softmax", "native")).score == "softmax"


def test_plan_refuses_the_exp2_offload():
    with pytest.raises(ValueError, match="exp2"):
        plan_mod.resolve_fa4(_call("softcap", "poly", program="exp2_f32_d3"))


# ------------------------------------------------------------------------------ the backend choice
@pytest.fixture
def fa4_present(monkeypatch):
    monkeypatch.setattr(fa4, "require", lambda: None)


@pytest.fixture
def fa4_absent(monkeypatch):
    def missing():
        raise ImportError(f"backend='fa4' needs flash-attn-4: pip install '{fa4.EXTRA}'")
    monkeypatch.setattr(fa4, "require", missing)


def _pick(backend, cap, call=None):
    dev = torch.device("cuda") if cap else torch.device("cpu")
    return interface._pick_backend(backend, call or _call(), dev, cap)


def test_auto_picks_fa4_on_blackwell_only(fa4_present):
    assert _pick("auto", (10, 0)) == "fa4"
    assert _pick("auto", (10, 3)) == "fa4"
    assert _pick("auto", (9, 0)) == "cuda"          # sm_90: our kernels; FA4 only when asked
    assert _pick("fa4", (9, 0)) == "fa4"
    with pytest.warns(UserWarning, match="sm_120"):
        assert _pick("auto", (12, 0)) == "reference"


def test_auto_names_the_extra_when_fa4_is_missing(fa4_absent):
    with pytest.warns(UserWarning, match=r"flash-attn-poly\[fa4\]"):
        assert _pick("auto", (10, 0)) == "reference"
    with pytest.raises(ImportError, match=r"flash-attn-poly\[fa4\]"):
        _pick("fa4", (10, 0))


@pytest.mark.parametrize("cap, call_kw, exc, match", [
    (None, {}, ValueError, "CUDA tensors"),
    ((8, 0), {}, RuntimeError, "sm_80"),
    ((10, 0), {"sigmoid_grad": "surrogate", "mode": "sigmoid"}, ValueError, "surrogate"),
])
def test_fa4_refusals_name_the_problem(fa4_present, cap, call_kw, exc, match):
    mode = call_kw.pop("mode", "softcap")
    with pytest.raises(exc, match=match):
        _pick("fa4", cap, _call(mode, "poly", **call_kw))


def test_fa4_refuses_fp32_and_head_dim(fa4_present):
    q, k, v = _qkv(dtype=torch.float32)
    with pytest.raises(TypeError, match="fp32"):
        interface._pick_backend("fa4", interface.validate(q, k, v, "softmax", "native"), torch.device("cuda"), (10, 0))
    q, k, v = _qkv(d=256)
    with pytest.raises(ValueError, match="head_dim 256"):
        interface._pick_backend("fa4", interface.validate(q, k, v, "softmax", "native"), torch.device("cuda"), (10, 0))


# ------------------------------------------------------------------------------ plumbing
class _FakeFA4:
    """flash_attn_func's stand-in: records its arguments and returns what FA4 computes for
    them, with the torch score function `ref_fn` standing for the score_mod it was given."""

    def __init__(self, ref_fn):
        self.ref_fn, self.kw = ref_fn, None

    def flash_attn_func(self, q, k, v, **kw):
        self.kw = kw
        scale = kw["softmax_scale"]
        fn = self.ref_fn
        if kw["softcap"]:
            fn = lambda x: kw["softcap"] * torch.tanh(x / kw["softcap"])
        out, lse = attention_ref(q, k, v, "softmax", causal=kw["causal"], softmax_scale=scale,
                                 dtype=torch.float32, score_fn=fn)
        out = out.to(q.dtype)
        return (out, lse.float()) if kw["return_lse"] else out


def _through_api(monkeypatch, fake, mode, evaluator, **kw):
    q, k, v = _qkv(amp=3.0 if mode == "softcap" else 1.0)
    monkeypatch.setattr(fa4, "require", lambda: fake)
    monkeypatch.setattr(interface, "_capability", lambda t: (10, 0))
    return q, k, v, interface.attention(q, k, v, mode, evaluator=evaluator, **kw)




def test_sigmoid_through_the_lse_identity(monkeypatch):
    """FA4's softmax of ln sigma(x + b) times exp(LSE) is sigmoid attention."""
    b = -math.log(64)
    fake = _FakeFA4(lambda x: torch.log(torch.sigmoid(x + b)))
    # the score functions are CuTe code (not built on the CPU here): only their selection is stubbed
    monkeypatch.setattr(fa4, "sigmoid_score_mods", lambda bias, program: ("fwd", "bwd"))
    q, k, v, out = _through_api(monkeypatch, fake, "sigmoid", "native")
    assert fake.kw["return_lse"] and fake.kw["score_mod"] == "fwd" and fake.kw["score_mod_bwd"] == "bwd"
    assert fake.kw["softcap"] == 0.0 and fake.kw["causal"] is True and fake.kw["window_size"] == (None, None)
    ref, _ = attention_ref(q, k, v, "sigmoid", causal=True)
    assert out.dtype == q.dtype and out.shape == q.shape
    err = (out.double() - ref).abs().max().item()
    assert err < 2 * 2 ** -8 * ref.abs().max().item(), err   # BF16 O, rescaled once in FP32


def test_softcap_native_is_fa4s_softcap(monkeypatch):
    fake = _FakeFA4(None)
    q, k, v, (out, lse) = _through_api(monkeypatch, fake, "softcap", "native", softcap=30.0,
                                       return_lse=True, window_size=(16, -1))
    assert fake.kw["softcap"] == 30.0 and fake.kw["score_mod"] is None
    assert fake.kw["window_size"] == (16, None)
    assert lse.shape == (1, 4, 64)


def test_softcap_poly_passes_the_plans_program(monkeypatch):
    seen = {}

    def mods(cap, program, rule):
        seen.update(cap=cap, program=program.name, rule=rule)
        return "fwd", "bwd"
    monkeypatch.setattr(fa4, "softcap_score_mods", mods)
    fake = _FakeFA4(lambda x: 50.0 * torch.tanh(x / 50.0))
    _through_api(monkeypatch, fake, "softcap", "poly", softcap=50.0)
    assert seen == dict(cap=50.0, program="softcap_c50_f16_odd", rule="value")
    assert fake.kw["softcap"] == 0.0 and fake.kw["score_mod"] == "fwd"


def test_user_score_mod_and_aux_pass_through(monkeypatch):
    from flash_attn_poly import score_mod as sm
    ref = lambda x, b, h, qi, ki, aux: x + aux[0][h] * (ki - qi)
    mod = sm.ScoreMod(lambda *a: a[0], lambda *a: a[0], ref, "bias")
    slopes = torch.full((4,), 0.01)
    fake = _FakeFA4(None)
    monkeypatch.setattr(fa4, "require", lambda: fake)
    monkeypatch.setattr(interface, "_capability", lambda t: (9, 0))
    q, k, v = _qkv()
    interface.attention(q, k, v, score_mod=mod, aux_tensors=[slopes], backend="fa4")
    assert fake.kw["score_mod"] is mod.fwd and fake.kw["score_mod_bwd"] is mod.bwd
    assert fake.kw["aux_tensors"] == [slopes]


def test_missing_fa4_error_names_the_extra():
    fa4._IMPORTED.clear()
    try:
        import builtins
        real = builtins.__import__

        def no_fa4(name, *a, **k):
            if name.startswith("flash_attn"):
                raise ImportError("No module named 'flash_attn'")
            return real(name, *a, **k)
        builtins.__import__ = no_fa4
        try:
            with pytest.raises(ImportError, match=r"pip install 'flash-attn-poly\[fa4\]'"):
                fa4.require()
        finally:
            builtins.__import__ = real
    finally:
        fa4._IMPORTED.clear()


# ------------------------------------------------------------------------------ the GPU test's judging
def _fa4_like_forward(q, k, v, mode, kw, plan, fn):
    """O as FA4 would return it from exact FP32 math: softmax modes the FP32 reference rounded to
    BF16; sigmoid through the identity attention() uses (FP32 softmax of ln sigma rounded to BF16,
    then times exp(LSE) in FP32 and rounded again)."""
    from flash_attn_poly.reference import attention_ref
    if mode != "sigmoid":
        out, _ = attention_ref(q, k, v, mode, score_fn=fn, dtype=torch.float32, **kw)
        return out.to(q.dtype)
    sig = fn or (lambda x: torch.sigmoid(x + plan.sigmoid_bias))
    o, lse = attention_ref(q, k, v, "softmax", causal=kw["causal"], dtype=torch.float32,
                           score_fn=lambda x: torch.log(sig(x)))
    return (o.to(q.dtype).float() * torch.exp(lse.float()).transpose(1, 2).unsqueeze(-1)).to(q.dtype)


@pytest.mark.parametrize("mode, evaluator, program", [
    ("softcap", "native", None), ("softcap", "poly", None), ("softcap", "poly", "softcap_c50"),
    ("sigmoid", "native", None), ("sigmoid", "poly", None), ("sigmoid", "poly", "sigmoid_attn_n4096")])
def test_gpu_judging_passes_a_perfect_fa4_and_fails_a_4x_worse_one(mode, evaluator, program):
    """tests/test_fa4_backend_gpu.py's judging on the CPU, at its shapes: exact FP32 math with
    FA4's roundings (the sigmoid identity's double rounding of O included) passes O, dQ, dK, dV;
    an O with 4x torch's error does not."""
    import test_fa4_backend_gpu as G
    from flash_attn_poly.reference import attention_ref, attention_ref_backward, attention_ref_lowprec
    q, k, v, do, kw, plan = G.inputs(mode, evaluator, program, device="cpu")
    fn, gfn = G.fns(plan)
    out = _fa4_like_forward(q, k, v, mode, kw, plan, fn)
    grads = [g.to(q.dtype) for g in attention_ref_backward(do, q, k, v, mode, score_fn=fn, score_grad_fn=gfn,
                                                            dtype=torch.float32, **kw)]
    checks = G.judge(out, grads, q, k, v, do, mode, kw, plan)
    assert all(c["ok"] for c in checks.values()), {n: c["why"] or round(c["ratio"], 3) for n, c in checks.items()}
    ref, _ = attention_ref(q, k, v, mode, score_fn=fn, **kw)
    low, _ = attention_ref_lowprec(q, k, v, mode, score_fn=fn, **kw)
    worse = (ref + 4 * (low.double() - ref)).to(q.dtype)
    assert not G.judge(worse, grads, q, k, v, do, mode, kw, plan)["o"]["ok"]
