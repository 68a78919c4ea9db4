"""Device pieces shared by the score functions (kernels/scores/*.py) and the attention kernels.

One-instruction PTX helpers (MUFU tanh / ex2, packs and unpacks of 16-bit pairs, register pins),
views of the wgmma fragments (rows x columns of a thread's accumulator, the A-operand view of
P), the online softmax state, and `Coords`: where each score of a fragment sits (batch, head,
query and key index), which the score hooks receive and user score functions read.
"""
from __future__ import annotations

import importlib
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from . import poly_pair

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def _cute_ops():
    """flash_attn_poly.asm.cute_ops (the inlined PTX blocks of the table's programs)."""
    try:
        return importlib.import_module("flash_attn_poly.asm.cute_ops")
    except ImportError:   # running from the repository root
        return importlib.import_module("asm.cute_ops")


def run_program(program, role: str, *values) -> tuple:
    """Inline block `role` of program (an asm.programs.ProgramSpec) on values; one Uint32 per output."""
    return _cute_ops().run_program(program, role, *values)


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
    return b32_as_f32(Int32(run_program(program, "exp2", a)[0]))


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



@dsl_user_op
def f16x2_to_bf16x2(p: Int32, *, loc=None, ip=None) -> Int32:
    """f16x2 -> bf16x2 (round to nearest): two cvt.f32.f16, one cvt.rn.bf16x2.f32; +0 stays +0."""
    lo, hi = unpack_f16x2(p, loc=loc, ip=ip)
    return pack_f32x2(lo, hi, True, loc=loc, ip=ip)



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
def write_p_fixed(acc_S: cute.Tensor, tOrP: cute.Tensor, state):
    """FwdConfig.fixed_max: FP32 P -> packed BF16 A fragment (one F2FP per pair, as
    write_p_pinned) and state.row_sum_p, the row sum of the ROUNDED P (two integer ops per
    pair unpack it, two FADD add it).

    Against a constant max a row's largest p is not 1; dividing O by the FP32 sum of the
    unrounded P would leave that p's BF16 rounding (up to 2^-9) in O, so a row dominated by one
    key (S_k = 1, the first causal rows, decode, an attention sink) would not return that key's
    V exactly.  O = sum(bf16(p) v) / sum(bf16(p)) is exact for one key, as the online max's
    p = 1 is.  The LSE keeps the FP32 sum (state.row_sum): ln sum(bf16(p)) would be off by that
    same rounding, and the backward recomputes P from the LSE.  Runs
    after the PV wait in the overlapped loop (pins as write_p_pinned), at once in the first
    block.  Frag-A index j of this thread is (adjacent pair, row pair, col group, M, ...) in
    column-major order, so its row of acc_mn_view is (j // 2) % 2 + 2 * ((j // 8) % M)."""
    src = acc_as_frag_a(acc_S)
    dst = cute.recast_tensor(tOrP, Int32)
    n_m = cute.size(src, mode=[1])
    for i in cutlass.range_constexpr(cute.size(acc_S)):
        acc_S[i] = pin_f32(acc_S[i])
    lo_sum = [None] * (2 * n_m)
    hi_sum = [None] * (2 * n_m)
    for i in cutlass.range_constexpr(cute.size(dst)):
        word = pack_f32x2(src[2 * i], src[2 * i + 1], True)
        dst[i] = word
        lo, hi = unpack_bf16x2(word)
        r = i % 2 + 2 * ((2 * i // 8) % n_m)
        lo_sum[r] = lo if lo_sum[r] is None else lo_sum[r] + lo
        hi_sum[r] = hi if hi_sum[r] is None else hi_sum[r] + hi
    for r in cutlass.range_constexpr(2 * n_m):
        state.row_sum_p[r] = state.row_sum_p[r] + (lo_sum[r] + hi_sum[r])


@cute.jit
def online_softmax_probs(acc_S, tOrP, state, scale_log2, is_first: cutlass.Constexpr[bool],
                         row_scale, is_bf16: cutlass.Constexpr[bool], masked: cutlass.Constexpr[bool] = True):
    """P = exp2(S * scale_log2 - max) in place (softmax and softcap); packed into tOrP unless
    tOrP is None (attn_fwd block_overlap: FP32 P stays in acc_S until write_p after the PV wait)."""
    state.step(acc_S, scale_log2, is_first, row_scale, masked)
    if cutlass.const_expr(tOrP is not None):
        if cutlass.const_expr(state.fixed):
            write_p_fixed(acc_S, tOrP, state)
        else:
            write_p_native(acc_S, tOrP, is_bf16)




# ----------------------------------------------------------------------------------------
# the device object's shared parts
# ----------------------------------------------------------------------------------------
class ScoreBase:
    """What the score functions' device objects (the contract: kernels/scores/__init__.py) share:
    the spec's choices as attributes, the per-key block rule, and the softmax family's defaults:
    flags, no transform, P by the online softmax over exp2(x * params[EXP2_SCALE] - max),
    packed after the PV wait by write_p_pinned, dS = P (dP - D).  A module's `Score` subclasses
    it and overrides what differs; only a score that runs a program (HAS_PROGRAM) takes the
    spec's evaluator, the others are "native" whatever the spec says."""
    has_lse = True
    uses_online_softmax = True
    needs_lse = True
    needs_dsum = True
    HAS_PROGRAM = False
    EXP2_SCALE = 1        # which of the 4 forward params scales the transformed scores into exp2
    # (index, weight) of the params that carry the bias b: the forward's 4 (fwd_scalars) and the
    # backward's 3 (bwd_scalars); seq_params adds weight * b there (spec.seq_bias)
    FWD_BIAS_SLOTS = ()
    BWD_BIAS_SLOTS = ()

    def __init__(self, spec):
        self.spec = spec
        self.evaluator = spec.evaluator if self.HAS_PROGRAM else "native"
        self.program = spec.program
        self.poly_split = spec.poly_split
        self.grad_rule = spec.grad_rule

    def seq_params(self, params, seqlen_k, backward: bool = False):
        """params with the bias of a packed sequence of seqlen_k keys, b = -ln S_k, added to the
        bias slots (spec.seq_bias: the host encoded b = 0); params as they are otherwise.  One
        MUFU.LG2 per tile; S_k = 0 (no key: nothing reads P) takes ln 1."""
        if not self.spec.seq_bias:
            return params
        slots = dict(self.BWD_BIAS_SLOTS if backward else self.FWD_BIAS_SLOTS)
        b = cute.math.log2(cutlass.max(seqlen_k, Int32(1)).to(Float32), fastmath=True) * Float32(-LN2)
        return tuple(p + b * Float32(slots[i]) if i in slots else p for i, p in enumerate(params))

    def poly_pair(self, col_group: int) -> bool:
        """Does key column group `col_group` run the program's block (scores.poly_pair)?"""
        return self.evaluator == "poly" and poly_pair(self.poly_split, col_group)

    def uses_block(self, col_group: int) -> bool:
        """The backward's rule per key column group: the forward's."""
        return self.poly_pair(col_group)

    @cute.jit
    def transform(self, acc_S: cute.Tensor, params, coords):
        pass

    @cute.jit
    def probs(self, acc_S, tOrP, state, params, is_first: cutlass.Constexpr[bool],
              masked: cutlass.Constexpr[bool], row_scale, is_bf16: cutlass.Constexpr[bool]):
        """P of the score stage, into tOrP, or (tOrP None: the overlapped loop) left in acc_S for
        write_p after the PV wait.  Returns what that write_p needs besides acc_S (its `carry`;
        None here)."""
        online_softmax_probs(acc_S, tOrP, state, params[self.EXP2_SCALE], is_first, row_scale, is_bf16,
                             masked)
        return None

    @cute.jit
    def write_p(self, acc_S, tOrP, is_bf16: cutlass.Constexpr[bool], carry=None):
        write_p_pinned(acc_S, tOrP, is_bf16)

    @cute.jit
    def dscore2(self, f0, f1, dp0, dp1, dsum0, dsum1):
        return f0 * (dp0 - dsum0), f1 * (dp1 - dsum1)


# ----------------------------------------------------------------------------------------
# online softmax state (shared by softmax and softcap)
# ----------------------------------------------------------------------------------------
class OnlineSoftmax:
    """Per-thread running row max (in the stage's score units) and partial row sum.

    The row sum stays thread-local (each thread sums its own columns) and is reduced over
    the quad once in `finalize`: that saves 2 shuffles per row per key block."""

    def __init__(self, num_rows: int, max_chains: int, sum_carry: bool, fixed_lse, rescale_threshold: float,
                 exp2_fma: int, exp2_program):
        if max_chains not in (1, 2, 4, 8):
            raise ValueError(f"max_chains must be 1, 2, 4 or 8, got {max_chains!r}")
        self.max_chains = max_chains
        # sum_carry: a block's row sum starts from the rescaled running sum instead of 0 (added
        # at the end). Same sum in another rounding order; the row's O-rescale factor then
        # heads the dependency chain, so ptxas computes it first and can schedule the O
        # rescale right after the PV wait instead of after the last exp2
        self.sum_carry = sum_carry
        # fixed_lse (a Float32, or None): the score hands `step` exp2 arguments taken against a
        # constant max m0 (softcap's transform_fixed) and fixed_lse = m0 in natural units:
        # no row max, no O rescale (bounded scores only)
        self.fixed_lse = fixed_lse
        self.fixed = fixed_lse is not None
        # exp2_fma n: in mask-free blocks, column groups g with g % 8 >= 8 - n take the exp2_f32
        # program's block (FMA pipe) instead of MUFU.EX2 (FwdConfig.exp2_fma; the fixed step only)
        self.exp2_fma = int(exp2_fma)
        self.exp2_program = exp2_program if self.exp2_fma else None
        if self.exp2_fma and (exp2_program is None or not exp2_program.is_exp2):
            raise ValueError(f"exp2_fma needs an exp2_f32 program, got {exp2_program}")
        # rescale_threshold t > 0 (log2 units, config.check_fwd keeps 0 <= t <= 16): a row keeps
        # its stale max until a block's max exceeds it by more than t, so p <= 2^t and most
        # blocks need no O rescale (row_scale exactly 1.0 for a kept row: `rescale_needed`);
        # 0 = rescale on every new max
        self.rescale_threshold = float(rescale_threshold)
        self.row_max = cute.make_rmem_tensor((num_rows,), Float32)
        self.row_sum = cute.make_rmem_tensor((num_rows,), Float32)
        # an empty tile (no key visible) finalises to O = 0, LSE = -inf
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)
        if self.fixed:   # the sum of the BF16-rounded P that O is divided by (write_p_fixed)
            self.row_sum_p = cute.make_rmem_tensor((num_rows,), Float32)
            self.row_sum_p.fill(0.0)

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
                a = s_mn[r, c] * scale_log2 + neg_m
                p = exp2_approx(a)
                s_mn[r, c] = p
                acc = acc + p
            if cutlass.const_expr(is_first or self.sum_carry):
                self.row_sum[r] = acc
            else:
                self.row_sum[r] = self.row_sum[r] * row_scale[r] + acc

    @cute.jit
    def _step_fixed(self, s_mn, is_first: cutlass.Constexpr[bool], masked: cutlass.Constexpr[bool] = True):
        """P = exp2(a) in place, a = (logit - m0) * log2(e) from the stage: no max, no rescale.
        row_sum adds the FP32 P (for the LSE); write_p_fixed adds the rounded P (for O)."""
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
            s_o = s
            if cutlass.const_expr(self.fixed):   # O by the rounded P's sum (write_p_fixed)
                s_o = quad_allreduce(self.row_sum_p[r], "sum")
            o_scale[r] = Float32(0.0) if empty else cute.arch.rcp_approx(s_o)
            m = self.fixed_lse if cutlass.const_expr(self.fixed) else self.row_max[r] * lse_scale
            if cutlass.const_expr(self.exp2_fma > 0):
                # a NaN score on an exp2_fma column leaves P = FLT_MAX there (the block's integer
                # exponent add on the canonical NaN), +inf once rounded: O is NaN by the division,
                # but ln of the FP32 sum would be finite; s_o - s_o is NaN for that row, +0 else
                m = m + (s_o - s_o)
            lse[r] = -Float32.inf if empty else m + cute.math.log2(s, fastmath=True) * LN2




def _frag_a_coord(shape, e: int) -> list:
    """Element e's coordinate in the PV A-fragment view ((2 cols, 2 rows, 2 groups), M, (N/16, N')) of
    acc_S (see acc_as_frag_a), flattened: [col, row half, group, M, N/16, N']."""
    flat = [shape[0][0], shape[0][1], shape[0][2], shape[1], shape[2][0], shape[2][1]]
    crd = []
    for n in flat:
        crd.append(e % n)
        e //= n
    return crd


def frag_a_col_group(shape, e: int) -> int:
    """Key column group (within the block) of element e of the PV A-fragment view of acc_S."""
    crd = _frag_a_coord(shape, e)
    return crd[2] + 2 * (crd[4] + shape[2][0] * crd[5])


def frag_a_row(shape, e: int) -> int:
    """The thread's row (0 .. 2 * MMA_M - 1: rows r and r + 8 of each 64-row atom) of element e of the
    PV A-fragment view of acc_S."""
    crd = _frag_a_coord(shape, e)
    return crd[1] + shape[0][1] * crd[3]



# ----------------------------------------------------------------------------------------
# where the scores of a fragment sit
# ----------------------------------------------------------------------------------------
class SeqlenInfo:
    """seqlen_q, seqlen_k of the current batch entry (a user score_mod's `seqlen_info`)."""

    def __init__(self, seqlen_q, seqlen_k):
        self.seqlen_q, self.seqlen_k = seqlen_q, seqlen_k


class Coords:
    """Where each score of an accumulator fragment sits, for the score hooks.

    idx_mn: the identity-tensor partition of the fragment in acc_mn_view form (tile-relative
    (row, col) of every element); the forward's rows are queries and its columns keys, the
    backward's (S^T) rows keys and columns queries (transposed=True).  q0 / k0: the tile's first
    query / key index.  batch, head (the query head), seqlen (SeqlenInfo) and aux (the user's aux
    tensors, or None) complete what a user score function may read.  Built-in score functions
    ignore it; the index arithmetic they do not read is dead code and leaves the SASS as is."""

    def __init__(self, idx_mn, q0, k0, batch, head, seqlen, aux=None, transposed: bool = False):
        self.idx_mn, self.q0, self.k0 = idx_mn, q0, k0
        self.batch, self.head, self.seqlen, self.aux = batch, head, seqlen, aux
        self.transposed = transposed

    def q_idx(self, r, c):
        return self.q0 + self.idx_mn[r, c][1 if self.transposed else 0]

    def kv_idx(self, r, c):
        return self.k0 + self.idx_mn[r, c][0 if self.transposed else 1]
