"""The torch launch of the attention backward's pre and post kernels (pure Python).

preprocess(dout, out, lse, ...) -> (lse2, dsum); postprocess(dq_acc, dk_acc, dv_acc, scale, dtype, s_q)
-> (dq, dk, dv); postprocess_dq(dq_acc, scale, dtype, s_q) -> dq; postprocess_dkv; the varlen forms.  The kernels are
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
    part: str = "dq"     # "dq": PostDqKernel (the dQ accumulator's order); "dkv": PostKernel (dK, dV)
    varlen: bool = False  # dq: packed sequences (PostDqVarlenKernel)

    def __post_init__(self):
        if self.dtype not in ("bf16", "f16") or self.part not in ("dq", "dkv") or (self.varlen and self.part != "dq"):
            raise ValueError(f"unsupported {self}")


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


# The dQ accumulator.  FP32 (B, H_q, S_pad, D) with S_pad = dq_acc_rows(S_q) (varlen: (1, H_q,
# varlen_padded_rows(total_q, B), D), sequence b from row varlen_padded_offset(cu_q[b], b)).  Each
# head's rows form bands of 16 rows (16 D words, contiguous); inside a band the values are in the
# wgmma accumulator fragment's order (dq_acc_word): the 16 bytes at (8-column step j, lane l) hold
# a thread's four values there, (row r, r + 8) x (column 8j + 2t, + 1) with r = l / 4, t = l % 4.
# Why: a query block of the backward (tile_m <= 128 rows of one head, bands whole) is then one
# contiguous range laid out exactly as the kernel's staged smem tile, so warp 1 adds a tile with
# one bulk reduction (cp.reduce.async.bulk), and the MMA threads stage it with one 16-byte store of
# four consecutive accumulator registers per step j (a warp's 32 stores fill 512 contiguous bytes:
# no bank conflicts, no padding words): half the stores of row-major 8-byte pairs, whose queue was
# the MMA warps' largest stall (docs/MEASURED.md, bwd-dq-order; FA4 stages its dQ the same way).
# Rows past S_q (up to the tile) take zero adds and are never read.  The post kernel (and
# dq_from_acc, the torch reference) put rows and columns back in order, as (B, S_q, H, D).
DQ_ROW_ALIGN = VARLEN_PAD   # S_pad: a multiple of every backward tile_m, as the varlen padding
DQ_BAND = 16                # rows per band of dq_acc_word


def dq_acc_word(row, col, d):
    """Word of a head's accumulator plane (S_pad x d) that holds (row, col); Python ints or the
    kernels' Int32 (shifts, bit operations and products by constants): band row >> 4, then
    16 x (8-column step j, lane 4 (row & 7) + (col >> 1 & 3)) chunks of 4 words, the word inside
    2 (row >> 3 & 1) + (col & 1).  A pair (col, col + 1), col even, is two adjacent words."""
    return ((row >> 4) * (DQ_BAND * d) + ((col >> 3) << 7) + ((row & 7) << 4) + ((col & 6) << 1)
            + (((row >> 3) & 1) << 1) + (col & 1))


def dq_acc_step(dr, dc, d):
    """dq_acc_word(row + dr, col + dc, d) - dq_acc_word(row, col, d) for a fragment's first (row,
    col) (row % 16 < 8) and steps dr, dc multiples of 8: the kernels add it as a constant to the
    thread's first word (one base register, not one per store)."""
    return (dr >> 4) * (DQ_BAND * d) + (((dr >> 3) & 1) << 1) + ((dc >> 3) << 7)


def dq_acc_rows(s_q: int) -> int:
    """Rows per head of the dense dQ accumulator."""
    return -(-s_q // DQ_ROW_ALIGN) * DQ_ROW_ALIGN


def dq_acc_shape(b: int, s_q: int, h_q: int, d: int) -> tuple:
    """The dense dQ accumulator's shape: (B, H_q, S_pad, D)."""
    return (b, h_q, dq_acc_rows(s_q), d)


def dq_acc_shape_varlen(total_q: int, n_seqs: int, h_q: int, d: int) -> tuple:
    """The packed dQ accumulator's shape: (1, H_q, rows, D), rows covering every sequence's
    padded offset and blocks (varlen_padded_rows)."""
    return (1, h_q, varlen_padded_rows(total_q, n_seqs), d)


def dq_from_acc(acc, s_q: int):
    """Torch: a dense dQ accumulator (B, H, S_pad, D) as (B, S_q, H, D) in order (no scale, no
    cast): the layout's reference, for the post kernel's oracle and the tests.  acc's rows start
    at a band (a varlen slice from a padded offset, its S_pad rows a multiple of 16)."""
    b, h, s_pad, d = acc.shape
    if s_q > s_pad:
        raise ValueError(f"dq_from_acc: the accumulator's {s_pad} rows do not cover S_q = {s_q}")
    words = dq_acc_index(s_pad, d).to(acc.device)
    return acc.reshape(b, h, s_pad * d)[..., words.view(-1)].view(b, h, s_pad, d)[:, :, :s_q].transpose(1, 2)


def dq_acc_index(rows: int, d: int):
    """Torch int64 (rows, D): the word of a head's accumulator plane that holds (row, col); rows a
    multiple of DQ_BAND (a plane, or a varlen sequence's slice from its padded offset)."""
    import torch
    if rows % DQ_BAND:
        raise ValueError(f"dq_acc_index: {rows} rows are not whole bands of {DQ_BAND}")
    r = torch.arange(rows).view(-1, 1)
    c = torch.arange(d).view(1, -1)
    return dq_acc_word(r, c, d)


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
    dq_acc: the FP32 dQ accumulator dq_acc_shape(B, S_q, H, D) that the same launch zeroes
    (PreZeroKernel)."""
    import torch
    from . import attn_bwd_prepost as reference
    b, s_q, h_q, d = dout.shape
    s_pad = -(-s_q // pad_to) * pad_to
    if dq_acc is not None and (tuple(dq_acc.shape) != dq_acc_shape(b, s_q, h_q, d) or dq_acc.dtype != torch.float32):
        raise ValueError(f"dq_acc must be FP32 {dq_acc_shape(b, s_q, h_q, d)} (the dQ accumulator of dout "
                         f"{tuple(dout.shape)}), got {dq_acc.dtype} {tuple(dq_acc.shape)}")
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


def postprocess_dq(dq_acc, scale: float, dtype, s_q: int):
    """Drop-in for attn_bwd_prepost.postprocess_dq: dq (B, S_q, H, D) in dtype from the dense
    accumulator (B, H, S_pad, D), bit-identical."""
    import torch
    b, h_q, s_pad, dp = dq_acc.shape
    d = dp
    if dq_acc.dtype != torch.float32 or s_pad != dq_acc_rows(s_q):
        raise ValueError(f"dq_acc must be FP32 {dq_acc_shape(b, s_q, h_q, d)} for S_q = {s_q}, got "
                         f"{dq_acc.dtype} {tuple(dq_acc.shape)}")
    dq = torch.empty(b, s_q, h_q, d, dtype=dtype, device=dq_acc.device)
    if dq.numel() == 0:
        return dq
    _check(dq_acc)
    _run(PostKey(_dtype_name(dtype), "dq"), (dq_acc, dq, float(scale)))
    return dq


def postprocess_dq_varlen(dq_acc, scale: float, dtype, cu_seqlens_q, max_seqlen_q: int, total_q: int):
    """dq (total_q, H, D) in dtype of packed sequences from the varlen accumulator (1, H,
    varlen_padded_rows(total_q, B), D) (sequence b from its padded offset)."""
    import torch
    _, h_q, rows, dp = dq_acc.shape
    d = dp
    batch = cu_seqlens_q.shape[0] - 1
    if dq_acc.dtype != torch.float32 or rows != varlen_padded_rows(total_q, batch):
        raise ValueError(f"dq_acc must be FP32 (1, {h_q}, {varlen_padded_rows(total_q, batch)}, {dp}), got "
                         f"{dq_acc.dtype} {tuple(dq_acc.shape)}")
    dq = torch.empty(1, total_q, h_q, d, dtype=dtype, device=dq_acc.device)
    if total_q == 0 or max_seqlen_q == 0:
        return dq[0]
    _check(dq_acc)
    _run(PostKey(_dtype_name(dtype), "dq", varlen=True),
         (dq_acc, dq, cu_seqlens_q, int(max_seqlen_q), float(scale)))
    return dq[0]


def postprocess_dkv(dk_acc, dv_acc, scale: float, dtype):
    """Drop-in for attn_bwd_prepost.postprocess_dkv: (dk, dv) in dtype, bit-identical."""
    import torch
    dk = torch.empty(dk_acc.shape, dtype=dtype, device=dk_acc.device)
    dv = torch.empty(dv_acc.shape, dtype=dtype, device=dv_acc.device)
    if dk_acc.numel() == 0:
        return dk, dv
    _check(dk_acc, dv_acc)
    if dk_acc.numel() % CHUNK32 or dv_acc.shape != dk_acc.shape:
        raise ValueError("postprocess_dkv needs numel % 8 == 0 and dv_acc.shape == dk_acc.shape")
    _run(PostKey(_dtype_name(dtype), "dkv"), (dk_acc, dv_acc, dk, dv, float(scale)))
    return dk, dv


def postprocess(dq_acc, dk_acc, dv_acc, scale: float, dtype, s_q: int):
    """(dq, dk, dv): postprocess_dq, then postprocess_dkv (two launches)."""
    return (postprocess_dq(dq_acc, scale, dtype, s_q),) + postprocess_dkv(dk_acc, dv_acc, scale, dtype)
