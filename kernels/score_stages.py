"""Score stages: what the attention kernels do between S = Q K^T and O += P V.

A stage is a frozen dataclass whose fields are compile-time constants (mode, evaluator,
program name and coefficient bits); its hash is its content, so it can key the compile
cache.  Runtime numbers (softmax scale, softcap value, sigmoid bias) travel as four FP32
kernel arguments computed by `host_scalars`, so one compiled kernel serves every value.

Forward side, called by `attn_fwd_sm90` on each FP32 score fragment (acc_S):
  1. `transform(acc_S, params)`  before masking (softcap: s -> tanh(s*scale/c)),
  2. the kernel masks (-inf) on diagonal / tail blocks,
  3. `probs(acc_S, tOrP, state, params, is_first, masked)` writes P (packed 16-bit pairs,
     the A operand of the PV wgmma) and returns the per-row O rescale factor or None.
   With tOrP=None (the forward's overlapped step) probs leaves its result in acc_S and
  4. `write_p(acc_S, tOrP, is_bf16)`, called after the PV wgmma in flight has retired,
     defines the A fragment (see write_p_pinned for why).
`finalize(state, params)` returns (per-row O scale, per-row LSE or None).

Backward sides are added by the backward kernel's engineer in this same module.

Evaluators: "native" uses MUFU (ex2.approx / tanh.approx); "poly" runs the packed bf16x2
PTX blocks generated in `flash_attn_poly.asm` from the coefficient table.

Poly split (`poly_split = (j, k)`, compile time): a poly stage sends the score pair of key
column group g = key_index // 8 through the block when g % k < j and through MUFU tanh
otherwise (native numerics, in the poly stage's units).  Why: on Hopper MUFU issues 16/clk/SM
and a packed block is ~9 FMA/ALU-pipe instructions per score, so all-poly overloads the FMA
and ALU pipes while all-native overloads MUFU; a fraction balances them.  The rule depends
only on the key index, so a backward recompute that calls `poly_pair(key_index // 8)` gets
the same P bit for bit.  (1, 1) = all pairs poly, (0, k) = all MUFU.  The forward decides
per column group at compile time from g's place in its key block (blocks start at multiples
of tile_n), which is the global rule only when the rule repeats inside a block: 8k must
divide tile_n (AttnFwdSm90 checks it; `default_poly_split` makes the defaults fit, so at
D = 256, 64-key forward blocks, the default 1/16 becomes 1/8 in both directions).

A poly stage holds its program as a `ProgramSpec` (flash_attn_poly.asm.programs; a name is
looked up in the committed table, a spec may come from any table): its facts (clamp L_c, n,
packed type, FP32 region threshold) and its blocks (`asm.blocks.block_for(spec, role)`) come
from the same spec, so the FP32 clamp of the kernel always equals the block's, and the
stage's hash (its content) covers the program's coefficients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
MODES = ("softmax", "softcap", "sigmoid")
# softcap with a constant row max (SoftcapStage.fixed_lse): largest p = e^HEADROOM; caps
# up to FIXED_MAX_CAP keep the smallest p = e^(HEADROOM - 2c) >= e^-80 normal in FP32/BF16
FIXED_MAX_HEADROOM = 20.0
FIXED_MAX_CAP = 50.0
EVALUATORS = ("native", "poly")


# ----------------------------------------------------------------------------------------
# small PTX helpers (one instruction each)
# ----------------------------------------------------------------------------------------
def _asm(ret, args, text, constraints):
    return llvm.inline_asm(ret, args, text, constraints, has_side_effects=False,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def tanh_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    """MUFU.TANH: abs error ~5e-4 (2^-10.7), one SFU issue."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)],
                        "tanh.approx.f32 $0, $1;", "=f,f"))


@dsl_user_op
def fma_sat(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    """fma.rn.sat.f32: a*b + c clamped to [0, 1] on the FMA pipe (NaN -> +0)."""
    return Float32(_asm(T.f32(), [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c)],
                        "fma.rn.sat.f32 $0, $1, $2, $3;", "=f,f,f,f"))


@dsl_user_op
def exp2_approx(x: Float32, *, loc=None, ip=None) -> Float32:
    """MUFU.EX2 with flush-to-zero; ex2(-inf) = +0 exactly."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)],
                        "ex2.approx.ftz.f32 $0, $1;", "=f,f"))


@cute.jit
def exp2_fma(a: Float32, program: cutlass.Constexpr) -> Float32:
    """2^a without MUFU, for finite a in [-125, 127] (normal results): the "exp2" block of an
    exp2_f32 program (exp2_f32_d3 of the coefficient table, fit/exp2.py): j = round(a) by the
    1.5 * 2^23 add, f = a - j, p = 2^f by a degree-3 FFMA Horner, j added to p's exponent field
    by one integer multiply-add.  Three FADD, three FFMA, one IMAD: FMA-pipe work instead of one
    MUFU.EX2, relative error 7.5e-5.  -inf (a masked score) is NOT mapped to 0."""
    return b32_as_f32(Int32(_cute_ops().run_program(program, "exp2", a)[0]))


@dsl_user_op
def pack_f32x2(lo: Float32, hi: Float32, is_bf16: cutlass.Constexpr[bool], *, loc=None, ip=None) -> Int32:
    """cvt.rn.{bf16x2,f16x2}.f32: one F2FP packs two scores; lo lands in bits 0..15."""
    kind = "bf16x2" if is_bf16 else "f16x2"
    return Int32(_asm(T.i32(), [Float32(lo).ir_value(loc=loc, ip=ip), Float32(hi).ir_value(loc=loc, ip=ip)],
                      f"cvt.rn.{kind}.f32 $0, $2, $1;", "=r,f,f"))


@dsl_user_op
def unpack_bf16x2(p: Int32, *, loc=None, ip=None):
    """bf16x2 -> two FP32 (exact): shift / mask, one integer op each."""
    v = Int32(p).ir_value(loc=loc, ip=ip)
    lo = Float32(_asm(T.f32(), [v], "shl.b32 $0, $1, 16;", "=f,r"))
    hi = Float32(_asm(T.f32(), [v], "and.b32 $0, $1, 0xffff0000;", "=f,r"))
    return lo, hi


@dsl_user_op
def unpack_f16x2(p: Int32, *, loc=None, ip=None):
    """f16x2 -> two FP32 (exact): cvt.f32.f16 of each half (one HADD2.F32 each)."""
    v = Int32(p).ir_value(loc=loc, ip=ip)
    lo = Float32(_asm(T.f32(), [v], "{ .reg .b16 l, h; mov.b32 {l, h}, $1; cvt.f32.f16 $0, l; }", "=f,r"))
    hi = Float32(_asm(T.f32(), [v], "{ .reg .b16 l, h; mov.b32 {l, h}, $1; cvt.f32.f16 $0, h; }", "=f,r"))
    return lo, hi


# The poly evaluator's program per mode.  H200 (bench/results/poly_split.md, accuracy_f16.md):
# at Gemma-2-like softcap spreads (scaled-score std ~12) the BF16 D4 program's attention
# error is 7.5x native, the FP16 D5 program's 1.2-1.3x; sigmoid BF16 D3 2.7-9.5x, FP16 D4
# 1.1-1.4x; the forward costs a few % more (softcap 1/4: 0.335 vs BF16 1/2 0.327 ms).
# The BF16 programs (the seed's B2 / B3 blocks) stay selectable by name.
# Softcap from a1f6741 to 8c57383 (H200, 7537f4e, bench/results/poly_split_grad.md): the two-region FP16
# program (residual D5 below |u| = 1, 1 - tanh above) at 1/16 with the backward's value rule:
# O / dQ / dK / dV error 1.03x native at std ~20 (the residual at 1/8: 1.92 / 1.36 / 1.40 / 1.99x),
# forward 0.289 ms and backward 0.853 vs the residual's 0.294 / 0.847 (native 0.287 / 0.821).
# Softcap back to the one-region residual, now on 1/16 with the value rule.  At Gemma-2's head dim
# it is the faster one in both side-by-side runs (H200, bench/results/gemma2_d256_programs.md):
# step 2.689 / 2.714 ms vs 2.767 / 2.818 (global), 2.059 / 2.092 vs 2.156 / 2.176 (local); the
# two-region backward spills 7 words there (its selects raise the register peak), the one-region
# one 1.  At D = 128 the two are within run-to-run noise (f0bbc82 shuffled: fwd 0.295 / bwd
# 0.822 vs 0.300 / 0.856; 8c57383 poly_split_r16.md: 0.298 / 0.846 vs 0.289 / 0.852).  Cost:
# accuracy at saturating spreads only (poly_split_r16.md): O / dQ / dK / dV 1.03 / 1.01 / 1.01 /
# 1.03x native at std ~12 for both; at std ~20 1.65 / 1.17 / 1.20 / 1.69x vs 1.03x.  The
# two-region program stays selectable by name (program="softcap_c50_f16_tail").
# Softcap since this change: the odd_u2 program softcap_c50_f16_odd (fit/softcap_odd.py: rho =
# (v u) Q(v), 6 FP16 coefficients, u clamped with fma.rn.sat.f32), still on 1/16 with the value
# rule.  Its pairs run no FMNMX / HMNMX2 / LOP3 (Hopper's ALU pipe, half the FMA rate:
# bench/results/issue_rates.md).  H200, ab31b85, bench/results/poly_split_odd.md (one run, 9
# alternating rounds, D = 128): fwd 0.290 / bwd 0.837 ms vs the one-region odd-form program's
# 0.297 / 0.849 (native 0.286 / 0.824); O / dQ / dK / dV error 1.02 / 1.01 / 1.01 / 1.03x native
# at std ~12, 1.55 / 1.16 / 1.18 / 1.59x at std ~20 (one-region: 1.65 / 1.17 / 1.20 / 1.69x).
# Gemma-2 D = 256 step (gemma2_d256_odd.md, two runs): global 2.770 / 2.756 ms vs 2.792 / 2.773,
# local 2.098 / 2.099 vs 2.121 / 2.129 (native 2.757 / 2.742, 2.057 / 2.040).  The one-region
# odd-form program stays selectable by name (program="softcap_c50_f16").
DEFAULT_PROGRAM = {"softcap": "softcap_c50_f16_odd", "sigmoid": "sigmoid_attn_n4096_f16"}

# The exp2 offload (program exp2_f32_d3, fit/exp2.py; H200, 2026-12-01): every tanh on MUFU and
# P = 2^a by an FP32 polynomial for 1/8 of the columns.  Next to softcap_c50_f16_odd, each pair
# timed alone (bench/results/gqa_4096_pairs_exp2.md, 59cca6e): forward 1.008x faster (1.033x
# faster than native), backward the native one (1.001x); O / dQ / dK / dV error 1.00x native at
# every spread against the odd_u2 program's 1.77 / 1.25 / 1.28 / 1.84x at std ~20
# (accuracy_softcap.md); Gemma-2 forward the fastest row in all four cells (gemma2_exp2.md).  It
# needs the constant row max (BF16, cap <= FIXED_MAX_CAP): default_program picks it there.
EXP2_PROGRAM = "exp2_f32_d3"


def default_program(mode: str, io_dtype: str, softcap=None) -> str:
    """The program attention() runs for evaluator="poly" when none is named: for softcap with
    BF16 inputs and 0 < cap <= FIXED_MAX_CAP (the constant row max bounds the exp2 argument)
    the exp2 offload EXP2_PROGRAM, else DEFAULT_PROGRAM[mode] (FP16 inputs, larger caps: the
    FP16 tanh program).  Kernel entries (attn_fwd / attn_bwd) given program=None run
    DEFAULT_PROGRAM[mode]: this rule is the public API's (flash_attn_poly.interface.validate)."""
    cap = 50.0 if softcap is None else float(softcap)
    if mode == "softcap" and io_dtype == "bf16" and 0.0 < cap <= FIXED_MAX_CAP:
        return EXP2_PROGRAM
    return DEFAULT_PROGRAM[mode]


def program_spec(program):
    """A stage's program as a ProgramSpec: a name is looked up in the committed table, a
    ProgramSpec (asm.programs.spec(name, table=...) of any table) is taken as it is."""
    programs = _asm_pkg().programs
    if isinstance(program, programs.ProgramSpec):
        return program
    if not isinstance(program, str):
        raise TypeError(f"program must be a table entry's name or a ProgramSpec, "
                        f"got {type(program).__name__}")
    return programs.spec(program)


def check_program(program, mode: str, roles: tuple) -> None:
    """A poly stage's program must be a forward program of its mode with the blocks it runs."""
    programs = _asm_pkg().programs
    if program.mode != mode or not set(roles) <= set(program.roles):
        raise ValueError(f"{mode} program {program.name!r} has no PTX blocks for the {mode} kernels (target "
                         f"{program.target!r}, form {program.form!r}, blocks {program.roles}; they need a "
                         f"forward program of target {programs.MODE_TARGETS[mode]} with blocks {roles}); "
                         f"{mode} programs of the committed table: "
                         f"{programs.names(mode=mode, derivative=False)}")


def check_sigmoid_dtype(evaluator: str, program, is_bf16: bool) -> None:
    """A sigmoid poly stage (forward or backward side) writes its block's packed P straight
    into the PV / dV operand: a BF16 program (bf16x2 P) needs BF16 inputs; an FP16 program
    converts to bf16x2 for BF16 inputs and keeps its f16x2 P for FP16 ones."""
    program = program_spec(program)
    if evaluator == "poly" and not is_bf16 and not program.f16:
        raise ValueError(f"sigmoid/poly program {program.name!r} writes packed bf16 P: BF16 inputs only "
                         f"(FP16 inputs need an FP16 program, e.g. {DEFAULT_PROGRAM['sigmoid']!r})")


@dsl_user_op
def f16x2_to_bf16x2(p: Int32, *, loc=None, ip=None) -> Int32:
    """f16x2 -> bf16x2 (round to nearest): two cvt.f32.f16, one cvt.rn.bf16x2.f32; +0 stays +0."""
    lo, hi = unpack_f16x2(p, loc=loc, ip=ip)
    return pack_f32x2(lo, hi, True, loc=loc, ip=ip)


def softcap_combine(x, r, u, c, tail_u: float):
    """logit = A - c r (one FFMA) from the block's value r at u = x/c: A = x for a one-region
    program (tail_u == 0, residual form), and for a two-region one copysign(c, x) where
    |u| >= tail_u (the tail form's r is sign(u) (1 - tanh|u|); tail_u is the program's
    ProgramSpec.region_threshold_f32: |u| >= tail_u exactly where the block's f16 |u| >= thr).
    Shared by the forward stage and the backward side, so both recompute the same logits
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
    r0, r1 = unpack_f16x2(Int32(_cute_ops().run_program(program, "fwd", u0, u1)[0]))
    return u0, u1, r0, r1


@dsl_user_op
def pin_f32(x: Float32, *, loc=None, ip=None) -> Float32:
    """Empty volatile asm that 'modifies' x: every later use of x stays below this point
    (volatile asm keeps its order against the wgmma waits, which are volatile too)."""
    return Float32(llvm.inline_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], "", "=f,0",
                                   has_side_effects=True, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def f32_as_b32(x: Float32, *, loc=None, ip=None) -> Int32:
    """The bits of an FP32 register as Int32 (no instruction)."""
    return Int32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def b32_as_f32(x: Int32, *, loc=None, ip=None) -> Float32:
    """A packed word kept in an FP32 register of acc_S (no instruction)."""
    return Float32(llvm.bitcast(T.f32(), Int32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def select_u32(keep: cutlass.Boolean, a: Int32, *, loc=None, ip=None) -> Int32:
    return cutlass.select_(keep, a, Int32(0))


# ----------------------------------------------------------------------------------------
# fragment views
# ----------------------------------------------------------------------------------------
def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """wgmma C fragment ((2, 2, N/8), MMA_M, MMA_N) viewed as (rows, cols) of this thread:
    ((2 rows 8 apart, MMA_M), (2 adjacent cols, N/8 col groups, MMA_N))."""
    l = cute.make_layout(acc.layout.shape)
    sh, st = l.shape, l.stride
    mn = cute.make_layout(
        ((sh[0][1], sh[1]), (sh[0][0], sh[0][2], sh[2])),
        stride=((st[0][1], st[1]), (st[0][0], st[0][2], st[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def acc_as_frag_a(acc: cute.Tensor) -> cute.Tensor:
    """The same registers viewed as the A operand of the next (RS) wgmma:
    ((2, 2, N/8), M, N') -> ((2, 2, 2), M, (N/16, N')) for 16-bit A (k = 16 per wgmma)."""
    l = cute.logical_divide(acc.layout, ((None, None, 2), None, None))
    frag = cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1], (l.shape[0][2][1], l.shape[2])),
        stride=((l.stride[0][0], l.stride[0][1], l.stride[0][2][0]), l.stride[1],
                (l.stride[0][2][1], l.stride[2])),
    )
    return cute.make_tensor(acc.iterator, frag)


@cute.jit
def quad_allreduce(x: Float32, op: cutlass.Constexpr[str]) -> Float32:
    """A row of the wgmma C fragment lives in 4 consecutive lanes: 2 butterfly shuffles."""
    for off in cutlass.range_constexpr(2):
        y = cute.arch.shuffle_sync_bfly(x, offset=1 << off)
        if cutlass.const_expr(op == "max"):
            x = cute.arch.fmax(x, y)
        else:
            x = x + y
    return x


@cute.jit
def write_p_native(acc_S: cute.Tensor, tOrP: cute.Tensor, is_bf16: cutlass.Constexpr[bool]):
    """FP32 probabilities -> packed 16-bit A fragment (one F2FP per pair).

    Stages skip it when given tOrP=None (attn_fwd block_overlap: the kernel packs after wait_group(0)).
    Why: ptxas copy-coalesces P_n with the A registers of the PV wgmma still in flight
    (it treats the A operand as read at issue), then flags the cvt (C7513)."""
    src = acc_as_frag_a(acc_S)
    dst = cute.recast_tensor(tOrP, Int32)
    for i in cutlass.range_constexpr(cute.size(dst)):
        dst[i] = pack_f32x2(src[2 * i], src[2 * i + 1], is_bf16)


@cute.jit
def write_p_pinned(acc_S: cute.Tensor, tOrP: cute.Tensor, is_bf16: cutlass.Constexpr[bool]):
    """The overlapped step's P step for stages that leave FP32 P in acc_S: pin all of acc_S, then pack.

    Called right after wait_group(0): the pins keep the packs (non-volatile asm) below the
    wait, so no instruction defines a wgmma A register while a wgmma is in flight."""
    for i in cutlass.range_constexpr(cute.size(acc_S)):
        acc_S[i] = pin_f32(acc_S[i])
    write_p_native(acc_S, tOrP, is_bf16)


@cute.jit
def online_softmax_probs(acc_S, tOrP, state, scale_log2, is_first: cutlass.Constexpr[bool],
                         row_scale, is_bf16: cutlass.Constexpr[bool], masked: cutlass.Constexpr[bool] = True):
    """P = exp2(S * scale_log2 - max) in place (softmax and softcap); packed into tOrP unless
    tOrP is None (attn_fwd block_overlap: FP32 P stays in acc_S until write_p after the PV wait)."""
    state.step(acc_S, scale_log2, is_first, row_scale, masked)
    if cutlass.const_expr(tOrP is not None):
        write_p_native(acc_S, tOrP, is_bf16)


# ----------------------------------------------------------------------------------------
# online softmax state (shared by softmax and softcap)
# ----------------------------------------------------------------------------------------
class OnlineSoftmax:
    """Per-thread running row max (in the stage's score units) and partial row sum.

    The row sum stays thread-local (each thread sums its own columns) and is reduced over
    the quad once in `finalize`: that saves 2 shuffles per row per key block."""

    def __init__(self, num_rows: int, max_chains: int = 1, sum_carry: bool = False, fixed_lse=None,
                 rescale_threshold: float = 0.0, exp2_fma: int = 0, exp2_program=None):
        if max_chains not in (1, 2, 4, 8):
            raise ValueError(f"max_chains must be 1, 2, 4 or 8, got {max_chains!r}")
        self.max_chains = max_chains
        # sum_carry: a block's row sum starts from the rescaled running sum instead of 0 (added
        # at the end). Same sum in another rounding order; the row's O-rescale factor then
        # heads the dependency chain, so ptxas computes it first and can schedule the O
        # rescale right after the PV wait instead of after the last exp2 (docs/NOTES_attn_fwd.md)
        self.sum_carry = sum_carry
        # fixed_lse (a Float32, or None): the stage hands `step` exp2 arguments taken against a
        # constant max m0 (SoftcapStage.transform_fixed) and fixed_lse = m0 in natural units:
        # no row max, no O rescale (bounded scores only)
        self.fixed_lse = fixed_lse
        self.fixed = fixed_lse is not None
        # exp2_fma n (fixed only): in mask-free blocks, column groups g with g % 8 >= 8 - n take
        # exp2_fma (FMA pipe) instead of MUFU.EX2 (AttnFwdConfig.exp2_fma; off by default)
        self.exp2_fma = int(exp2_fma)
        # the exp2_f32 program (ProgramSpec or name) whose block those columns run (None: EXP2_PROGRAM)
        self.exp2_program = program_spec(exp2_program or EXP2_PROGRAM) if self.exp2_fma else None
        # rescale_threshold t > 0 (log2 units, AttnFwdConfig checks 0 <= t <= 16): a row keeps
        # its stale max until a block's max exceeds it by more than t, so p <= 2^t and most
        # blocks need no O rescale (row_scale exactly 1.0 for a kept row: `rescale_needed`);
        # 0 = rescale on every new max
        self.rescale_threshold = float(rescale_threshold)
        self.row_max = cute.make_rmem_tensor((num_rows,), Float32)
        self.row_sum = cute.make_rmem_tensor((num_rows,), Float32)
        # an empty tile (no key visible) finalises to O = 0, LSE = -inf
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def step(self, acc_S: cute.Tensor, scale_log2: Float32, is_first: cutlass.Constexpr[bool],
             row_scale: cute.Tensor, masked: cutlass.Constexpr[bool] = True):
        """P = exp2(s*scale_log2 - max*scale_log2) in place; row_scale gets the O rescale."""
        s_mn = acc_mn_view(acc_S)
        if cutlass.const_expr(self.fixed):
            self._step_fixed(s_mn, is_first, masked)
            return
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            m = self._row_max(s_mn, r)
            m = quad_allreduce(m, "max")
            keep = False
            if cutlass.const_expr(not is_first):
                m = cute.arch.fmax(m, self.row_max[r])
                if cutlass.const_expr(self.rescale_threshold > 0.0):
                    # stale max kept while the growth is <= t (an empty row: -inf - -inf = NaN
                    # and a first visible key: +inf both compare false, so those take m)
                    keep = (m - self.row_max[r]) * scale_log2 <= self.rescale_threshold
                    m = self.row_max[r] if keep else m
            # a row with every score masked keeps max = -inf: use 0 so exp2(-inf - 0) = 0
            m_safe = m if m != -Float32.inf else Float32(0.0)
            neg_m = -m_safe * scale_log2
            if cutlass.const_expr(is_first):
                row_scale[r] = Float32(1.0)
            else:
                old = self.row_max[r]
                old_safe = old if old != -Float32.inf else Float32(0.0)
                row_scale[r] = exp2_approx(old_safe * scale_log2 + neg_m)
                if cutlass.const_expr(self.rescale_threshold > 0.0):
                    row_scale[r] = Float32(1.0) if keep else row_scale[r]
            self.row_max[r] = m
            acc = Float32(0.0)
            if cutlass.const_expr(self.sum_carry and not is_first):
                acc = self.row_sum[r] * row_scale[r]
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                p = exp2_approx(s_mn[r, c] * scale_log2 + neg_m)
                s_mn[r, c] = p
                acc = acc + p
            if cutlass.const_expr(is_first or self.sum_carry):
                self.row_sum[r] = acc
            else:
                self.row_sum[r] = self.row_sum[r] * row_scale[r] + acc

    @cute.jit
    def _step_fixed(self, s_mn, is_first: cutlass.Constexpr[bool], masked: cutlass.Constexpr[bool] = True):
        """P = exp2(a) in place, a = (logit - m0) * log2(e) from the stage: no max, no rescale."""
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            acc = Float32(0.0)
            if cutlass.const_expr(self.sum_carry and not is_first):
                acc = self.row_sum[r]
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                if cutlass.const_expr(not masked and (c // 2) % 8 >= 8 - self.exp2_fma):
                    # bounded argument: no -inf in a mask-free block
                    p = exp2_fma(s_mn[r, c], self.exp2_program)
                else:
                    p = exp2_approx(s_mn[r, c])
                s_mn[r, c] = p
                acc = acc + p
            if cutlass.const_expr(is_first or self.sum_carry):
                self.row_sum[r] = acc
            else:
                self.row_sum[r] = self.row_sum[r] + acc

    @cute.jit
    def rescale_needed(self, row_scale: cute.Tensor):
        """rescale_threshold > 0: whether any row of this warp has row_scale != 1 (a warp-uniform
        vote, so the O rescale is skipped or run by the whole warp)."""
        need = row_scale[0] != Float32(1.0)
        for r in cutlass.range_constexpr(1, cute.size(row_scale)):
            need = need or row_scale[r] != Float32(1.0)
        return cute.arch.vote_any_sync(need)

    def _row_max(self, s_mn, r: int):
        """Max of row r's columns: max_chains running maxima (column c feeds chain c % k),
        then a pairwise tree; k = 1 is the single serial chain.  Exact in any order (PTX
        max.f32 returns the non-NaN operand), so every k gives the same bits."""
        n = cute.size(s_mn, mode=[1])
        k = self.max_chains if n % self.max_chains == 0 else 1
        ms = [s_mn[r, c] for c in range(k)]
        for c in range(k, n):
            ms[c % k] = cute.arch.fmax(ms[c % k], s_mn[r, c])
        while len(ms) > 1:
            ms = [cute.arch.fmax(ms[i], ms[i + 1]) for i in range(0, len(ms), 2)]
        return ms[0]

    @cute.jit
    def finalize(self, lse_scale: Float32, o_scale: cute.Tensor, lse: cute.Tensor):
        """o_scale = 1/sum (0 for an empty row); lse = max*lse_scale + ln(sum) (-inf if empty)."""
        for r in cutlass.range_constexpr(cute.size(self.row_sum)):
            s = quad_allreduce(self.row_sum[r], "sum")
            empty = s == Float32(0.0) or s != s
            o_scale[r] = Float32(0.0) if empty else cute.arch.rcp_approx(s)
            m = self.fixed_lse if cutlass.const_expr(self.fixed) else self.row_max[r] * lse_scale
            lse[r] = -Float32.inf if empty else m + cute.math.log2(s, fastmath=True) * LN2


# ----------------------------------------------------------------------------------------
# coefficient table and blocks (flash_attn_poly.asm)
# ----------------------------------------------------------------------------------------
def _asm_pkg():
    try:
        import flash_attn_poly.asm as pkg  # installed layout
        from flash_attn_poly.asm import programs  # noqa: F401
    except ImportError:
        import asm as pkg  # type: ignore  (repository root on sys.path)
        from asm import programs  # type: ignore  # noqa: F401
    return pkg


def _cute_ops():
    """flash_attn_poly.asm.cute_ops (the inlined PTX blocks); imports cutlass."""
    pkg = _asm_pkg()
    import importlib
    return importlib.import_module(pkg.__name__ + ".cute_ops")


def _check_split(split) -> tuple:
    j, k = (int(v) for v in split)
    if not (k >= 1 and 0 <= j <= k and 16 % k == 0):
        # k | 16: the rule repeats inside a 128-key block (64-key blocks: split_fits_block)
        raise ValueError(f"poly_split (j, k) needs 0 <= j <= k, k in (1, 2, 4, 8, 16); got {split}")
    return (j, k)


def default_key_block(head_dim: int) -> int:
    """The forward's default key block (AttnFwdConfig.default's tile_n): 128 keys up to
    D = 128, 64 at D = 256 (shared memory)."""
    return 128 if head_dim <= 128 else 64


def split_fits_block(split: tuple, key_block: int) -> bool:
    """Can a forward with key blocks of key_block keys apply the per-key rule of split at
    compile time?  Yes when all or no pairs go through the block, or the rule's period
    (8k keys) divides the block."""
    j, k = split
    return j in (0, k) or key_block % (8 * k) == 0


def default_poly_split(mode: str, key_block: int = 128) -> tuple:
    """DEFAULT_POLY_SPLIT[mode] (measured with 128-key blocks), coarsened to the finest
    split whose period fits a forward key block of key_block keys: (1, 16) -> (1, 8) for
    64-key blocks.  The forward and the backward of one call must resolve the same split."""
    j, k = DEFAULT_POLY_SPLIT[mode]
    k_max = key_block // 8
    return (j, k) if k <= k_max else (max(1, j * k_max // k), k_max)


def exp2_program_of(stage):
    """The exp2_f32 program of a stage's exp2 offload (None: the stage has none; OnlineSoftmax
    then runs EXP2_PROGRAM where a tuning sets exp2_fma)."""
    return stage.program if getattr(stage, "exp2_split", ()) else None


def exp2_groups(split: tuple) -> int:
    """Column groups of every 8 that the exp2 offload takes for split (j, k): 8 j / k."""
    j, k = _check_split(split)
    if 8 % k or not 0 < 8 * j // k <= 8:
        raise ValueError(f"the exp2 offload runs j/k of the key columns in groups of 8 out of 8: "
                         f"k must divide 8, got split {split}")
    return 8 * j // k


def poly_pair(split: tuple, col_group: int) -> bool:
    """Does key column group `col_group` (= key index // 8) go through the block?"""
    j, k = split
    return col_group % k < j


def frag_a_col_group(shape, e: int) -> int:
    """Key column group (within the block) of element e of the PV A-fragment view
    ((2 cols, 2 rows, 2 groups), M, (N/16, N')) of acc_S (see acc_as_frag_a)."""
    flat = [shape[0][0], shape[0][1], shape[0][2], shape[1], shape[2][0], shape[2][1]]
    crd = []
    for n in flat:
        crd.append(e % n)
        e //= n
    return crd[2] + 2 * (crd[4] + flat[4] * crd[5])


# ----------------------------------------------------------------------------------------
# stages
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SoftmaxStage:
    """softmax(s * scale): p = exp2(s*scale*log2e - max)."""

    mode: str = field(default="softmax", init=False)
    evaluator: str = "native"
    has_lse = True
    uses_online_softmax = True

    def host_scalars(self, softmax_scale: float, seqlen_k: int, **_):
        return (softmax_scale * LOG2E, softmax_scale, 0.0, 0.0)

    @cute.jit
    def transform(self, acc_S: cute.Tensor, params):
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


@dataclass(frozen=True)
class SoftcapStage:
    """Gemma-2 softcap: logit = c * tanh(x / c), x = s * scale, then softmax over logits.

    native: t = tanh.approx(s * scale/c) (one MUFU), softmax over t with scale c*log2e,
            so each score costs 2 MUFU (tanh + ex2).
    poly:   residual form logit = x_c - c * rho(u), x_c = clamp(x, +-c*L_c), u = x_c / c,
            rho(u) = u - tanh(u) from the packed bf16x2 block `softcap_fwd` (program
            softcap_c50; program="softcap_c50_f16": the f16x2 D5 block, rho unpacked by
            cvt.f32.f16; program="softcap_c50_f16_odd", the default: an odd_u2 program,
            u clamped on the FMA pipe and logit = c u - c rho, softcap_u2_pair): the tanh
            leaves the MUFU pipe; ex2 stays.  With poly_split
            (j, k), pairs outside the split take logit = c * tanh.approx(x / c) (MUFU);
            softmax runs over logits in both cases (LSE scale 1).
    program: a ProgramSpec after __post_init__ (a name: the committed table's entry); clamp_l
    (L_c), rho_f16, tail_u, u2 come from it, never from a literal.
    """

    mode: str = field(default="softcap", init=False)
    evaluator: str = "native"
    program: object = DEFAULT_PROGRAM["softcap"]
    poly_split: tuple = (1, 1)
    clamp_l: float = field(default=0.0, init=False)   # the program's L_c: |u| clamped there
    rho_f16: bool = field(default=False, init=False)  # the program's block returns f16x2
    tail_u: float = field(default=0.0, init=False)    # two-region program: FP32 |u| threshold
    u2: bool = field(default=False, init=False)       # odd_u2 program: FMA-pipe clamp (softcap_u2_pair)
    # exp2 offload (an exp2_f32 program, make_stage): the tanh stays on MUFU for every score and
    # this split of the key column groups computes P = 2^a by the exp2_f32 block instead of
    # MUFU.EX2, where the constant row max bounds a (AttnFwdConfig.exp2_fma); () = none
    exp2_split: tuple = ()
    has_lse = True
    uses_online_softmax = True

    def __post_init__(self):
        object.__setattr__(self, "program", program_spec(self.program))
        object.__setattr__(self, "poly_split", _check_split(self.poly_split))
        if self.exp2_split:
            exp2_groups(self.exp2_split)                  # a clear error for a split it cannot run
            if self.evaluator != "native" or not self.program.is_exp2:
                raise ValueError(f"the exp2 offload is a native-tanh stage running an exp2_f32 program (e.g. "
                                 f"{EXP2_PROGRAM!r}, the program its block is built from), got evaluator="
                                 f"{self.evaluator!r}, program={self.program.name!r}")
        if self.evaluator == "poly":
            prog = self.program
            check_program(prog, "softcap", ("fwd",))
            object.__setattr__(self, "clamp_l", float(prog.clamp))
            object.__setattr__(self, "rho_f16", prog.f16)
            object.__setattr__(self, "tail_u", prog.region_threshold_f32)
            object.__setattr__(self, "u2", prog.clamp_on_fma)

    def poly_pair(self, col_group: int) -> bool:
        return self.evaluator == "poly" and poly_pair(self.poly_split, col_group)

    def host_scalars(self, softmax_scale: float, seqlen_k: int, softcap: float = 50.0, **_):
        if self.evaluator == "native":
            return (softmax_scale / softcap, softcap * LOG2E, softcap, 0.0)
        return (softmax_scale, LOG2E, softcap, 1.0 / softcap)

    def fixed_lse(self, params):
        """m0 = c - FIXED_MAX_HEADROOM: the constant row max of AttnFwdConfig.fixed_max (logits).

        Capped logits lie in [-c, c], so every p = exp(logit - m0) lies in [e^(20-2c), e^20]
        (FIXED_MAX_HEADROOM = 20), inside FP32's and BF16's normal range for c <= FIXED_MAX_CAP
        = 50 (e^-80 > 2^-126): no row max and no O rescale are needed, and P keeps its relative
        precision (a float's rounding does not depend on its exponent).  Row sums stay below
        S_k e^20.  Not for FP16 P (its range is e^-17..e^11)."""
        return params[2] - FIXED_MAX_HEADROOM

    @cute.jit
    def transform_fixed(self, acc_S: cute.Tensor, params):
        """fixed_max: acc_S <- a = (logit - m0) * log2(e), the exp2 argument (the online step's
        FFMA folded in).  native: a = tanh(s*scale/c) * c*log2e + k; poly pairs: a = logit*log2e + k;
        poly's native pairs: a = tanh(s*(scale/c)) * c*log2e + k (one FMUL fewer than logits)."""
        k = (FIXED_MAX_HEADROOM - params[2]) * LOG2E
        c_log2 = params[2] * LOG2E
        if cutlass.const_expr(self.evaluator == "native"):
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = tanh_approx(acc_S[i] * params[0]) * c_log2 + k
        else:
            s_mn = acc_mn_view(acc_S)
            x_max = params[2] * self.clamp_l
            u_scale = params[0] * params[3]
            alpha = softcap_u2_alpha(u_scale, self.clamp_l)
            for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
                for g in cutlass.range_constexpr(cute.size(s_mn, mode=[1]) // 2):
                    if cutlass.const_expr(self.poly_pair(g) and self.u2):
                        # a = (c u - c rho) log2e + k as two FFMAs: c log2e u + k, then - c log2e rho
                        u0, u1, r0, r1 = softcap_u2_pair(s_mn[r, 2 * g], s_mn[r, 2 * g + 1], alpha,
                                                         self.clamp_l, self.program)
                        s_mn[r, 2 * g] = (u0 * c_log2 + k) - c_log2 * r0
                        s_mn[r, 2 * g + 1] = (u1 * c_log2 + k) - c_log2 * r1
                    elif cutlass.const_expr(self.poly_pair(g)):
                        self._pair_poly(s_mn, r, 2 * g, x_max, params)
                        for c in cutlass.range_constexpr(2 * g, 2 * g + 2):
                            s_mn[r, c] = s_mn[r, c] * LOG2E + k
                    else:
                        for c in cutlass.range_constexpr(2 * g, 2 * g + 2):
                            s_mn[r, c] = tanh_approx(s_mn[r, c] * u_scale) * c_log2 + k

    @cute.jit
    def transform(self, acc_S: cute.Tensor, params):
        if cutlass.const_expr(self.evaluator == "native"):
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = tanh_approx(acc_S[i] * params[0])
        else:
            self._transform_poly(acc_S, params)

    @cute.jit
    def _transform_poly(self, acc_S: cute.Tensor, params):
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
                    s_mn[r, 2 * g] = (params[2] * u0) - params[2] * r0
                    s_mn[r, 2 * g + 1] = (params[2] * u1) - params[2] * r1
                elif cutlass.const_expr(self.poly_pair(g)):
                    self._pair_poly(s_mn, r, 2 * g, x_max, params)
                else:
                    for c in cutlass.range_constexpr(2 * g, 2 * g + 2):
                        s_mn[r, c] = params[2] * tanh_approx(s_mn[r, c] * u_scale)

    @cute.jit
    def _pair_poly(self, s_mn, r, c, x_max, params):
        x0 = cute.arch.fmin(cute.arch.fmax(s_mn[r, c] * params[0], -x_max), x_max)
        x1 = cute.arch.fmin(cute.arch.fmax(s_mn[r, c + 1] * params[0], -x_max), x_max)
        u0, u1 = x0 * params[3], x1 * params[3]
        rho = Int32(_cute_ops().run_program(self.program, "fwd", u0, u1)[0])
        r0, r1 = unpack_f16x2(rho) if cutlass.const_expr(self.rho_f16) else unpack_bf16x2(rho)
        s_mn[r, c] = softcap_combine(x0, r0, u0, params[2], self.tail_u)
        s_mn[r, c + 1] = softcap_combine(x1, r1, u1, params[2], self.tail_u)

    @cute.jit
    def probs(self, acc_S, tOrP, state, params, is_first: cutlass.Constexpr[bool],
              masked: cutlass.Constexpr[bool], row_scale, is_bf16: cutlass.Constexpr[bool]):
        online_softmax_probs(acc_S, tOrP, state, params[1], is_first, row_scale, is_bf16, masked)

    @cute.jit
    def write_p(self, acc_S, tOrP, is_bf16: cutlass.Constexpr[bool]):
        write_p_pinned(acc_S, tOrP, is_bf16)

    def lse_scale(self, params):
        # native: max is in tanh units (logit = c*t); poly: max is already a logit
        return params[2] if self.evaluator == "native" else Float32(1.0)


@dataclass(frozen=True)
class SigmoidStage:
    """Sigmoid attention: P = sigma(x + b), x = s * scale, no max, no normalisation.

    native: p = 0.5 * tanh.approx(0.5 x + 0.5 b) + 0.5: one MUFU and 2 FFMA per score;
            a masked score (-inf) gives tanh = -1, p = +0 exactly.
    poly:   the program's "fwd" block (17 instructions for program sigmoid_attn_n{n}, BF16
            D3) computes sigma(x' - ln n) on two FP32 inputs and returns packed bf16x2 P, which
            is the PV A operand directly; we feed x' = x + b + ln n, so any bias works (exact
            for b = -ln n).  Masked lanes are zeroed afterwards with a select.  Pairs outside
            poly_split run the native formula (params[2] = scale/2, params[3] = b/2).
            attn_fwd block_overlap (tOrP=None) runs the block in two parts: its "head" (16
            instr.) in the stage, its packed q kept in acc_S, then write_p's "tail" (P = q*q, one
            mul) after the wait: same instructions, same bits as the block.  An FP16 program (the
            default sigmoid_attn_n4096_f16, D4): f16x2 P converted to bf16x2 after the block
            (f16x2_to_bf16x2) for BF16 inputs.
    program: a ProgramSpec after __post_init__ (a name: the committed table's entry);
    program_n, p_f16 come from it.
    """

    mode: str = field(default="sigmoid", init=False)
    evaluator: str = "native"
    program: object = DEFAULT_PROGRAM["sigmoid"]
    poly_split: tuple = (1, 1)
    program_n: int = field(default=0, init=False)
    p_f16: bool = field(default=False, init=False)   # the program's block returns f16x2 P
    has_lse = False
    uses_online_softmax = False

    def __post_init__(self):
        object.__setattr__(self, "program", program_spec(self.program))
        object.__setattr__(self, "poly_split", _check_split(self.poly_split))
        if self.evaluator == "poly":
            check_program(self.program, "sigmoid", ("fwd", "head", "tail"))
            object.__setattr__(self, "program_n", self.program.n)
            object.__setattr__(self, "p_f16", self.program.f16)

    def poly_pair(self, col_group: int) -> bool:
        return self.evaluator == "poly" and poly_pair(self.poly_split, col_group)

    def host_scalars(self, softmax_scale: float, seqlen_k: int, sigmoid_bias=None, **_):
        b = -math.log(seqlen_k) if sigmoid_bias is None else float(sigmoid_bias)
        if self.evaluator == "native":
            return (0.5 * softmax_scale, 0.5 * b, 0.0, 0.0)
        return (softmax_scale, b + math.log(self.program_n), 0.5 * softmax_scale, 0.5 * b)

    @cute.jit
    def transform(self, acc_S: cute.Tensor, params):
        pass

    @cute.jit
    def probs(self, acc_S, tOrP, state, params, is_first: cutlass.Constexpr[bool],
              masked: cutlass.Constexpr[bool], row_scale, is_bf16: cutlass.Constexpr[bool]):
        if cutlass.const_expr(self.evaluator == "native"):
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = tanh_approx(acc_S[i] * params[0] + params[1]) * 0.5 + 0.5
            if cutlass.const_expr(tOrP is not None):
                write_p_native(acc_S, tOrP, is_bf16)
        else:
            self._probs_poly(acc_S, tOrP, params, masked, is_bf16)

    def check_dtype(self, is_bf16: bool) -> None:
        check_sigmoid_dtype(self.evaluator, self.program, is_bf16)

    @cute.jit
    def _probs_poly(self, acc_S, tOrP, params, masked: cutlass.Constexpr[bool], is_bf16: cutlass.Constexpr[bool]):
        """P of every pair into tOrP; tOrP=None (attn_fwd block_overlap): block pairs leave the head's
        packed q (P = q*q) in their even acc_S register, MUFU pairs FP32 P in both."""
        src = acc_as_frag_a(acc_S)
        dst = None
        if cutlass.const_expr(tOrP is not None):
            dst = cute.recast_tensor(tOrP, Int32)
        for i in cutlass.range_constexpr(cute.size(src) // 2):
            if cutlass.const_expr(self.poly_pair(frag_a_col_group(src.shape, 2 * i))):
                if cutlass.const_expr(tOrP is None):
                    src[2 * i] = b32_as_f32(self._pair_poly(src[2 * i], src[2 * i + 1], params,
                                                            masked, "head", is_bf16))
                else:
                    dst[i] = self._pair_poly(src[2 * i], src[2 * i + 1], params, masked, "fwd", is_bf16)
            else:
                # native sigma = 0.5 tanh(0.5 x + 0.5 b) + 0.5; masked -inf gives +0 exactly
                p0 = tanh_approx(src[2 * i] * params[2] + params[3]) * 0.5 + 0.5
                p1 = tanh_approx(src[2 * i + 1] * params[2] + params[3]) * 0.5 + 0.5
                if cutlass.const_expr(tOrP is None):
                    src[2 * i], src[2 * i + 1] = p0, p1
                else:
                    dst[i] = pack_f32x2(p0, p1, is_bf16)

    @cute.jit
    def _pair_poly(self, s0, s1, params, masked: cutlass.Constexpr[bool], role: cutlass.Constexpr[str],
                   is_bf16: cutlass.Constexpr[bool] = True):
        """The program's block `role` ("fwd": P; "head": q, P = q*q) on one score pair."""
        p = Int32(_cute_ops().run_program(self.program, role, s0 * params[0] + params[1],
                                          s1 * params[0] + params[1])[0])
        if cutlass.const_expr(self.p_f16 and is_bf16 and role == "fwd"):
            p = f16x2_to_bf16x2(p)   # the full f16 block's P -> the PV operand's bf16x2
        if cutlass.const_expr(masked):
            # masked scores are -inf: force exact zeros whatever the block returns (on q the
            # tail's 0 * 0 = +0 gives the same P bits: tests/test_asm_emulator.py)
            keep = Int32(0)
            if s0 != -Float32.inf:
                keep = keep | Int32(0xFFFF)
            if s1 != -Float32.inf:
                keep = keep | Int32(-65536)   # 0xFFFF0000
            p = p & keep
        return p

    @cute.jit
    def write_p(self, acc_S, tOrP, is_bf16: cutlass.Constexpr[bool]):
        """attn_fwd block_overlap, after wait_group(0): P into tOrP from what probs(tOrP=None) left."""
        if cutlass.const_expr(self.evaluator == "native"):
            write_p_pinned(acc_S, tOrP, is_bf16)
        else:
            self._write_p_poly(acc_S, tOrP, is_bf16)

    @cute.jit
    def _write_p_poly(self, acc_S, tOrP, is_bf16: cutlass.Constexpr[bool]):
        """Block pairs: the tail (one mul.bf16x2) on the head's q; MUFU pairs: the pack.
        Only the registers read are pinned: an odd register of a block pair holds a dead
        score, and pinning it would keep it live through the stage (+1 reg per block pair)."""
        src = acc_as_frag_a(acc_S)
        dst = cute.recast_tensor(tOrP, Int32)
        for i in cutlass.range_constexpr(cute.size(dst)):
            src[2 * i] = pin_f32(src[2 * i])
            if cutlass.const_expr(not self.poly_pair(frag_a_col_group(src.shape, 2 * i))):
                src[2 * i + 1] = pin_f32(src[2 * i + 1])
        for i in cutlass.range_constexpr(cute.size(dst)):
            if cutlass.const_expr(self.poly_pair(frag_a_col_group(src.shape, 2 * i))):
                p = Int32(_cute_ops().run_program(self.program, "tail", f32_as_b32(src[2 * i]))[0])
                dst[i] = f16x2_to_bf16x2(p) if cutlass.const_expr(self.p_f16 and is_bf16) else p
            else:
                dst[i] = pack_f32x2(src[2 * i], src[2 * i + 1], is_bf16)

    def lse_scale(self, params):
        return None


def make_stage(mode: str, evaluator: str = "native", key_block: int = 128, **kw):
    """Build the stage for (mode, evaluator); poly stages read program facts (L_c, n,
    coefficients) from their program's spec.  kw: program (a name of the committed table or a
    ProgramSpec), poly_split.  key_block: the forward's key block (tile_n), which bounds the
    default split (default_poly_split).  A softcap "poly" program of form exp2_f32 selects the
    exp2 offload: tanh on MUFU for every score, P = 2^a on the FMA pipe for a split of the key
    columns (AttnFwdConfig.exp2_fma); the backward then recomputes P with MUFU (attn_bwd): P
    differs by <= 7.5e-5 relative, below BF16 P's 2^-9."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if evaluator not in EVALUATORS:
        raise ValueError(f"evaluator must be one of {EVALUATORS}, got {evaluator!r}")
    if mode == "softmax":
        return SoftmaxStage(evaluator="native")
    if evaluator == "poly" and "poly_split" not in kw:
        kw["poly_split"] = default_poly_split(mode, key_block)
    if mode == "softcap" and evaluator == "poly" and kw.get("program") is not None \
            and program_spec(kw["program"]).is_exp2:
        return SoftcapStage(evaluator="native", program=kw["program"], exp2_split=tuple(kw["poly_split"]))
    cls = SoftcapStage if mode == "softcap" else SigmoidStage
    return cls(evaluator=evaluator, **kw)


# Measured default split per mode (H200, B=1 S=4096 Hq=32 Hkv=8 D=128 causal; history in
# docs/NOTES_attn_fwd.md): (j, k) = fraction j/k of the key column groups through the block.
#   softcap, overlap_v2 loop: fwd 1/4 0.337 ms, 1/2 0.354, 3/4 0.376 (native 0.316: on Hopper
#            the MUFU pipe keeps up once the loop overlaps; bench/results/fwd_overlap_v2.md);
#            the backward follows the split: bwd 1/2 1.224 ms, 1/4 1.343 (gqa_4096 runs), so
#            1/2 gives the faster training step (fwd + bwd 1.58 vs 1.70 ms);
#   sigmoid, ping-pong loop: 1/4 0.263 ms, 1/2 0.273 (all-poly 0.336 earlier).
# With the FP16 programs (DEFAULT_PROGRAM; bench/results/poly_split.md, 3779e11):
#   softcap fwd 1/2 0.348 ms, 1/4 0.335, 1/8 0.346 (native 0.299); bwd 0.865 / 0.893 / 0.878;
#            O error at std ~12: 1.31 / 1.18 / 1.10x native -> 1/4;
#   sigmoid fwd 1/4 0.259, 1/8 0.249 (native 0.235); bwd 0.788 / 0.803; error 1.1-1.4x /
#            1.05-1.24x native -> 1/8.
# Softcap with the constant row max (AttnFwdConfig.fixed_max; bench/results/poly_split_fixed_max.md,
# d1f88d5): fwd 1/2 0.314, 1/4 0.304, 1/8 0.295 ms (native 0.287); bwd 0.852 / 0.854 / 0.832;
#            O / dQ / dK / dV error at std ~20: 3.20 / 1.98 / 2.08 / 3.36, 2.41 / 1.61 / 1.67 /
#            2.50, 1.92 / 1.36 / 1.40 / 1.99x native -> 1/8 (faster, and within 2x of the
#            fixed-max native; 2.63 / 1.70 / 1.75 / 1.99x the online-max native of accuracy.md).
# Two-region FP16 softcap (the default program from a1f6741 to 8c57383; bench/results/
# poly_split_grad.md, 7537f4e, 9 alternating rounds): fwd 1/8 0.313, 1/16 0.289 ms; bwd (value
# rule) 0.890 / 0.853; error 1.04-1.06 / 1.03x native at std ~20 -> 1/16, kept for the
# one-region default (bench/results/poly_split_r16.md: 0.298 / 0.846 ms at 1/16).
# Sigmoid FP16 program on 1/16 (bench/results/poly_split_sigmoid16.md, f4f609b, 9 alternating
# rounds): fwd 1/8 0.248, 1/16 0.234 ms (native 0.231); bwd 0.751 / 0.757 (native 0.750); error
# at std 1.7: 1.12-1.24 / 1.06-1.12x native -> 1/16.
# Softcap 1/16 -> 1/8 (2026-11-30, tenth session) with the three-warpgroup forward at D = 128 (64-key
# blocks cannot repeat a 1/16 rule; attn_fwd_sm90.AttnFwdConfig.default): odd_u2 program at 1/8 vs 1/16
# (bench/results/poly_split_odd.md): fwd 0.284 / 0.290, bwd 0.838 / 0.837 ms, O error at std ~20
# 1.77-1.84x / 1.55-1.59x native (the goal: <= 2x); 1/4 was 2.2x.
DEFAULT_POLY_SPLIT = {"softcap": (1, 8), "sigmoid": (1, 16)}
