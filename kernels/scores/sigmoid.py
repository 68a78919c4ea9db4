"""Sigmoid attention: P = sigma(x + b), x = softmax_scale * q.k; no max, no normalisation.

Forward.
  native: p = 0.5 tanh.approx(0.5 x + 0.5 b) + 0.5: one MUFU and 2 FFMA per score; a masked
          score (-inf) gives tanh = -1, p = +0 exactly.
  poly:   the program's "fwd" block (17 instructions for the seed's BF16 D3 sigmoid_attn_n4096)
          computes sigma(x' - ln n) on two FP32 inputs and returns packed P, the PV A operand
          directly; it is fed x' = x + b + ln n, so any bias works (exact for b = -ln n).  Lanes
          whose x' is at or below the block's lower clamp params.lo (masked -inf among them)
          are zeroed afterwards with a select (the block would give its floor P(lo) > 0 to
          every such key).  Pairs outside poly_split run the native
          formula (params[2] = scale/2, params[3] = b/2).  The overlapped loop (tOrP=None) runs
          the block in two parts: its "head" in the score stage (the packed q kept in acc_S),
          then write_p's "tail" (P = q*q, one mul) after the PV wait: the same instructions and
          bits as the block.  An FP16 program's f16x2 P is converted to bf16x2 for BF16 inputs.
          The block clamps its input at the program's params.hi, where its P stops at P(hi) < 1
          (0.975 for the default: O missed the FlashAttention rule at score std 16).  So each
          thread keeps its block pairs' raw scores and their running max per row, and one branch
          per thread row and key block (taken only when that max's block input passes the plan's
          threshold) recomputes all of them as the MUFU columns do (one TANH per score); typical
          scores pay the max chain, one FFMA and the branch.
          The surrogate backward's coupled block keeps both clamps (tests/poly_reference).
Backward: g = dP sigma'(x + b) (no LSE, no D).  MUFU columns: the forward's p and sigma' =
p (1 - p).  The product rule's backward is the native score (the plan hands it the native spec:
the program's P error reached dV); a poly backward is the surrogate rule's: on its block columns
the coupled "fwd_bwd" block's P and its factored D4 derivative surrogate (seed B3).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .common import (ScoreBase, acc_as_frag_a, b32_as_f32, f16x2_to_bf16x2, f32_as_b32, frag_a_col_group,
                     frag_a_row, pack_f32x2, pin_f32, run_program, tanh_approx,
                     unpack_bf16x2, write_p_native, write_p_pinned)


@cute.jit
def sigma_tanh(s: Float32, k: Float32, c: Float32) -> Float32:
    """The MUFU route's sigma: 0.5 tanh(s k + c) + 0.5 (k, c = half the scale and half the shift:
    sigma(z) = 0.5 tanh(z / 2) + 0.5); a masked -inf gives +0 exactly, NaN stays NaN."""
    return tanh_approx(s * k + c) * 0.5 + 0.5


@cute.jit
def nan_through(p: Int32, s0: Float32, s1: Float32, f16: cutlass.Constexpr[bool]) -> Int32:
    """A NaN score gives a NaN P half, as torch's sigmoid does: the blocks clamp their inputs
    with min/max, which return the non-NaN operand, so a NaN in q or k would otherwise leave a
    finite P.  Sets the quiet-NaN bits of that half (f16 0x7E00 / bf16 0x7FC0); a few integer
    ops on the block pairs only."""
    m = Int32(0)
    if s0 != s0:
        m = m | Int32(0x7E00 if f16 else 0x7FC0)
    if s1 != s1:
        m = m | Int32(0x7E000000 if f16 else 0x7FC00000)
    return p | m


def check_dtype(spec, is_bf16: bool) -> None:
    """A sigmoid poly score writes its block's packed P straight into the PV / dV operand: a BF16
    program (bf16x2 P) needs BF16 inputs; an FP16 program converts to bf16x2 for BF16 inputs and
    keeps its f16x2 P for FP16 ones."""
    if spec.evaluator == "poly" and not is_bf16 and not spec.program.f16:
        raise ValueError(f"sigmoid/poly program {spec.program.name!r} writes packed bf16 P: BF16 inputs only "
                         "(FP16 inputs need an FP16 program)")


class Score(ScoreBase):
    has_lse = False
    uses_online_softmax = False
    needs_lse = False
    needs_dsum = False
    HAS_PROGRAM = True

    def __init__(self, spec):
        super().__init__(spec)
        self.program_n, self.p_f16 = 0, False
        # where fwd_scalars / bwd_scalars put the bias b (seq_params)
        self.FWD_BIAS_SLOTS = ((1, 0.5),) if self.evaluator == "native" else ((1, 1.0), (3, 0.5))
        self.BWD_BIAS_SLOTS = ((1, 0.5),) if self.evaluator == "native" else ((1, 1.0), (2, 0.5))
        if self.evaluator == "poly":
            prog = self.program
            roles = ("fwd", "head", "tail") + (("fwd_bwd",) if self.grad_rule == "surrogate" else ())
            if prog.mode != "sigmoid" or not set(roles) <= set(prog.roles):
                raise ValueError(f"sigmoid program {prog.name!r} has no PTX blocks {roles} for the sigmoid "
                                 f"kernels (target {prog.target!r}, form {prog.form!r}, blocks {prog.roles})"
                                 + ("; the derivative surrogate needs a _grad entry of form "
                                    "piecewise2_factored" if self.grad_rule == "surrogate" else ""))
            self.program_n = prog.n
            self.p_f16 = prog.f16
            self.clamp_lo = float(prog.param("lo"))
            # above this block input the pairs run on MUFU: the program's clamp, or lower where the
            # plan keeps the block to the inputs it is accurate on (ScoreSpec.mufu_above)
            hi = float(prog.param("hi"))
            self.mufu_above = hi if spec.mufu_above is None else min(float(spec.mufu_above), hi)

    def check_dtype(self, is_bf16: bool) -> None:
        check_dtype(self.spec, is_bf16)

    # ------------------------------------------------------------------ host
    def fwd_scalars(self, scale: float, softcap, bias: float):
        import math
        if self.evaluator == "native":
            return (0.5 * scale, 0.5 * bias, 0.0, 0.0)
        return (scale, bias + math.log(self.program_n), 0.5 * scale, 0.5 * bias)

    def bwd_scalars(self, scale: float, softcap, bias: float):
        import math
        if self.evaluator == "native":
            return (0.5 * scale, 0.5 * bias, 0.0)
        # block: x' = s*scale + (b + ln n) as the forward feeds its block; MUFU columns use
        # scale*0.5 (exact: power of two) and 0.5 b, the forward's params[2], params[3]
        return (scale, bias + math.log(self.program_n), 0.5 * bias)

    # ------------------------------------------------------------------ forward
    @cute.jit
    def probs(self, acc_S, tOrP, state, params, is_first: cutlass.Constexpr[bool],
              masked: cutlass.Constexpr[bool], row_scale, is_bf16: cutlass.Constexpr[bool]):
        carry = None
        if cutlass.const_expr(self.evaluator == "native"):
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = sigma_tanh(acc_S[i], params[0], params[1])
            if cutlass.const_expr(tOrP is not None):
                write_p_native(acc_S, tOrP, is_bf16)
        else:
            carry = self._probs_poly(acc_S, tOrP, params, is_bf16)   # masked -inf: below the clamp, P = +0
        return carry

    @cute.jit
    def _probs_poly(self, acc_S, tOrP, params, is_bf16: cutlass.Constexpr[bool]):
        """P of every pair into tOrP; tOrP=None (the overlapped loop): block pairs leave the head's
        packed q (P = q*q) in their even acc_S register, MUFU pairs FP32 P in both.  Block pairs
        whose inputs pass the clamp: _above_clamp."""
        src = acc_as_frag_a(acc_S)
        dst = None
        if cutlass.const_expr(tOrP is not None):
            dst = cute.recast_tensor(tOrP, Int32)
        saved, mx = {}, {}   # per thread row: its block pairs (i, s0, s1) and their largest score
        for i in cutlass.range_constexpr(cute.size(src) // 2):
            if cutlass.const_expr(self.poly_pair(frag_a_col_group(src.shape, 2 * i))):
                row = frag_a_row(src.shape, 2 * i)
                saved.setdefault(row, []).append((i, src[2 * i], src[2 * i + 1]))
                pair_max = cutlass.max(src[2 * i], src[2 * i + 1])
                mx[row] = pair_max if cutlass.const_expr(row not in mx) else cutlass.max(mx[row], pair_max)
                if cutlass.const_expr(tOrP is None):
                    src[2 * i] = b32_as_f32(self._pair_poly(src[2 * i], src[2 * i + 1], params, "head", is_bf16))
                else:
                    dst[i] = self._pair_poly(src[2 * i], src[2 * i + 1], params, "fwd", is_bf16)
            else:
                p0 = sigma_tanh(src[2 * i], params[2], params[3])
                p1 = sigma_tanh(src[2 * i + 1], params[2], params[3])
                if cutlass.const_expr(tOrP is None):
                    src[2 * i], src[2 * i + 1] = p0, p1
                else:
                    dst[i] = pack_f32x2(p0, p1, is_bf16)
        # per thread row: whether its block pairs took the MUFU branch (write_p's carry)
        return {row: self._above_clamp(src, dst, saved[row], mx[row], params, is_bf16) for row in saved}

    @cute.jit
    def _above_clamp(self, src, dst, saved, mx, params, is_bf16: cutlass.Constexpr[bool]):
        """One branch per thread row and key block: when the largest input among the row's block
        pairs in this thread passes mufu_above (the program's clamp, or the plan's lower threshold
        where the block's error exceeds a BF16 rounding of P), those pairs take P = 0.5 tanh(z / 2)
        + 0.5, z = x + b = 2 (s params[2] + params[3]), as the MUFU columns do (one TANH per score;
        the raw scores were kept, the head overwrote the even registers), packed in the program's
        16-bit type.  Head (dst None): P in the even register, where the head leaves q; the
        row's predicate is returned and write_p selects that P over the tail's q * q.  The first
        block (which writes P itself): the same P, converted here as write_p converts it.  Masked
        -inf gives +0 and NaN stays NaN, as on the MUFU columns.  Per row, not per thread, and
        one route: a row's P then depends on its own scores at this thread's key columns alone,
        not on the row it shares the thread with nor on whether its block is the first (both of
        which the tile's alignment, q_bottom, and packed GQA change), so those layouts give the
        same bits."""
        hot = mx * params[0] + params[1] > Float32(self.mufu_above)
        if hot:
            for i, s0, s1 in saved:
                p0 = sigma_tanh(s0, params[2], params[3])
                p1 = sigma_tanh(s1, params[2], params[3])
                p = pack_f32x2(p0, p1, not self.p_f16)
                if cutlass.const_expr(dst is None):
                    src[2 * i] = b32_as_f32(p)
                else:
                    dst[i] = self._to_operand(p, is_bf16)
        return hot

    @cute.jit
    def _pair_poly(self, s0, s1, params, role: cutlass.Constexpr[str], is_bf16: cutlass.Constexpr[bool] = True):
        """The program's block `role` ("fwd": P; "head": q, P = q*q) on one score pair.  A block
        input below the program's lower clamp (params.lo) gives P = +0 (the block would return
        its floor P(lo) > 0 for every such key: 4.4e-6 for the default, where the sigmoid goes to
        0); masked scores (-inf) are below it too."""
        x0 = s0 * params[0] + params[1]
        x1 = s1 * params[0] + params[1]
        p = Int32(run_program(self.program, role, x0, x1)[0])
        if cutlass.const_expr(role == "fwd"):
            p = self._to_operand(p, is_bf16)   # the full block's P -> the PV operand's type
        # zeros whatever the block returns (on q the tail's 0 * 0 = +0 gives the same P bits:
        # tests/test_asm_emulator.py)
        keep = Int32(0)
        if x0 > Float32(self.clamp_lo):
            keep = keep | Int32(0xFFFF)
        if x1 > Float32(self.clamp_lo):
            keep = keep | Int32(-65536)   # 0xFFFF0000
        p = p & keep
        # NaN after the zeroing (NaN > lo is false); q of "head" is NaN too: the tail's q * q keeps it
        return nan_through(p, s0, s1, False if self.p_f16 and is_bf16 and role == "fwd" else self.p_f16)

    @cute.jit
    def write_p(self, acc_S, tOrP, is_bf16: cutlass.Constexpr[bool], carry=None):
        """After the PV wait: P into tOrP from what probs(tOrP=None) left (carry: its per-row
        branch predicates)."""
        if cutlass.const_expr(self.evaluator == "native"):
            write_p_pinned(acc_S, tOrP, is_bf16)
        else:
            self._write_p_poly(acc_S, tOrP, is_bf16, carry)

    @cute.jit
    def _write_p_poly(self, acc_S, tOrP, is_bf16: cutlass.Constexpr[bool], hot):
        """Block pairs: the tail (one mul) on the head's q, or, in a row that took the branch
        (hot[row]), the branch's P as it is (one select); MUFU pairs: the pack.  Only the
        registers read are pinned: an odd register of a block pair holds a dead score, and
        pinning it would keep it live through the stage (+1 reg per block pair)."""
        src = acc_as_frag_a(acc_S)
        dst = cute.recast_tensor(tOrP, Int32)
        for i in cutlass.range_constexpr(cute.size(dst)):
            src[2 * i] = pin_f32(src[2 * i])
            if cutlass.const_expr(not self.poly_pair(frag_a_col_group(src.shape, 2 * i))):
                src[2 * i + 1] = pin_f32(src[2 * i + 1])
        for i in cutlass.range_constexpr(cute.size(dst)):
            if cutlass.const_expr(self.poly_pair(frag_a_col_group(src.shape, 2 * i))):
                held = f32_as_b32(src[2 * i])
                p = cutlass.select_(hot[frag_a_row(src.shape, 2 * i)], held,
                                    Int32(run_program(self.program, "tail", held)[0]))
                dst[i] = self._to_operand(p, is_bf16)
            else:
                dst[i] = pack_f32x2(src[2 * i], src[2 * i + 1], is_bf16)

    @cute.jit
    def _to_operand(self, p, is_bf16: cutlass.Constexpr[bool]):
        """A packed P in the program's 16-bit type -> the PV operand's type."""
        if cutlass.const_expr(self.p_f16 and is_bf16):
            p = f16x2_to_bf16x2(p)
        return p

    def lse_scale(self, params):
        return None

    # ------------------------------------------------------------------ backward
    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args, block: cutlass.Constexpr[bool],
              is_bf16: cutlass.Constexpr[bool], coords=None, rc=None):
        if cutlass.const_expr(block):   # the surrogate (config.check_bwd: the only poly backward)
            p, dp = run_program(self.program, "fwd_bwd", s0 * args[0] + args[1], s1 * args[0] + args[1])
            d0, d1 = unpack_bf16x2(nan_through(Int32(dp), s0, s1, False))
            return nan_through(Int32(p), s0, s1, False), d0, d1
        k0, k1 = args[0], args[1]
        if cutlass.const_expr(self.evaluator == "poly"):
            k0, k1 = args[0] * 0.5, args[2]
        p0 = sigma_tanh(s0, k0, k1)
        p1 = sigma_tanh(s1, k0, k1)
        # sigma' = p (1 - p) as p - p * p: one FFMA (rounded once) where p * (1 - p) took an FADD
        # and an FMUL
        return pack_f32x2(p0, p1, is_bf16), p0 - p0 * p0, p1 - p1 * p1

    @cute.jit
    def dscore2(self, f0, f1, dp0, dp1, dsum0, dsum1):
        return f0 * dp0, f1 * dp1
