"""attention(backend="fa4") on the H200: flash-attn-4's Hopper kernels with our score functions,
forward and backward, every mode and program the FA4 plan runs, each of O, dQ, dK, dV by the
FlashAttention rule (tests/rule_harness.judge: error <= 2x torch's at BF16 + floor) against the
FP64 reference that replays the same program on every score (tests/poly_reference.py; FA4 runs no
poly split), torch at BF16 with the same replay as the low-precision side; native scores against
the exact functions.  Skipped without flash-attn-4.

Cost: 7 cases, each one FA4 forward and one backward build on first use (FA4's own compile:
11-22 s per case for the same score functions built for sm_90a on a 2-core CPU, fewer on the
device machine's) and a 256-token launch: about 2 minutes in all, at most 3.
    pytest -m gpu -s tests/test_fa4_backend_gpu.py
The CUDA launch is the only untested part: the plan, the reference functions and the judging ran
on the CPU (tests/test_fa4_backend_cpu.py: the plumbing with a stand-in for FA4, and the judging
of a perfect FA4 and of a 4x worse one), and the score functions of every case compile for sm_90a
(tests/fa4_builds.py, arch "sm_90a").
"""
import zlib

import pytest
import torch

import poly_reference as PR
import rule_harness as H

pytestmark = pytest.mark.gpu

SHAPE = (1, 256, 4, 2, 128)   # B, S, H_q, H_kv, D: GQA, causal
CASES = [  # (mode, evaluator, program): None = the FA4 plan's program (plan.FA4_ROWS)
    ("softmax", "native", None),
    ("softcap", "native", None),
    ("softcap", "poly", None),               # softcap_c50_f16_odd, value rule
    ("softcap", "poly", "softcap_c50"),      # the seed's BF16 B2 program, its derivative block
    ("sigmoid", "native", None),
    ("sigmoid", "poly", None),               # sigmoid_attn_n4096_f16
    ("sigmoid", "poly", "sigmoid_attn_n4096"),   # the seed's BF16 B3 program
]


def fns(plan):
    """(score_fn, score_grad_fn) of the score FA4 runs: every key column through the program
    (FA4 runs no split); (None, None) for a native score (the exact function)."""
    if plan.program is None:
        return None, None
    if plan.score == "softcap":
        return PR.softcap_fns(plan.softcap, plan.program, plan.grad_rule)
    # FA4 takes the program's P as it comes out of the block (f16 or bf16, widened to FP32), not
    # rounded to the PV operand's type as our kernels do: "f16" keeps an FP16 program's P as is
    # (the block alone: FA4's score_mod has neither of our forward's clamp fix-ups)
    return PR.sigmoid_fns(plan.sigmoid_bias, plan.program.n, "product", plan.program,
                          "f16" if plan.program.f16 else "bf16", forward=False)


def inputs(mode, evaluator, program, device="cuda"):
    """(q, k, v, dout, kw, plan) of a case: BF16, softcap scores spanning tens of logits."""
    from flash_attn_poly import interface, plan as plan_mod
    b, s, hq, hkv, d = SHAPE
    g = torch.Generator(device=device).manual_seed(zlib.crc32(repr((mode, evaluator, program)).encode()) % 1000)
    amp = 3.5 if mode == "softcap" else 1.0
    mk = lambda h, a: (torch.randn(b, s, h, d, device=device, generator=g) * a).to(torch.bfloat16)
    q, k, v, do = mk(hq, amp), mk(hkv, amp), mk(hkv, 1.0), mk(hq, 1.0)
    kw = dict(causal=True, softcap=50.0) if mode == "softcap" else dict(causal=True)
    plan = plan_mod.resolve_fa4(interface.validate(q, k, v, mode, evaluator, True, kw.get("softcap"),
                                                   program=program))
    return q, k, v, do, kw, plan


def judge(out, grads, q, k, v, do, mode, kw, plan) -> dict:
    """The rule for O, dQ, dK, dV against the same-program FP64 reference."""
    from flash_attn_poly.reference import attention_ref, attention_ref_backward, attention_ref_lowprec
    fn, gfn = fns(plan)
    kw = dict(kw, sigmoid_bias=plan.sigmoid_bias) if mode == "sigmoid" else kw
    ref, _ = attention_ref(q, k, v, mode, score_fn=fn, **kw)
    low, _ = attention_ref_lowprec(q, k, v, mode, score_fn=fn, **kw)
    ref_g = attention_ref_backward(do, q, k, v, mode, score_fn=fn, score_grad_fn=gfn, **kw)
    low_g = H.lowprec_backward(do, q, k, v, low, mode, score_fn=fn, score_grad_fn=gfn, **kw)
    mag = H.magnitudes(do, q, k, v, ref, mode, score_fn=fn, score_grad_fn=gfn, **kw)
    checks = {"o": H.judge("o", out, ref, low, q.dtype, mag["o"])}
    for name, got, r, lo in zip(("dq", "dk", "dv"), grads, ref_g, low_g):
        checks[name] = H.judge(name, got, r, lo, q.dtype, mag[name])
    return checks


@pytest.mark.parametrize("mode, evaluator, program", CASES)
def test_fa4_forward_and_backward(mode, evaluator, program):
    pytest.importorskip("flash_attn.cute")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the H200 run: FA4's Hopper path")
    import flash_attn_poly
    q, k, v, do, kw, plan = inputs(mode, evaluator, program)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = flash_attn_poly.attention(qg, kg, vg, mode, evaluator=evaluator, program=program,
                                    backend="fa4", **kw)
    try:
        grads = torch.autograd.grad(out, (qg, kg, vg), do)
    except Exception as e:   # an FA4 limitation is a finding, not a skip
        raise AssertionError(f"FA4 backward raised {type(e).__name__}: {e}") from e
    checks = judge(out, grads, q, k, v, do, mode, kw, plan)
    print(f"\nfa4 {mode}/{evaluator}/{program}: ratios "
          f"{({n: round(c['ratio'], 3) for n, c in checks.items()})}")
    bad = [f"{n}: {c['why']}" for n, c in checks.items() if not c["ok"]]
    assert not bad, bad
