"""Input validation of flash_attn_poly.attention and its CPU reference backend."""
import math

import pytest
import torch

import flash_attn_poly.interface as fi
from flash_attn_poly.reference import attention_ref


def _qkv(b=1, s=16, hq=4, hkv=2, d=64, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h: torch.randn(b, s, h, d, generator=g).to(dtype)
    return mk(hq), mk(hkv), mk(hkv)


@pytest.mark.parametrize("bad, match", [
    (dict(dtype=torch.float64), "dtype"),
    (dict(hq=3, hkv=2), "multiple"),
])
def test_rejects_bad_tensors(bad, match):
    q, k, v = _qkv(**bad)
    with pytest.raises((TypeError, ValueError), match=match):
        fi.attention(q, k, v, backend="reference")


def test_rejects_mismatched_shapes_and_layouts():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="4-D"):
        fi.attention(q[0], k, v, backend="reference")
    with pytest.raises(ValueError, match="head_dim mismatch"):
        fi.attention(q, k[..., :32], v[..., :32], backend="reference")
    with pytest.raises(ValueError, match="same shape"):
        fi.attention(q, k, v[:, :8], backend="reference")
    with pytest.raises(ValueError, match="contiguous in its last"):
        fi.attention(q.transpose(1, 3).contiguous().transpose(1, 3), k, v, backend="reference")
    with pytest.raises(TypeError, match="share one dtype"):
        fi.attention(q, k.half(), v, backend="reference")


@pytest.mark.parametrize("kw, match", [
    (dict(mode="relu"), "mode must be"),
    (dict(evaluator="fast"), "evaluator must be"),
    (dict(mode="softcap"), "softcap > 0"),
    (dict(mode="softcap", softcap=-1.0), "softcap > 0"),
    (dict(mode="softcap", softcap=float("inf")), "softcap must be finite"),
    (dict(mode="softmax", softcap=50.0), "only meaningful"),
    (dict(mode="softmax", sigmoid_bias=-1.0), "only meaningful"),
    (dict(softmax_scale=0.0), "softmax_scale"),
    (dict(window_size=(-2, 0)), "window_size"),
    (dict(backend="tpu"), "backend must be"),
    (dict(mode="sigmoid", return_lse=True), "no log-sum-exp"),
])
def test_rejects_bad_options(kw, match):
    q, k, v = _qkv()
    kw.setdefault("backend", "reference")
    with pytest.raises(ValueError, match=match):
        fi.attention(q, k, v, **kw)


def test_cuda_backend_rejects_cpu_tensors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="CUDA tensors"):
        fi.attention(q, k, v, backend="cuda")


def test_auto_backend_warns_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    q, k, v = _qkv()
    with pytest.warns(UserWarning, match="slow torch reference"):
        fi.attention(q, k, v)


@pytest.mark.parametrize("mode, kw", [("softmax", {}), ("softcap", {"softcap": 5.0}), ("sigmoid", {})])
def test_reference_backend_matches_fp64_and_has_gradients(mode, kw):
    q, k, v = _qkv(s=24, seed=1)
    q.requires_grad_(True)
    out = fi.attention(q, k, v, mode, backend="reference", **kw)
    ref, _ = attention_ref(q.detach(), k, v, mode, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert (out.double() - ref).abs().max() < 2e-2
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_custom_op_traces_under_torch_compile_with_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, k, v = _qkv(s=8)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out = fi.attention(fq, fk, fv, "softcap", softcap=10.0, backend="reference")
        assert out.shape == q.shape and out.dtype == q.dtype
    torch.library.opcheck(torch.ops.flash_attn_poly.attn_fwd.default,
                          (q, k, v, [], "softmax", "poly", True, 0.0, math.nan, 0.125, [-1, -1], False, "", "", "",
                           "reference"))


def test_torch_compile_no_graph_break_and_gradients():
    q, k, v = _qkv(s=8, seed=3)
    q.requires_grad_(True)

    def f(q, k, v):
        return fi.attention(q, k, v, "sigmoid", backend="reference").float().square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    loss = compiled(q, k, v)
    (g,) = torch.autograd.grad(loss, q)
    q2 = q.detach().clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(f(q2, k, v), q2)
    assert torch.allclose(g.float(), g_ref.float(), atol=1e-2)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_deterministic_must_be_bool(bad):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        fi.attention(q, k, v, backend="reference", deterministic=bad)


def test_deterministic_reaches_the_backward_op(monkeypatch):
    """attention(deterministic=True) -> forward op -> autograd context -> backward op; the
    reference backend ignores the flag (it is deterministic already)."""
    seen = []
    real = fi._reference_backward
    monkeypatch.setattr(fi, "_reference_backward",
                        lambda dout, q, k, v, call, aux=(): seen.append(call) or real(dout, q, k, v, call, aux))
    q, k, v = _qkv(s=12, seed=2)
    grads = {}
    for det in (False, True):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        fi.attention(qq, kk, vv, backend="reference", deterministic=det).float().sum().backward()
        grads[det] = (qq.grad, kk.grad, vv.grad)
    assert [a.deterministic for a in seen] == [False, True]
    assert all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))
    torch.library.opcheck(torch.ops.flash_attn_poly.attn_fwd.default,
                          (q, k, v, [], "softmax", "poly", True, 0.0, math.nan, 0.125, [-1, -1], True, "", "", "",
                           "reference"))


@pytest.mark.parametrize("kw, err, match", [
    (dict(mode="softmax", program="softcap_c50_f16"), ValueError, "needs evaluator='poly'"),
    (dict(mode="softcap", softcap=50.0, evaluator="native", program="softcap_c50_f16"), ValueError,
     "needs evaluator='poly'"),
    (dict(mode="sigmoid", program="softcap_c50_f16"), ValueError, "not a sigmoid program"),
    (dict(mode="softcap", softcap=50.0, program="softcap_c50_nope"), ValueError, "not a softcap program"),
    (dict(mode="softcap", softcap=50.0, program=3), TypeError, "program must be a str"),
    (dict(mode="sigmoid", program="exp2_f32_d3"), ValueError, "not a sigmoid program"),
])
def test_rejects_bad_programs(kw, err, match):
    q, k, v = _qkv()
    with pytest.raises(err, match=match):
        fi.attention(q, k, v, backend="reference", **kw)


def _plan(call):
    from flash_attn_poly import plan
    return plan.resolve(call, 132)


def test_default_program_follows_the_inputs():
    """attention()'s program for evaluator="poly" and program=None, decided by the plan (the
    call carries None): the exp2 offload for BF16 softcap with cap <= 50 (the constant row max),
    the FP16 tanh program for BF16 with a larger cap, the sigmoid default for sigmoid on BF16
    inside its fitted bias span; native (no program) for FP16 softcap and sigmoid and for sigmoid
    at S_k = 8 (plan.poly_outside_rule); native and softmax calls carry none."""
    from flash_attn_poly import plan
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    h = q.half()
    call = lambda x, mode, ev="poly", cap=None: fi.validate(x, x, x, mode, ev, True, cap, None, None)
    prog = lambda *a, **kw: (lambda p: p and p.name)(_plan(call(*a, **kw)).score.program)
    assert call(q, "softcap", cap=50.0).program is None
    assert prog(q, "softcap", cap=50.0) == prog(q, "softcap", cap=30.0) == plan.EXP2_PROGRAM == "exp2_f32_d3"
    assert prog(q, "softcap", cap=60.0) == "softcap_c50_f16_odd" and prog(h, "softcap", cap=50.0) is None
    q256 = torch.randn(1, 256, 2, 64, dtype=torch.bfloat16)
    assert prog(q256, "sigmoid") == "sigmoid_attn_n4096_f16"
    assert prog(q256.half(), "sigmoid") is None and prog(q, "sigmoid") is None
    assert prog(q, "softcap", "native", 50.0) is None and prog(q, "softmax") is None


def test_softcap_takes_the_exp2_program():
    """program="exp2_f32_d3" is a softcap program (the exp2 offload), poly evaluator only; its
    score keeps the tanh on MUFU (a native softcap score carrying the program) and offloads 1/8
    of the exp2s where the constant row max bounds them (BF16, cap <= 50), none elsewhere."""
    from flash_attn_poly.asm import programs
    from flash_attn_poly.kernels.scores import ScoreSpec
    q, k, v = _qkv()
    fi.attention(q, k, v, "softcap", softcap=50.0, backend="reference", program="exp2_f32_d3")
    with pytest.raises(ValueError, match="needs evaluator='poly'"):
        fi.attention(q, k, v, "softcap", softcap=50.0, evaluator="native", backend="reference", program="exp2_f32_d3")
    p = _plan(fi.validate(q, k, v, "softcap", "poly", True, 50.0, None, None, program="exp2_f32_d3"))
    assert (p.score.evaluator, p.score.program.name) == ("native", "exp2_f32_d3")
    assert p.fwd.fixed_max and p.fwd.exp2_fma == 1 and p.score_bwd.program is None
    assert p.score.program.coeff_bits        # the coefficients are in the build's key
    assert programs.spec("exp2_f32_d3").is_exp2 and not programs.spec("softcap_c50_f16_odd").is_exp2
    p16 = _plan(fi.validate(q.half(), k.half(), v.half(), "softcap", "poly", True, 50.0, None, None,
                            program="exp2_f32_d3"))
    assert not p16.fwd.fixed_max and p16.fwd.exp2_fma == 0
    with pytest.raises(ValueError, match="exp2_f32 program runs in a native softcap score only"):
        ScoreSpec(kind="softcap", evaluator="poly", program=programs.spec("exp2_f32_d3"), poly_split=(1, 8))


def test_program_reaches_both_ops(monkeypatch):
    """attention(program=...) -> forward op -> autograd context -> backward op, in the call
    (AttnCall.program; the CUDA paths resolve it into the plan's score specs, program=None into
    the plan's default for the inputs); the reference backend computes the exact function
    whatever the program, so its results do not change."""
    seen = []
    real_f, real_b = fi._reference_forward, fi._reference_backward
    monkeypatch.setattr(fi, "_reference_forward",
                        lambda q, k, v, c, aux=(): seen.append(("f", c.program)) or real_f(q, k, v, c, aux))
    monkeypatch.setattr(fi, "_reference_backward",
                        lambda dout, q, k, v, c, aux=(): seen.append(("b", c.program)) or real_b(dout, q, k, v, c, aux))
    q, k, v = _qkv(s=12, seed=3)
    outs = []
    for prog in (None, "sigmoid_attn_n4096_f16"):
        qq = q.clone().requires_grad_(True)
        out = fi.attention(qq, k, v, "sigmoid", backend="reference", program=prog)
        out.float().sum().backward()
        outs.append((out, qq.grad))
    assert seen == [("f", None), ("b", None), ("f", "sigmoid_attn_n4096_f16"), ("b", "sigmoid_attn_n4096_f16")]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    qb, kb, vb = _qkv(s=256, seed=3)   # S_k inside the program's fitted bias span (S_k = 12 is not)
    plans = [_plan(fi.validate(qb, kb, vb, "sigmoid", "poly", True, None, None, None, program=prog))
             for prog in (None, "sigmoid_attn_n4096_f16")]
    # the default is that program: the same builds
    assert (plans[0].fwd, plans[0].bwd) == (plans[1].fwd, plans[1].bwd) and plans[0].call.program is None
    assert plans[0].score.program.name == "sigmoid_attn_n4096_f16" and plans[0].score_bwd.program is None
    torch.library.opcheck(torch.ops.flash_attn_poly.attn_fwd.default,
                          (q, k, v, [], "softcap", "poly", True, 50.0, math.nan, 0.125, [-1, -1], False,
                           "softcap_c50_f16", "", "", "reference"))


def test_sigmoid_poly_program_must_match_fp16_inputs():
    """FP16 sigmoid/poly runs the FP16 program (its f16x2 P is the PV operand); the seed's
    BF16 program is refused for FP16 inputs with a message naming it: by attention() for the
    CUDA backend (before the plan; it runs the check for non-BF16 inputs), and by the kernels'
    sigmoid score when a build is made."""
    q, k, v = _qkv(dtype=torch.float16)
    default = fi.validate(q, k, v, "sigmoid", "poly", True, None, None, None)
    fi._check_sigmoid_program_dtype(default)                       # FP16 default program: accepted
    f16_prog = fi.validate(q, k, v, "sigmoid", "poly", True, None, None, None, program="sigmoid_attn_n4096_f16")
    fi._check_sigmoid_program_dtype(f16_prog)
    bf16_prog = fi.validate(q, k, v, "sigmoid", "poly", True, None, None, None, program="sigmoid_attn_n4096")
    with pytest.raises(ValueError, match="sigmoid_attn_n4096.*BF16 inputs only"):
        fi._check_sigmoid_program_dtype(bf16_prog)
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels.scores import sigmoid
    spec = _plan(bf16_prog).score
    sigmoid.check_dtype(spec, is_bf16=True)                        # BF16 inputs: accepted
    with pytest.raises(ValueError, match="sigmoid_attn_n4096.*BF16 inputs only"):
        sigmoid.check_dtype(spec, is_bf16=False)
    sigmoid.check_dtype(_plan(default).score, is_bf16=False)
    sigmoid.check_dtype(_plan(fi.validate(q, k, v, "sigmoid", "native", True, None, None, None)).score, False)


def test_eager_path_equals_custom_op_path():
    """attention() eagerly (torch.autograd.Function) and the custom op it uses under
    torch.compile give the same output and gradients, bit for bit (same functions)."""
    q, k, v = _qkv(s=12, seed=5)
    dout = torch.randn_like(q)
    for mode, kw in (("softmax", {}), ("softcap", {"softcap": 10.0}), ("sigmoid", {})):
        qa, ka, va = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = fi.attention(qa, ka, va, mode, backend="reference", **kw)
        ga = torch.autograd.grad(out, (qa, ka, va), dout)
        qb, kb, vb = (t.clone().requires_grad_(True) for t in (q, k, v))
        call = fi.validate(q, k, v, mode, "poly", True, kw.get("softcap"), None, None)
        out_op, _ = torch.ops.flash_attn_poly.attn_fwd(qb, kb, vb, [], *fi._op_args(call), "reference")
        gb = torch.autograd.grad(out_op, (qb, kb, vb), dout)
        assert torch.equal(out, out_op), mode
        for x, y in zip(ga, gb):
            assert torch.equal(x, y), mode


def test_eager_path_routes_to_cuda_bodies(monkeypatch):
    """_EagerAttn with backend 'cuda' resolves the call's plan once and hands that plan to the
    kernels' forward and backward launch (kernels/dispatch.py, stood in by the reference here);
    it returns only the gradients asked for."""
    from flash_attn_poly import plan as plan_mod
    from flash_attn_poly.kernels import dispatch
    calls = []
    monkeypatch.setattr(fi, "plan_for", lambda call, device: plan_mod.resolve(call, 132))
    monkeypatch.setattr(dispatch, "forward", lambda p, q, k, v, aux=(): calls.append(("fwd", p))
                        or fi._reference_forward(q, k, v, p.call, aux))
    monkeypatch.setattr(dispatch, "backward", lambda p, dout, q, k, v, out, lse, aux=(): calls.append(("bwd", p))
                        or fi._reference_backward(dout, q, k, v, p.call, aux))
    q, k, v = _qkv(s=8, seed=2)
    q.requires_grad_(True)
    call = fi.validate(q, k, v, "softcap", "poly", True, 10.0, None, 0.125, (-1, -1), True)
    out, lse = fi._EagerAttn.apply(q, k, v, call, "cuda")
    assert lse.shape == (1, 4, 8) and not lse.requires_grad
    (gq,) = torch.autograd.grad(out.float().sum(), (q,))
    assert [c[0] for c in calls] == ["fwd", "bwd"] and calls[0][1] is calls[1][1]
    p = calls[1][1]
    assert p.call == call and p.bwd.deterministic and p.softcap == 10.0 and p.softmax_scale == 0.125
    assert gq.shape == q.shape and torch.isfinite(gq.float()).all()


def test_rejects_zero_keys():
    """seqlen_k = 0 has no softmax normaliser and no default sigmoid bias (-ln S_k): a clear
    error instead of a math domain error from the bias."""
    q, k, v = _qkv()
    for mode in ("softmax", "sigmoid"):
        with pytest.raises(ValueError, match="seqlen 0"):
            fi.attention(q, k[:, :0], v[:, :0], mode, backend="reference")


@pytest.mark.parametrize("shape", [(0, 16, 4), (1, 0, 4), (1, 16, 0)], ids=["batch0", "seqlen_q0", "heads0"])
@pytest.mark.parametrize("mode", ["softmax", "sigmoid"])
def test_cuda_bodies_skip_the_launch_without_queries(shape, mode, monkeypatch):
    """No query rows: the CUDA bodies return without launching (a grid of 0 CTAs is a CUDA
    launch error): empty O and LSE, zero gradients, the shapes the reference backend gives.
    Runs on the CPU: neither body reaches the kernels."""
    b, s_q, h_q = shape
    g = torch.Generator().manual_seed(5)
    q = torch.randn(b, s_q, h_q, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(b, 16, max(h_q // 2, 1) if h_q else 2, 64, generator=g).to(torch.bfloat16)
    v = torch.randn_like(k)
    call = fi._call_from_op(q, k, [], mode, "poly", True, 0.0, -2.0, 0.125, [-1, -1], False, "", "", "")
    from flash_attn_poly.kernels import dispatch
    for name in ("forward", "backward"):
        monkeypatch.setattr(dispatch, name, lambda *a, **kw: pytest.fail("a kernel launch without query rows"))
    out, lse = fi._forward(q, k, v, call, None, "cuda", ())
    ref_out, ref_lse = fi._forward(q, k, v, call, None, "reference", ())
    assert out.shape == ref_out.shape == q.shape
    assert lse.dtype == ref_lse.dtype == torch.float32
    assert lse.shape == ref_lse.shape == ((0,) if mode == "sigmoid" else (b, h_q, s_q))
    dq, dk, dv = fi._backward(torch.zeros_like(q), q, k, v, out, lse, call, None, "cuda", ())
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert not dk.any() and not dv.any()


# ------------------------------------------------------------------ windows in flash-attn's canonical form
@pytest.mark.parametrize("causal,window,s_q,s_k,want", [
    (True, (15, 0), 16, 16, ((-1, -1), True)),      # the last query already sees key 0
    (True, (14, 0), 16, 16, ((14, -1), True)),      # one key masked: stays
    (True, (-1, 5), 16, 16, ((-1, -1), True)),      # causal: the right bound is the diagonal
    (False, (-1, 0), 16, 16, ((-1, -1), True)),     # right = 0 alone is causal
    (False, (15, 0), 16, 16, ((-1, -1), True)),
    (False, (15, 15), 16, 16, ((-1, -1), False)),
    (False, (15, 14), 16, 16, ((-1, 14), False)),
    (False, (3, 0), 16, 16, ((3, 0), False)),
    (False, (-1, 7), 8, 32, ((-1, -1), False)),     # S_q < S_k: the first query sees the last key
    (False, (-1, 6), 8, 32, ((-1, 6), False)),
    (True, (7, 0), 32, 8, ((-1, -1), True)),        # S_q > S_k: left against S_k
    (True, (6, 0), 32, 8, ((6, -1), True)),
])
def test_window_canonical_form(causal, window, s_q, s_k, want):
    q = torch.empty(1, s_q, 2, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, s_k, 2, 64, dtype=torch.bfloat16, device="meta")
    call = fi.validate(q, k, k, causal=causal, window_size=window)
    assert (call.window, call.causal) == want


def test_window_canonical_form_masks_the_same_keys():
    """Every (causal, left, right) at S_q, S_k in 1..6: the canonical call's mask (reference.
    window_mask and the causal mask) equals the one asked for."""
    from flash_attn_poly.reference import causal_mask, window_mask
    changed = 0
    for s_q in range(1, 7):
        for s_k in range(1, 7):
            for causal in (False, True):
                for left in range(-1, 8):
                    for right in range(-1, 8):
                        (l2, r2), c2 = fi._canonical_window((left, right), causal, s_q, s_k)
                        mask = lambda lr, c: window_mask(s_q, s_k, *lr) & (causal_mask(s_q, s_k) if c
                                                                            else True)
                        assert torch.equal(mask((left, right), causal), mask((l2, r2), c2)), \
                            (s_q, s_k, causal, left, right)
                        changed += ((l2, r2), c2) != ((left, right), causal)
    assert changed > 1000   # the rule fires on most of the grid's windows, not on none


def test_window_that_masks_nothing_gets_the_unwindowed_plan():
    """A sliding window at least as long as the sequence (Mistral / Gemma-2 callers at S <= window)
    resolves to the plan of the call without it: the unwindowed kernels and their rows."""
    from flash_attn_poly import plan as plan_mod
    q = torch.empty(2, 4096, 32, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 4096, 8, 128, dtype=torch.bfloat16, device="meta")
    for mode, kw in (("softcap", dict(softcap=50.0)), ("softmax", {})):
        plain = plan_mod.resolve(fi.validate(q, k, k, mode, **kw), 132)
        for window in ((4095, 0), (8191, -1), (5000, 7)):
            got = plan_mod.resolve(fi.validate(q, k, k, mode, window_size=window, **kw), 132)
            assert got == plain, (mode, window)
        windowed = plan_mod.resolve(fi.validate(q, k, k, mode, window_size=(4094, 0), **kw), 132)
        assert windowed.fwd.window_left and windowed != plain


def test_varlen_window_canonical_form_uses_max_seqlen():
    import flash_attn_poly.varlen as fv
    q = torch.empty(30, 4, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)
    v = lambda w, causal=True: fv.validate(q, q, q, cu, cu, 20, 20, "softmax", "poly", causal, None, None,
                                           None, w)
    assert v((19, 0)).window == (-1, -1)                        # every sequence's last query sees key 0
    assert v((18, 0)).window == (18, -1)                        # the 20-token sequence's last query does not
    assert (v((-1, 0), False).window, v((-1, 0), False).causal) == ((-1, -1), True)
    assert v((5, 19), False).window == (5, -1)
