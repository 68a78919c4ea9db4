"""FP64 check of the attention backward for the GPU tests (tests/test_attn_bwd_gpu.py).

`run_case(case, **kw)`: dQ/dK/dV of kernels/attn_bwd_sm90.attn_bwd (options kw) on seeded
inputs against FP64 autograd of the exact function (flash_attn_poly.reference.attention_ref),
the kernel fed the reference's own O (rounded to the input dtype) and LSE, so only the
backward's error is measured. Returns ([max |kernel - ref| / max |ref| for dq, dk, dv],
all finite).
"""
import torch

from flash_attn_poly import reference


def grads_ref(q, k, v, do, mode, causal, softcap):
    qs, ks, vs = (t.double().requires_grad_() for t in (q, k, v))
    o, lse = reference.attention_ref(qs, ks, vs, mode, causal=causal, softcap=softcap)
    o.backward(do.double())
    return o, lse, qs.grad, ks.grad, vs.grad


def run_case(case, dtype=torch.bfloat16, **kw):
    """case = (B, S_q, S_k, H_q, H_kv, D, causal, mode[, evaluator])."""
    from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd
    b, sq, sk, hq, hkv, d, causal, mode = case[:8]
    ev = case[8] if len(case) > 8 else "native"
    g = torch.Generator(device="cuda").manual_seed(hash(case) % 2**31)
    mk = lambda s, h: torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    q, k, v, do = mk(sq, hq), mk(sk, hkv), mk(sk, hkv), mk(sq, hq)
    softcap = 50.0 if mode == "softcap" else None
    o, lse, dq_r, dk_r, dv_r = grads_ref(q, k, v, do, mode, causal, softcap)
    lse_in = None if lse is None else lse.detach().float()
    dq, dk, dv = attn_bwd(do, q, k, v, o.detach().to(dtype), lse_in, mode=mode, evaluator=ev,
                          causal=causal, softcap=softcap, **kw)
    torch.cuda.synchronize()
    errs = [((a.double() - r).abs().max() / r.abs().max()).item()
            for a, r in ((dq, dq_r), (dk, dk_r), (dv, dv_r))]
    finite = all(torch.isfinite(t).all().item() for t in (dq, dk, dv))
    return errs, finite
