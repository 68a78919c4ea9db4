"""Pre- and post-processing of the attention backward as CuTe DSL kernels (sm_90a).

Same contract as the torch reference in kernels/attn_bwd_prepost.py (the tests' oracle);
attn_bwd() runs these kernels (measured against the torch steps: docs/MEASURED.md).

pre (one launch): for every (batch, head, query row)
    dsum[b, h, s] = sum_d dO[b, s, h, d] * O[b, s, h, d]   (FP32; products of 16-bit
                    values are exact in FP32, so only the summation order differs from
                    torch: per thread in order, then a butterfly over the row's lanes)
    lse2[b, h, s] = LSE * log2(e) (or LSE as is for lse_base "2"), -inf -> +inf
    both (B, H, S_pad) FP32 including the tail [S, S_pad): dsum 0, lse2 +inf.
    A buffer the score stage does not need is written as zeros (the backward only reads
    it); with neither needed (sigmoid) the host allocates one zeroed buffer, no launch.
  PreZeroKernel (PreKey.zero_dq): the same, plus zeroing the head_loop backward's FP32 dQ
    accumulator in the same launch (attn_bwd(zero_dq_in_pre=True); the default for the
    softmax modes, attn_bwd_sm90.zero_dq_in_pre_default).
  Grid (S_pad / rows, H, B), 128 threads.  A row of D 16-bit values is split over
  D / 32 adjacent lanes (4 for D=128, 2 for D=64), each loading 4 chunks of 16 bytes of
  dO and of O (8 LDG.E.128; chunk c of lane l is c * lanes + l, so the lanes of a row read
  adjacent 16 bytes per instruction); each lane sums its 32 products in order, then a
  shuffle butterfly (2 or 1 steps) adds the lanes.  One CTA = 32 rows (D=128) or 64 rows
  (D=64) of one head, so the dsum writes of a warp are consecutive floats; thread t < rows
  also converts LSE of row t (coalesced 4-byte reads and writes).  A two-rows-per-thread
  variant was dropped: ptxas put the first row's math before the second row's loads.

post: dq = dq_acc * scale (PostDqKernel: the accumulator's rows reordered, kernels/
    prepost_launch.py, "The dQ accumulator"), and (PostKernel, one launch for both; head_loop
    builds have none) dk = dk_acc * scale, dv = dv_acc, each product in FP32 rounded once to
    the output dtype (cvt.rn, as torch.mul(acc, scale, out=bf16) does: the scale is rounded to
    FP32 first there too).  Both move 8-value chunks (32 bytes in = 2 LDG.E.128, 16 bytes out
    = 1 STG.E.128), 256 threads x 4 chunks per thread per step, loads first.  PostKernel treats
    dK / dV as flat arrays: blocks [0, g_k) do dK, the next g_k dV.

Compile: PreKernel(PreKey).compile() / PostKernel(PostKey).compile(); the torch entries
preprocess() / postprocess() are in kernels/prepost_launch.py (pure Python: a process whose kernels
load from the compile cache never imports this module).  Limits: tensors 16-byte aligned (LSE 4),
contiguous, element counts < 2**31 (32-bit indexing); the entries check and raise
otherwise.  Empty tensors and an O whose dtype differs from dO go to the torch reference.
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .prepost_launch import CHUNK32, DQ_BAND, VARLEN_PAD, PostKey, PreKey, dq_acc_word  # noqa: F401  (the keys are pure data)

LOG2_E = math.log2(math.e)
CHUNK16 = 8          # 16-bit values per 16-byte load

PRE_THREADS = 128
PRE_CHUNKS = 4       # 16-byte chunks of dO (and of O) per lane: 8 loads per thread
ZERO_CHUNK = 4       # FP32 values per 16-byte store (PreZeroKernel)

POST_THREADS = 256
POST_UNROLL = 4      # chunks per thread per block (4 x 32 bytes in flight)
DQ_UNIT = 16         # PostDqKernel: accumulator words per unit (rows r, r + 8 x 8 columns)


def _dtype(name: str):
    return {"bf16": cutlass.BFloat16, "f16": cutlass.Float16}[name]


def _fake(dt, rank: int, div: int = 1, align: int = 16):
    """rank-D fake tensor: 32-bit symbolic shape, 64-bit symbolic strides (multiples of
    div), unit innermost stride, `align`-byte aligned base: what the tvm-ffi entry checks
    the torch tensors against (see attn_bwd_sm90.fake_args)."""
    shape = tuple(cute.sym_int(32) for _ in range(rank))
    stride = tuple(cute.sym_int64(divisibility=div) for _ in range(rank - 1)) + (1,)
    return cute.runtime.make_fake_tensor(dt, shape, stride, assumed_align=align)


# ------------------------------------------------------------------------------- pre
class PreKernel:
    def __init__(self, key: PreKey):
        self.key = key
        self.dtype = _dtype(key.dtype)
        self.D = key.head_dim
        self.lanes = self.D // (CHUNK16 * PRE_CHUNKS)          # threads per row: 8, 4 or 2
        self.rows = PRE_THREADS // self.lanes                  # rows per CTA: 32 or 64

    @cute.kernel
    def kernel(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mLSE2: cute.Tensor, mDsum: cute.Tensor):
        self._rows(mdO, mO, mLSE, mLSE2, mDsum)

    @cute.jit
    def _rows(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
              mLSE2: cute.Tensor, mDsum: cute.Tensor, seq=None):
        """dsum and lse2 of this CTA's rows (the whole pre kernel without zero_dq).
        seq: (batch index, S_q, S_pad) of one packed sequence (PreVarlenKernel), whose tensors
        the caller has offset to the sequence's first row; None: the grid's batch and the
        tensors' lengths."""
        tidx, _, _ = cute.arch.thread_idx()
        s_blk, h, b = cute.arch.block_idx()
        s_q = mdO.shape[1]
        s_pad = mDsum.shape[2]
        if cutlass.const_expr(seq is not None):
            b, s_q, s_pad = seq
        s0 = s_blk * self.rows

        # ---- dsum: the lanes of one row sit next to each other in the warp
        lane = tidx % self.lanes
        s = s0 + tidx // self.lanes
        if cutlass.const_expr(self.key.needs_dsum):
            # Rows past S_q load row S_q - 1 (in bounds) and are zeroed after the sum: no
            # branch around the loads.  (ptxas issues 4, then the other 4 during the first
            # FFMAs, at 34 registers; 12 CTAs per SM keep ~100 KB in flight per SM.)
            s_in = cutlass.min(s, s_q - 1)
            rows = [cute.zipped_divide(cute.make_tensor(m[b, s_in, h, None].iterator,
                                                        cute.make_layout(self.D)), (CHUNK16,))
                    for m in (mdO, mO)]
            regs = []
            for c in cutlass.range_constexpr(PRE_CHUNKS):
                idx = c * self.lanes + lane       # the lanes of a row read adjacent 16 bytes
                for g in rows:
                    t = cute.make_rmem_tensor((CHUNK16,), self.dtype)
                    cute.autovec_copy(g[(None, idx)], t)          # LDG.E.128
                    regs.append(t)
            acc = Float32(0.0)
            for c in cutlass.range_constexpr(PRE_CHUNKS):       # in order, one lane's 32 values
                prod = cute.make_rmem_tensor((CHUNK16,), Float32)
                # exact in FP32 (8- or 11-bit significands): only the summation order differs
                prod.store(regs[2 * c].load().to(Float32) * regs[2 * c + 1].load().to(Float32))
                for i in cutlass.range_constexpr(CHUNK16):
                    acc = acc + prod[i]
            for i in cutlass.range_constexpr(int(math.log2(self.lanes))):
                # butterfly over the row's lanes: every lane ends with the row sum
                acc = acc + cute.arch.shuffle_sync_bfly(acc, self.lanes >> (i + 1))
            if s >= s_q:
                acc = Float32(0.0)
            if lane == 0 and s < s_pad:
                mDsum[b, h, s] = acc
        else:
            if lane == 0 and s < s_pad:
                mDsum[b, h, s] = Float32(0.0)

        # ---- lse2: thread t converts row s0 + t
        if tidx < self.rows:
            row = s0 + tidx
            if row < s_pad:
                v = Float32(0.0)
                if cutlass.const_expr(self.key.needs_lse):
                    v = Float32(math.inf)
                    if row < s_q:
                        lse = mLSE[b, h, row]
                        if cutlass.const_expr(self.key.lse_base == "e"):
                            lse = lse * Float32(LOG2_E)
                        if lse != Float32(-math.inf):   # NaN and +inf kept
                            v = lse
                mLSE2[b, h, row] = v

    @cute.jit
    def __call__(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mLSE2: cute.Tensor, mDsum: cute.Tensor, stream):
        grid = self._grid(mDsum)
        self.kernel(mdO, mO, mLSE, mLSE2, mDsum).launch(
            grid=grid, block=[PRE_THREADS, 1, 1], stream=stream)

    def _grid(self, mDsum):
        """(S_pad / rows, H, B): a CTA per `rows` query rows of one head."""
        return (cute.ceil_div(mDsum.shape[2], self.rows), mDsum.shape[1], mDsum.shape[0])

    def fake_args(self):
        io = [_fake(self.dtype, 4, div=8) for _ in range(2)]      # (B, S, H, D) dO, O
        lse = _fake(Float32, 3, align=4)                          # (B, H, S), read per value
        return io + [lse] + [_fake(Float32, 3) for _ in range(2)]  # lse2, dsum (B, H, S_pad)

    def compile(self, options: str = ""):
        """Uncached build with compiler options (SASS inspection); launches use compiled()."""
        from . import compile_cache
        return compile_cache.compile_tvm_ffi(self, self.fake_args(), options)


class PreZeroKernel(PreKernel):
    """PreKernel that also zeroes the FP32 dQ accumulator (B, H, S_pad, D) rows of its CTA,
    so the backward needs no separate memset launch for it (PreKey.zero_dq; the head_loop
    backward's only accumulator).  Same thread-to-row map as the dsum loads: lane l of a
    row stores chunks c * lanes + l, 4 floats each (8 STG.E.128 per thread), the row's D
    words; the grid covers the S_pad rows (the padding
    rows take the main kernel's zero adds).  With neither dsum nor lse2 needed (sigmoid) the
    kernel writes their zeros; the default (attn_bwd_sm90.zero_dq_in_pre_default) uses it only
    where the pre kernel runs anyway."""

    @cute.kernel
    def kernel(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mLSE2: cute.Tensor, mDsum: cute.Tensor, mDQacc: cute.Tensor):
        self._rows(mdO, mO, mLSE, mLSE2, mDsum)
        self._zero_dq(mDQacc)

    @cute.jit
    def _zero_dq(self, mDQacc: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        s_blk, h, b = cute.arch.block_idx()
        lane = tidx % self.lanes
        s = s_blk * self.rows + tidx // self.lanes
        if s < mDQacc.shape[2]:
            row = cute.zipped_divide(cute.make_tensor(mDQacc[b, h, s, None].iterator,
                                                      cute.make_layout(self.D)), (ZERO_CHUNK,))
            z = cute.make_rmem_tensor((ZERO_CHUNK,), Float32)
            z.fill(0.0)
            for c in cutlass.range_constexpr(self.D // ZERO_CHUNK // self.lanes):
                cute.autovec_copy(z, row[(None, c * self.lanes + lane)])     # STG.E.128

    @cute.jit
    def __call__(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mLSE2: cute.Tensor, mDsum: cute.Tensor, mDQacc: cute.Tensor, stream):
        grid = self._grid(mDsum)
        self.kernel(mdO, mO, mLSE, mLSE2, mDsum, mDQacc).launch(
            grid=grid, block=[PRE_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        return super().fake_args() + [_fake(Float32, 4, div=4)]   # dQ accumulator (B, H, S_pad, D)


class PreVarlenKernel(PreKernel):
    """PreKernel on packed sequences (PreKey.varlen; kernels/prepost_launch.py, "Packed
    sequences"): dO, O (1, total_q, H, D), LSE (1, H, total_q), lse2 and dsum (1, H, padded rows),
    cu_seqlens_q (B + 1).  Grid (padded max_seqlen_q / rows, H, B): CTA (x, h, b) converts rows
    [x * rows, ...) of sequence b below its padded length ceil(S_b / VARLEN_PAD) * VARLEN_PAD
    (dO / O / LSE from row cu_q[b], lse2 / dsum from its padded offset); a CTA past that length
    (an empty sequence: all of them) loads nothing."""

    @cute.kernel
    def kernel(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mLSE2: cute.Tensor, mDsum: cute.Tensor, mCuQ: cute.Tensor):
        s_blk, _, b = cute.arch.block_idx()
        off = mCuQ[b]
        s_q = mCuQ[b + 1] - off
        s_pad = (s_q + (VARLEN_PAD - 1)) // VARLEN_PAD * VARLEN_PAD
        off_pad = (off + b * VARLEN_PAD) // VARLEN_PAD * VARLEN_PAD   # prepost_launch.varlen_padded_offset
        mdO, mO = (cute.domain_offset((0, off, 0, 0), t) for t in (mdO, mO))
        mLSE = cute.domain_offset((0, 0, off), mLSE)
        mLSE2, mDsum = (cute.domain_offset((0, 0, off_pad), t) for t in (mLSE2, mDsum))
        if s_blk * self.rows < s_pad:
            self._rows(mdO, mO, mLSE, mLSE2, mDsum, (Int32(0), s_q, s_pad))

    @cute.jit
    def __call__(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mLSE2: cute.Tensor, mDsum: cute.Tensor, mCuQ: cute.Tensor, max_seqlen_q: Int32, stream):
        rows = cute.ceil_div(max_seqlen_q, VARLEN_PAD) * VARLEN_PAD
        grid = (cute.ceil_div(rows, self.rows), mDsum.shape[1], mCuQ.shape[0] - 1)
        self.kernel(mdO, mO, mLSE, mLSE2, mDsum, mCuQ).launch(
            grid=grid, block=[PRE_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        cu = cute.runtime.make_fake_tensor(Int32, (cute.sym_int(32),), (1,), assumed_align=4)
        return super().fake_args() + [cu, Int32(1)]


# ------------------------------------------------------------------------------ post
class PostKernel:
    """dK, dV (PostKey part "dkv"): flat segments of 8-value chunks (module docstring)."""

    def __init__(self, key: PostKey):
        self.key = key
        self.dtype = _dtype(key.dtype)
        self.per_block = POST_THREADS * POST_UNROLL     # chunks per block

    @cute.jit
    def _segment(self, mAcc: cute.Tensor, mOut: cute.Tensor, n_chunks: Int32, blk: Int32,
                 scale: Float32, scaled: cutlass.Constexpr):
        """Chunks blk * per_block + tidx + k * THREADS, k < UNROLL, of one gradient."""
        tidx, _, _ = cute.arch.thread_idx()
        flat = cute.make_layout(n_chunks * CHUNK32)
        gA = cute.zipped_divide(cute.make_tensor(mAcc.iterator, flat), (CHUNK32,))
        gO = cute.zipped_divide(cute.make_tensor(mOut.iterator, flat), (CHUNK32,))
        first = blk * self.per_block + tidx
        regs = []
        for k in cutlass.range_constexpr(POST_UNROLL):
            c = first + k * POST_THREADS
            t = cute.make_rmem_tensor((CHUNK32,), Float32)
            if c < n_chunks:
                cute.autovec_copy(gA[(None, c)], t)          # 2 x LDG.E.128
            regs.append(t)
        for k in cutlass.range_constexpr(POST_UNROLL):
            c = first + k * POST_THREADS
            if c < n_chunks:
                self._store(regs[k], gO[(None, c)], scale, scaled)

    @cute.jit
    def _store(self, t, dst, scale: Float32, scaled: cutlass.Constexpr):
        x = t.load()
        if cutlass.const_expr(scaled):
            x = x * scale                             # FP32 product, then one rounding
        o = cute.make_rmem_tensor((CHUNK32,), self.dtype)
        o.store(x.to(self.dtype))
        cute.autovec_copy(o, dst)                     # STG.E.128

    @cute.kernel
    def kernel(self, mKa: cute.Tensor, mVa: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
               nk: Int32, gk: Int32, scale: Float32):
        bidx, _, _ = cute.arch.block_idx()
        if bidx < gk:
            self._segment(mKa, mK, nk, bidx, scale, True)
        else:
            self._segment(mVa, mV, nk, bidx - gk, scale, False)

    @cute.jit
    def __call__(self, mKa: cute.Tensor, mVa: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                 scale: Float32, stream):
        nk = cute.size(mKa) // CHUNK32       # the host checks numel % 8 == 0 and < 2**31
        gk = cute.ceil_div(nk, self.per_block)
        self.kernel(mKa, mVa, mK, mV, nk, gk, scale).launch(
            grid=[2 * gk, 1, 1], block=[POST_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        accs = [_fake(Float32, 4, div=4) for _ in range(2)]    # (B, S, H, D) FP32
        outs = [_fake(self.dtype, 4, div=8) for _ in range(2)]
        return accs + outs + [Float32(1.0)]

    def compile(self, options: str = ""):
        """Uncached build with compiler options (SASS inspection); launches use compiled()."""
        from . import compile_cache
        return compile_cache.compile_tvm_ffi(self, self.fake_args(), options)


class PostDqKernel(PostKernel):
    """dQ (PostKey part "dq"): dq[b, s, h, :] = scale * the accumulator's row s of head h, read in
    dq_acc_word's order (kernels/prepost_launch.py, "The dQ accumulator").  Grid (row blocks, B):
    CTA (x, b) writes rows [x * R, (x + 1) * R) (R = rows_per_cta, a multiple of the 16-row band
    set by the host) of sequence b, all heads.  Unit j of the CTA is (band, row r < 8 of it, head,
    8-column step k): the 64 contiguous bytes of the accumulator that hold rows r and r + 8 x the
    step's 8 columns (4 LDG.E.128), stored as two 16-byte chunks of dq (rows below n_rows), so a
    warp's loads are whole 64-byte runs and its stores consecutive 16-byte chunks of one row.
    Varlen (PostKey.varlen): packed dq (1, total_q, H, D) from row cu_q[b], the accumulator (1, H,
    rows, D) from the padded offset (a multiple of VARLEN_PAD: whole bands); dense: dq (B, S_q, H,
    D), the accumulator (B, H, S_pad, D)."""

    def __init__(self, key: PostKey):
        super().__init__(key)
        self.unroll = POST_UNROLL * CHUNK32 // DQ_UNIT          # the same words per step as PostKernel
        self.per_block = POST_THREADS * self.unroll

    @cute.jit
    def _rows(self, mAcc: cute.Tensor, mOut: cute.Tensor, b_acc: Int32, p0: Int32, out0: Int32,
              n_rows: Int32, scale: Float32):
        """n_rows rows: accumulator rows p0 + r of batch entry b_acc -> dq rows out0 + r (flat);
        p0 starts a band."""
        tidx, _, _ = cute.arch.thread_idx()
        n_h = mOut.shape[2]
        d = mOut.shape[3]
        n8 = d // CHUNK32
        per_row = n_h * n8                          # dq chunks per row, units per band row
        per_band = 8 * per_row
        plane = mAcc.shape[2] * d                   # words per head of the accumulator
        flat_a = cute.make_layout(cute.size(mAcc))
        flat_o = cute.make_layout(cute.size(mOut))
        gA = cute.zipped_divide(cute.make_tensor(mAcc.iterator, flat_a), (DQ_UNIT,))   # 64-byte runs
        gO = cute.zipped_divide(cute.make_tensor(mOut.iterator, flat_o), (CHUNK32,))
        n = cute.ceil_div(n_rows, DQ_BAND) * per_band
        for j0 in cutlass.range(0, n, self.per_block, unroll=1):
            regs = []
            for k in cutlass.range_constexpr(self.unroll):
                j = j0 + tidx + k * POST_THREADS
                t = cute.make_rmem_tensor((DQ_UNIT,), Float32)   # word 4t + 2 (row r + 8) + e: column 2t + e
                if j < n:
                    band = j // per_band
                    rem = j - band * per_band
                    r = rem // per_row
                    rem = rem - r * per_row
                    h = rem // n8
                    c8 = rem - h * n8
                    w = (b_acc * n_h + h) * plane + dq_acc_word(p0 + band * DQ_BAND + r, c8 * CHUNK32, d)
                    cute.autovec_copy(gA[(None, w // DQ_UNIT)], t)      # 4 x LDG.E.128
                regs.append(t)
            for k in cutlass.range_constexpr(self.unroll):
                j = j0 + tidx + k * POST_THREADS
                if j < n:
                    band = j // per_band
                    rem = j - band * per_band
                    r = rem // per_row
                    rest = rem - r * per_row                # head x step: the chunk inside the row
                    for hi in cutlass.range_constexpr(2):   # rows r, r + 8 of the band
                        row = band * DQ_BAND + r + 8 * hi
                        if row < n_rows:
                            cols = cute.make_rmem_tensor((CHUNK32,), Float32)
                            for c in cutlass.range_constexpr(CHUNK32):
                                cols[c] = regs[k][4 * (c // 2) + 2 * hi + c % 2]
                            self._store(cols, gO[(None, (out0 + row) * per_row + rest)], scale, True)

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mOut: cute.Tensor, rows_per_cta: Int32, scale: Float32):
        x, b, _ = cute.arch.block_idx()
        s_q = mOut.shape[1]
        s0 = x * rows_per_cta
        if s0 < s_q:
            self._rows(mAcc, mOut, b, s0, b * s_q + s0, cutlass.min(rows_per_cta, s_q - s0), scale)

    @cute.jit
    def __call__(self, mAcc: cute.Tensor, mOut: cute.Tensor, rows_per_cta: Int32, scale: Float32, stream):
        grid = (cute.ceil_div(mOut.shape[1], rows_per_cta), mOut.shape[0], 1)
        self.kernel(mAcc, mOut, rows_per_cta, scale).launch(grid=grid, block=[POST_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        return [_fake(Float32, 4, div=4), _fake(self.dtype, 4, div=8), Int32(1), Float32(1.0)]


class PostDqVarlenKernel(PostDqKernel):
    """PostDqKernel on packed sequences (PostKey varlen): grid (row blocks of max_seqlen_q, B)."""

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mOut: cute.Tensor, mCuQ: cute.Tensor, rows_per_cta: Int32,
               scale: Float32):
        x, b, _ = cute.arch.block_idx()
        off = mCuQ[b]
        s_q = mCuQ[b + 1] - off
        off_pad = (off + b * VARLEN_PAD) // VARLEN_PAD * VARLEN_PAD   # prepost_launch.varlen_padded_offset
        s0 = x * rows_per_cta
        if s0 < s_q:
            self._rows(mAcc, mOut, Int32(0), off_pad + s0, off + s0, cutlass.min(rows_per_cta, s_q - s0), scale)

    @cute.jit
    def __call__(self, mAcc: cute.Tensor, mOut: cute.Tensor, mCuQ: cute.Tensor, max_seqlen_q: Int32,
                 rows_per_cta: Int32, scale: Float32, stream):
        grid = (cute.ceil_div(max_seqlen_q, rows_per_cta), mCuQ.shape[0] - 1, 1)
        self.kernel(mAcc, mOut, mCuQ, rows_per_cta, scale).launch(
            grid=grid, block=[POST_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        cu = cute.runtime.make_fake_tensor(Int32, (cute.sym_int(32),), (1,), assumed_align=4)
        return [_fake(Float32, 4, div=4), _fake(self.dtype, 4, div=8), cu, Int32(1), Int32(1), Float32(1.0)]


def kernel_for(key):
    """The kernel object of a PreKey or PostKey."""
    if isinstance(key, PreKey):
        return (PreZeroKernel if key.zero_dq else PreVarlenKernel if key.varlen else PreKernel)(key)
    if key.part == "dkv":
        return PostKernel(key)
    return (PostDqVarlenKernel if key.varlen else PostDqKernel)(key)


def build(key):
    """(kernel, compile args) of a PreKey / PostKey: the compile cache's build."""
    kern = kernel_for(key)
    return kern, kern.fake_args()
