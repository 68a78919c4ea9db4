"""Gemma-2 softcap: logit = c tanh(x / c), x = softmax_scale * q.k, then softmax over the logits.

Forward.
  native: t = tanh.approx(s * scale/c) (one MUFU), softmax over t with scale c log2 e, so each
          score costs two MUFU ops (tanh and ex2).
  poly:   the program (spec.program, a softcap-target entry of the table) evaluates the residual
          rho(u) = u - tanh(u) of u = x_c / c, x_c = clamp(x, +-c L_c), as a packed 16-bit block,
          and logit = x_c - c rho(u) (softcap_combine); an odd_u2 program clamps u on the FMA pipe
          (softcap_u2_pair) and logit = c u - c rho.  The tanh leaves the MUFU pipe; the ex2 stays.
          Pairs outside poly_split take logit = c tanh.approx(x / c) (MUFU).  Softmax then runs
          over logits (LSE scale 1).
  exp2 offload (native with an exp2_f32 program, FwdConfig.exp2_fma): every tanh on MUFU, and
          where the constant row max bounds the exp2 argument (fixed_max), FwdConfig.exp2_fma of
          every 8 key column groups take P = 2^a from the program's FP32 block instead of MUFU.EX2
          (common.OnlineSoftmax).  Its backward is native's: P differs by <= 7.5e-5 relative,
          below BF16 P's 2^-9.
  fixed_max (BF16, c <= 50): the row max is the constant m0 = c - 20 (fixed_lse), and
          transform_fixed hands the online step exp2 arguments directly: no row max, no O rescale.
          O is divided by the sum of the BF16-rounded P and the LSE takes the FP32 sum
          (common.write_p_fixed), so a row dominated by one key is as exact as with its own max.

Backward: P recomputed as the forward computed it, d logit/dx = 1 - tanh^2(u) (the c of the chain
rule cancels the 1/c of u) and dS = P (dP - D) d logit/dx.  Poly block columns by grad_rule:
  "value": 1 - t^2 with t = logit / c from the block's own logit (no second block);
  "block": the differentiated program's derivative block (seed B2; the program's "bwd" role).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .common import (LOG2E, ScoreBase, acc_mn_view, fma_sat, pack_f32x2, run_program, tanh_approx,
                     unpack_bf16x2, unpack_f16x2)

# the constant row max of fixed_max: largest p = e^HEADROOM; caps up to 50 keep the smallest
# p = e^(HEADROOM - 2c) >= e^-80 normal in FP32 and BF16 (flash_attn_poly.plan.FIXED_MAX_CAP)
FIXED_MAX_HEADROOM = 20.0


def _exp2(x):
    return cute.math.exp2(x, fastmath=True)  # ex2.approx.ftz: one MUFU.EX2


def softcap_combine(x, r, u, c, tail_u: float):
    """logit = A - c r (one FFMA) from the block's value r at u = x/c: A = x for a one-region
    program (tail_u == 0, residual form), and for a two-region one copysign(c, x) where
    |u| >= tail_u (the tail form's r is sign(u) (1 - tanh|u|); tail_u is the program's
    ProgramSpec.region_threshold_f32: |u| >= tail_u exactly where the block's f16 |u| >= thr).
    The forward and the backward both call it, so both compute the same logits
    (fit/runtime.softcap_logit)."""
    if tail_u:
        x = cutlass.select_(cute.math.abs(u) >= Float32(tail_u), cute.math.copysign(c, x), x)
    return x - c * r


def softcap_u2_alpha(u_scale, clamp_l: float):
    """alpha of softcap_u2_pair from u_scale = scale / c (one FMUL, no division)."""
    return u_scale * Float32(1.0 / (2.0 * clamp_l))


@cute.jit
def softcap_u2_pair(s0, s1, alpha, clamp_l: cutlass.Constexpr[float], program: cutlass.Constexpr):
    """Odd_u2 program on two raw scores: (u0, u1, rho0, rho1), u = fma_sat(s, alpha, 0.5) * 2L - L
    = clamp(s * scale / c, +-L) with one fma.rn.sat.f32 + one FFMA each (no FMNMX), alpha =
    softcap_u2_alpha(scale / c, L); rho = the program's f16x2 "fwd" block unpacked.  The
    forward and the backward both call this (their scale / c may differ in the last FP32 bit:
    the forward's is scale * (1/c) on the device, the backward's the host's); each forms its
    exp2 argument from u and rho in its own FP32 order."""
    two_l, lim = Float32(2.0 * clamp_l), Float32(clamp_l)
    u0 = fma_sat(s0, alpha, Float32(0.5)) * two_l - lim
    u1 = fma_sat(s1, alpha, Float32(0.5)) * two_l - lim
    r0, r1 = unpack_f16x2(Int32(run_program(program, "fwd", u0, u1)[0]))
    return u0, u1, r0, r1


class Score(ScoreBase):
    HAS_PROGRAM = True
    EXP2_SCALE = 1        # params[1]: c log2 e (native: tanh units), log2 e (poly: logits)

    def __init__(self, spec):
        super().__init__(spec)
        self.clamp_l, self.rho_f16, self.tail_u, self.u2 = 0.0, False, 0.0, False
        if self.evaluator == "poly":
            prog = self.program
            if prog.mode != "softcap" or "fwd" not in prog.roles:
                raise ValueError(f"softcap program {prog.name!r} has no forward block for the softcap "
                                 f"kernels (target {prog.target!r}, form {prog.form!r}, blocks {prog.roles})")
            if self.grad_rule == "block" and "bwd" not in prog.roles:
                raise ValueError(f"softcap program {prog.name!r} has no derivative block (no "
                                 f"{prog.name + '_grad'!r} entry of a lane-wise form): use grad_rule='value'")
            self.clamp_l = float(prog.clamp)
            self.rho_f16 = prog.f16
            self.tail_u = prog.region_threshold_f32
            self.u2 = prog.clamp_on_fma

    # ------------------------------------------------------------------ host
    def fwd_scalars(self, scale: float, softcap: float, bias):
        if self.evaluator == "native":
            return (scale / softcap, softcap * LOG2E, softcap, 0.0)
        return (scale, LOG2E, softcap, 1.0 / softcap)

    def bwd_scalars(self, scale: float, softcap: float, bias):
        # native: the forward's (scale/c, c log2e); poly: (scale, c, 1/c) as its params 0, 2, 3;
        # poly with an odd_u2 program: (scale/c, c, c log2e), so that its MUFU columns cost what
        # native's do (one FMUL before the tanh, none after) and its block columns take
        # t = u - rho, e = t c log2e (_e2_u2)
        if self.evaluator == "native":
            return (scale / softcap, softcap * LOG2E, 0.0)
        if self.u2:
            return (scale / softcap, softcap, softcap * LOG2E)
        return (scale, softcap, 1.0 / softcap)

    # ------------------------------------------------------------------ forward
    def fixed_lse(self, params):
        """m0 = c - FIXED_MAX_HEADROOM: the constant row max of FwdConfig.fixed_max (logits).

        Capped logits lie in [-c, c], so every p = exp(logit - m0) lies in [e^(20-2c), e^20],
        inside FP32's and BF16's normal range for c <= 50 (e^-80 > 2^-126): no row max and no O
        rescale are needed, and P keeps its relative precision (a float's rounding does not
        depend on its exponent).  Row sums stay below S_k e^20.  Not for FP16 P (its range is
        e^-17..e^11)."""
        return params[2] - FIXED_MAX_HEADROOM

    @cute.jit
    def transform_fixed(self, acc_S: cute.Tensor, params, coords):
        """fixed_max: acc_S <- a = (logit - m0) * log2(e), the exp2 argument (the online step's
        FFMA folded in).  native: a = tanh(s*scale/c) * c*log2e + k; poly pairs: a = logit*log2e + k;
        poly's native pairs: a = tanh(s*(scale/c)) * c*log2e + k (one FMUL fewer than logits)."""
        k = (FIXED_MAX_HEADROOM - params[2]) * LOG2E
        c_log2 = params[2] * LOG2E
        if cutlass.const_expr(self.evaluator == "native"):
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = tanh_approx(acc_S[i] * params[0]) * c_log2 + k
        else:
            self._transform_poly(acc_S, params, (c_log2, k))

    @cute.jit
    def transform(self, acc_S: cute.Tensor, params, coords):
        if cutlass.const_expr(self.evaluator == "native"):
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = tanh_approx(acc_S[i] * params[0])
        else:
            self._transform_poly(acc_S, params, None)

    @cute.jit
    def _transform_poly(self, acc_S: cute.Tensor, params, exp2_arg):
        """Poly score pair by pair: the program's block on poly_pair groups (an odd_u2 program
        clamping on the FMA pipe), c tanh.approx(s (scale/c)) on the others.  exp2_arg None:
        acc_S <- logits (transform); (c log2e, k): acc_S <- logit log2e + k (transform_fixed)."""
        if cutlass.const_expr(exp2_arg is not None):
            c_log2, k = exp2_arg
        s_mn = acc_mn_view(acc_S)
        x_max = params[2] * self.clamp_l
        u_scale = params[0] * params[3]   # scale/c once ((s*scale)*(1/c) per score cost an FMUL more)
        alpha = softcap_u2_alpha(u_scale, self.clamp_l)
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            for g in cutlass.range_constexpr(cute.size(s_mn, mode=[1]) // 2):
                # s_mn columns (2 adjacent, N/8 groups): flat column 2g, 2g+1 = group g
                if cutlass.const_expr(self.poly_pair(g) and self.u2):
                    u0, u1, r0, r1 = softcap_u2_pair(s_mn[r, 2 * g], s_mn[r, 2 * g + 1], alpha,
                                                     self.clamp_l, self.program)
                    if cutlass.const_expr(exp2_arg is None):
                        s_mn[r, 2 * g] = (params[2] * u0) - params[2] * r0
                        s_mn[r, 2 * g + 1] = (params[2] * u1) - params[2] * r1
                    else:   # a = (c u - c rho) log2e + k as two FFMAs: c log2e u + k, then - c log2e rho
                        s_mn[r, 2 * g] = (u0 * c_log2 + k) - c_log2 * r0
                        s_mn[r, 2 * g + 1] = (u1 * c_log2 + k) - c_log2 * r1
                elif cutlass.const_expr(self.poly_pair(g)):
                    self._pair_poly(s_mn, r, 2 * g, x_max, params)
                    if cutlass.const_expr(exp2_arg is not None):
                        for c in cutlass.range_constexpr(2 * g, 2 * g + 2):
                            s_mn[r, c] = s_mn[r, c] * LOG2E + k
                else:
                    for c in cutlass.range_constexpr(2 * g, 2 * g + 2):
                        if cutlass.const_expr(exp2_arg is None):
                            s_mn[r, c] = params[2] * tanh_approx(s_mn[r, c] * u_scale)
                        else:   # one FMUL fewer than through the logit
                            s_mn[r, c] = tanh_approx(s_mn[r, c] * u_scale) * c_log2 + k

    @cute.jit
    def _pair_poly(self, s_mn, r, c, x_max, params):
        x0 = cute.arch.fmin(cute.arch.fmax(s_mn[r, c] * params[0], -x_max), x_max)
        x1 = cute.arch.fmin(cute.arch.fmax(s_mn[r, c + 1] * params[0], -x_max), x_max)
        u0, u1 = x0 * params[3], x1 * params[3]
        rho = Int32(run_program(self.program, "fwd", u0, u1)[0])
        r0, r1 = unpack_f16x2(rho) if cutlass.const_expr(self.rho_f16) else unpack_bf16x2(rho)
        s_mn[r, c] = softcap_combine(x0, r0, u0, params[2], self.tail_u)
        s_mn[r, c + 1] = softcap_combine(x1, r1, u1, params[2], self.tail_u)

    def lse_scale(self, params):
        # native: max is in tanh units (logit = c*t); poly: max is already a logit
        return params[2] if self.evaluator == "native" else Float32(1.0)

    # ------------------------------------------------------------------ backward
    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args, block: cutlass.Constexpr[bool],
              is_bf16: cutlass.Constexpr[bool], coords=None, rc=None):
        if cutlass.const_expr(self.evaluator == "native"):
            # the forward's native P = exp2(t * c log2e - max), t = tanh.approx(s * scale/c)
            t0, t1 = tanh_approx(s0 * args[0]), tanh_approx(s1 * args[0])
            e0, e1, a0, a1 = t0 * args[1], t1 * args[1], 1.0 - t0 * t0, 1.0 - t1 * t1
        elif cutlass.const_expr(self.u2):
            if cutlass.const_expr(block):
                e0, e1, a0, a1 = self._e2_u2(s0, s1, args)
            else:   # MUFU column: as native, with c log2e in args[2]
                t0, t1 = tanh_approx(s0 * args[0]), tanh_approx(s1 * args[0])
                e0, e1, a0, a1 = t0 * args[2], t1 * args[2], 1.0 - t0 * t0, 1.0 - t1 * t1
        else:
            if cutlass.const_expr(block):
                l0, l1, a0, a1 = self._logit2_block(s0, s1, args)
            else:
                l0, l1, a0, a1 = self._logit2_mufu(s0, s1, args)
            e0, e1 = l0 * LOG2E, l1 * LOG2E   # poly: softmax over logits (LSE scale 1)
        p0, p1 = _exp2(e0 - lse0), _exp2(e1 - lse1)
        return pack_f32x2(p0, p1, is_bf16), p0 * a0, p1 * a1

    @cute.jit
    def _logit2_mufu(self, s0, s1, args):
        """Poly score, MUFU column: the forward's logit = c * tanh.approx((s*scale) * (1/c))."""
        t0 = tanh_approx(s0 * args[0] * args[2])
        t1 = tanh_approx(s1 * args[0] * args[2])
        return args[1] * t0, args[1] * t1, 1.0 - t0 * t0, 1.0 - t1 * t1

    @cute.jit
    def _e2_u2(self, s0, s1, args):
        """odd_u2 block column: (e0, e1, a0, a1), e = t c log2e the exp2 argument, a = 1 - t^2
        (value rule), t = u - rho = logit / c; u = clamp(s scale/c, +-L) as the forward's
        softcap_u2_pair (args[0] = scale/c)."""
        alpha = softcap_u2_alpha(args[0], self.clamp_l)
        u0, u1, r0, r1 = softcap_u2_pair(s0, s1, alpha, self.clamp_l, self.program)
        t0, t1 = u0 - r0, u1 - r1
        return t0 * args[2], t1 * args[2], 1.0 - t0 * t0, 1.0 - t1 * t1

    @cute.jit
    def _logit2_block(self, s0, s1, args):
        x_max = args[1] * self.clamp_l
        x0 = cute.arch.fmin(cute.arch.fmax(s0 * args[0], -x_max), x_max)
        x1 = cute.arch.fmin(cute.arch.fmax(s1 * args[0], -x_max), x_max)
        u0, u1 = x0 * args[2], x1 * args[2]
        f16 = self.program.f16
        unpack = unpack_f16x2 if f16 else unpack_bf16x2
        r0, r1 = unpack(Int32(run_program(self.program, "fwd", u0, u1)[0]))
        l0 = softcap_combine(x0, r0, u0, args[1], self.tail_u)
        l1 = softcap_combine(x1, r1, u1, args[1], self.tail_u)
        if cutlass.const_expr(self.grad_rule == "value"):
            t0, t1 = l0 * args[2], l1 * args[2]
            return l0, l1, 1.0 - t0 * t0, 1.0 - t1 * t1
        g0, g1 = unpack(Int32(run_program(self.program, "bwd", u0, u1)[0]))
        return l0, l1, g0, g1
