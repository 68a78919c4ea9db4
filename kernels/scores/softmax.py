"""Softmax attention: P = softmax(x), x = softmax_scale * q.k.

Forward: the online softmax over exp2(x log2 e - max) (common.OnlineSoftmax); LSE = max + ln sum.
Backward: P = exp2(s scale log2 e - LSE log2 e), dS = P (dP - D), D = rowsum(dO o O).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .common import LOG2E, online_softmax_probs, pack_f32x2, write_p_pinned


def _exp2(x):
    return cute.math.exp2(x, fastmath=True)  # ex2.approx.ftz: one MUFU.EX2


class Score:
    has_lse = True
    uses_online_softmax = True
    needs_lse = True
    needs_dsum = True

    def __init__(self, spec):
        self.spec = spec
        self.evaluator = "native"

    # ------------------------------------------------------------------ host
    def fwd_scalars(self, scale: float, softcap, bias):
        return (scale * LOG2E, scale, 0.0, 0.0)

    def bwd_scalars(self, scale: float, softcap, bias):
        return (scale * LOG2E, 0.0, 0.0)

    # ------------------------------------------------------------------ forward
    def poly_pair(self, col_group: int) -> bool:
        return False

    @cute.jit
    def transform(self, acc_S: cute.Tensor, params, coords):
        pass

    @cute.jit
    def probs(self, acc_S, tOrP, state, params, is_first: cutlass.Constexpr[bool],
              masked: cutlass.Constexpr[bool], row_scale, is_bf16: cutlass.Constexpr[bool]):
        online_softmax_probs(acc_S, tOrP, state, params[0], is_first, row_scale, is_bf16)

    @cute.jit
    def write_p(self, acc_S, tOrP, is_bf16: cutlass.Constexpr[bool]):
        write_p_pinned(acc_S, tOrP, is_bf16)

    def lse_scale(self, params):
        return params[1]

    # ------------------------------------------------------------------ backward
    def uses_block(self, col_group) -> bool:
        return False

    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args, block: cutlass.Constexpr[bool],
              is_bf16: cutlass.Constexpr[bool], coords=None, rc=None):
        p0 = _exp2(s0 * args[0] - lse0)
        p1 = _exp2(s1 * args[0] - lse1)
        return pack_f32x2(p0, p1, is_bf16), p0, p1

    @cute.jit
    def dscore2(self, f0, f1, dp0, dp1, dsum0, dsum1):
        return f0 * (dp0 - dsum0), f1 * (dp1 - dsum1)
