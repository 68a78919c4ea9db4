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
  Grid (S_pad / rows, H, B), 128 threads.  A row of D 16-bit values is split over D / 8
  adjacent lanes (8 for D=64, 16 for D=128, 32 for D=256), one 16-byte chunk of dO and of O
  each, so every load instruction of a warp reads whole rows (whole 128-byte lines: 4, 2 or 1
  rows); the CTA's 128 threads cover 128 / lanes rows per pass and PRE_CHUNKS passes (8
  LDG.E.128 per thread, all issued before the math).  Each lane sums its 8 products per row
  in order, then a shuffle butterfly (3-5 steps) adds the row's lanes.  One CTA = 64 rows
  (D=64), 32 (D=128) or 16 (D=256) of one head; thread t < rows also converts LSE of row t
  (coalesced 4-byte reads and writes).  (Fewer lanes per row, each reading several chunks,
  would have a warp's load touch up to 16 lines, part of each: the L1's request rate, not
  DRAM, would bound the kernel; docs/MEASURED.md bwd-prepost-lines.)

post: dq = dq_acc * scale (PostDqKernel: the accumulator's rows reordered, kernels/
    prepost_launch.py, "The dQ accumulator"), and (PostKernel, one launch for both; head_loop
    builds have none) dk = dk_acc * scale, dv = dv_acc, each product in FP32 rounded once to
    the output dtype (cvt.rn, as torch.mul(acc, scale, out=bf16) does: the scale is rounded to
    FP32 first there too).  PostKernel moves 8-value chunks (32 bytes in = 2 LDG.E.128, 16 bytes
    out = 1 STG.E.128), 256 threads x 4 chunks per thread per step, loads first, treating dK / dV
    as flat arrays: blocks [0, g_k) do dK, the next g_k dV.  PostDqKernel reorders the
    accumulator's warp-wide 512-byte runs through a per-warp smem slot (its docstring).

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
from cutlass.memory import SmemAllocator

from .prepost_launch import CHUNK32, DQ_BAND, VARLEN_PAD, PostKey, PreKey, dq_acc_word  # noqa: F401  (the keys are pure data)

LOG2_E = math.log2(math.e)
CHUNK16 = 8          # 16-bit values per 16-byte load

PRE_THREADS = 128
PRE_CHUNKS = 4       # 16-byte chunks of dO (and of O) per lane: 8 loads per thread
ZERO_CHUNK = 4       # FP32 values per 16-byte store (PreZeroKernel)

POST_THREADS = 256
POST_UNROLL = 4      # chunks per thread per block (4 x 32 bytes in flight)
DQ_STEPS = 4         # PostDqKernel: 8-column steps per warp item (4 x 512 contiguous bytes)
POST_DQ_ITEMS = 2    # PostDqKernel: warp items per warp (both items' 8 loads in flight)


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
        self.lanes = self.D // CHUNK16                         # threads per row: 8, 16 or 32
        self.pass_rows = PRE_THREADS // self.lanes             # rows per pass: 16, 8 or 4
        self.rows = self.pass_rows * PRE_CHUNKS                # rows per CTA: 64, 32 or 16

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
        r0 = s0 + tidx // self.lanes        # this thread's row of pass 0; pass p: r0 + p * pass_rows
        if cutlass.const_expr(self.key.needs_dsum):
            # Rows past S_q load row S_q - 1 (in bounds) and are zeroed after the sum: no
            # branch around the loads, all 8 issued before the first product.
            regs = []
            for p in cutlass.range_constexpr(PRE_CHUNKS):
                s_in = cutlass.min(r0 + p * self.pass_rows, s_q - 1)
                for m in (mdO, mO):
                    g = cute.zipped_divide(cute.make_tensor(m[b, s_in, h, None].iterator,
                                                            cute.make_layout(self.D)), (CHUNK16,))
                    t = cute.make_rmem_tensor((CHUNK16,), self.dtype)
                    cute.autovec_copy(g[(None, lane)], t)         # LDG.E.128
                    regs.append(t)
            for p in cutlass.range_constexpr(PRE_CHUNKS):
                prod = cute.make_rmem_tensor((CHUNK16,), Float32)
                # exact in FP32 (8- or 11-bit significands): only the summation order differs
                prod.store(regs[2 * p].load().to(Float32) * regs[2 * p + 1].load().to(Float32))
                acc = Float32(0.0)
                for i in cutlass.range_constexpr(CHUNK16):      # in order, one lane's 8 values
                    acc = acc + prod[i]
                for i in cutlass.range_constexpr(int(math.log2(self.lanes))):
                    # butterfly over the row's lanes: every lane ends with the row sum
                    acc = acc + cute.arch.shuffle_sync_bfly(acc, self.lanes >> (i + 1))
                s = r0 + p * self.pass_rows
                if s >= s_q:
                    acc = Float32(0.0)
                if lane == 0 and s < s_pad:
                    mDsum[b, h, s] = acc
        else:
            for p in cutlass.range_constexpr(PRE_CHUNKS):
                s = r0 + p * self.pass_rows
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
    backward's only accumulator).  The CTA's rows of one head are one contiguous block
    (rows x D words, 16 KB at every D): 8 STG.E.128 of zeros per thread, warp-contiguous
    (_zero_dq); the grid covers the S_pad rows (the padding rows take the main kernel's zero
    adds).  With neither dsum nor lse2 needed (sigmoid) the
    kernel writes their zeros; the default (attn_bwd_sm90.zero_dq_in_pre_default) uses it only
    where the pre kernel runs anyway."""

    @cute.kernel
    def kernel(self, mdO: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mLSE2: cute.Tensor, mDsum: cute.Tensor, mDQacc: cute.Tensor):
        self._rows(mdO, mO, mLSE, mLSE2, mDsum)
        self._zero_dq(mDQacc)

    @cute.jit
    def _zero_dq(self, mDQacc: cute.Tensor):
        """The CTA's rows of one head are rows x D contiguous words: thread t stores chunks
        t + 128 k (ZERO_CHUNK words each), so a warp's store fills 512 contiguous bytes."""
        tidx, _, _ = cute.arch.thread_idx()
        s_blk, h, b = cute.arch.block_idx()
        s0 = s_blk * self.rows
        n_chunks = self.rows * self.D // ZERO_CHUNK
        blk = cute.zipped_divide(cute.make_tensor(mDQacc[b, h, s0, None].iterator,
                                                  cute.make_layout(self.rows * self.D)), (ZERO_CHUNK,))
        z = cute.make_rmem_tensor((ZERO_CHUNK,), Float32)
        z.fill(0.0)
        for k in cutlass.range_constexpr(n_chunks // PRE_THREADS):
            c = tidx + k * PRE_THREADS
            if s0 + c * ZERO_CHUNK // self.D < mDQacc.shape[2]:
                cute.autovec_copy(z, blk[(None, c)])                  # STG.E.128

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
    dq_acc_word's order (kernels/prepost_launch.py, "The dQ accumulator").

    Work is split in warp items: (16-row band, head, group of DQ_STEPS 8-column steps), the 2 KB of
    the accumulator that hold the band's 32 columns of that group, contiguous.  A warp loads an
    item as DQ_STEPS warp-wide 16-byte loads (each 512 contiguous bytes: lane l gets the wgmma
    fragment chunk of lane l, rows l / 4 and l / 4 + 8 x columns 2 (l % 4), + 1 of the step),
    stores the chunks to its own smem slot with chunk c of step k at position c ^ k, and reads back
    per lane (r, q) = (l / 4, l % 4) the 4 chunks 4 r + i of step q (position (4 r + i) ^ q): rows r,
    r + 8 x the step's 8 columns in register order, so each lane writes two 16-byte chunks of dq
    (a warp's store: 8 rows x 64 contiguous bytes).  The XOR spreads both the stores (a warp's 32
    chunks of a step are a permutation of one 512-byte run) and the loads (the 8 lanes of a
    quarter-warp phase read 8 distinct 16-byte bank groups) over the banks.  (A lane loading its
    own 64 contiguous bytes from global memory would have each warp load touch 32 lines, 16
    bytes of each: the L1's request rate, not DRAM, would bound the kernel.)

    A CTA runs POST_DQ_ITEMS items per warp: grid (items of the longest sequence / items per CTA,
    B); items order (band, head, group), group fastest.  Varlen (PostKey.varlen): packed dq (1,
    total_q, H, D) from row cu_q[b], the accumulator (1, H, rows, D) from the padded offset (a
    multiple of VARLEN_PAD: whole bands); dense: dq (B, S_q, H, D), the accumulator (B, H, S_pad,
    D).  D a multiple of 32."""

    def __init__(self, key: PostKey):
        super().__init__(key)
        self.warps = POST_THREADS // 32
        self.per_block = self.warps * POST_DQ_ITEMS              # warp items per CTA

    @staticmethod
    def _item(it, per_band, groups):
        """Warp item it -> (it, band, head, group): items in (band, head, group) order, group fastest."""
        band = it // per_band
        rem = it - band * per_band
        h = rem // groups
        return it, band, h, rem - h * groups

    @cute.jit
    def _items(self, mAcc: cute.Tensor, mOut: cute.Tensor, b_acc: Int32, p0: Int32, out0: Int32,
               n_rows: Int32, first: Int32, scale: Float32):
        """Warp items first + warp + warps * u (u < POST_DQ_ITEMS) of n_rows rows: accumulator
        rows p0 + r of batch entry b_acc (p0 starts a band) -> dq rows out0 + r (flat)."""
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // 32
        lane = tidx % 32
        n_h = mOut.shape[2]
        d = mOut.shape[3]
        groups = d // (CHUNK32 * DQ_STEPS)          # 32-column groups per row
        per_band = n_h * groups
        n_items = cute.ceil_div(n_rows, DQ_BAND) * per_band
        plane = mAcc.shape[2] * d                   # words per head of the accumulator
        per_row = n_h * (d // CHUNK32)              # dq chunks per row
        gA = cute.zipped_divide(cute.make_tensor(mAcc.iterator, cute.make_layout(cute.size(mAcc))),
                                (ZERO_CHUNK,))      # 16-byte chunks of the accumulator
        gO = cute.zipped_divide(cute.make_tensor(mOut.iterator, cute.make_layout(cute.size(mOut))),
                                (CHUNK32,))         # 16-byte chunks of dq
        slot = DQ_STEPS * 32                        # chunks of one warp item
        sBuf = SmemAllocator().allocate_tensor(
            Float32, cute.make_layout(self.per_block * slot * ZERO_CHUNK), byte_alignment=16)
        sC = cute.zipped_divide(sBuf, (ZERO_CHUNK,))
        regs = []
        for u in cutlass.range_constexpr(POST_DQ_ITEMS):
            it, band, h, g = self._item(first + warp + self.warps * u, per_band, groups)
            base = ((b_acc * n_h + h) * plane + (p0 + band * DQ_BAND) * d + g * (DQ_STEPS * CHUNK32 * DQ_BAND)) // ZERO_CHUNK
            for k in cutlass.range_constexpr(DQ_STEPS):
                t = cute.make_rmem_tensor((ZERO_CHUNK,), Float32)
                if it < n_items:
                    cute.autovec_copy(gA[(None, base + k * 32 + lane)], t)      # LDG.E.128, 512 B per warp
                regs.append(t)
        own = warp * POST_DQ_ITEMS * slot
        for u in cutlass.range_constexpr(POST_DQ_ITEMS):
            for k in cutlass.range_constexpr(DQ_STEPS):
                cute.autovec_copy(regs[u * DQ_STEPS + k], sC[(None, own + u * slot + k * 32 + (lane ^ k))])
        cute.arch.sync_warp()
        r = lane // 4
        q = lane % 4
        for u in cutlass.range_constexpr(POST_DQ_ITEMS):   # the decode again: cheaper than keeping it live
            it, band, h, g = self._item(first + warp + self.warps * u, per_band, groups)
            v = []
            for i in cutlass.range_constexpr(4):     # chunk 4 r + i of step q: rows r, r + 8 x columns 2 i, + 1
                t = cute.make_rmem_tensor((ZERO_CHUNK,), Float32)
                cute.autovec_copy(sC[(None, own + u * slot + q * 32 + ((4 * r + i) ^ q))], t)
                v.append(t)
            for hi in cutlass.range_constexpr(2):   # rows r, r + 8 of the band
                row = band * DQ_BAND + r + 8 * hi
                if it < n_items and row < n_rows:
                    cols = cute.make_rmem_tensor((CHUNK32,), Float32)
                    for c in cutlass.range_constexpr(CHUNK32):
                        cols[c] = v[c // 2][2 * hi + c % 2]
                    self._store(cols, gO[(None, (out0 + row) * per_row + h * (d // CHUNK32) + g * DQ_STEPS + q)],
                                scale, True)

    @cute.jit
    def _grid_x(self, rows: Int32, mOut: cute.Tensor):
        """CTAs of one sequence of `rows` rows."""
        per_band = mOut.shape[2] * (mOut.shape[3] // (CHUNK32 * DQ_STEPS))
        return cute.ceil_div(cute.ceil_div(rows, DQ_BAND) * per_band, self.per_block)

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mOut: cute.Tensor, scale: Float32):
        x, b, _ = cute.arch.block_idx()
        s_q = mOut.shape[1]
        self._items(mAcc, mOut, b, Int32(0), b * s_q, s_q, x * self.per_block, scale)

    @cute.jit
    def __call__(self, mAcc: cute.Tensor, mOut: cute.Tensor, scale: Float32, stream):
        grid = (self._grid_x(mOut.shape[1], mOut), mOut.shape[0], 1)
        self.kernel(mAcc, mOut, scale).launch(grid=grid, block=[POST_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        return [_fake(Float32, 4, div=4), _fake(self.dtype, 4, div=8), Float32(1.0)]


class PostDqVarlenKernel(PostDqKernel):
    """PostDqKernel on packed sequences (PostKey varlen): grid (CTAs of max_seqlen_q, B); a CTA past
    its sequence's items exits."""

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mOut: cute.Tensor, mCuQ: cute.Tensor, scale: Float32):
        x, b, _ = cute.arch.block_idx()
        off = mCuQ[b]
        s_q = mCuQ[b + 1] - off
        off_pad = (off + b * VARLEN_PAD) // VARLEN_PAD * VARLEN_PAD   # prepost_launch.varlen_padded_offset
        self._items(mAcc, mOut, Int32(0), off_pad, off, s_q, x * self.per_block, scale)

    @cute.jit
    def __call__(self, mAcc: cute.Tensor, mOut: cute.Tensor, mCuQ: cute.Tensor, max_seqlen_q: Int32,
                 scale: Float32, stream):
        grid = (self._grid_x(max_seqlen_q, mOut), mCuQ.shape[0] - 1, 1)
        self.kernel(mAcc, mOut, mCuQ, scale).launch(grid=grid, block=[POST_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        cu = cute.runtime.make_fake_tensor(Int32, (cute.sym_int(32),), (1,), assumed_align=4)
        return [_fake(Float32, 4, div=4), _fake(self.dtype, 4, div=8), cu, Int32(1), Float32(1.0)]


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
