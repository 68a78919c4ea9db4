"""The torch launch of the attention backward's pre and post kernels (pure Python).

preprocess(dout, out, lse, ...) -> (lse2, dsum); postprocess(dq_acc, dk_acc, dv_acc, scale, dtype)
-> (dq, dk, dv); postprocess_dq(dq_acc, scale, dtype) -> dq.  The kernels are
kernels/attn_bwd_prepost_sm90.py (same contract as the torch reference kernels/attn_bwd_prepost.py,
the tests' oracle); they come from kernels/compile_cache.py, and their module is imported only
when a build is missing.  Limits: tensors 16-byte aligned (LSE 4), contiguous, element counts
< 2**31 (32-bit indexing); the entries check and raise otherwise.  Empty tensors and an O whose
dtype differs from dO go to the torch reference.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from . import compile_cache

CHUNK32 = 8          # FP32 accumulator values per post chunk (two 16-byte loads)


@dataclass(frozen=True)
class PreKey:
    dtype: str           # "bf16" | "f16"
    head_dim: int        # 64 | 128 | 256
    needs_lse: bool
    needs_dsum: bool
    lse_base: str = "e"  # "e": multiply by log2(e); "2": as is
    zero_dq: bool = False  # PreZeroKernel: also zero the rows of the dQ accumulator
    varlen: bool = False   # PreVarlenKernel: packed sequences into the padded packed buffers

    def __post_init__(self):
        if self.head_dim not in (64, 128, 256) or self.dtype not in ("bf16", "f16") or self.lse_base not in ("e", "2"):
            raise ValueError(f"unsupported {self}")
        if self.zero_dq and self.varlen:
            raise ValueError(f"unsupported {self}: zero_dq serves the head_loop backward, which has no varlen build")


@dataclass(frozen=True)
class PostKey:
    dtype: str           # output dtype "bf16" | "f16"


# Packed sequences (the varlen backward): the pre kernel writes lse2 and dsum of sequence b from
# row varlen_padded_offset(cu_q[b], b) of a (1, H, varlen_padded_rows(total_q, B)) buffer, its
# rows [S_b, ceil(S_b / VARLEN_PAD) * VARLEN_PAD) padded with +inf / 0, so the main kernel's
# query blocks (tile_m 64 or 128, both dividing VARLEN_PAD) past a sequence's end see P = 0
# instead of the next sequence's statistics.  Offset b is at most cu_q[b] + b * VARLEN_PAD and
# more than cu_q[b] + (b - 1) * VARLEN_PAD, so offset b + 1 >= offset b + (S_b // PAD + 1) * PAD:
# the padded blocks of consecutive sequences never overlap (flash-attn's padded offsets).  The
# kernel computes the same formula from cu_seqlens_q (kernels/attn_bwd_prepost_sm90.py,
# kernels/attn_bwd_sm90.py); these are the host's and the tests' copies.
VARLEN_PAD = 128


def varlen_padded_offset(cu_q_b: int, b: int) -> int:
    """First row of sequence b in the padded packed LSE / dsum buffers."""
    return (cu_q_b + b * VARLEN_PAD) // VARLEN_PAD * VARLEN_PAD


def varlen_padded_rows(total_q: int, batch: int) -> int:
    """Rows of the padded packed buffers: the offset a sequence `batch` would have (it covers
    the last sequence's padded blocks)."""
    return varlen_padded_offset(total_q, batch)


def _build(key):
    from . import attn_bwd_prepost_sm90
    return attn_bwd_prepost_sm90.build(key)


def get_compiled(key):
    """The cached build of a PreKey / PostKey (kernels/compile_cache.py)."""
    return compile_cache.compiled("attn_bwd_prepost", key, functools.partial(_build, key))


def _dtype_name(t) -> str:
    import torch
    return {torch.bfloat16: "bf16", torch.float16: "f16"}[t]


def _check(*ts, align: int = 16):
    for t in ts:
        if not t.is_contiguous() or t.data_ptr() % align or t.numel() >= 2**31:
            raise ValueError(f"attn_bwd_prepost_sm90 needs contiguous {align}-byte aligned tensors "
                             f"with < 2**31 elements; got shape {tuple(t.shape)} stride {t.stride()}")


def _run(key, args, scalars=()):
    """Launch: torch tensors and floats straight into the tvm-ffi build."""
    get_compiled(key)(*args, *scalars)


def preprocess(dout, out, lse, needs_lse: bool, needs_dsum: bool, lse_base: str, pad_to: int,
               dq_acc=None):
    """Drop-in for attn_bwd_prepost.preprocess: (lse2, dsum), both (B, H, S_pad) FP32.
    dq_acc: an FP32 tensor shaped like dout that the same launch zeroes (PreZeroKernel)."""
    import torch
    from . import attn_bwd_prepost as reference
    b, s_q, h_q, d = dout.shape
    s_pad = -(-s_q // pad_to) * pad_to
    if dq_acc is not None and (dq_acc.shape != dout.shape or dq_acc.dtype != torch.float32):
        raise ValueError(f"dq_acc must be FP32 shaped like dout {tuple(dout.shape)}, got "
                         f"{dq_acc.dtype} {tuple(dq_acc.shape)}")
    if dout.numel() == 0 or (needs_dsum and out.dtype != dout.dtype):
        # empty grid / mixed-precision O (e.g. FP32): the torch reference handles these
        return reference.preprocess(dout, out, lse, needs_lse, needs_dsum, lse_base, pad_to, dq_acc)
    if not (needs_lse or needs_dsum or dq_acc is not None):
        # nothing to compute (sigmoid): one placeholder buffer, left uninitialised; the main
        # kernel loads it with the Q tile and never reads it (stage.needs_lse / needs_dsum are
        # compile-time False), so no memset launch
        buf = torch.empty(b, h_q, s_pad, dtype=torch.float32, device=dout.device)
        return buf, buf
    lse2 = torch.empty(b, h_q, s_pad, dtype=torch.float32, device=dout.device)
    dsum = torch.empty_like(lse2)
    out = out.contiguous() if needs_dsum else dout    # not read: any tensor of the right type
    lse = lse.float().contiguous() if needs_lse else lse2
    _check(dout, out)
    _check(lse, align=4)
    key = PreKey(_dtype_name(dout.dtype), d, bool(needs_lse), bool(needs_dsum), lse_base, dq_acc is not None)
    if dq_acc is None:
        _run(key, (dout, out, lse, lse2, dsum))
    else:
        _check(dq_acc)
        _run(key, (dout, out, lse, lse2, dsum, dq_acc))
    return lse2, dsum


def preprocess_varlen(dout, out, lse, cu_seqlens_q, max_seqlen_q: int, needs_lse: bool, needs_dsum: bool,
                      lse_base: str = "e"):
    """(lse2, dsum), both (1, H, varlen_padded_rows(total_q, B)) FP32, of packed dout / out
    (total_q, H, D) and lse (H, total_q): sequence b's rows start at its padded offset, their
    tail up to a multiple of VARLEN_PAD rows is +inf (lse2) / 0 (dsum); rows between the
    sequences' padded blocks are left unwritten (no query block reads them).  Unneeded
    buffers are zeros (sigmoid: one uninitialised placeholder, never read)."""
    import torch
    total_q, h_q, d = dout.shape
    batch = cu_seqlens_q.shape[0] - 1
    rows = varlen_padded_rows(total_q, batch)
    if not (needs_lse or needs_dsum):
        buf = torch.empty(1, h_q, rows, dtype=torch.float32, device=dout.device)
        return buf, buf
    lse2 = torch.empty(1, h_q, rows, dtype=torch.float32, device=dout.device)
    dsum = torch.empty_like(lse2)
    if total_q == 0 or max_seqlen_q == 0:
        return lse2, dsum
    if needs_dsum and out.dtype != dout.dtype:
        raise ValueError(f"preprocess_varlen: out must have dout's dtype {dout.dtype}, got {out.dtype}")
    dout = dout.contiguous()
    out = out.contiguous() if needs_dsum else dout    # not read: any tensor of the right type
    lse = lse.float().contiguous() if needs_lse else lse2[0]
    _check(dout, out)
    _check(lse, align=4)
    key = PreKey(_dtype_name(dout.dtype), d, bool(needs_lse), bool(needs_dsum), lse_base, varlen=True)
    _run(key, (dout[None], out[None], lse[None], lse2, dsum, cu_seqlens_q, int(max_seqlen_q)))
    return lse2, dsum


def postprocess(dq_acc, dk_acc, dv_acc, scale: float, dtype):
    """Drop-in for attn_bwd_prepost.postprocess: (dq, dk, dv) in dtype, bit-identical."""
    import torch
    if dq_acc.numel() == 0 or dk_acc.numel() == 0:
        from . import attn_bwd_prepost as reference
        return reference.postprocess(dq_acc, dk_acc, dv_acc, scale, dtype)
    dq = torch.empty(dq_acc.shape, dtype=dtype, device=dq_acc.device)
    dk = torch.empty(dk_acc.shape, dtype=dtype, device=dk_acc.device)
    dv = torch.empty(dv_acc.shape, dtype=dtype, device=dv_acc.device)
    _check(dq_acc, dk_acc, dv_acc)
    if dq_acc.numel() % CHUNK32 or dk_acc.numel() % CHUNK32 or dv_acc.shape != dk_acc.shape:
        raise ValueError("postprocess needs numel % 8 == 0 and dv_acc.shape == dk_acc.shape")
    _run(PostKey(_dtype_name(dtype)), (dq_acc, dk_acc, dv_acc, dq, dk, dv), (float(scale),))
    return dq, dk, dv


_DUMMY: dict = {}


def postprocess_dq(dq_acc, scale: float, dtype):
    """dQ alone (head_loop backward: dK, dV leave the main kernel in dtype): the post kernel
    with one-chunk placeholder K/V segments (2 idle blocks), so there is one compiled post."""
    import torch
    if dq_acc.numel() == 0 or dq_acc.numel() % CHUNK32:
        from . import attn_bwd_prepost as reference
        return reference.postprocess_dq(dq_acc, scale, dtype)
    key = (dq_acc.device, dtype)
    if key not in _DUMMY:
        _DUMMY[key] = (torch.zeros(1, 1, 1, CHUNK32, dtype=torch.float32, device=dq_acc.device),
                       torch.empty(1, 1, 1, CHUNK32, dtype=dtype, device=dq_acc.device),
                       torch.empty(1, 1, 1, CHUNK32, dtype=dtype, device=dq_acc.device))
    acc, ok, ov = _DUMMY[key]
    dq = torch.empty(dq_acc.shape, dtype=dtype, device=dq_acc.device)
    _check(dq_acc)
    _run(PostKey(_dtype_name(dtype)), (dq_acc, acc, acc, dq, ok, ov), (float(scale),))
    return dq
