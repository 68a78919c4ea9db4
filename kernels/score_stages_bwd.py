"""Backward sides of the attention score stages (device code for kernels/attn_bwd_sm90.py).

The backward kernel recomputes the raw score s = q.k (FP32 accumulator, softmax scale not
applied) and needs two things per score pair (same key, two adjacent queries) from the stage:

* ``prob2(s0, s1, lse0, lse1, args, block, is_bf16)`` -> (p, f0, f1): ``p`` the probability
  pair the forward used, packed 16-bit (the A operand of dV += P^T dO), and the dS factor
  ``f`` in FP32, so that the kernel keeps one FP32 value per score across the dP wgmma
  instead of two (P and an auxiliary derivative: 32 more registers per thread at
  tile 128x64, which made the softcap backward spill 36-43 STL);
* ``dscore2(f0, f1, dp0, dp1, dsum0, dsum1)`` -> (g0, g1): the gradient with respect to the
  raw score divided by the softmax scale (the kernel's conversion applies ``scale`` once).

  softmax  f = P            g = f (dP - D)
  softcap  f = P dlogit/dx  g = f (dP - D)     (P (dP - D) dlogit/dx, regrouped)
  sigmoid  f = dsigma/dx    g = f dP           (no D, no LSE)

Poly split: a poly stage evaluates the key column group g = key_index // 8 with the block
when ``score_stages.poly_pair(poly_split, g)`` holds and with MUFU otherwise, exactly as the
forward stage does (same function, same split: ``bwd_side_for(forward_stage)``), so P is
recomputed bit for bit.  ``block`` (compile time) says which evaluator a call runs; the
kernel decides it per key row.  MUFU formulas are the forward's, operand for operand.
"""

import functools
import math
from dataclasses import dataclass, field

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .score_stages import (DEFAULT_POLY_SPLIT, DEFAULT_PROGRAM, _check_split, _cute_ops, check_program,
                           check_sigmoid_dtype, pack_f32x2, poly_pair, program_spec, softcap_combine,
                           softcap_u2_alpha, softcap_u2_pair, tanh_approx, unpack_bf16x2, unpack_f16x2)

LOG2_E = math.log2(math.e)
# sigmoid poly block columns: sigma' from the block's P ("product") or the B3 surrogate
SIGMOID_GRAD_RULES = ("product", "surrogate")
# softcap poly block columns: d logit/dx = 1 - (logit/c)^2 from the block's logit ("value",
# two FP32 ops) or from the differentiated program's block ("block", seed B2)
SOFTCAP_GRAD_RULES = ("value", "block")


def default_softcap_grad(program) -> str:
    """The softcap poly side's default rule: "value" for FP16 programs, "block" for the seed's
    BF16 one (tests/poly_reference.py applies the same rule)."""
    return "value" if program_spec(program).f16 else "block"


def _exp2(x):
    return cute.math.exp2(x, fastmath=True)  # ex2.approx.ftz: one MUFU.EX2


@dataclass(frozen=True)
class SoftmaxBwd:
    """dS = P (dP - D), D = rowsum(dO o O); P = exp2(s * scale*log2e - LSE*log2e)."""
    evaluator: str = "native"
    mode = "softmax"
    needs_lse = True
    needs_dsum = True

    def uses_block(self, col_group) -> bool:
        return False

    def host_args(self, softmax_scale: float, softcap, sigmoid_bias):
        return (softmax_scale * LOG2_E, 0.0, 0.0)

    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args, block: cutlass.Constexpr[bool],
              is_bf16: cutlass.Constexpr[bool]):
        p0 = _exp2(s0 * args[0] - lse0)
        p1 = _exp2(s1 * args[0] - lse1)
        return pack_f32x2(p0, p1, is_bf16), p0, p1

    @cute.jit
    def dscore2(self, f0, f1, dp0, dp1, dsum0, dsum1):
        return f0 * (dp0 - dsum0), f1 * (dp1 - dsum1)


class _PolySplit:
    """Split bookkeeping shared by the poly-capable sides (fields evaluator, poly_split)."""

    def _init_split(self):
        split = self.poly_split
        if split is None:
            split = DEFAULT_POLY_SPLIT[self.mode] if self.evaluator == "poly" else (0, 1)
        object.__setattr__(self, "poly_split", _check_split(split))

    def uses_block(self, col_group):
        """Block or MUFU for key column group `col_group` (Python int or runtime Int32):
        the forward stage's rule, score_stages.poly_pair."""
        return self.evaluator == "poly" and poly_pair(self.poly_split, col_group)


@dataclass(frozen=True)
class SoftcapBwd(_PolySplit):
    """logit = c tanh(u), u = s*scale/c; P = softmax(logit); d logit/dx = 1 - tanh^2 u.

    The c of the chain rule cancels the 1/c of u, leaving the softmax scale that the kernel
    applies at the end.  poly block columns: the forward's residual form logit = xc - c rho(u),
    xc = clamp(x, +-c L_c), u = xc/c, rho from block softcap_fwd; d logit/dx by grad_rule:
      "block": 1 - rho'(u) from the differentiated program's block softcap_bwd (seed B2);
      "value": 1 - t^2 with t = logit/c, the tanh identity applied to the block's own logit
        (two FP32 ops, no second block).  clamp_l is the table's L_c.
    An odd_u2 program (fit/softcap_odd.py, the default) has no derivative block: value rule
    only, u and rho from score_stages.softcap_u2_pair, t = u - rho (_e2_u2).
    """
    evaluator: str = "native"
    poly_split: tuple = None
    program: object = DEFAULT_PROGRAM["softcap"]     # a ProgramSpec after __post_init__
    # None: default_softcap_grad(program): "value" for the FP16 programs since 2026-11-30 (H200,
    # 7537f4e, bench/results/poly_split_grad.md: with the two-region program at 1/16 the
    # backward takes 0.853 ms vs "block"'s 0.877, CPU SASS 7 STL vs 16 in the head-loop build,
    # same gradient error, 1.03x native; its d logit/dx is within 7.3e-4 of 1 - tanh^2 up to
    # the clamp, the derivative block's 3.4e-3); "block" for the seed's BF16 program (B2 as
    # the seed builds it; the value rule spills 5 words there at 1/2, CPU SASS)
    grad_rule: str = None
    clamp_l: float = field(default=0.0, init=False)
    tail_u: float = field(default=0.0, init=False)    # two-region program: FP32 |u| threshold
    u2: bool = field(default=False, init=False)       # odd_u2 program (score_stages.softcap_u2_pair)
    mode = "softcap"
    needs_lse = True
    needs_dsum = True

    def __post_init__(self):
        object.__setattr__(self, "program", program_spec(self.program))
        self._init_split()
        if self.grad_rule is None:
            object.__setattr__(self, "grad_rule", default_softcap_grad(self.program))
        if self.grad_rule not in SOFTCAP_GRAD_RULES:
            raise ValueError(f"softcap grad_rule must be one of {SOFTCAP_GRAD_RULES}, got {self.grad_rule!r}")
        if self.evaluator == "poly":
            prog = self.program
            check_program(prog, "softcap", ("fwd",))
            object.__setattr__(self, "clamp_l", float(prog.clamp))
            if "bwd" not in prog.roles and self.grad_rule == "block":
                raise ValueError(f"softcap program {prog.name!r} has no derivative block (no "
                                 f"{prog.name + '_grad'!r} entry of a lane-wise form): use grad_rule='value'")
            object.__setattr__(self, "tail_u", prog.region_threshold_f32)
            object.__setattr__(self, "u2", prog.clamp_on_fma)

    def host_args(self, softmax_scale: float, softcap, sigmoid_bias):
        # native: the forward's (scale/c, c log2e); poly: (scale, c, 1/c) as its params 0, 2, 3;
        # poly with an odd_u2 program: (scale/c, c, c log2e), so that its MUFU columns cost what
        # native's do (one FMUL before the tanh, none after) and its block columns take
        # t = u - rho, e = t c log2e (_e2_u2)
        if self.evaluator == "native":
            return (softmax_scale / softcap, softcap * LOG2_E, 0.0)
        if self.u2:
            return (softmax_scale / softcap, softcap, softcap * LOG2_E)
        return (softmax_scale, softcap, 1.0 / softcap)

    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args, block: cutlass.Constexpr[bool],
              is_bf16: cutlass.Constexpr[bool]):
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
            e0, e1 = l0 * LOG2_E, l1 * LOG2_E   # poly stage: softmax over logits (LSE scale 1)
        p0 = _exp2(e0 - lse0)
        p1 = _exp2(e1 - lse1)
        return pack_f32x2(p0, p1, is_bf16), p0 * a0, p1 * a1

    @cute.jit
    def _logit2_mufu(self, s0, s1, args):
        """Poly stage, MUFU column: the forward's logit = c * tanh.approx((s*scale) * (1/c))."""
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
        r0, r1 = unpack(Int32(_cute_ops().run_program(self.program, "fwd", u0, u1)[0]))
        l0 = softcap_combine(x0, r0, u0, args[1], self.tail_u)
        l1 = softcap_combine(x1, r1, u1, args[1], self.tail_u)
        if cutlass.const_expr(self.grad_rule == "value"):
            t0, t1 = l0 * args[2], l1 * args[2]
            return l0, l1, 1.0 - t0 * t0, 1.0 - t1 * t1
        g0, g1 = unpack(Int32(_cute_ops().run_program(self.program, "bwd", u0, u1)[0]))
        return l0, l1, g0, g1

    @cute.jit
    def dscore2(self, f0, f1, dp0, dp1, dsum0, dsum1):
        return f0 * (dp0 - dsum0), f1 * (dp1 - dsum1)


@dataclass(frozen=True)
class SigmoidBwd(_PolySplit):
    """P = sigma(x + b), x = s*scale; no normalisation, no LSE, no D: g = dP sigma'(x + b).

    MUFU (native, and poly-stage MUFU columns): the forward's p = 0.5 tanh.approx(0.5 x +
    0.5 b) + 0.5 (one MUFU.TANH, not EX2 + RCP) and sigma' = p (1 - p).  poly block columns,
    by grad_rule:
      "product" (default): the program's forward block ("fwd", 17 instructions for the BF16
        sigmoid_attn_n4096) on x' = x + b + ln n gives packed P (the forward's values, written
        to the dV operand) and sigma' = p (1 - p) in FP32 from those P (one FFMA per score);
      "surrogate": the coupled block ("fwd_bwd", 22 instructions for sigmoid_attn_n4096 and its
        _grad entry) gives the same P and the factored D4 derivative surrogate d sigma/dx'
        (seed B3).  Its dQ/dK error against the exact derivative is 8-25x native's
        (bench/results/accuracy.md, 96ac86f), the product rule's is P's own.
    program_n (n) comes from the program's spec.
    """
    evaluator: str = "native"
    poly_split: tuple = None
    program: object = DEFAULT_PROGRAM["sigmoid"]     # a ProgramSpec after __post_init__
    grad_rule: str = "product"
    program_n: int = field(default=0, init=False)
    mode = "sigmoid"
    needs_lse = False
    needs_dsum = False

    def __post_init__(self):
        object.__setattr__(self, "program", program_spec(self.program))
        self._init_split()
        if self.grad_rule not in SIGMOID_GRAD_RULES:
            raise ValueError(f"sigmoid grad_rule must be one of {SIGMOID_GRAD_RULES}, got {self.grad_rule!r}")
        if self.evaluator == "poly":
            check_program(self.program, "sigmoid", ("fwd",))
            object.__setattr__(self, "program_n", self.program.n)
            if self.grad_rule == "surrogate" and "fwd_bwd" not in self.program.roles:
                name = self.program.name
                raise ValueError(f"sigmoid program {name!r}: only grad_rule='product' (the derivative "
                                 f"surrogate needs a {name + '_grad'!r} entry of form piecewise2_factored, "
                                 f"fitted for the BF16 programs only)")

    def check_dtype(self, is_bf16: bool) -> None:
        check_sigmoid_dtype(self.evaluator, self.program, is_bf16)

    def host_args(self, softmax_scale: float, softcap, sigmoid_bias):
        if self.evaluator == "native":
            return (0.5 * softmax_scale, 0.5 * sigmoid_bias, 0.0)
        # block: x' = s*scale + (b + ln n) as the forward feeds sigmoid_fwd; MUFU columns use
        # scale*0.5 (exact: power of two) and 0.5 b, the forward's params[2], params[3]
        return (softmax_scale, sigmoid_bias + math.log(self.program_n), 0.5 * sigmoid_bias)

    @cute.jit
    def prob2(self, s0, s1, lse0, lse1, args, block: cutlass.Constexpr[bool],
              is_bf16: cutlass.Constexpr[bool]):
        if cutlass.const_expr(block and self.grad_rule == "product"):
            p = Int32(_cute_ops().run_program(self.program, "fwd", s0 * args[0] + args[1],
                                              s1 * args[0] + args[1])[0])
            f16 = self.program.f16
            if cutlass.const_expr(f16):
                # the forward's P is bf16(p) for BF16 inputs, p itself for FP16 ones (dV
                # operand); sigma' from the f16 p
                q0, q1 = unpack_f16x2(p)
                return (pack_f32x2(q0, q1, True) if cutlass.const_expr(is_bf16) else p), q0 - q0 * q0, q1 - q1 * q1
            q0, q1 = unpack_bf16x2(p)
            return p, q0 - q0 * q0, q1 - q1 * q1
        if cutlass.const_expr(block):
            p, dp = _cute_ops().run_program(self.program, "fwd_bwd", s0 * args[0] + args[1],
                                            s1 * args[0] + args[1])
            d0, d1 = unpack_bf16x2(Int32(dp))
            return Int32(p), d0, d1
        k0, k1 = args[0], args[1]
        if cutlass.const_expr(self.evaluator == "poly"):
            k0, k1 = args[0] * 0.5, args[2]
        p0 = tanh_approx(s0 * k0 + k1) * 0.5 + 0.5
        p1 = tanh_approx(s1 * k0 + k1) * 0.5 + 0.5
        return pack_f32x2(p0, p1, is_bf16), p0 * (1.0 - p0), p1 * (1.0 - p1)

    @cute.jit
    def dscore2(self, f0, f1, dp0, dp1, dsum0, dsum1):
        return f0 * dp0, f1 * dp1


_SIDES = {"softmax": SoftmaxBwd, "softcap": SoftcapBwd, "sigmoid": SigmoidBwd}


@functools.lru_cache(maxsize=128)
def bwd_side(mode: str, evaluator: str = "native", poly_split=None, sigmoid_grad=None, program=None,
             softcap_grad=None):
    """Backward side for (mode, evaluator); a poly side takes poly_split (default: the
    forward's score_stages.DEFAULT_POLY_SPLIT[mode], what make_stage builds for 128-key
    blocks; attn_bwd passes the head dim's split, score_stages.default_poly_split).
    sigmoid_grad: SigmoidBwd.grad_rule of the sigmoid poly side (None: its default).
    softcap_grad: SoftcapBwd.grad_rule of the softcap poly side (None: its default).
    program: the poly side's program, a name of the committed table or a ProgramSpec (None:
    the side's default); it must be the forward stage's.
    Cached (sides are frozen): building a poly side reads the coefficient table, ~35 us of
    host time per backward call otherwise (CPU timing)."""
    if mode not in _SIDES:
        raise ValueError(f"unknown mode {mode!r}")
    if evaluator not in ("native", "poly"):
        raise ValueError(f"unknown evaluator {evaluator!r}")
    if mode == "softmax":
        return SoftmaxBwd()
    kw = {} if program is None or evaluator != "poly" else {"program": program}
    if mode == "sigmoid" and sigmoid_grad is not None:
        return SigmoidBwd(evaluator=evaluator, poly_split=poly_split, grad_rule=sigmoid_grad, **kw)
    if mode == "softcap" and softcap_grad is not None:
        return SoftcapBwd(evaluator=evaluator, poly_split=poly_split, grad_rule=softcap_grad, **kw)
    return _SIDES[mode](evaluator=evaluator, poly_split=poly_split, **kw)


def bwd_side_for(stage):
    """The backward side of a forward score stage (score_stages.make_stage): same mode,
    evaluator, program and poly_split, hence the same P."""
    if stage.mode == "softmax":
        return SoftmaxBwd()
    kw = dict(evaluator=stage.evaluator, poly_split=stage.poly_split)
    if stage.evaluator == "poly":
        kw["program"] = stage.program
    return _SIDES[stage.mode](**kw)
