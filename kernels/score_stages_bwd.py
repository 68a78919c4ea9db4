"""Backward sides of the attention score stages (device code for kernels/attn_bwd_sm90.py).

The backward kernel recomputes the raw score s = q.k (FP32 accumulator, softmax scale not
applied) and needs two things per score from the stage:

* ``prob2(s0, s1, lse0, lse1, args)`` -> (p0, p1, a0, a1): the probability P that the
  forward used (it feeds dV = P^T dO) and an auxiliary factor ``a`` kept for the gradient;
* ``dscore2(p0, p1, dp0, dp1, dsum0, dsum1, a0, a1)`` -> (g0, g1): the gradient with
  respect to the raw score divided by the softmax scale (dQ = scale * g K and
  dK = scale * g^T Q; the kernel's epilogue/conversion applies ``scale`` once).

Methods work on lane pairs because the polynomial PTX blocks are two-lane (bf16x2).
A stage is keyed by content: ``bwd_side(mode, evaluator)`` returns a frozen dataclass.

The forward stage objects live in kernels/score_stages.py (forward engineer); the "poly"
sides call the asm.cute_ops blocks softcap_fwd/softcap_bwd and sigmoid_fwd_bwd with the
forward's argument conventions, so P is recomputed bit-identically to the forward.
"""

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

LOG2_E = math.log2(math.e)


@dsl_user_op
def tanh_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    """MUFU.TANH (tanh.approx.f32, max rel. error ~2^-11): the native softcap evaluator."""
    return Float32(llvm.inline_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)],
                                   "tanh.approx.f32 $0, $1;", "=f,f",
                                   has_side_effects=False, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


def _exp2(x):
    return cute.math.exp2(x, fastmath=True)  # ex2.approx.ftz: one MUFU.EX2


@dataclass(frozen=True)
class SoftmaxBwd:
    """dS = P (dP - D), D = rowsum(dO o O); P = exp2(s * scale*log2e - LSE*log2e)."""
    mode: str = "softmax"
    evaluator: str = "native"
    needs_lse: bool = True
    needs_dsum: bool = True

    def host_args(self, softmax_scale: float, softcap, sigmoid_bias):
        return (softmax_scale * LOG2_E, 0.0, 0.0)

    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args):
        p0 = _exp2(s0 * args[0] - lse0)
        p1 = _exp2(s1 * args[0] - lse1)
        return p0, p1, Float32(1.0), Float32(1.0)

    @cute.jit
    def dscore2(self, p0, p1, dp0, dp1, dsum0, dsum1, a0, a1):
        return p0 * (dp0 - dsum0), p1 * (dp1 - dsum1)


@dataclass(frozen=True)
class SoftcapBwd:
    """logit = c tanh(u), u = s*scale/c; P = softmax(logit); d logit/du = c (1 - tanh^2 u).

    g = P (dP - D) (1 - t^2): the c of the chain rule cancels the 1/c of u, leaving the
    softmax scale that the kernel applies at the end.
    """
    mode: str = "softcap"
    evaluator: str = "native"
    needs_lse: bool = True
    needs_dsum: bool = True

    @property
    def clamp_l(self) -> float:
        """L_c of program softcap_c50 from the coefficient table (the forward stage and the
        blocks read the same entry): |u| is clamped there.  Backward poly_split: not yet
        (a forward split stage's poly_pair(key // 8) is the rule to follow)."""
        from .score_stages import _program
        return float(_program("softcap_c50")["L_c"])


    def host_args(self, softmax_scale: float, softcap, sigmoid_bias):
        if self.evaluator == "native":
            return (softmax_scale / softcap, softcap * LOG2_E, 0.0)
        return (softmax_scale, softcap, 1.0 / softcap)

    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args):
        if cutlass.const_expr(self.evaluator == "poly"):
            return self._prob2_poly(s0, s1, lse0, lse1, args)
        t0 = tanh_approx(s0 * args[0])
        t1 = tanh_approx(s1 * args[0])
        p0 = _exp2(t0 * args[1] - lse0)
        p1 = _exp2(t1 * args[1] - lse1)
        return p0, p1, 1.0 - t0 * t0, 1.0 - t1 * t1

    @cute.jit
    def _prob2_poly(self, s0, s1, lse0, lse1, args):
        """The forward's residual form (score_stages.SoftcapStage, poly): logit = xc - c rho(u),
        xc = clamp(x, +-c L_c), u = xc/c, rho from block softcap_fwd; d logit/dx = 1 - rho'(u)
        from block softcap_bwd (the differentiated D3 program, packed bf16x2, no MUFU)."""
        from flash_attn_poly.asm import cute_ops
        from .score_stages import unpack_bf16x2
        x_max = args[1] * self.clamp_l
        x0 = cute.arch.fmin(cute.arch.fmax(s0 * args[0], -x_max), x_max)
        x1 = cute.arch.fmin(cute.arch.fmax(s1 * args[0], -x_max), x_max)
        u0 = x0 * args[2]
        u1 = x1 * args[2]
        r0, r1 = unpack_bf16x2(cutlass.Int32(cute_ops.softcap_fwd(u0, u1)))
        g0, g1 = unpack_bf16x2(cutlass.Int32(cute_ops.softcap_bwd(u0, u1)))
        p0 = _exp2((x0 - args[1] * r0) * LOG2_E - lse0)
        p1 = _exp2((x1 - args[1] * r1) * LOG2_E - lse1)
        return p0, p1, g0, g1

    @cute.jit
    def dscore2(self, p0, p1, dp0, dp1, dsum0, dsum1, a0, a1):
        return p0 * (dp0 - dsum0) * a0, p1 * (dp1 - dsum1) * a1


@dataclass(frozen=True)
class SigmoidBwd:
    """P = sigma(x), x = s*scale + b; no normalisation, no LSE, no D: g = dP sigma'(x)."""
    mode: str = "sigmoid"
    evaluator: str = "native"
    needs_lse: bool = False
    needs_dsum: bool = False

    program_n: int = 4096   # sigmoid_attn_n4096: the block evaluates sigma(x' - ln n)

    def host_args(self, softmax_scale: float, softcap, sigmoid_bias):
        if self.evaluator == "native":
            # exp2(-(s*scale + b) log2e) = exp2(-s*k0 - k1)
            return (softmax_scale * LOG2_E, sigmoid_bias * LOG2_E, 0.0)
        # x' = s*scale + b + ln n, exactly what the forward feeds block sigmoid_fwd
        return (softmax_scale, sigmoid_bias + math.log(self.program_n), 0.0)

    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args):
        if cutlass.const_expr(self.evaluator == "poly"):
            return self._prob2_poly(s0, s1, args)
        # sigma = 1 / (1 + 2^-x2): MUFU.EX2 + MUFU.RCP per score
        p0 = cute.arch.rcp_approx(1.0 + _exp2(-(s0 * args[0] + args[1])))
        p1 = cute.arch.rcp_approx(1.0 + _exp2(-(s1 * args[0] + args[1])))
        return p0, p1, p0 * (1.0 - p0), p1 * (1.0 - p1)

    @cute.jit
    def _prob2_poly(self, s0, s1, args):
        """Coupled 22-instruction block: bf16x2 P (the forward's values, for dV) and the
        factored derivative surrogate d sigma/dx' from one clamp/mask/Horner chain."""
        from flash_attn_poly.asm import cute_ops
        from .score_stages import unpack_bf16x2
        p, dp = cute_ops.sigmoid_fwd_bwd(s0 * args[0] + args[1], s1 * args[0] + args[1])
        p0, p1 = unpack_bf16x2(cutlass.Int32(p))
        d0, d1 = unpack_bf16x2(cutlass.Int32(dp))
        return p0, p1, d0, d1

    @cute.jit
    def dscore2(self, p0, p1, dp0, dp1, dsum0, dsum1, a0, a1):
        return dp0 * a0, dp1 * a1


_SIDES = {"softmax": SoftmaxBwd, "softcap": SoftcapBwd, "sigmoid": SigmoidBwd}


def bwd_side(mode: str, evaluator: str = "native"):
    """Backward side for a score stage (mode in softmax|softcap|sigmoid, evaluator native|poly)."""
    if mode not in _SIDES:
        raise ValueError(f"unknown mode {mode!r}")
    if evaluator not in ("native", "poly"):
        raise ValueError(f"unknown evaluator {evaluator!r}")
    return _SIDES[mode](evaluator="native" if mode == "softmax" else evaluator)
