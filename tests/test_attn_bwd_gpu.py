"""GPU tier: dQ/dK/dV of kernels/attn_bwd_sm90.py against FP64 references.

Native modes: FP64 autograd of the exact function (tests/bwd_fp64.py).  Poly modes:
the forward kernel (default poly_split, NaN-poisoned preallocated O) feeds the backward
kernel, and both are judged against the FP64 explicit backward of the per-key-column split
reference (poly_reference.split_fns: block columns replay the program and its derivative
program, MUFU columns the exact function), the same split the kernels run."""
import pytest

torch = pytest.importorskip("torch")

CASES = [  # (B, S_q, S_k, H_q, H_kv, D, causal, mode)
    (1, 128, 128, 2, 2, 128, False, "softmax"),
    (2, 200, 200, 8, 2, 128, True, "softmax"),
    (1, 333, 333, 8, 1, 64, True, "softmax"),
    (1, 177, 301, 4, 4, 64, False, "softmax"),
    (1, 301, 177, 4, 2, 128, True, "softmax"),
    (1, 257, 257, 8, 8, 128, True, "softcap"),
    (1, 257, 257, 8, 2, 128, True, "sigmoid"),
    # D = 256: two 128-column chunks per key block (grid z = batch x chunk), one Q/dO stage
    (1, 200, 200, 4, 2, 256, True, "softmax"),
    (2, 177, 301, 4, 1, 256, False, "softmax"),
    (1, 257, 257, 4, 4, 256, True, "softcap"),
    (1, 257, 257, 4, 2, 256, True, "sigmoid"),
]
POLY_CASES = [  # (B, S_q, S_k, H_q, H_kv, D, causal, mode)
    (1, 257, 257, 8, 8, 128, True, "softcap"),
    (1, 333, 333, 8, 2, 128, True, "softcap"),
    (1, 257, 257, 8, 2, 128, True, "sigmoid"),
    (2, 200, 301, 4, 1, 128, False, "sigmoid"),
    (1, 333, 333, 4, 2, 256, True, "softcap"),
]


def _check_vs_fp64(case, **kw):
    """dQ/dK/dV of attn_bwd (options kw) vs FP64 autograd of the exact function
    (tests/bwd_fp64.run_case): finite, max relative error < 2e-2."""
    from bwd_fp64 import run_case
    errs, finite = run_case(case, **kw)
    assert finite
    assert max(errs) < 2e-2, errs


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_attn_bwd_matches_fp64_autograd(case):
    _check_vs_fp64(case)


DQ_CASES = [CASES[1], CASES[2], CASES[3], CASES[5], CASES[6]]   # D 128/64, causal or not, 3 modes


@pytest.mark.gpu
@pytest.mark.parametrize("case", DQ_CASES, ids=str)
def test_attn_bwd_dq_atomic_matches_fp64_autograd(case):
    """The other dQ path: red.global.add from the MMA threads (dq_async=False; the default
    stages dQ in smem for warp 1's bulk reductions, and D = 256 always uses this one)."""
    _check_vs_fp64(case, dq_async=False)


LPT_CASES = [CASES[1], CASES[3], CASES[5], CASES[7],
             (1, 5000, 5000, 8, 2, 128, True, "softmax")]   # S=5000: sections of 6 + 2 heads


@pytest.mark.gpu
@pytest.mark.parametrize("case", LPT_CASES, ids=str)
def test_attn_bwd_lpt_order_matches_fp64_autograd(case):
    """CTA order of kernels/tile_scheduler.SectionLptScheduler (BwdKey.lpt)."""
    _check_vs_fp64(case, lpt=True)


HEAD_LOOP_CASES = CASES[:9] + [(1, 5000, 5000, 8, 2, 128, True, "softmax"),   # LPT sections of KV heads
                                (2, 257, 257, 8, 2, 128, True, "softcap", "poly"),
                                (1, 333, 333, 8, 1, 128, True, "sigmoid", "poly")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", HEAD_LOOP_CASES, ids=str)
def test_attn_bwd_head_loop_matches_fp64_autograd(case):
    """head_loop=True: a CTA per (key block, KV head) runs the G query heads of its group and
    stores dK/dV directly (MHA, GQA 4/8, MQA; D 64/128/256; causal or not; odd S)."""
    _check_vs_fp64(case, head_loop=True)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[8]], ids=str)
def test_attn_bwd_head_loop_fp16_matches_fp64_autograd(case):
    """head_loop's direct dK/dV stores in FP16 (cvt.rn.f16x2 pairs)."""
    _check_vs_fp64(case, dtype=torch.float16, head_loop=True)


@pytest.mark.gpu
@pytest.mark.parametrize("case", POLY_CASES, ids=str)
def test_poly_bwd_head_loop_matches_split_reference(case):
    test_poly_bwd_matches_split_reference(case, head_loop=True)


FP16_CASES = [CASES[1], CASES[3], CASES[5], CASES[6], CASES[8]]   # softmax causal/non-causal, softcap, sigmoid


@pytest.mark.gpu
@pytest.mark.parametrize("case", FP16_CASES, ids=str)
def test_attn_bwd_fp16_matches_fp64_autograd(case):
    _check_vs_fp64(case, dtype=torch.float16)


def _split_grads(q, k, v, do, mode, causal, softcap, sigmoid_grad=None, program=None, softcap_grad=None):
    """FP64 (dq, dk, dv) of the split reference of the default poly forward stage."""
    import poly_reference as PR
    from flash_attn_poly import reference
    from flash_attn_poly.kernels import score_stages as S
    # what attn_fwd / attn_bwd build by default (or with the given table program)
    stage = S.make_stage(mode, "poly", key_block=S.default_key_block(q.shape[-1]),
                         **({"program": program} if program else {}))
    fn, grad_fn = PR.split_fns(mode, stage, k.shape[1], softcap or 50.0, sigmoid_grad=sigmoid_grad,
                               io_dtype="f16" if q.dtype == torch.float16 else "bf16", softcap_grad=softcap_grad)
    return reference.attention_ref_backward(do, q, k, v, mode, causal=causal, softcap=softcap,
                                            score_fn=fn, score_grad_fn=grad_fn)


SURROGATE_CASES = [c for c in POLY_CASES if c[-1] == "sigmoid"]
BF16_SOFTCAP_CASES = [c for c in POLY_CASES if c[-1] == "softcap"]
BF16_SIGMOID_CASES = [c for c in POLY_CASES if c[-1] == "sigmoid"]


@pytest.mark.gpu
@pytest.mark.parametrize("case", BF16_SIGMOID_CASES, ids=str)
def test_sigmoid_bf16_program_fwd_bwd_matches_split_reference(case):
    """program="sigmoid_attn_n4096": the seed's BF16 D3 block (B3) in the forward and the
    backward's product rule (the default program is the FP16 D4 one, POLY_CASES)."""
    test_poly_bwd_matches_split_reference(case, program="sigmoid_attn_n4096")


@pytest.mark.gpu
@pytest.mark.parametrize("case", BF16_SOFTCAP_CASES, ids=str)
def test_softcap_bf16_program_fwd_bwd_matches_split_reference(case):
    """program="softcap_c50": the seed's BF16 D4 residual blocks (B2) forward and backward."""
    test_poly_bwd_matches_split_reference(case, program="softcap_c50")


@pytest.mark.gpu
@pytest.mark.parametrize("case", BF16_SIGMOID_CASES, ids=str)
def test_sigmoid_poly_fp16_inputs_fwd_bwd_matches_split_reference(case):
    """FP16 inputs, FP16 D4 program: the block's f16x2 P is the PV / dV operand as is (no
    conversion); kernel-level only (attention() still refuses FP16 sigmoid/poly until this
    has run on a GPU)."""
    test_poly_bwd_matches_split_reference(case, dtype=torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("case", SURROGATE_CASES, ids=str)
def test_sigmoid_poly_bwd_surrogate_matches_split_reference(case):
    """sigmoid_grad="surrogate": the coupled B3 block's derivative surrogate (BF16 program only)."""
    test_poly_bwd_matches_split_reference(case, sigmoid_grad="surrogate", program="sigmoid_attn_n4096")


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["value", "block"])
@pytest.mark.parametrize("program", ["softcap_c50_f16", "softcap_c50_f16_tail", "softcap_c50_f16_odd"])
@pytest.mark.parametrize("case", BF16_SOFTCAP_CASES, ids=str)
def test_softcap_poly_bwd_grad_rules_match_split_reference(case, program, rule):
    """softcap_grad: d logit/dx of the block columns from the block's logit ("value", 1 - t^2)
    or from the differentiated program ("block"), with the residual and the two-region FP16
    programs; the reference applies the same rule.  The odd_u2 program has no derivative
    block: "block" must raise, naming the value rule."""
    if program == "softcap_c50_f16_odd" and rule == "block":
        with pytest.raises(ValueError, match="grad_rule='value'"):
            test_poly_bwd_matches_split_reference(case, program=program, softcap_grad=rule)
        return
    test_poly_bwd_matches_split_reference(case, program=program, softcap_grad=rule)


@pytest.mark.gpu
@pytest.mark.parametrize("case", POLY_CASES, ids=str)
def test_poly_bwd_matches_split_reference(case, sigmoid_grad=None, program=None, head_loop=None,
                                         dtype=torch.bfloat16, softcap_grad=None):
    from flash_attn_poly import testing
    from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd
    b, sq, sk, hq, hkv, d, causal, mode = case
    g = torch.Generator(device="cuda").manual_seed(sum(case[:7]))
    mk = lambda s, h, sc=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * sc).to(dtype)
    # softcap: q scaled by 8 so logits reach the cap (|x| ~ 8 * sqrt(D) / sqrt(D) * ...)
    q, k, v, do = mk(sq, hq, 8.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv), mk(sq, hq)
    softcap = 50.0 if mode == "softcap" else None
    out = testing.poison_(torch.empty_like(q))
    from flash_attn_poly.kernels import score_stages as S
    stage = S.make_stage(mode, "poly", program=program, key_block=S.default_key_block(d)) if program else None
    o, lse = attn_fwd(q, k, v, mode=mode, evaluator="poly", causal=causal, softcap=softcap, out=out,
                      stage=stage)
    dq, dk, dv = attn_bwd(do, q, k, v, o, lse, mode=mode, evaluator="poly", causal=causal, softcap=softcap,
                          sigmoid_grad=sigmoid_grad, program=program, head_loop=head_loop,
                          softcap_grad=softcap_grad)
    torch.cuda.synchronize()
    refs = _split_grads(q, k, v, do, mode, causal, softcap, sigmoid_grad, program, softcap_grad)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        assert torch.isfinite(got).all(), name
        err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-2, (name, err)
