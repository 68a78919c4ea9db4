"""Pre- and post-processing around kernels/attn_bwd_sm90.py in torch: the reference
implementation, the oracle of tests/test_attn_bwd_prepost_gpu.py.  attn_bwd runs the same two
steps as the CuTe DSL kernels of kernels/attn_bwd_prepost_sm90.py, which fall back to these
functions for inputs they do not take (empty tensors, an O of another dtype); attn_bwd also
takes its FP32 accumulators from `accumulators` below (cost of both in docs/NOTES_attn_bwd.md).

preprocess: D = rowsum(dO o O) and LSE in log2 units, both (B, H_q, S_pad) FP32 with the
    tail padded so that a whole tile_m block can be TMA-loaded; LSE = -inf rows (no key
    visible) and padding become +inf, so the kernel's P = exp2(s - LSE) is exactly 0 there.
postprocess: FP32 accumulators -> dtype, times softmax_scale (the kernel accumulates
    gradients with respect to the unscaled score, see kernels/scores); dQ's accumulator is
    reordered to (B, S_q, H, D) first (kernels/prepost_launch.py, "The dQ accumulator").
"""
import math

import torch

LOG2_E = math.log2(math.e)


def _padded(b: int, h: int, s: int, s_pad: int, pad_value: float, device) -> torch.Tensor:
    """(b, h, s_pad) FP32 buffer whose tail [s, s_pad) holds pad_value; the caller writes
    [:s] with an out= op instead of a full fill + copy (one kernel less per buffer)."""
    outp = torch.empty((b, h, s_pad), dtype=torch.float32, device=device)
    if s_pad > s:
        outp[:, :, s:].fill_(pad_value)
    return outp


def _lse_log2(lse, s_pad: int, lse_base: str) -> torch.Tensor:
    """LSE * log2(e) (or as is for base 2), -inf -> +inf, padded with +inf.
    Was 6 kernels (mul, isneginf, full_like, where, full, copy); now 2-3: mul into the
    padded buffer, nan_to_num in place (NaN kept, +inf kept, -inf -> +inf), tail fill."""
    b, h, s = lse.shape
    outp = _padded(b, h, s, s_pad, math.inf, lse.device)
    body = outp[:, :, :s]
    if lse_base == "e":
        torch.mul(lse.float(), LOG2_E, out=body)
    else:
        body.copy_(lse)
    torch.nan_to_num(body, nan=math.nan, posinf=math.inf, neginf=math.inf, out=body)
    return outp


def _dsum(dout, out, s_pad: int) -> torch.Tensor:
    """rowsum(dO o O) in FP32, (B, H, S_pad), zero padded.  Same products and the same
    sum(-1) as before (bit-identical); one FP32 copy of the operands instead of two
    (dO.float() is reused in place: 64 MB less traffic at B=1 S=4096 H=32 D=128)."""
    b, s, h, _ = dout.shape
    outp = _padded(b, h, s, s_pad, 0.0, dout.device)
    prod = dout.float()
    prod = prod.mul_(out) if prod is not dout else prod * out
    outp[:, :, :s].copy_(prod.sum(-1).transpose(1, 2))
    return outp


def preprocess(dout, out, lse, needs_lse: bool, needs_dsum: bool, lse_base: str, pad_to: int,
               dq_acc=None):
    """(lse2, dsum), both (B, H, S_pad) FP32; dq_acc (the FP32 dQ accumulator) is zeroed."""
    if dq_acc is not None:
        dq_acc.zero_()
    b, s_q, h_q, _ = dout.shape
    s_pad = -(-s_q // pad_to) * pad_to
    zeros = None
    if not (needs_lse and needs_dsum):
        # the kernel only reads an unneeded buffer: one zero buffer serves both
        zeros = torch.zeros(b, h_q, s_pad, dtype=torch.float32, device=dout.device)
    lse2 = _lse_log2(lse, s_pad, lse_base) if needs_lse else zeros
    dsum = _dsum(dout, out, s_pad) if needs_dsum else zeros
    return lse2, dsum


def preprocess_varlen(dout, out, lse, cu_q: list, needs_lse: bool, needs_dsum: bool, lse_base: str = "e"):
    """The oracle of kernels/prepost_launch.preprocess_varlen: packed dout / out (total_q, H, D),
    lse (H, total_q), host offsets cu_q -> (lse2, dsum) (1, H, padded rows), each sequence's
    preprocess (padded to VARLEN_PAD) at its padded offset; rows no sequence owns are NaN (the
    kernel leaves them unwritten: compare the owned rows, varlen_owned_rows)."""
    from .prepost_launch import VARLEN_PAD, varlen_padded_offset, varlen_padded_rows
    total_q, h, _ = dout.shape
    rows = varlen_padded_rows(total_q, len(cu_q) - 1)
    lse2 = torch.full((1, h, rows), math.nan, dtype=torch.float32, device=dout.device)
    dsum = torch.full_like(lse2, math.nan)
    for b in range(len(cu_q) - 1):
        q0, q1 = cu_q[b], cu_q[b + 1]
        p, n = varlen_padded_offset(q0, b), -(-(q1 - q0) // VARLEN_PAD) * VARLEN_PAD
        lse_b = lse[None, :, q0:q1] if needs_lse else None
        l2, ds = preprocess(dout[None, q0:q1], out[None, q0:q1], lse_b, needs_lse, needs_dsum, lse_base, VARLEN_PAD)
        lse2[:, :, p:p + n], dsum[:, :, p:p + n] = l2, ds
    return lse2, dsum


def varlen_owned_rows(cu_q: list) -> list:
    """Row indices of the padded packed buffers that preprocess_varlen writes (sequence order)."""
    from .prepost_launch import VARLEN_PAD, varlen_padded_offset
    out = []
    for b in range(len(cu_q) - 1):
        p = varlen_padded_offset(cu_q[b], b)
        out += range(p, p + -(-(cu_q[b + 1] - cu_q[b]) // VARLEN_PAD) * VARLEN_PAD)
    return out


def accumulators(q, k, n_counters: int = 0, dq_shape: tuple | None = None):
    """dQ, dK, dV FP32 accumulators as views of one zeroed buffer: one memset kernel
    instead of three.  dQ is the (B, H, S_pad, D) accumulator of kernels/prepost_launch.py
    ("The dQ accumulator"), dK / dV are shaped like k.  Every view starts at a multiple of
    32 bytes (D >= 64 words per dQ row), above the kernels' 16-byte alignment assumption.
    n_counters > 0 (deterministic backward): a 4th view, n_counters Int32 turn counters
    after dV, zeroed by the same memset.  dq_shape: the dQ accumulator's shape (varlen:
    dq_acc_shape_varlen; default the dense dq_acc_shape of q)."""
    from .prepost_launch import dq_acc_shape
    qs = dq_acc_shape(*q.shape) if dq_shape is None else tuple(dq_shape)
    nq, nk = math.prod(qs), k.numel()
    buf = torch.zeros(nq + 2 * nk + n_counters, dtype=torch.float32, device=q.device)
    views = (buf[:nq].view(qs), buf[nq:nq + nk].view(k.shape), buf[nq + nk:nq + 2 * nk].view(k.shape))
    return views + (buf[nq + 2 * nk:].view(torch.int32),) if n_counters else views


def postprocess_dq(dq_acc, scale: float, dtype, s_q: int):
    """dq (B, S_q, H, D) from the dense dQ accumulator: reordered, times scale, one rounding."""
    from .prepost_launch import dq_from_acc
    src = dq_from_acc(dq_acc, s_q)
    dq = torch.empty(src.shape, dtype=dtype, device=dq_acc.device)
    torch.mul(src, scale, out=dq)
    return dq


def postprocess_dq_varlen(dq_acc, scale: float, dtype, cu_q: list):
    """dq (total_q, H, D) of packed sequences (host offsets cu_q) from the varlen accumulator."""
    from .prepost_launch import DQ_BAND, varlen_padded_offset
    _, h, _, d = dq_acc.shape
    dq = torch.empty(cu_q[-1], h, d, dtype=dtype, device=dq_acc.device)
    for b in range(len(cu_q) - 1):
        q0, q1 = cu_q[b], cu_q[b + 1]
        p = varlen_padded_offset(q0, b)
        bands = -(-(q1 - q0) // DQ_BAND) * DQ_BAND      # the sequence's rows, whole bands (its padding)
        dq[q0:q1] = postprocess_dq(dq_acc[:, :, p:p + bands], scale, dtype, q1 - q0)[0]
    return dq


def postprocess_dkv(dk_acc, dv_acc, scale: float, dtype):
    """(dk, dv): dK times scale, dV as is, one rounding each."""
    dk = torch.empty(dk_acc.shape, dtype=dtype, device=dk_acc.device)
    torch.mul(dk_acc, scale, out=dk)
    return dk, dv_acc.to(dtype)


def postprocess(dq_acc, dk_acc, dv_acc, scale: float, dtype, s_q: int):
    """Scale and cast in one kernel per gradient (was mul then .to: 5 kernels -> 3); the
    product is still formed in FP32 and rounded once to dtype, as before."""
    return (postprocess_dq(dq_acc, scale, dtype, s_q),) + postprocess_dkv(dk_acc, dv_acc, scale, dtype)
