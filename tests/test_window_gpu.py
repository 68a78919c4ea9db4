"""GPU tier: sliding-window (window_size=(left, right)) forward and backward kernels against
the FP64 references (reference.attention_ref / attention_ref_backward with the same window).

Poly evaluators are judged against the per-key-column split reference of the default poly
stage (poly_reference.split_fns), as in test_attn_fwd_gpu / test_attn_bwd_gpu.  Windows are
smaller than S so tiles are skipped on both sides; odd S, GQA, S_q != S_k, causal and not.
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


def _inputs(case, mode):
    b, sq, sk, hq, hkv, d, causal, win = case
    g = torch.Generator(device="cuda").manual_seed(sq * 7 + sk + hq)
    mk = lambda s, h, sc=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * sc).bfloat16()
    # softcap: q x8 so logits reach the cap
    return mk(sq, hq, 8.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv), mk(sq, hq)


def _score_fns(mode, evaluator, s_k, d):
    if evaluator != "poly":
        return None, None
    import poly_reference as PR
    from flash_attn_poly.kernels import score_stages as S
    return PR.split_fns(mode, S.make_stage(mode, "poly", key_block=S.default_key_block(d)), s_k, 50.0)


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
def test_window_fwd_bwd_match_reference(case, mode, evaluator, program=None, **bwd_kw):
    from flash_attn_poly import reference, testing
    from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd
    b, sq, sk, hq, hkv, d, causal, win = case
    q, k, v, do = _inputs(case, mode)
    softcap = 50.0 if mode == "softcap" else None
    # the exp2 offload (program exp2_f32_d3) computes the exact logits: the exact-function reference
    fn, grad_fn = (None, None) if program else _score_fns(mode, evaluator, sk, d)
    out = testing.poison_(torch.empty_like(q))
    o, lse = attn_fwd(q, k, v, mode=mode, evaluator=evaluator, causal=causal, softcap=softcap,
                      out=out, window_size=win, program=program)
    dq, dk, dv = attn_bwd(do, q, k, v, o, lse, mode=mode, evaluator=evaluator, causal=causal,
                          softcap=softcap, window_size=win, program=program, **bwd_kw)
    torch.cuda.synchronize()
    kw = dict(causal=causal, softcap=softcap, window_size=win, score_fn=fn)
    o_ref, lse_ref = reference.attention_ref(q, k, v, mode, **kw)
    o_low, _ = reference.attention_ref_lowprec(q, k, v, mode, fixed_max=testing.fixed_max_m0(mode, q.dtype, softcap),
                                               **kw)
    assert torch.isfinite(o).all()
    testing.assert_close_rule(o, o_ref, o_low, floor=1e-3, name=f"o {mode}/{evaluator} {case}")
    if lse is not None:
        seen = torch.isfinite(lse_ref)          # rows with no key: LSE = -inf in both
        assert torch.equal(seen, torch.isfinite(lse)), "rows without keys differ"
        assert (lse[seen].double() - lse_ref[seen]).abs().max().item() < 5e-2
    # the constant row max's O is off by up to 2^-9 on a row's dominant key (exact: 1), and
    # D = rowsum(dO o O) carries it: the backward is checked against the O it was given there
    fixed = testing.fixed_max_m0(mode, q.dtype, softcap) is not None
    refs = reference.attention_ref_backward(do, q, k, v, mode, score_grad_fn=grad_fn, out=o if fixed else None, **kw)
    scale = max(r.abs().max().item() for r in refs)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        assert torch.isfinite(got).all(), name
        assert _rel(got, ref, scale) < 2e-2, (name, _rel(got, ref, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES[:6], ids=str)
def test_window_exp2_offload(case):
    """Softcap with the exp2 offload (attention()'s BF16 default) under sliding windows: the
    offload runs in mask-free blocks only, MUFU where a window or causal mask cuts a block."""
    test_window_fwd_bwd_match_reference(case, "softcap", "poly", program="exp2_f32_d3")


@pytest.mark.gpu
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")],
                         ids=lambda x: str(x))
@pytest.mark.parametrize("case", [c for c in CASES if c[4] < c[3]][:6], ids=str)
def test_window_head_loop(case, mode, evaluator):
    """The head_loop backward (a CTA per KV head over its GQA group) under sliding windows."""
    test_window_fwd_bwd_match_reference(case, mode, evaluator, head_loop=True)


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
