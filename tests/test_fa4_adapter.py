"""flash_attn_poly.fa4: our softcap program as an FA4 score_mod pair.

Compile tier: the pair, inlined into a tiny kernel, builds for sm_90a and runs on the FMA
pipe (packed BF16 FMAs, no MUFU). GPU tier: FA4 with the pair, forward and backward,
by the FlashAttention rule against the FP64 reference that replays the program (skipped
without FA4)."""
import pytest

pytest.importorskip("cutlass")


@pytest.mark.compile
def test_score_mods_compile_without_mufu():
    import cutlass.cute as cute
    from cutlass import Float32
    from cutlass.cute.runtime import make_fake_compact_tensor

    from flash_attn_poly.fa4 import softcap_score_mods
    from flash_attn_poly.kernels import sass

    fwd, bwd = softcap_score_mods(50.0)
    assert fwd.__vec_size__ == 2

    @cute.kernel
    def kern(mX: cute.Tensor, mY: cute.Tensor):
        t = cute.arch.thread_idx()[0]
        r = cute.make_rmem_tensor((2,), Float32)
        r[0], r[1] = mX[2 * t], mX[2 * t + 1]
        g = bwd(fwd(r.load(), 0, 0, 0, 0, None, None), r.load(), 0, 0, 0, 0, None, None)
        r.store(g)
        mY[2 * t], mY[2 * t + 1] = r[0], r[1]

    @cute.jit
    def host(mX: cute.Tensor, mY: cute.Tensor):
        kern(mX, mY).launch(grid=(1, 1, 1), block=(32, 1, 1))

    x, y = (make_fake_compact_tensor(Float32, (64,)) for _ in range(2))
    counts = sass.count_opcodes(sass.sass_of(host, x, y))
    assert counts["MUFU"] == 0, counts
    assert counts["HFMA2.BF16"] >= 6, counts  # 3 Horner FMAs forward + 3 backward


def test_rejects_bad_softcap():
    from flash_attn_poly.fa4 import softcap_score_mods
    with pytest.raises(ValueError, match="softcap"):
        softcap_score_mods(0.0)


def _judge_against_replay(out, grads, q, k, v, do, causal, cap):
    """The rule (tests/rule_harness.judge) for O, dQ, dK, dV of a softcap attention that runs
    the FA4 pair's program on every score: FP64 reference and BF16 torch both replay it."""
    import torch
    import poly_reference
    import rule_harness as H
    from flash_attn_poly.fa4 import PROGRAM
    from flash_attn_poly.reference import attention_ref, attention_ref_backward, attention_ref_lowprec
    fn, gfn = poly_reference.softcap_fns(cap, PROGRAM, grad_rule="block")
    kw = dict(causal=causal, softcap=cap)
    ref, _ = attention_ref(q, k, v, "softcap", score_fn=fn, **kw)
    low, _ = attention_ref_lowprec(q, k, v, "softcap", score_fn=fn, **kw)
    ref_g = attention_ref_backward(do, q, k, v, "softcap", score_fn=fn, score_grad_fn=gfn, **kw)
    low_g = H.lowprec_backward(do, q, k, v, low, "softcap", score_fn=fn, score_grad_fn=gfn, **kw)
    mag = H.magnitudes(do, q, k, v, ref, "softcap", score_fn=fn, score_grad_fn=gfn, **kw)
    checks = {"o": H.judge("o", out, ref, low, q.dtype, mag["o"])}
    for name, got, r, lo in zip(("dq", "dk", "dv"), grads, ref_g, low_g):
        checks[name] = H.judge(name, got, r, lo, q.dtype, mag[name])
    return checks


def test_replay_judge_passes_the_replay_and_catches_a_4x_error():
    """The GPU test's judging on the CPU: the replay reference itself in FP32 (a perfect FA4)
    passes every tensor; its O with 4x torch's error does not."""
    import torch
    import poly_reference
    from flash_attn_poly.fa4 import PROGRAM
    from flash_attn_poly.reference import attention_ref, attention_ref_backward, attention_ref_lowprec
    g = torch.Generator().manual_seed(5)
    q, k, v, do = ((torch.randn(1, s, h, 64, generator=g) * a).to(torch.bfloat16)
                   for s, h, a in ((70, 4, 12.5), (90, 2, 1.0), (90, 2, 1.0), (70, 4, 1.0)))
    fn, gfn = poly_reference.softcap_fns(50.0, PROGRAM, grad_rule="block")
    kw = dict(causal=True, softcap=50.0)
    out, _ = attention_ref(q, k, v, "softcap", score_fn=fn, dtype=torch.float32, **kw)
    grads = attention_ref_backward(do, q, k, v, "softcap", score_fn=fn, score_grad_fn=gfn, dtype=torch.float32, **kw)
    checks = _judge_against_replay(out.to(torch.bfloat16), [t.to(torch.bfloat16) for t in grads], q, k, v, do, True, 50.0)
    assert all(c["ok"] for c in checks.values()), checks
    ref, _ = attention_ref(q, k, v, "softcap", score_fn=fn, **kw)
    low, _ = attention_ref_lowprec(q, k, v, "softcap", score_fn=fn, **kw)
    worse = (ref + 4 * (low.double() - ref)).to(torch.bfloat16)
    assert not _judge_against_replay(worse, [t.to(torch.bfloat16) for t in grads], q, k, v, do, True, 50.0)["o"]["ok"]


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,s,causal", [(8, 2, 333, True)])   # GQA 4, a partial last block, causal
def test_fa4_with_poly_softcap_forward_and_backward_by_the_rule(hq, hkv, s, causal):
    """FA4's forward and backward with our score_mod pair, each of O, dQ, dK, dV by the
    FlashAttention rule (tests/rule_harness.py) against the FP64 reference that replays the
    program the pair runs on every score (softcap_c50, its _grad program for d logit/dx: the
    "block" rule, tests/poly_reference.softcap_fns), torch at BF16 with the same replay as the
    low-precision side.  The error against the exact tanh is printed beside FA4's own softcap."""
    import torch
    fa4 = pytest.importorskip("flash_attn.cute")
    from flash_attn_poly.fa4 import softcap_score_mods
    from flash_attn_poly.reference import attention_ref
    cap = 50.0
    g = torch.Generator(device="cuda").manual_seed(1234 + s)
    mk = lambda h, a: (torch.randn(1, s, h, 128, device="cuda", generator=g) * a).to(torch.bfloat16)
    q, k, v = mk(hq, cap / 4), mk(hkv, 1.0), mk(hkv, 1.0)
    do = mk(hq, 1.0)
    fwd, bwd = softcap_score_mods(cap)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = fa4.flash_attn_func(qg, kg, vg, causal=causal, score_mod=fwd, score_mod_bwd=bwd)
    out = out[0] if isinstance(out, tuple) else out
    try:
        grads = torch.autograd.grad(out, (qg, kg, vg), do)
    except Exception as e:   # an FA4 limitation is a finding, not a skip
        raise AssertionError(f"FA4 backward with score_mod_bwd raised {type(e).__name__}: {e}") from e
    checks = _judge_against_replay(out, grads, q, k, v, do, causal, cap)
    kw = dict(causal=causal, softcap=cap)
    exact, _ = attention_ref(q, k, v, "softcap", **kw)
    native = fa4.flash_attn_func(q, k, v, causal=causal, softcap=cap)
    native = native[0] if isinstance(native, tuple) else native
    print(f"\nFA4+poly softcap: ratios {({n: round(c['ratio'], 3) for n, c in checks.items()})}; O max err vs "
          f"exact tanh {(out.double() - exact).abs().max().item():.3e}, FA4 softcap "
          f"{(native.double() - exact).abs().max().item():.3e}")
    bad = [f"{n}: {c['why']}" for n, c in checks.items() if not c["ok"]]
    assert not bad, bad
