"""dQ/dK/dV reductions of the attention backward (mixed into kernels/attn_bwd_sm90.py).

FP32 atomics: dK and dV are added once per CTA (epilogue_dkv), dQ once per query block.
head_loop builds (a CTA owns a KV head's whole GQA group) store dK and dV instead, scaled
and cast (store_dkv), and loop the dQ reductions over the group's heads (reduce_dq).
The dQ tile goes one of two ways.
- add_dq: `red.global.add.v4.f32` from the MMA threads (four adjacent words of the accumulator's
  order per add: atomic_tile(dq_order)); D = 256 and the deterministic build.
- stage_dq + reduce_dq (dq_async, the default for D <= 128):
  - the MMA threads write the tile into smem in the accumulator's own layout (the wgmma
    fragment's order, one 16-byte store per thread and 8-column step: kernels/prepost_launch.py,
    "The dQ accumulator");
  - one lane of warp 1 adds the whole tile with one `cp.reduce.async.bulk` (a query block is one
    contiguous range of the accumulator; one add per row kept the MMA warps waiting for the
    staging buffer: docs/MEASURED.md, bwd-dq-async);
  - named barriers 3 (full) and 4 (empty) hand the single buffer back and forth;
  - dq_halves (the 128-row step, whose warpgroups own 64 rows each; or tile_m 64, whose
    warpgroups own half of dQ's columns: the same half of each 16-row band, a bulk add per band):
    each warpgroup's half of the buffer has its own pair (DQ_FULL_HALF + w, DQ_EMPTY_HALF + w, 128 + 32 threads) and
    bulk add, so a warpgroup waits only until warp 1 has read its own rows (FA4's per-warpgroup
    dQ, here inside one buffer).
Both paths write the same accumulator (the atomics through its row stride), so the post
kernel has one form.

Deterministic mode (BwdConfig.deterministic).  FP32 atomics
commute only up to rounding, so the order in which CTAs reach a shared tile decides the
low bits.  The deterministic build fixes that order with one Int32 turn counter per
output tile (zeroed by the host with the accumulators, same memset):
  * dQ tile (m, h, b): the key blocks that visit query block m form one contiguous range
    [n_lo, n_hi) (kernels/mask.py: a key block's query range [m_min, m_max) moves up with
    n), and they add from n_hi - 1 down: rank = n_hi - 1 - n.
  * dK/dV tile (n, h_kv, b): the query heads of the GQA group add in ascending head order
    (all of them visit the same query blocks, the range depends on n only).
A CTA waits until the counter equals its rank (MMA thread 0 spins on ld.acquire.gpu, a
named barrier holds the other 255 MMA threads), adds, passes a second barrier and
increments with red.release.gpu.  The key blocks launch in reverse (blockIdx.x = 0 is the
last key block), which makes the descending dQ order match the pace of the causal
staircase: block n + 1 starts its query range no lower than block n, so it reaches every
shared query block earlier and the next rank rarely waits.  (Non-causal dQ: every key
block starts at query block 0, so rank r first waits r query blocks; lockstep after that.)
Deadlock freedom: every wait is on CTAs with a lower linear block index (x fastest, then
y = head, then z = batch).  dQ waits on key blocks n' > n of the same (h, b), which have
blockIdx.x = N - 1 - n' smaller; dK/dV waits on heads h' < h of the same (n, b), which
have a smaller blockIdx.y.  The hardware dispatches CTAs in linear index order, so the
lowest-index unfinished CTA is resident; all of its predecessors have finished (their
increments are done), so its waits are satisfied and it finishes; by induction every CTA
does, however few CTAs fit on the GPU at once.  The producer warp never waits on a counter.
The non-deterministic build is unchanged: every step above is behind const_expr.
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from . import mask as mask_mod
from .barriers import BwdBarrier
from .prepost_launch import DQ_BAND, dq_acc_step, dq_acc_word


@dsl_user_op
def red_add_v2_f32(addr: cutlass.Int64, a: Float32, b: Float32, *, loc=None, ip=None):
    """red.global.add.v2.f32 (sm_90): one 8-byte reduction instead of two 4-byte ones."""
    llvm.inline_asm(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip),
                           Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                    "red.global.add.v2.f32 [$0], {$1, $2};", "l,f,f",
                    has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def red_add_v4_f32(addr: cutlass.Int64, a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None):
    """red.global.add.v4.f32 (sm_90): one 16-byte reduction (16-byte aligned)."""
    llvm.inline_asm(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)]
                    + [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
                    "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f",
                    has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def st_shared_v4_f32(addr: Int32, a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None):
    llvm.inline_asm(None, [Int32(addr).ir_value(loc=loc, ip=ip)]
                    + [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
                    "st.shared.v4.f32 [$0], {$1, $2, $3, $4};", "r,f,f,f,f",
                    has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def bulk_reduce_add_f32(gaddr: cutlass.Int64, saddr: Int32, nbytes: Int32, *, loc=None, ip=None):
    """cp.reduce.async.bulk (sm_90): global[gaddr : +nbytes] += smem[saddr : +nbytes] as FP32,
    done by the TMA unit (bulk async group: commit, then wait_group.read before reusing smem)."""
    llvm.inline_asm(None, [cutlass.Int64(gaddr).ir_value(loc=loc, ip=ip), Int32(saddr).ir_value(loc=loc, ip=ip),
                           Int32(nbytes).ir_value(loc=loc, ip=ip)],
                    "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;", "l,r,r",
                    has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def cvt_pack_f32x2(lo: Float32, hi: Float32, is_bf16: cutlass.Constexpr[bool], *, loc=None, ip=None) -> Int32:
    """cvt.rn.{bf16x2,f16x2}.f32: two FP32 rounded to one packed pair (lo in bits 0..15)."""
    kind = "bf16x2" if is_bf16 else "f16x2"
    return Int32(llvm.inline_asm(T.i32(), [Float32(lo).ir_value(loc=loc, ip=ip), Float32(hi).ir_value(loc=loc, ip=ip)],
                                 f"cvt.rn.{kind}.f32 $0, $2, $1;", "=r,f,f", has_side_effects=False,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def st_global_b32(addr: cutlass.Int64, v: Int32, *, loc=None, ip=None):
    llvm.inline_asm(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip), Int32(v).ir_value(loc=loc, ip=ip)],
                    "st.global.b32 [$0], $1;", "l,r", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def ld_acquire_s32(addr: cutlass.Int64, *, loc=None, ip=None) -> Int32:
    """ld.acquire.gpu: a counter read that orders this thread's later accesses after it."""
    return Int32(llvm.inline_asm(T.i32(), [cutlass.Int64(addr).ir_value(loc=loc, ip=ip)],
                                 "ld.acquire.gpu.global.s32 $0, [$1];", "=r,l",
                                 has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def red_release_add_s32(addr: cutlass.Int64, v: Int32, *, loc=None, ip=None):
    """red.release.gpu add: publishes every access ordered before it (the CTA's barrier
    included) to whoever acquires the new counter value."""
    llvm.inline_asm(None, [cutlass.Int64(addr).ir_value(loc=loc, ip=ip), Int32(v).ir_value(loc=loc, ip=ip)],
                    "red.release.gpu.global.add.s32 [$0], $1;", "l,r",
                    has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def dq_rank(n_block: Int32, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
            tile_n: cutlass.Constexpr[int], causal: cutlass.Constexpr[bool], has_left: cutlass.Constexpr[bool],
            has_right: cutlass.Constexpr[bool], win_right: Int32):
    """Turn of key block n_block among the key blocks that add into query block m_block, from
    the highest down.  Those blocks are [n_lo, n_hi) with n_hi = BlockRange.n_block_max (the
    forward's bound): query_block_range's m_min(n) <= m <=> n < n_hi, m < m_max(n) <=> n >= n_lo.
    Module-level so that a CPU test can run it against query_block_range on the host."""
    rng = mask_mod.BlockRange(tile_m, tile_n, causal, has_left, has_right)
    return rng.n_block_max(m_block, seqlen_q, seqlen_k, win_right) - 1 - n_block


def acc_mn_view(t: cute.Tensor) -> cute.Tensor:
    """View a wgmma C fragment ((2,2,V),M,N) as (rows, cols) = ((2,M), (2,V,N))."""
    s, d = t.layout.shape, t.layout.stride
    lay = cute.make_layout(((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
                           stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])))
    return cute.make_tensor(t.iterator, lay)


def dq_quads(coords, acc_mn, d: int):
    """The 16-byte pieces of a C fragment in the dQ accumulator's order (dq_acc_word), the one walk
    of stage_dq and atomic_tile(dq_order): acc_mn (acc_mn_view) rows run (r / r + 8, 16-row
    block), so rows 2i and 2i + 1 are a thread's r and r + 8, and (r, r + 8) x a column pair are
    four adjacent words.  Yields (word step from the thread's first piece: dq_acc_step, a
    function returning the four values) per piece; coords are the fragment's (row, col) (the
    identity tensor partitioned like acc_mn).  The values are read when the caller asks, after it
    has formed the address (the order the stores were written in)."""
    r0, c0 = coords[0, 0]
    for i in range(cute.size(acc_mn, mode=[0]) // 2):
        for c in range(0, cute.size(acc_mn, mode=[1]), 2):
            row, col = coords[2 * i, c]
            yield (dq_acc_step(row - r0, col - c0, d),
                   lambda i=i, c=c: (acc_mn[2 * i, c], acc_mn[2 * i, c + 1], acc_mn[2 * i + 1, c], acc_mn[2 * i + 1, c + 1]))


class BwdReductions:
    """Reduction steps of AttnBwdSm90 (uses its tile_m, tile_n, Dc, n_chunks, is_causal,
    has_left, has_right, deterministic)."""

    # ---------------------------------------------------------------- dq_async
    @cute.jit
    def stage_dq(self, mma_dq, acc_dQ, sdQ_addr, tidx):
        """MMA threads: wait until warp 1 has read the previous tile, write acc_dQ into smem in
        the accumulator's layout (dq_acc_word: per 8-column step, a thread's rows r and r + 8 x
        columns 8j + 2t + {0, 1}, four consecutive accumulator registers, in one 16-byte store),
        make it visible to the async proxy, signal warp 1.  dq_halves: each warpgroup waits for
        and signals its own half (its rows at tile_m 128, its columns at 64)."""
        full, empty = self.dq_barriers(tidx // 128)
        empty.sync()
        thr = mma_dq.get_slice(tidx)
        c_mn = acc_mn_view(thr.partition_C(cute.make_identity_tensor((self.tile_m, self.Dc))))
        # the thread's first word once, the others a constant step on (a word per store kept 8
        # address registers live at D = 64 and spilled)
        row0, col0 = c_mn[0, 0]
        base = sdQ_addr + dq_acc_word(row0, col0, self.Dc) * 4
        for step, vals in dq_quads(c_mn, acc_mn_view(acc_dQ), self.Dc):
            st_shared_v4_f32(base + step * 4, *vals())
        cute.arch.fence_view_async_shared()
        full.arrive()

    def dq_barriers(self, wg):
        """(full, empty) named barriers of the staged dQ tile: the whole tile's (256 MMA threads +
        warp 1), or with dq_halves warpgroup wg's half (its 128 threads + warp 1)."""
        if const_expr(self.cfg.dq_halves):
            return (pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DQ_FULL_HALF) + wg, num_threads=128 + 32),
                    pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DQ_EMPTY_HALF) + wg, num_threads=128 + 32))
        return (pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DQ_FULL), num_threads=256 + 32),
                pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DQ_EMPTY), num_threads=256 + 32))

    @cute.jit
    def reduce_dq(self, mdQacc, sdQ_addr, lane, head, batch, m_min, m_max, n_heads):
        """Warp 1: per query block, one bulk FP32 reduction of the staged tile (tile_m padded
        rows, the block's rows of the accumulator; rows >= S_q add zeros to the padding rows,
        which the post kernel never reads).  The first EMPTY arrival frees the buffer for the
        first tile; the last tile's arrival is left out (nobody waits for it).  head_loop
        builds: query heads head .. head + n_heads - 1 in turn, the MMA order.  dq_halves: each
        warpgroup's half behind its own barriers (reduce_dq_step)."""
        if m_min < m_max:
            for w in cutlass.range_constexpr(2 if const_expr(self.cfg.dq_halves) else 1):
                self.dq_barriers(w)[1].arrive()      # the (first) tile's buffer is free
            nm = m_max - m_min
            n = nm
            if const_expr(self.head_loop):
                n = nm * n_heads
            h, m_block = Int32(0), m_min
            for it in cutlass.range(n, unroll=1):
                self.reduce_dq_step(mdQacc[None, None, head + h, batch], sdQ_addr, lane, m_block, it < n - 1)
                if const_expr(self.head_loop):
                    h, m_block = self.head_step(h, m_block, m_min, m_max)
                else:
                    m_block = m_block + 1
            cute.arch.cp_async_bulk_wait_group(0)

    @cute.jit
    def reduce_dq_block(self, mX, sdQ_addr, lane, m_block, full, half: cutlass.Constexpr = None):
        """Wait for the staged tile of m_block (or with dq_halves warpgroup `half`'s part of it),
        add it (lane 0; D = Dc, so the block's words are contiguous in the accumulator), wait until
        read.  The whole tile or a 128-row step's half (64 rows: its bands) is one bulk reduction;
        at tile_m 64 a warpgroup's half is its columns, the same half of each 16-row band
        (dq_acc_word: a band is 8-column steps in order), one bulk reduction per band."""
        full.sync()
        if const_expr(half is not None and not self.dq_split_m):
            band = DQ_BAND * self.Dc            # words per band; the half's are its first or second half
            if lane == 0:
                g = mX.iterator + m_block * self.tile_m * mX.stride[0] + half * (band // 2)
                for b in cutlass.range_constexpr(self.tile_m // DQ_BAND):
                    bulk_reduce_add_f32((g + b * band).toint(), sdQ_addr + Int32((half * (band // 2) + b * band) * 4),
                                        Int32(band // 2 * 4))
        else:
            rows, row0 = self.tile_m, 0
            if const_expr(half is not None):
                rows = self.tile_m // 2
                row0 = half * rows
            if lane == 0:
                g = mX.iterator + (m_block * self.tile_m + row0) * mX.stride[0]
                bulk_reduce_add_f32(g.toint(), sdQ_addr + Int32(row0 * self.Dc * 4), Int32(rows * self.Dc * 4))
        cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def reduce_dq_step(self, mX, sdQ_addr, lane, m_block, more):
        """One query block: the staged tile (reduce_dq_block), or with dq_halves warpgroup 0's
        half, then warpgroup 1's, each behind its own barriers; each handed back to the MMA
        threads once read if another block follows (more)."""
        halves = const_expr(self.cfg.dq_halves)
        for w in cutlass.range_constexpr(2 if halves else 1):
            full, empty = self.dq_barriers(w)
            self.reduce_dq_block(mX, sdQ_addr, lane, m_block, full, w if halves else None)
            if more:
                empty.arrive()

    @cute.jit
    def add_dq(self, mma_dq, acc_dQ, mdQacc, tidx, n_block, m_block, head, batch, chunk, seqlen_q, seqlen_k,
               args):
        """dQ tile of (m_block, head, batch) += acc_dQ; in order of the key blocks when deterministic."""
        if const_expr(self.deterministic):
            sem, rank = self.dq_turn(args[5], mdQacc, n_block, m_block, head, batch, chunk, seqlen_q, seqlen_k,
                                     args)
            self.turn_wait(sem, rank, tidx)
        self.atomic_tile(mma_dq, acc_dQ, mdQacc[None, None, head, batch], (self.tile_m, self.Dc),
                         m_block, seqlen_q, tidx, chunk * self.Dc, dq_order=True)
        if const_expr(self.deterministic):
            self.turn_done(sem, tidx)

    @cute.jit
    def atomic_tile(self, tiled_mma, acc, mX, tile, block, seqlen, tidx, col0, dq_order: cutlass.Constexpr = False):
        """FP32 reduction of a C fragment into rows [block*tile[0], ...) and columns
        [col0, col0 + tile[1]) of mX (rows < seqlen); dq_order: mX is a head's plane of the dQ
        accumulator, in dq_acc_word's order: rows r, r + 8 x a column pair are four adjacent
        words, added with one red.global.add.v4.f32 (a warp's 32 adds cover 512 contiguous bytes,
        the sectors of the row-major pairs with half the instructions; v2 pairs 16 bytes apart
        would touch every sector twice); every row of the tile (rows >= S_q add the zeros their
        Q / LSE padding gives, into the accumulator's padding rows, as the staged path does).

        Addresses come from the fragment's identity coordinates and mX's row stride."""
        thr = tiled_mma.get_slice(tidx)
        tXcX = acc_mn_view(thr.partition_C(cute.make_identity_tensor(tile)))
        acc_mn = acc_mn_view(acc)
        row0 = block * tile[0]
        row_stride = mX.stride[0]
        if const_expr(dq_order):
            # row0 is a multiple of the 16-row band, so (row0 + lr, col) sits at row0 D + the word
            # of (lr, col); every (lr, col) of the thread a constant step from its first
            lr0, lc0 = tXcX[0, 0]
            first = mX.iterator + row0 * self.D + dq_acc_word(lr0, col0 + lc0, self.D)
            for step, vals in dq_quads(tXcX, acc_mn, self.D):
                red_add_v4_f32((first + step).toint(), *vals())
        else:
            for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
                row = row0 + tXcX[r, 0][0]
                if row < seqlen:
                    row_ptr = mX.iterator + row * row_stride + col0
                    for c in cutlass.range_constexpr(0, cute.size(acc_mn, mode=[1]), 2):
                        ptr = row_ptr + tXcX[r, c][1]
                        red_add_v2_f32(ptr.toint(), acc_mn[r, c], acc_mn[r, c + 1])

    @cute.jit
    def epilogue_dkv(self, mma_dkv, acc_dK, acc_dV, mdQacc, mdKacc, mdVacc, tidx,
                     n_block, head, head_kv, batch, chunk, seqlen_q, seqlen_k, args):
        """dK, dV tiles of (n_block, head_kv, batch) += this query head's sums; deterministic
        builds add the GQA group's query heads in ascending order."""
        tile = (self.tile_n, self.Dc)
        col0 = chunk * self.Dc
        if const_expr(self.deterministic):
            sem = self.dkv_turn(args[5], mdQacc, mdKacc, n_block, head_kv, batch, chunk, seqlen_q, seqlen_k)
            rank = args[6]
            self.turn_wait(sem, rank, tidx)
        self.atomic_tile(mma_dkv, acc_dK, mdKacc[None, None, head_kv, batch], tile, n_block, seqlen_k, tidx, col0)
        self.atomic_tile(mma_dkv, acc_dV, mdVacc[None, None, head_kv, batch], tile, n_block, seqlen_k, tidx, col0)
        if const_expr(self.deterministic):
            self.turn_done(sem, tidx)

    @cute.jit
    def store_dkv(self, mma_dkv, acc_dK, acc_dV, mdK, mdV, tidx, n_block, head_kv, batch, chunk, seqlen_k,
                  dk_scale, sK, sV):
        """head_loop builds: this CTA holds the whole GQA group's sums, so dK (times dk_scale,
        in FP32, then one rounding, as the post pass does) and dV are stored as dtype: from the
        registers as packed pairs, or (dkv_smem) staged through the K / V tiles sK, sV."""
        tile = (self.tile_n, self.Dc)
        col0 = chunk * self.Dc
        if const_expr(self.cfg.dkv_smem):
            self.store_tiles_staged(mma_dkv, acc_dK, acc_dV, mdK[None, None, head_kv, batch],
                                    mdV[None, None, head_kv, batch], sK, sV, n_block, chunk, seqlen_k, tidx,
                                    dk_scale)
        else:
            self.store_tile(mma_dkv, acc_dK, mdK[None, None, head_kv, batch], tile, n_block, seqlen_k, tidx,
                            col0, dk_scale, True)
            self.store_tile(mma_dkv, acc_dV, mdV[None, None, head_kv, batch], tile, n_block, seqlen_k, tidx,
                            col0, dk_scale, False)

    @cute.jit
    def store_tiles_staged(self, mma_dkv, acc_dK, acc_dV, gK, gV, sK, sV, n_block, chunk, seqlen_k, tidx,
                           dk_scale):
        """dkv_smem: dK (scaled) and dV cast, written with stmatrix over this CTA's own K and V
        tiles (free once every wgmma of the loop has read them), then stored as 16-byte row
        chunks: a warp covers whole rows, full sectors, rows >= S_k skipped (the forward's O
        epilogue, o_smem).  The first barrier spans both MMA warpgroups: the other one's last
        dQ product (dS K) reads every row of K; after it each warpgroup reads back only the 64
        rows it wrote (a barrier of its own 128 threads).  A key block no query sees (m_min >=
        m_max) never loaded K / V, so no copy into them is in flight."""
        wg = tidx // 128
        pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DKV_STAGED), num_threads=256).arrive_and_wait()
        r2s = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype),
            mma_dkv)
        thr_r2s = r2s.get_slice(tidx)
        rK = cute.make_fragment_like(acc_dK, self.dtype)
        rK.store((acc_dK.load() * dk_scale).to(self.dtype))
        rV = cute.make_fragment_like(acc_dV, self.dtype)
        rV.store(acc_dV.load().to(self.dtype))
        sKc, sVc = self.d_chunk(sK, chunk), self.d_chunk(sV, chunk)
        cute.copy(r2s, thr_r2s.retile(rK), thr_r2s.partition_D(sKc))
        cute.copy(r2s, thr_r2s.retile(rV), thr_r2s.partition_D(sVc))
        pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DKV_STAGED) + 1 + wg, num_threads=128).arrive_and_wait()
        rows = (64, self.Dc)
        blk = n_block * (self.tile_n // 64) + wg
        self.store_rows(((sKc, gK), (sVc, gV)), rows, (wg, 0), (blk, chunk), tidx - wg * 128, 128, seqlen_k)

    @cute.jit
    def store_rows(self, tiles, rows: cutlass.Constexpr, s_coord, g_coord, tidx, threads: cutlass.Constexpr,
                   seqlen):
        """The rows[0] x rows[1] tiles at s_coord / g_coord of each (smem, global) pair of `tiles`
        (16-bit) stored as 16-byte row chunks by `threads` threads (tidx their index): rows[1] / 8
        threads per row, a warp covers whole rows (full sectors); global rows >= seqlen skipped."""
        chunks = rows[1] // 8
        s2g = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128),
            cute.make_ordered_layout((threads // chunks, chunks), order=(1, 0)),
            cute.make_layout((1, 8)))
        thr_s2g = s2g.get_slice(tidx)
        tc = thr_s2g.partition_S(cute.make_identity_tensor(rows))
        row0 = g_coord[0] * rows[0]
        for sX, gX in tiles:
            ts = thr_s2g.partition_S(cute.local_tile(sX, rows, s_coord))
            tg = thr_s2g.partition_D(cute.local_tile(gX, rows, g_coord))
            tr = cute.make_fragment_like(ts, self.dtype)
            cute.autovec_copy(ts, tr)
            for i in cutlass.range_constexpr(cute.size(tr.shape[1])):
                if row0 + tc[0, i, 0][0] < seqlen:
                    cute.copy(s2g, tr[None, i, None], tg[None, i, None])

    @cute.jit
    def store_tile(self, tiled_mma, acc, mX, tile, block, seqlen, tidx, col0, scale, scaled: cutlass.Constexpr):
        """Store a C fragment into rows [block*tile[0], ...) (rows < seqlen), columns
        [col0, col0 + tile[1]) of the 16-bit mX: one packed pair (st.global.b32) per two columns."""
        thr = tiled_mma.get_slice(tidx)
        tXcX = acc_mn_view(thr.partition_C(cute.make_identity_tensor(tile)))
        acc_mn = acc_mn_view(acc)
        row0 = block * tile[0]
        row_stride = mX.stride[0]
        is_bf16 = const_expr(self.dtype is cutlass.BFloat16)
        for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
            row = row0 + tXcX[r, 0][0]
            if row < seqlen:
                row_ptr = mX.iterator + row * row_stride + col0
                for c in cutlass.range_constexpr(0, cute.size(acc_mn, mode=[1]), 2):
                    lo, hi = acc_mn[r, c], acc_mn[r, c + 1]
                    if const_expr(scaled):
                        lo, hi = lo * scale, hi * scale
                    st_global_b32((row_ptr + tXcX[r, c][1]).toint(), cvt_pack_f32x2(lo, hi, is_bf16))

    # ---------------------------------------------------------------- deterministic mode
    @cute.jit
    def dq_turn(self, mSem, mdQacc, n_block, m_block, head, batch, chunk, seqlen_q, seqlen_k, args):
        """(counter address, rank) of this CTA's dQ add into query block m_block.  The key
        blocks visiting m_block are one contiguous range [n_block_min, n_block_max) (the
        query ranges of kernels/mask.py grow with n); they add from the highest block down."""
        m_blocks = cute.ceil_div(seqlen_q, self.tile_m)
        slot = ((batch * mdQacc.shape[2] + head) * m_blocks + m_block) * self.n_chunks + chunk
        rank = dq_rank(n_block, m_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n, self.is_causal,
                       self.has_left, self.has_right, args[4])
        return (mSem.iterator + slot).toint(), rank

    @cute.jit
    def dkv_turn(self, mSem, mdQacc, mdKacc, n_block, head_kv, batch, chunk, seqlen_q, seqlen_k):
        """Counter address of this CTA's dK/dV add: counters of (n_block, head_kv, batch)
        follow the B * H_q * ceil(S_q / tile_m) dQ counters.  The rank is the query head's
        place in its group (args[6]): every head of a group visits the same query blocks,
        so all of them add."""
        dq_slots = mdQacc.shape[3] * mdQacc.shape[2] * cute.ceil_div(seqlen_q, self.tile_m) * self.n_chunks
        slot = dq_slots + ((batch * mdKacc.shape[2] + head_kv) * cute.ceil_div(seqlen_k, self.tile_n)
                           + n_block) * self.n_chunks + chunk
        return (mSem.iterator + slot).toint()

    @cute.jit
    def turn_wait(self, sem_addr, rank, tidx):
        """Block the 256 MMA threads until the counter at sem_addr equals rank.  One thread
        spins with acquire loads; the named barrier then orders every thread's adds after
        that acquire (a barrier is CTA-wide synchronisation, the acquire makes it GPU-wide)."""
        if tidx == 0:
            seen = ld_acquire_s32(sem_addr)
            while seen != rank:
                seen = ld_acquire_s32(sem_addr)
        pipeline.NamedBarrier(barrier_id=int(BwdBarrier.TURN), num_threads=256).arrive_and_wait()

    @cute.jit
    def turn_done(self, sem_addr, tidx):
        """Pass the turn on: after the barrier every MMA thread's reductions precede thread
        0's release increment, so the next rank's acquire sees all of them applied."""
        pipeline.NamedBarrier(barrier_id=int(BwdBarrier.TURN), num_threads=256).arrive_and_wait()
        if tidx == 0:
            red_release_add_s32(sem_addr, Int32(1))
