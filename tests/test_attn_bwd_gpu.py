"""GPU tier: dQ/dK/dV of kernels/attn_bwd_sm90.py against FP64 references.

Each case runs the plan attention() resolves for it (flash_attn_poly.testing.plan_for), with
plan overrides for the non-default builds ("bwd.head_loop", "bwd.dq_async", "grad_rule", ...).
Native modes: FP64 autograd of the exact function (tests/bwd_fp64.py).  Poly modes:
the forward kernel (the plan's poly split, NaN-poisoned O) feeds the backward kernel, and
both are judged against the FP64 explicit backward of the per-key-column split reference
(tests/plan_reference.py: block columns replay the program and its derivative program, MUFU
columns the exact function), the same split the kernels run.  Softcap's BF16 default (cap <=
50) is the exp2 offload, whose backward is native's; the poly backward tests run softcap with
the FP16 tanh program (POLY_PROGRAM), the default for FP16 inputs and caps above 50."""
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
# the program of the poly backward tests per mode (None: the plan's default)
POLY_PROGRAM = {"softcap": "softcap_c50_f16_odd", "sigmoid": None}
POLY_CASES = [  # (B, S_q, S_k, H_q, H_kv, D, causal, mode)
    (1, 257, 257, 8, 8, 128, True, "softcap"),
    (1, 333, 333, 8, 2, 128, True, "softcap"),
    (1, 257, 257, 8, 2, 128, True, "sigmoid"),
    (2, 200, 301, 4, 1, 128, False, "sigmoid"),
    (1, 333, 333, 4, 2, 256, True, "softcap"),
]


def _check_vs_fp64(case, dtype=torch.bfloat16, overrides=None):
    """dQ/dK/dV of the backward (plan overrides) vs FP64 autograd of the exact function
    (tests/bwd_fp64.run_case): finite, max relative error < 2e-2."""
    from bwd_fp64 import run_case
    errs, finite = run_case(case, dtype, overrides)
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
    _check_vs_fp64(case, overrides={"bwd.dq_async": False})


LPT_CASES = [CASES[1], CASES[3], CASES[5], CASES[7],
             (1, 5000, 5000, 8, 2, 128, True, "softmax")]   # S=5000: sections of 6 + 2 heads


@pytest.mark.gpu
@pytest.mark.parametrize("case", LPT_CASES, ids=str)
def test_attn_bwd_lpt_order_matches_fp64_autograd(case):
    """CTA order of kernels/tile_scheduler.SectionLptScheduler (BwdConfig.lpt)."""
    _check_vs_fp64(case, overrides={"bwd.lpt": True})


HEAD_LOOP_CASES = CASES[:9] + [(1, 5000, 5000, 8, 2, 128, True, "softmax"),   # LPT sections of KV heads
                                (2, 257, 257, 8, 2, 128, True, "softcap", "poly", POLY_PROGRAM["softcap"]),
                                (1, 333, 333, 8, 1, 128, True, "sigmoid", "poly")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", HEAD_LOOP_CASES, ids=str)
def test_attn_bwd_head_loop_matches_fp64_autograd(case):
    """head_loop=True: a CTA per (key block, KV head) runs the G query heads of its group and
    stores dK/dV directly (MHA, GQA 4/8, MQA; D 64/128/256; causal or not; odd S)."""
    _check_vs_fp64(case, overrides={"bwd.head_loop": True})


@pytest.mark.gpu
@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[8]], ids=str)
def test_attn_bwd_head_loop_fp16_matches_fp64_autograd(case):
    """head_loop's direct dK/dV stores in FP16 (cvt.rn.f16x2 pairs)."""
    _check_vs_fp64(case, dtype=torch.float16, overrides={"bwd.head_loop": True})


@pytest.mark.gpu
@pytest.mark.parametrize("case", POLY_CASES, ids=str)
def test_poly_bwd_head_loop_matches_split_reference(case):
    test_poly_bwd_matches_split_reference(case, head_loop=True)


FP16_CASES = [CASES[1], CASES[3], CASES[5], CASES[6], CASES[8]]   # softmax causal/non-causal, softcap, sigmoid


@pytest.mark.gpu
@pytest.mark.parametrize("case", FP16_CASES, ids=str)
def test_attn_bwd_fp16_matches_fp64_autograd(case):
    _check_vs_fp64(case, dtype=torch.float16)


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
    conversion).  Named: the plan's default for FP16 sigmoid is native (the program misses the
    FlashAttention rule against torch's FP16 error: plan.poly_outside_rule), so it warns."""
    with pytest.warns(UserWarning, match="FP16 inputs"):
        test_poly_bwd_matches_split_reference(case, dtype=torch.float16, program="sigmoid_attn_n4096_f16")


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
    import plan_reference
    from flash_attn_poly import reference, testing
    b, sq, sk, hq, hkv, d, causal, mode = case
    g = torch.Generator(device="cuda").manual_seed(sum(case[:7]))
    mk = lambda s, h, sc=1.0: (torch.randn(b, s, h, d, device="cuda", generator=g) * sc).to(dtype)
    # softcap: q scaled by 8 so logits reach the cap (|x| ~ 8 * sqrt(D) / sqrt(D) * ...)
    q, k, v, do = mk(sq, hq, 8.0 if mode == "softcap" else 1.0), mk(sk, hkv), mk(sk, hkv), mk(sq, hq)
    softcap = 50.0 if mode == "softcap" else None
    overrides = {} if head_loop is None else {"bwd.head_loop": head_loop}
    if softcap_grad is not None:
        overrides["grad_rule"] = softcap_grad
    o, lse, plan = testing.run_forward(q, k, v, mode, "poly", overrides, poison=True, causal=causal, softcap=softcap,
                                       program=program or POLY_PROGRAM[mode], sigmoid_grad=sigmoid_grad)
    assert plan.score_bwd.evaluator == "poly", plan.score_bwd   # a poly backward, not native's
    dq, dk, dv = testing.run_backward(plan, do, q, k, v, o, lse)
    torch.cuda.synchronize()
    fn, grad_fn = plan_reference.score_fns(plan)
    refs = reference.attention_ref_backward(do, q, k, v, mode, causal=causal, softcap=softcap,
                                            score_fn=fn, score_grad_fn=grad_fn)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        assert torch.isfinite(got).all(), name
        err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-2, (name, err)
