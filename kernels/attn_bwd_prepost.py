"""Pre- and post-processing around kernels/attn_bwd_sm90.py (torch for now: measured cost
is reported in docs/NOTES_attn_bwd.md; a fused CuTe kernel replaces it when it pays).

preprocess: D = rowsum(dO o O) and LSE in log2 units, both (B, H_q, S_pad) FP32 with the
    tail padded so that a whole tile_m block can be TMA-loaded; LSE = -inf rows (no key
    visible) and padding become +inf, so the kernel's P = exp2(s - LSE) is exactly 0 there.
postprocess: FP32 accumulators -> dtype, times softmax_scale (the kernel accumulates
    gradients with respect to the unscaled score, see score_stages_bwd).
"""
import math

import torch

LOG2_E = math.log2(math.e)


def _pad(t: torch.Tensor, s_pad: int, value: float) -> torch.Tensor:
    b, h, s = t.shape
    outp = torch.full((b, h, s_pad), value, dtype=torch.float32, device=t.device)
    outp[:, :, :s] = t
    return outp


def preprocess(dout, out, lse, needs_lse: bool, needs_dsum: bool, lse_base: str, pad_to: int):
    b, s_q, h_q, _ = dout.shape
    s_pad = -(-s_q // pad_to) * pad_to
    if needs_lse:
        lse2 = lse.float() * (LOG2_E if lse_base == "e" else 1.0)
        lse2 = _pad(torch.where(torch.isneginf(lse2), torch.full_like(lse2, math.inf), lse2), s_pad, math.inf)
    else:
        lse2 = torch.zeros(b, h_q, s_pad, dtype=torch.float32, device=dout.device)
    if needs_dsum:
        dsum = _pad((dout.float() * out.float()).sum(-1).transpose(1, 2), s_pad, 0.0)
    else:
        dsum = torch.zeros(b, h_q, s_pad, dtype=torch.float32, device=dout.device)
    return lse2.contiguous(), dsum.contiguous()


def accumulators(q, k):
    z = lambda t: torch.zeros(t.shape, dtype=torch.float32, device=t.device)
    return z(q), z(k), z(k)


def postprocess(dq_acc, dk_acc, dv_acc, scale: float, dtype):
    return (dq_acc * scale).to(dtype), (dk_acc * scale).to(dtype), dv_acc.to(dtype)
