"""A FlashAttention-order emulation in torch (CPU), to calibrate the rule of tests/rule_harness.py.

What a correct FlashAttention-style kernel does with 16-bit inputs, step by step: forward over
key blocks with an online row max (P = exp(logit - m) in FP32, rounded to the input dtype for
the PV product, the row sum l of the unrounded P, O = acc / l at the end, LSE = m + log l);
backward from that O and LSE (P recomputed from the LSE, dV = P^T dO with P rounded, dS = P (dP -
D) rounded, D = rowsum(dO o O)).  The rule must pass this with room (tests/test_correctness_cpu.py),
or a right kernel would fail it on the GPU.
"""
from __future__ import annotations

import math

import torch

from flash_attn_poly import reference as R


def _expand(t, grp):
    return t.repeat_interleave(grp, dim=2)


def forward(q, k, v, mode, *, causal, softcap=None, window_size=(-1, -1), block=64, fixed_max=None,
            rounded_row_sum=False):
    """(O in q.dtype, LSE FP32 or None).  fixed_max: a constant row max m0 instead of the online
    one (softcap's constant-max build); rounded_row_sum: l sums the rounded P that the PV product
    uses (the normalisation that is exact when one key dominates)."""
    dt = q.dtype
    s_q, s_k = q.shape[1], k.shape[1]
    grp = q.shape[2] // k.shape[2]
    scale = q.shape[-1] ** -0.5
    x = R.scores(q, k, scale, torch.float32)
    allowed = R.window_mask(s_q, s_k, *window_size)
    if causal:
        allowed &= R.causal_mask(s_q, s_k)
    v_up = _expand(v, grp).float()
    if mode == "sigmoid":
        p = torch.sigmoid(x - math.log(s_k)).masked_fill(~allowed, 0.0)
        return torch.einsum("bhqk,bkhd->bqhd", p.to(dt).float(), v_up).to(dt), None
    logits = softcap * torch.tanh(x / softcap) if mode == "softcap" else x
    logits = logits.masked_fill(~allowed, -math.inf)
    b, h = x.shape[:2]
    m = torch.full((b, h, s_q), -math.inf)
    l = torch.zeros(b, h, s_q)
    acc = torch.zeros(b, s_q, h, q.shape[-1])
    for j in range(0, s_k, block):
        xb = logits[..., j:j + block]
        m_new = torch.maximum(m, xb.amax(-1)) if fixed_max is None else torch.full_like(m, fixed_max)
        safe = torch.where(m_new == -math.inf, 0.0, m_new)
        alpha = torch.exp(m - safe)
        pb = torch.exp(xb - safe[..., None])
        l = l * alpha + (pb.to(dt).float() if rounded_row_sum else pb).sum(-1)
        acc = acc * alpha.transpose(1, 2)[..., None] + torch.einsum(
            "bhqk,bkhd->bqhd", pb.to(dt).float(), v_up[:, j:j + block])
        m = m_new
    out = acc / torch.where(l > 0, l, 1.0).transpose(1, 2)[..., None]
    lse = torch.where(l > 0, m + torch.log(l), -math.inf)
    return out.to(dt), lse


def backward(dout, q, k, v, out, lse, mode, *, causal, softcap=None, window_size=(-1, -1), f16_factor=False):
    """(dq, dk, dv) in the input dtype from the forward's O and LSE.  f16_factor: the dS factor f
    (softcap P (1 - t^2), sigmoid p (1 - p)) rounded to FP16 before dS = f (dP - D), as the
    backward's 128-row step keeps it (kernels/attn_bwd_sm90.py, f_packed)."""
    rnd = (lambda f: f.to(torch.float16).float()) if f16_factor else (lambda f: f)
    dt = q.dtype
    s_q, s_k, h_kv = q.shape[1], k.shape[1], k.shape[2]
    grp = q.shape[2] // h_kv
    scale = q.shape[-1] ** -0.5
    x = R.scores(q, k, scale, torch.float32)
    allowed = R.window_mask(s_q, s_k, *window_size)
    if causal:
        allowed &= R.causal_mask(s_q, s_k)
    do = dout.float()
    dp = torch.einsum("bqhd,bkhd->bhqk", do, _expand(v, grp).float())
    if mode == "sigmoid":
        sig = torch.sigmoid(x - math.log(s_k))
        p = sig.masked_fill(~allowed, 0.0)
        ds = (dp * rnd(sig * (1 - sig))).masked_fill(~allowed, 0.0)
    else:
        logits, dcap = x, 1.0
        if mode == "softcap":
            t = torch.tanh(x / softcap)
            logits, dcap = softcap * t, 1 - t * t
        safe = torch.where(lse == -math.inf, 0.0, lse)
        p = torch.exp(logits - safe[..., None]).masked_fill(~allowed, 0.0)
        f = rnd(p * dcap) if mode == "softcap" else p
        ds = f * (dp - torch.einsum("bqhd,bqhd->bhq", do, out.float())[..., None])
    ds = ds.to(dt).float()
    fold = lambda t: t.reshape(t.shape[0], t.shape[1], h_kv, grp, t.shape[3]).sum(3)
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, _expand(k, grp).float()) * scale
    dk = fold(torch.einsum("bhqk,bqhd->bkhd", ds, q.float()) * scale)
    dv = fold(torch.einsum("bhqk,bqhd->bkhd", p.to(dt).float(), do))
    return dq.to(dt), dk.to(dt), dv.to(dt)
