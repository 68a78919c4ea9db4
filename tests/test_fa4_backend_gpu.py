"""attention(backend="fa4") on the H200: flash-attn-4's Hopper kernels with our score functions,
forward and backward, every mode and program the FA4 plan runs, against the reference that
replays the same program (tests/poly_reference.py) by the FlashAttention error rule
(flash_attn_poly.testing.assert_close_rule) for O, and a relative L2 bound for the gradients
as tests/test_api_gpu.py.  Skipped without flash-attn-4.

Cost: 7 cases, each one FA4 forward and one backward build on first use (FA4's own compile:
11-22 s per case for the same score functions built for sm_90a on a 2-core CPU, fewer on the
device machine's) and a 256-token launch: about 2 minutes in all, at most 3.
    pytest -m gpu -s tests/test_fa4_backend_gpu.py
The CUDA launch is the only untested part: the plan, the reference functions and the rule ran on
the CPU (tests/test_fa4_backend_cpu.py dry-runs the plumbing with a stand-in for FA4), and the
score functions of every case compile for sm_90a (tests/fa4_builds.py, arch "sm_90a").
"""
import zlib

import pytest
import torch

import flash_attn_poly
import poly_reference as PR
from flash_attn_poly.reference import attention_ref, attention_ref_backward, attention_ref_lowprec
from flash_attn_poly.testing import assert_close_rule, rel_l2_err

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


def _fns(plan):
    """(score_fn, score_grad_fn) of the score FA4 runs: every key column through the program
    (FA4 runs no split); (None, None) for a native score (the exact function)."""
    if plan.program is None:
        return None, None
    if plan.score == "softcap":
        return PR.softcap_fns(plan.softcap, plan.program, plan.grad_rule)
    # FA4 takes the program's P as it comes out of the block (f16 or bf16, widened to FP32), not
    # rounded to the PV operand's type as our kernels do: "f16" keeps an FP16 program's P as is
    return PR.sigmoid_fns(plan.sigmoid_bias, plan.program.n, "product", plan.program,
                          "f16" if plan.program.f16 else "bf16")


@pytest.mark.parametrize("mode, evaluator, program", CASES)
def test_fa4_forward_and_backward(mode, evaluator, program):
    pytest.importorskip("flash_attn.cute")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the H200 run: FA4's Hopper path")
    from flash_attn_poly import interface, plan as plan_mod
    b, s, hq, hkv, d = SHAPE
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr((mode, evaluator, program)).encode()) % 1000)
    amp = 3.5 if mode == "softcap" else 1.0   # softcap: scores spanning tens of logits
    mk = lambda h, a: (torch.randn(b, s, h, d, device="cuda", generator=g) * a).to(torch.bfloat16)
    q, k, v = mk(hq, amp), mk(hkv, amp), mk(hkv, 1.0)
    kw = dict(causal=True, softcap=50.0) if mode == "softcap" else dict(causal=True)
    plan = plan_mod.resolve_fa4(interface.validate(q, k, v, mode, evaluator, True, kw.get("softcap"),
                                                   program=program))
    fn, gfn = _fns(plan)

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = flash_attn_poly.attention(qg, kg, vg, mode, evaluator=evaluator, program=program,
                                    backend="fa4", **kw)
    ref, _ = attention_ref(q, k, v, mode, score_fn=fn, **kw)
    low, _ = attention_ref_lowprec(q, k, v, mode, score_fn=fn, **kw)
    stats = assert_close_rule(out, ref, low, floor=1e-3, name=f"fa4 {mode}/{evaluator}/{program} out")
    exact, _ = attention_ref(q, k, v, mode, **kw)
    print(f"\nfa4 {mode}/{evaluator}/{program}: out err {stats['max_abs_err']:.2e} (bound "
          f"{stats['bound']:.2e}); rel L2 vs exact {rel_l2_err(out, exact):.2e}")
    assert rel_l2_err(out, exact) < 0.3

    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (qg, kg, vg), dout)
    ref_g = attention_ref_backward(dout, q, k, v, mode, score_fn=fn, score_grad_fn=gfn, **kw)
    for name, got, exp in zip(("dq", "dk", "dv"), grads, ref_g):
        assert torch.isfinite(got).all(), name
        err = rel_l2_err(got, exp)
        print(f"  {name}: rel L2 {err:.2e}")
        assert err < 2e-2, f"fa4 {mode}/{evaluator}/{program} {name} rel L2 error {err:.3e}"
