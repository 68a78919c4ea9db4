"""The torch launch of the attention kernels for a resolved plan (flash_attn_poly.plan.AttnPlan).

forward(plan, q, k, v, aux)                    -> (o, lse or None)
backward(plan, dout, q, k, v, out, lse, aux)   -> (dq, dk, dv)

Mechanism only: buffers, layouts the kernels need (TMA strides), the call's numbers (scale,
cap, bias: the kernels' host code encodes them for the score function), and the compiled kernels from kernels/compile_cache.py (one launch path:
torch tensors and Python numbers straight into the tvm-ffi entry).  Every choice was made by the
plan.  The kernel modules are imported when a build is missing, not before.
"""
from __future__ import annotations

import functools

from . import compile_cache


def _numbers(plan) -> tuple:
    """The call's own numbers, as the kernels take them (FP64; 0 where a mode has none): the
    score function's encoding into FP32 kernel arguments happens in the compiled host code."""
    return (plan.softmax_scale, plan.softcap or 0.0, plan.sigmoid_bias or 0.0)


def _tma_ready(t):
    """TMA: last dim contiguous, other strides multiples of 16 bytes (8 elements)."""
    if t.stride(-1) == 1 and all(st % 8 == 0 for st in t.stride()[:-1]):
        return t
    return t.contiguous()


def _fwd_build(cfg):
    from . import attn_fwd_sm90
    return attn_fwd_sm90.kernel_for(cfg), attn_fwd_sm90._fake_args(cfg)


def _bwd_build(cfg):
    from . import attn_bwd_sm90
    return attn_bwd_sm90.kernel_for(cfg), attn_bwd_sm90.fake_args(cfg)


def _aux_args(spec, aux) -> tuple:
    if not spec.aux:
        return ()
    return ([t.contiguous() for t in aux],)


def forward(plan, q, k, v, aux=(), out=None, lse=None):
    """out / lse: buffers to write into (default new ones; tests pass NaN-filled ones)."""
    import torch
    b, s_q, h_q, _ = q.shape
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device) if lse is None else lse
    fn = compile_cache.compiled("attn_fwd", plan.fwd, functools.partial(_fwd_build, plan.fwd))
    fn(q, k, v, out, lse, *_numbers(plan), *plan.window, plan.fwd_ctas, plan.l2_section_mb << 20,
       *_aux_args(plan.fwd.score, aux))
    return out, (None if plan.call.mode == "sigmoid" else lse)


def forward_varlen(plan, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, out=None, lse=None):
    """The varlen forward build (plan.fwd.varlen) on packed q (total_q, H_q, D), k/v (total_k, H_kv,
    D) and int32 offsets: (o (total_q, H_q, D), lse (H_q, total_q) or None).  The kernel sees
    (1, total, H, D) views; max_seqlen_q sizes its grid (> 0)."""
    import torch
    total_q, h_q, _ = q.shape
    q, k, v = (_tma_ready(t)[None] for t in (q, k, v))
    out = torch.empty_like(q) if out is None else out[None]
    lse = torch.empty(1, h_q, total_q, dtype=torch.float32, device=q.device) if lse is None else lse[None]
    fn = compile_cache.compiled("attn_fwd", plan.fwd, functools.partial(_fwd_build, plan.fwd))
    order = ()
    if plan.fwd.varlen_compact:   # the live (query tile, sequence) pairs, built on the device
        from .tile_scheduler import compact_varlen_table
        # query tiles of tile_m / pack_gqa positions (packed GQA: each of pack_gqa heads)
        order = (compact_varlen_table(cu_seqlens_q, max_seqlen_q, plan.fwd.tile_m // plan.fwd.pack_gqa),)
    fn(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, *order, *_numbers(plan), *plan.window,
       plan.fwd_ctas, plan.l2_section_mb << 20)
    return out[0], (None if plan.call.mode == "sigmoid" else lse[0])


def backward_varlen(plan, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                    max_seqlen_k: int):
    """The varlen backward build (plan.bwd.varlen) on packed dout, q, out (total_q, H_q, D), k, v
    (total_k, H_kv, D), lse (H_q, total_q) (sigmoid: ignored) and int32 offsets: (dq, dk, dv)
    like q, k, v.  The pre kernel writes the padded packed lse2 / dsum (prepost_launch,
    "Packed sequences"), the main kernel sees (1, total, H, D) views and runs a CTA per live (key
    block, query head, sequence) of a table built here on the device (max_seqlen_k > 0 sizes it;
    head_loop builds: per KV head, dK and dV stored in dtype by the main kernel), the post kernel
    reads the dQ accumulator per sequence (its padded offset; dK / dV unless head_loop)."""
    import torch
    from . import attn_bwd_prepost, prepost_launch as prepost
    cfg = plan.bwd
    dout, q, k, v = (t.contiguous() for t in (dout, q, k, v))
    needs = plan.call.mode != "sigmoid"   # the LSE and dsum of softmax-like scores
    lse2, dsum = prepost.preprocess_varlen(dout, out, lse, cu_seqlens_q, max_seqlen_q, needs, needs, "e")
    q4, k4, v4, do4 = (t[None] for t in (q, k, v, dout))
    from .tile_scheduler import varlen_bwd_ctas, varlen_bwd_section, varlen_bwd_table
    # the live CTAs, a table built on the device, and their host bound (the grid); head_loop
    # builds run a CTA per KV head over its query heads
    heads = k.shape[1] if cfg.head_loop else q.shape[1]
    table = varlen_bwd_table(cu_seqlens_k, max_seqlen_k, cfg.tile_n, heads, k.shape[0],
                             varlen_bwd_section(plan.varlen_bwd_order, cfg.head_loop, heads, max_seqlen_q, cfg.head_dim))
    ctas = varlen_bwd_ctas(k.shape[0], cu_seqlens_k.shape[0] - 1, max_seqlen_k, cfg.tile_n, heads)
    fn = compile_cache.compiled("attn_bwd", cfg, functools.partial(_bwd_build, cfg))
    total_q, h_q, d = q.shape
    acc_shape = prepost.dq_acc_shape_varlen(total_q, cu_seqlens_q.shape[0] - 1, h_q, d)
    if cfg.head_loop:   # dK, dV leave the kernel in dtype (every live key block stores its rows)
        dq_acc = torch.zeros(acc_shape, dtype=torch.float32, device=q.device)
        dk4, dv4 = torch.empty_like(k4), torch.empty_like(v4)
        fn(q4, k4, v4, do4, lse2, dsum, dq_acc, dk4, dv4, cu_seqlens_q, cu_seqlens_k, table, ctas,
           *_numbers(plan), *plan.window, plan.softmax_scale)
        dk, dv = dk4[0], dv4[0]
    else:
        dq_acc, dk_acc, dv_acc = attn_bwd_prepost.accumulators(q4, k4, dq_shape=acc_shape)
        fn(q4, k4, v4, do4, lse2, dsum, dq_acc, dk_acc, dv_acc, cu_seqlens_q, cu_seqlens_k, table, ctas,
           *_numbers(plan), *plan.window)
        dk, dv = (t[0] for t in prepost.postprocess_dkv(dk_acc, dv_acc, plan.softmax_scale, q.dtype))
    dq = prepost.postprocess_dq_varlen(dq_acc, plan.softmax_scale, q.dtype, cu_seqlens_q, max_seqlen_q, total_q)
    return dq, dk, dv


def turn_counters(cfg, b: int, s_q: int, s_k: int, h_q: int, h_kv: int) -> int:
    """Int32 counters of a deterministic backward: one per (query block, query head, batch,
    column chunk) for dQ, then one per (key block, KV head, batch, column chunk) for dK/dV
    (kernel: dq_turn, dkv_turn; D = 256 has 2 chunks)."""
    chunks = max(1, cfg.head_dim // 128)
    return (b * h_q * -(-s_q // cfg.tile_m) + b * h_kv * -(-s_k // cfg.tile_n)) * chunks


def backward(plan, dout, q, k, v, out, lse, aux=()):
    """Gradients (dq, dk, dv): the pre kernel (LSE in log2 units padded with +inf, D =
    rowsum(dO o O)), the main kernel, the post kernel (scale and cast)."""
    import torch
    from . import attn_bwd_prepost, prepost_launch as prepost
    cfg = plan.bwd
    dout, q, k, v = (t.contiguous() for t in (dout, q, k, v))
    b, s_q, h_q, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    needs_lse = needs_dsum = plan.call.mode != "sigmoid"
    scale = plan.softmax_scale
    acc_shape = prepost.dq_acc_shape(b, s_q, h_q, d)
    dq_acc = torch.empty(acc_shape, dtype=torch.float32, device=q.device) if plan.zero_dq_in_pre else None
    lse2, dsum = prepost.preprocess(dout, out, lse, needs_lse, needs_dsum, "e", pad_to=128,
                                    **({"dq_acc": dq_acc} if plan.zero_dq_in_pre else {}))
    if cfg.head_loop:   # dK, dV come out of the kernel in dtype; only dQ needs an accumulator
        if dq_acc is None:
            dq_acc = torch.zeros(acc_shape, dtype=torch.float32, device=q.device)
        dk_acc, dv_acc = torch.empty_like(k), torch.empty_like(v)
        extra = (scale,)
    else:
        counters = turn_counters(cfg, b, s_q, s_k, h_q, h_kv) if cfg.deterministic else 0
        accs = attn_bwd_prepost.accumulators(q, k, counters)
        dq_acc, dk_acc, dv_acc = accs[:3]
        extra = accs[3:]   # (Int32 turn counters,) in deterministic builds, else ()
    fn = compile_cache.compiled("attn_bwd", cfg, functools.partial(_bwd_build, cfg))
    fn(q, k, v, dout, lse2, dsum, dq_acc, dk_acc, dv_acc, *_numbers(plan), *plan.window, *extra,
       *_aux_args(cfg.score, aux))
    if cfg.head_loop:
        return prepost.postprocess_dq(dq_acc, scale, q.dtype, s_q), dk_acc, dv_acc
    return prepost.postprocess(dq_acc, dk_acc, dv_acc, scale, q.dtype, s_q)
