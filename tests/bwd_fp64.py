"""FP64 check of the attention backward for the GPU tests (tests/test_attn_bwd_gpu.py).

`run_case(case, dtype, overrides)`: dQ/dK/dV of the backward kernel for the plan that
attention() resolves for the case (flash_attn_poly.testing.plan_for, with plan overrides such
as {"bwd.head_loop": True}) on seeded inputs against FP64 autograd of the exact function
(flash_attn_poly.reference.attention_ref), the kernel fed the reference's own O (rounded to the
input dtype) and LSE, so only the backward's error is measured. Returns ([max |kernel - ref| /
max |ref| for dq, dk, dv], all finite).
"""
import zlib

import torch

from flash_attn_poly import reference, testing


def grads_ref(q, k, v, do, mode, causal, softcap):
    qs, ks, vs = (t.double().requires_grad_() for t in (q, k, v))
    o, lse = reference.attention_ref(qs, ks, vs, mode, causal=causal, softcap=softcap)
    o.backward(do.double())
    return o, lse, qs.grad, ks.grad, vs.grad


def run_case(case, dtype=torch.bfloat16, overrides=None):
    """case = (B, S_q, S_k, H_q, H_kv, D, causal, mode[, evaluator[, program]])."""
    b, sq, sk, hq, hkv, d, causal, mode = case[:8]
    ev = case[8] if len(case) > 8 else "native"
    program = case[9] if len(case) > 9 else None
    # a seed fixed per case (hash() of a tuple holding a str changes with every process)
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr(case).encode()) % 2**31)
    mk = lambda s, h: torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    q, k, v, do = mk(sq, hq), mk(sk, hkv), mk(sk, hkv), mk(sq, hq)
    softcap = 50.0 if mode == "softcap" else None
    o, lse, dq_r, dk_r, dv_r = grads_ref(q, k, v, do, mode, causal, softcap)
    lse_in = None if lse is None else lse.detach().float()
    plan = testing.plan_for(q, k, v, mode, ev, overrides, causal=causal, softcap=softcap, program=program)
    dq, dk, dv = testing.run_backward(plan, do, q, k, v, o.detach().to(dtype), lse_in)
    torch.cuda.synchronize()
    errs = [((a.double() - r).abs().max() / r.abs().max()).item()
            for a, r in ((dq, dq_r), (dk, dk_r), (dv, dv_r))]
    finite = all(torch.isfinite(t).all().item() for t in (dq, dk, dv))
    return errs, finite
