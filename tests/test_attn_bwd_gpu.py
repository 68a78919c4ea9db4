"""GPU tier of kernels/attn_bwd_sm90.py: what the catalogue does not run.

The catalogue (tests/test_correctness_gpu.py) runs every variant's default plan forward and
backward through attention(), including both backward builds of every score (MHA: head_loop;
GQA with few KV heads: not) and the LPT order at S = 2048-4224.  This file runs the backward's
other builds on catalogue cases (tests/cases.py), each tensor judged by the one rule
(tests/gpu_check.py: dQ, dK, dV each within 2x torch's error at the input precision + floor,
against the FP64 reference of the function the plan computes):

- plan overrides of the backward alone (dQ by red.global from the MMA threads, blockIdx order,
  head_loop on GQA groups, in BF16 and FP16): the backward is fed the FP64 reference's O
  (rounded) and LSE, so only its own error is measured and no forward is compiled;
- poly programs other than the defaults, forward then backward (the forward's NaN-poisoned O
  feeds the backward), against the per-key-column split reference of the plan's program, split
  and grad rule (tests/plan_reference.py: block columns replay the program and its derivative,
  MUFU columns the exact function): the FP16 tanh program (BF16 softcap's default below cap 50
  is the exp2 offload, whose backward is native's), the seed's BF16 programs, the FP16 sigmoid
  program on FP16 inputs, sigmoid's surrogate derivative, softcap's grad rules.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_attn_bwd_gpu.py        (the H200)
    FAP_TEST_BACKEND=reference python -m pytest -q -m gpu tests/test_attn_bwd_gpu.py  (CPU dry run)
"""
import pytest

torch = pytest.importorskip("torch")

import cases  # noqa: E402
import gpu_check as G  # noqa: E402

HONORS_TEST_BACKEND = True   # tests/conftest.py: FAP_TEST_BACKEND=reference runs these on the CPU

SMALL = 600_000   # B x H_q x S_q x S_k of a mechanism case: its FP64 references take ~0.1 s
TANH_PROGRAM = "softcap_c50_f16_odd"


def _mid(c) -> bool:
    return c.seqlen_q >= 64 and c.seqlen_k >= 128


def pick(gqa=None, **attrs):
    """The first mid-size catalogue case of the variant with these fields (gqa True: H_q > H_kv,
    False: MHA, None: either); no window."""
    where = (lambda c: _mid(c) and (gqa is None or (c.hq > c.hkv) == gqa))
    return cases.pick(1, where=where, max_size=SMALL, window=None, **attrs)[0]


# ----------------------------------------------------------------------------- backward-only overrides
SOFTMAX_GQA = pick(True, mode="softmax", dtype="bf16", head_dim=128, causal=True)
SOFTMAX_FULL = pick(True, mode="softmax", dtype="bf16", head_dim=128, causal=False)
SOFTMAX_D64 = pick(True, mode="softmax", dtype="bf16", head_dim=64)
SOFTMAX_D256 = pick(True, mode="softmax", dtype="bf16", head_dim=256)
SOFTCAP_NATIVE = pick(True, mode="softcap", evaluator="native", dtype="bf16", head_dim=128, causal=True)
SOFTCAP_NATIVE_MHA = pick(False, mode="softcap", evaluator="native", dtype="bf16", head_dim=128, causal=True)
SIGMOID_NATIVE = pick(True, mode="sigmoid", evaluator="native", dtype="bf16", head_dim=128, causal=True)
SOFTCAP_POLY_GQA = pick(True, mode="softcap", evaluator="poly", dtype="bf16", head_dim=128, causal=True)
SOFTCAP_POLY_MHA = pick(False, mode="softcap", evaluator="poly", dtype="bf16", head_dim=128, causal=True)
SIGMOID_POLY = pick(True, mode="sigmoid", evaluator="poly", dtype="bf16", head_dim=128, causal=True)
SIGMOID_POLY_FULL = pick(True, mode="sigmoid", evaluator="poly", dtype="bf16", head_dim=128, causal=False)

# the other dQ path: red.global.add from the MMA threads (dq_async=False; the default stages dQ
# in smem for warp 1's bulk reductions, and D = 256 always uses this one): D 128/64, causal or
# not, MHA and GQA, three scores
DQ_ATOMIC_RUNS = [G.run(c, overrides={"bwd.dq_async": False}, fwd=False)
                  for c in (SOFTMAX_GQA, SOFTMAX_D64, SOFTMAX_FULL, SOFTCAP_NATIVE_MHA, SIGMOID_NATIVE)]
# blockIdx order instead of the default LPT order (kernels/tile_scheduler.SectionLptScheduler)
BLOCK_ORDER_RUNS = [G.run(c, overrides={"bwd.lpt": False}, fwd=False) for c in (SOFTMAX_GQA, SOFTCAP_NATIVE_MHA)]
# head_loop=True where the plan picks the other build (GQA with few KV heads): a CTA per (key
# block, KV head) runs the G query heads of its group and stores dK/dV directly; D 64/128/256,
# causal or not, every score, the poly backwards (the exp2 offload's is native's; the FP16 tanh
# program; the sigmoid default program); FP16's direct stores (cvt.rn.f16x2 pairs)
HEAD_LOOP_RUNS = [G.run(c, overrides={"bwd.head_loop": True}, fwd=False)
                  for c in (SOFTMAX_GQA, SOFTMAX_FULL, SOFTMAX_D64, SOFTMAX_D256, SOFTCAP_NATIVE,
                            SIGMOID_NATIVE, SOFTCAP_POLY_GQA, SIGMOID_POLY,
                            pick(True, mode="softmax", dtype="fp16", head_dim=128))]
HEAD_LOOP_RUNS.append(G.run(SOFTCAP_POLY_GQA, program=TANH_PROGRAM, overrides={"bwd.head_loop": True}, fwd=False))
# the 128-query-row step at D = 64 (override bwd.tile_m=128, with and without head_loop: dQ split by rows,
# dV after the dS math, P^T / dS^T packed pair by pair): softmax (the other causality where the
# catalogue has a mid-size case), the plan's
# dq_async and the red.global path; softcap and sigmoid through the same tile (their dS factor f
# packed to FP16 pairs in the probs pass, f_packed), both causalities, native and poly
TILE128 = {"bwd.tile_m": 128, "bwd.head_loop": False}
TILE128_RUNS = ([G.run(c, overrides=TILE128, fwd=False)
                 for c in (SOFTMAX_D64, pick(None, mode="softmax", dtype="bf16", head_dim=64, causal=not SOFTMAX_D64.causal),
                           pick(None, mode="softcap", evaluator="native", dtype="bf16", head_dim=64),
                           cases.retarget(pick(None, mode="softcap", evaluator="native", dtype="bf16", head_dim=64),
                                          dtype="fp16", causal=False),
                           pick(None, mode="softcap", evaluator="poly", dtype="bf16", head_dim=64),
                           pick(None, mode="sigmoid", evaluator="native", dtype="bf16", head_dim=64),
                           pick(None, mode="sigmoid", evaluator="poly", dtype="bf16", head_dim=64))]
                + [G.run(c, overrides=TILE128, fwd=False)   # several query and key blocks, odd S_q
                   for m in ("softcap", "sigmoid")
                   for c in cases.pick(1, where=lambda c: c.seqlen_q >= 1000 and c.seqlen_k >= 1000, window=None,
                                       mode=m, evaluator="native", dtype="bf16", head_dim=64)]
                + [G.run(SOFTMAX_D64, overrides={**TILE128, "bwd.dq_async": False}, fwd=False)]
                # with the per-KV-head loop (dK / dV stored from registers, store_in_branch)
                + [G.run(c, overrides={**TILE128, "bwd.head_loop": True}, fwd=False)
                   for c in (SOFTMAX_D64, pick(True, mode="sigmoid", evaluator="native", dtype="bf16", head_dim=64),
                             cases.pick(1, where=lambda c: c.seqlen_q >= 1000 and c.hq > c.hkv, window=None,
                                        mode="softcap", evaluator="native", dtype="bf16", head_dim=64)[0])])


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(DQ_ATOMIC_RUNS + BLOCK_ORDER_RUNS + HEAD_LOOP_RUNS + TILE128_RUNS))
def test_attn_bwd_overrides(r):
    G.check(r)


# ----------------------------------------------------------------------------- poly programs, forward then backward
# the FP16 tanh program on BF16 inputs (the default above cap 50), MHA (head_loop) and GQA, D 128/256,
# and D = 64 (the 64-row step with its staged dQ halves: plan row bwd-d64-softcap-program)
TANH_RUNS = [G.run(c, program=TANH_PROGRAM) for c in
             (SOFTCAP_POLY_GQA, SOFTCAP_POLY_MHA,
              pick(None, mode="softcap", evaluator="poly", dtype="bf16", head_dim=256),
              pick(None, mode="softcap", evaluator="poly", dtype="bf16", head_dim=64))]
# the seed's BF16 programs: sigmoid's D3 block (B3) with the product rule and with its coupled
# derivative surrogate; softcap's D4 residual blocks (B2) with the differentiated program
SEED_PROGRAM_RUNS = ([G.run(c, program="sigmoid_attn_n4096") for c in (SIGMOID_POLY, SIGMOID_POLY_FULL)]
                     + [G.run(c, program="sigmoid_attn_n4096", sigmoid_grad="surrogate")
                        for c in (SIGMOID_POLY, SIGMOID_POLY_FULL)]
                     + [G.run(SOFTCAP_POLY_GQA, program="softcap_c50")])
# softcap_grad: d logit/dx of the block columns from the block's logit ("value", 1 - t^2) or from
# the differentiated program ("block"), the residual and the two-region FP16 programs; the
# reference applies the same rule (the odd_u2 program has no derivative block: its "block" is
# refused, tests/test_attn_bwd_compile.py::test_softcap_odd_program_side)
GRAD_RULE_RUNS = [G.run(SOFTCAP_POLY_GQA, program=p, overrides={"grad_rule": rule})
                  for p in ("softcap_c50_f16", "softcap_c50_f16_tail") for rule in ("value", "block")]
GRAD_RULE_RUNS.append(G.run(SOFTCAP_POLY_GQA, program=TANH_PROGRAM, overrides={"grad_rule": "value"}))


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(TANH_RUNS + SEED_PROGRAM_RUNS + GRAD_RULE_RUNS))
def test_poly_fwd_bwd_match_split_reference(r):
    res = G.check(r)
    # a poly backward, not native's, except sigmoid's product rule (P recomputed on MUFU)
    native_bwd = r.case.mode == "sigmoid" and res["plan"].score.grad_rule == "product"
    assert (res["plan"].score_bwd.evaluator == "native") == native_bwd, res["plan"].score_bwd


# FP16 inputs, FP16 D4 program: the block's f16x2 P is the PV operand as is (no conversion); the
# backward (product rule) recomputes P on MUFU.
# Named: the plan's default for FP16 sigmoid is native (the program misses the rule against
# torch's FP16 error: plan.poly_outside_rule), so it warns
FP16_SIGMOID_RUNS = [G.run(pick(None, mode="sigmoid", evaluator="poly", dtype="fp16", head_dim=128),
                           program="sigmoid_attn_n4096_f16")]


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(FP16_SIGMOID_RUNS))
def test_sigmoid_fp16_program_on_fp16_inputs(r):
    with pytest.warns(UserWarning, match="FP16 inputs"):
        res = G.check(r)
    assert res["plan"].score.evaluator == "poly" and res["plan"].score_bwd.evaluator == "native"


RUNS = (DQ_ATOMIC_RUNS + BLOCK_ORDER_RUNS + HEAD_LOOP_RUNS + TANH_RUNS + SEED_PROGRAM_RUNS + GRAD_RULE_RUNS
        + FP16_SIGMOID_RUNS)
