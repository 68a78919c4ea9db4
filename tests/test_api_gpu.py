"""The public API on the GPU: what the catalogue does not run through it.

The catalogue (tests/test_correctness_gpu.py) runs every variant's default plan through
attention() and autograd.  This file runs, on catalogue cases (tests/cases.py) and judged by
the one rule (tests/gpu_check.py, against the FP64 reference of the function the plan
computes): the named programs through attention(program=...), forward and backward; the sigmoid
program at the length it was fitted for; sigmoid's derivative surrogate through the API (and
that it is the surrogate that ran); softcap's exp2 offload beside the native build on the same
inputs.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_api_gpu.py        (the H200)
    FAP_TEST_BACKEND=reference python -m pytest -q -m gpu tests/test_api_gpu.py  (CPU dry run)
"""
import pytest

torch = pytest.importorskip("torch")

import cases  # noqa: E402
import gpu_check as G  # noqa: E402

HONORS_TEST_BACKEND = True   # tests/conftest.py: FAP_TEST_BACKEND=reference runs these on the CPU

SMALL = 600_000   # B x H_q x S_q x S_k of a mechanism case: its FP64 references take ~0.1 s


def pick(gqa=None, **attrs):
    """The first mid-size catalogue case of the variant with these fields (no window)."""
    where = (lambda c: c.seqlen_q >= 64 and c.seqlen_k >= 128 and (gqa is None or (c.hq > c.hkv) == gqa))
    return cases.pick(1, where=where, max_size=SMALL, window=None, **attrs)[0]


SOFTCAP_POLY_GQA = pick(True, mode="softcap", evaluator="poly", dtype="bf16", head_dim=128, causal=True)
SOFTCAP_POLY_MHA = pick(False, mode="softcap", evaluator="poly", dtype="bf16", head_dim=128, causal=True)
SIGMOID_POLY = pick(True, mode="sigmoid", evaluator="poly", dtype="bf16", head_dim=128, causal=True)
SIGMOID_POLY_FULL = pick(True, mode="sigmoid", evaluator="poly", dtype="bf16", head_dim=128, causal=False)

# attention(program=...): the seed's BF16 programs, the one-region FP16 residual, the exp2 offload
# (tanh on MUFU, 2^a on the FMA pipe; BF16 softcap's default, at D = 64 here) and the FP16 tanh
# program (the default above cap 50)
PROGRAM_RUNS = [G.run(c, program=p, path="api") for c, p in (
    (SOFTCAP_POLY_GQA, "softcap_c50"),
    (SIGMOID_POLY_FULL, "sigmoid_attn_n4096"),
    (SOFTCAP_POLY_GQA, "softcap_c50_f16"),
    (pick(None, mode="softcap", evaluator="poly", dtype="bf16", head_dim=64), "exp2_f32_d3"),
    (SOFTCAP_POLY_MHA, "softcap_c50_f16_odd"))]


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(PROGRAM_RUNS))
def test_named_program_forward_and_backward(r):
    res = G.check(r)
    fn = res["fn"]
    if r.program != "exp2_f32_d3":   # a program, not the exp2 offload (a native score)
        assert fn is not None, res["plan"].score


# S_k = 4096, the length the sigmoid program was fitted for (bias = -ln 4096, no shift): the
# catalogue's largest sigmoid/poly shape at that length, two query heads over one KV head, forward
PROGRAM_LENGTH_RUN = G.run(cases.retarget(cases.pick(1, mode="sigmoid", evaluator="poly", dtype="bf16", head_dim=128,
                                                     window=None, where=lambda c: c.seqlen_k >= 2048)[0],
                                          batch=1, seqlen_q=4096, seqlen_k=4096, hq=2, hkv=1),
                           path="api", bwd=False)


@pytest.mark.gpu
def test_sigmoid_poly_at_program_length():
    res = G.check(PROGRAM_LENGTH_RUN)
    assert res["fn"] is not None, res["plan"].score   # the program ran, not a native fallback


SURROGATE_RUN = G.run(SIGMOID_POLY, program="sigmoid_attn_n4096", sigmoid_grad="surrogate", path="api")


@pytest.mark.gpu
def test_sigmoid_surrogate_through_the_api():
    """attention(..., "sigmoid", program="sigmoid_attn_n4096", sigmoid_grad="surrogate"): the
    backward runs the seed's coupled 22-instruction block (B3) on the plan's poly columns.  Its
    dQ/dK pass the rule against the surrogate's same-program reference and sit measurably off
    the product rule's (the two references differ by ~3.9e-2 rel L2, CPU-measured); dV does not
    involve sigma'."""
    import plan_reference
    from flash_attn_poly import reference as R
    from flash_attn_poly.testing import rel_l2_err
    res = G.check(SURROGATE_RUN)
    product = G.run(SIGMOID_POLY, program="sigmoid_attn_n4096", sigmoid_grad="product")
    fn, gfn = plan_reference.score_fns(product.plan(res["q"], res["k"], res["v"]))
    c = SURROGATE_RUN.case
    refs = {"surrogate": R.attention_ref_backward(res["dout"], res["q"], res["k"], res["v"], "sigmoid",
                                                  score_fn=res["fn"], score_grad_fn=res["gfn"], **c.kwargs()),
            "product": R.attention_ref_backward(res["dout"], res["q"], res["k"], res["v"], "sigmoid",
                                                score_fn=fn, score_grad_fn=gfn, **c.kwargs())}
    for i, name in ((0, "dq"), (1, "dk")):   # the coupled block ran, not the product rule
        e_s, e_p = (rel_l2_err(res["grads"][i], refs[k][i]) for k in ("surrogate", "product"))
        print(f"  surrogate {name}: rel L2 vs surrogate ref {e_s:.2e}, vs product-rule ref {e_p:.2e}")
        assert e_s < e_p / 2, f"{name}: {e_s:.2e} vs the surrogate ref, {e_p:.2e} vs the product ref"


# program="exp2_f32_d3" beside the native build on the same inputs (same case, same seed):
# BF16 (the offload runs) D 128 causal and not, D 256; FP16 (no constant row max: no offload)
EXP2_CASES = [pick(None, mode="softcap", evaluator="native", dtype="bf16", head_dim=128, causal=True),
              pick(None, mode="softcap", evaluator="native", dtype="bf16", head_dim=128, causal=False),
              pick(None, mode="softcap", evaluator="native", dtype="bf16", head_dim=256),
              pick(None, mode="softcap", evaluator="native", dtype="fp16", head_dim=128)]
EXP2_RUNS = [(G.run(c, bwd=False), G.run(cases.retarget(c, evaluator="poly"), program="exp2_f32_d3", bwd=False))
             for c in EXP2_CASES]


@pytest.mark.gpu
@pytest.mark.parametrize("native,offload", [pytest.param(*p, id=p[0].id) for p in EXP2_RUNS])
def test_softcap_exp2_offload_next_to_native(native, offload):
    """Both pass the rule (against the exact function: the offload computes the exact logits);
    BF16: the offload's O error against the FP64 exact function is within 1.1x native's (rel L2;
    the offloaded P = 2^a differs by <= 7.5e-5 relative, below the BF16 rounding of P that
    dominates both) and its LSE within 1e-4 of native's; FP16 inputs: bitwise native's."""
    from flash_attn_poly import reference as R
    from flash_attn_poly.testing import rel_l2_err
    qkvd = G.inputs(native)
    n = G.check(native, qkvd)
    x = G.check(offload, qkvd)
    if native.case.dtype == "fp16":
        assert x["plan"].fwd.exp2_fma == 0 and not x["plan"].fwd.fixed_max   # no constant row max: no offload
        assert torch.equal(x["o"], n["o"]) and torch.equal(x["lse"], n["lse"])
        return
    assert x["plan"].fwd.fixed_max and x["plan"].fwd.exp2_fma > 0, x["plan"].fwd   # the offload runs
    exact, _ = R.attention_ref(n["q"], n["k"], n["v"], "softcap", **native.case.kwargs())
    e_x, e_n = rel_l2_err(x["o"], exact), rel_l2_err(n["o"], exact)
    print(f"\n{native.case.id}: O rel L2 vs exact: exp2 offload {e_x:.3e}, native {e_n:.3e}")
    assert e_x <= 1.1 * e_n + 1e-5, (e_x, e_n)
    assert (x["lse"] - n["lse"]).abs().max().item() <= 1e-4


RUNS = PROGRAM_RUNS + [PROGRAM_LENGTH_RUN, SURROGATE_RUN] + [r for p in EXP2_RUNS for r in p]
