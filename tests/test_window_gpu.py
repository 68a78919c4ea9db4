"""GPU tier: sliding-window (window_size=(left, right)) forward and backward kernels against
the FP64 references (reference.attention_ref / attention_ref_backward with the same window).

Each case runs the plan attention() resolves for it (flash_attn_poly.testing.plan_for).  Poly
scores are judged against the per-key-column split reference of the plan's program and split
(tests/plan_reference.py), as in test_attn_fwd_gpu / test_attn_bwd_gpu; softcap/poly runs the
FP16 tanh program (PROGRAMS: a poly score; BF16 softcap's default, the exp2 offload, is a native
score with its own test).  Windows are smaller than S so tiles are skipped on both sides; odd
S, GQA, S_q != S_k, causal and not.
Run: python -m pytest -q tests/test_window_gpu.py (H200)."""
import pytest

torch = pytest.importorskip("torch")

CASES = [  # (B, S_q, S_k, H_q, H_kv, D, causal, (left, right))
    (1, 1000, 1000, 4, 2, 128, True, (200, -1)),     # Gemma-2 local layer shape, small
    (2, 333, 333, 8, 2, 128, True, (64, 0)),         # odd S, left < one key block
    (1, 517, 517, 4, 4, 64, False, (100, 37)),       # two-sided, non-causal
    (1, 300, 411, 8, 1, 128, False, (-1, 50)),       # right only, S_q < S_k, MQA
    (1, 411, 300, 4, 2, 128, True, (129, -1)),       # S_q > S_k: rows with no key
    (1, 700, 700, 4, 2, 128, False, (0, 0)),         # the diagonal only
]
MODES = [("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
         ("sigmoid", "native"), ("sigmoid", "poly")]
# the program of the poly rows (None: the plan's default)
PROGRAMS = {("softcap", "poly"): "softcap_c50_f16_odd"}


def _inputs(case, mode):
    b, sq, sk, hq, hkv, d, causal, win = case
    g = torch.Generator(device="cuda").manual_seed(sq * 7 + sk + hq)
    mk = lambda s, h, sc=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * sc).bfloat16()
    # softcap: q x8 so logits reach the cap
    return mk(sq, hq, 8.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv), mk(sq, hq)


def _rel(got, ref, scale=None):
    """max |got - ref| / max |ref|; scale (the largest gradient of the set) floors the
    denominator at 1e-2 * scale: with window (0, 0) every row sees one key, so P = 1 and the
    exact dq = dk = 0 while the kernel's dS = P (dP - D) keeps FP32 rounding residue."""
    den = ref.double().abs().max().clamp_min(1e-6)
    if scale is not None:
        den = den.clamp_min(1e-2 * scale)
    return ((got.double() - ref.double()).abs().max() / den).item()


@pytest.mark.gpu
@pytest.mark.parametrize("mode,evaluator", MODES, ids=lambda x: str(x))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_window_fwd_bwd_match_reference(case, mode, evaluator):
    _check(case, mode, evaluator)


def _check(case, mode, evaluator, program=False, overrides=None):
    """Forward and backward of the case's plan against the references; returns the plan.
    program=False: PROGRAMS' program for (mode, evaluator); None: the plan's default."""
    import plan_reference
    from flash_attn_poly import reference, testing
    b, sq, sk, hq, hkv, d, causal, win = case
    q, k, v, do = _inputs(case, mode)
    softcap = 50.0 if mode == "softcap" else None
    program = PROGRAMS.get((mode, evaluator)) if program is False else program
    o, lse, plan = testing.run_forward(q, k, v, mode, evaluator, overrides, poison=True, causal=causal,
                                       softcap=softcap, window_size=win, program=program)
    dq, dk, dv = testing.run_backward(plan, do, q, k, v, o, lse)
    torch.cuda.synchronize()
    # the exp2 offload (a native score) computes the exact logits: the exact-function reference
    fn, grad_fn = plan_reference.score_fns(plan)
    kw = dict(causal=causal, softcap=softcap, window_size=win, score_fn=fn)
    o_ref, lse_ref = reference.attention_ref(q, k, v, mode, **kw)
    o_low, _ = reference.attention_ref_lowprec(q, k, v, mode, **kw)
    assert torch.isfinite(o).all()
    testing.assert_close_rule(o, o_ref, o_low, floor=1e-3, name=f"o {mode}/{evaluator} {case}")
    if lse is not None:
        seen = torch.isfinite(lse_ref)          # rows with no key: LSE = -inf in both
        assert torch.equal(seen, torch.isfinite(lse)), "rows without keys differ"
        assert (lse[seen].double() - lse_ref[seen]).abs().max().item() < 5e-2
    refs = reference.attention_ref_backward(do, q, k, v, mode, score_grad_fn=grad_fn, **kw)
    scale = max(r.abs().max().item() for r in refs)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        assert torch.isfinite(got).all(), name
        assert _rel(got, ref, scale) < 2e-2, (name, _rel(got, ref, scale))
    return plan


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES[:6], ids=str)
def test_window_exp2_offload(case):
    """Softcap with the exp2 offload (attention()'s BF16 default) under sliding windows: the
    offload runs in mask-free blocks only, MUFU where a window or causal mask cuts a block."""
    plan = _check(case, "softcap", "poly", program=None)
    assert plan.fwd.exp2_fma > 0 and plan.score.program.is_exp2, plan.fwd   # the offload ran


@pytest.mark.gpu
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")],
                         ids=lambda x: str(x))
@pytest.mark.parametrize("case", [c for c in CASES if c[4] < c[3]][:6], ids=str)
def test_window_head_loop(case, mode, evaluator):
    """The head_loop backward (a CTA per KV head over its GQA group) under sliding windows."""
    _check(case, mode, evaluator, overrides={"bwd.head_loop": True})


@pytest.mark.gpu
def test_window_through_the_public_api():
    """attention(..., window_size=) through the public API: forward and autograd."""
    from flash_attn_poly import attention, reference
    case = (1, 600, 600, 8, 4, 128, True, (255, 0))
    q, k, v, do = _inputs(case, "softcap")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = attention(q, k, v, "softcap", softcap=50.0, evaluator="native", window_size=(255, 0))
    o.backward(do)
    kw = dict(causal=True, softcap=50.0, window_size=(255, 0))
    o_ref, _ = reference.attention_ref(q.detach(), k.detach(), v.detach(), "softcap", **kw)
    assert _rel(o, o_ref) < 2e-2
    for got, ref in zip((q.grad, k.grad, v.grad),
                        reference.attention_ref_backward(do, q.detach(), k.detach(), v.detach(), "softcap", **kw)):
        assert _rel(got, ref) < 2e-2
