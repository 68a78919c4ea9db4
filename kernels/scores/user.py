"""A user's score function (flash_attn_poly.score_mod.ScoreMod) inside the attention kernels.

Forward: x = softmax_scale * s for every score, y = score_mod(x, batch, head, q_idx, kv_idx,
seqlen_info, aux_tensors) on pairs of adjacent keys (two-value TensorSSAs), then the masks, then
the online softmax over y (LSE in y's units).  Backward: the recomputed y gives
P = exp2(y log2 e - LSE log2 e); the user's derivative gives f = score_mod_bwd(P, x, ...) =
P dy/dx, and dS = f (dP - D), the softmax rule through the score function.

q_idx and kv_idx are absolute positions; those of a tile's padding (past the sequence ends,
whose scores are masked or never stored) are clamped to the last valid one, so a score_mod may
index aux tensors by them.  A score_mod whose result is not a two-value FP32 TensorSSA fails
while the kernel is traced, with its name in the message.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .common import LOG2E, ScoreBase, acc_mn_view, pack_f32x2


def _exp2(x):
    return cute.math.exp2(x, fastmath=True)


def _check_result(y, what: str, name: str):
    if not isinstance(y, cute.TensorSSA):
        raise TypeError(f"{what} {name!r} must return a cute.TensorSSA of 2 Float32 values (its "
                        f"`scores` argument's shape and type), got {type(y).__name__}")
    if tuple(y.shape) != (2,):
        raise TypeError(f"{what} {name!r} returned shape {tuple(y.shape)}; it must keep its input's (2,)")
    if y.dtype is not Float32:
        y = y.to(Float32)
    return y


class Score(ScoreBase):
    EXP2_SCALE = 1        # params[1] = log2 e: transform leaves y = score_mod(x) in natural units

    def __init__(self, spec):
        super().__init__(spec)
        self.mod = spec.user

    # ------------------------------------------------------------------ host
    def fwd_scalars(self, scale: float, softcap, bias):
        return (scale, LOG2E, 0.0, 0.0)

    def bwd_scalars(self, scale: float, softcap, bias):
        return (scale, 0.0, 0.0)

    # ------------------------------------------------------------------ both directions
    def _indices(self, coords, r, c0: int, c1: int):
        """(batch, head, q_idx, kv_idx) TensorSSAs of elements (r, c0), (r, c1), positions
        clamped to the sequences."""
        q = cute.make_rmem_tensor((2,), Int32)
        kv = cute.make_rmem_tensor((2,), Int32)
        bh = cute.make_rmem_tensor((2,), Int32)
        hh = cute.make_rmem_tensor((2,), Int32)
        for i, c in ((0, c0), (1, c1)):
            q[i] = cutlass.min(coords.q_idx(r, c), coords.seqlen.seqlen_q - 1)
            kv[i] = cutlass.min(coords.kv_idx(r, c), coords.seqlen.seqlen_k - 1)
            bh[i] = coords.batch
            hh[i] = coords.head
        return bh.load(), hh.load(), q.load(), kv.load()

    def _aux(self, coords):
        return () if coords.aux is None else coords.aux

    def _fwd(self, x, coords, r, c0, c1):
        b, h, q, kv = self._indices(coords, r, c0, c1)
        y = self.mod.fwd(x, b, h, q, kv, coords.seqlen, self._aux(coords))
        return _check_result(y, "score_mod", self.mod.name)

    # ------------------------------------------------------------------ forward
    @cute.jit
    def transform(self, acc_S: cute.Tensor, params, coords):
        s_mn = acc_mn_view(acc_S)
        x = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            for g in cutlass.range_constexpr(cute.size(s_mn, mode=[1]) // 2):
                x[0] = s_mn[r, 2 * g] * params[0]
                x[1] = s_mn[r, 2 * g + 1] * params[0]
                x.store(self._fwd(x.load(), coords, r, 2 * g, 2 * g + 1))
                s_mn[r, 2 * g], s_mn[r, 2 * g + 1] = x[0], x[1]

    def lse_scale(self, params):
        return Float32(1.0)

    # ------------------------------------------------------------------ backward
    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args, block: cutlass.Constexpr[bool],
              is_bf16: cutlass.Constexpr[bool], coords=None, rc=None):
        r, c = rc
        x = cute.make_rmem_tensor((2,), Float32)
        x[0], x[1] = s0 * args[0], s1 * args[0]
        xs = x.load()
        y = self._fwd(xs, coords, r, c, c + 1)
        p = cute.make_rmem_tensor((2,), Float32)
        p[0] = _exp2(y[0] * LOG2E - lse0)
        p[1] = _exp2(y[1] * LOG2E - lse1)
        b, h, q, kv = self._indices(coords, r, c, c + 1)
        f = self.mod.bwd(p.load(), xs, b, h, q, kv, coords.seqlen, self._aux(coords))
        f = _check_result(f, "score_mod_bwd", self.mod.name)
        return pack_f32x2(p[0], p[1], is_bf16), f[0], f[1]
