"""Attention forward for Hopper (sm_90a) in CuTe DSL, with pluggable score stages.

O = stage(Q K^T) V for q (B, S_q, H_q, D), k/v (B, S_k, H_kv, D) (flash_attn_func layout),
H_q a multiple of H_kv (GQA/MQA), D in {64, 128, 256}, BF16 or FP16, any S and B,
causal (bottom-right aligned, see kernels/mask.py) or not.  Softmax-type stages also
write LSE (FP32, (B, H_q, S_q), natural log; -inf for a row that sees no key).

Structure (a tile = one tile_m-row query tile of one head, or with packed GQA (FwdConfig.pack_gqa)
tile_m / g positions of the g query heads of one KV head; by default the grid is persistent,
one CTA per SM walking tiles in snake order over the LPT order, FwdConfig.persistent):
  * warpgroup 0 is the producer: one warp issues TMA loads of Q (once per tile) and of K, V
    tiles into `num_stages`-deep shared-memory rings (separate K and V mbarrier
    pipelines, so QK^T of a block can start before its V has landed); it gives its
    registers away (setmaxnreg 24).
  * warpgroups 1 and 2 are consumers (setmaxnreg 240), 64 query rows each: per key
    block S = Q K^T (wgmma, SS, FP32 accumulators), the score stage turns S into P in
    registers, O += P V (wgmma with A = P from registers).  The loop is overlapped: step n
    issues S_n = Q K_n^T and P_{n-1} V_{n-1} together and runs the score stage of S_n while
    PV is on the tensor cores (block_overlap); with ping-pong (FwdConfig.pingpong) the
    two consumer warpgroups also take turns issuing their GEMMs.
  * key blocks run from the diagonal down to 0: the first block and the ones crossing
    the causal diagonal are masked, interior blocks are not; blocks above the diagonal
    are never loaded.

Usage: `attn_fwd(q, k, v, mode="softmax", causal=True)` -> (o, lse).
Compile-only (no GPU): CUTE_DSL_ARCH=sm_90a python -m flash_attn_poly.kernels.attn_fwd_sm90
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Float64, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from . import compile_cache, mask as mask_mod, scores
from .barriers import FwdBarrier
from .config import FwdConfig, check_fwd
from .scores import common as sc
from .tile_scheduler import (COMPACT_MAX_SEQS, COMPACT_SEQ_BITS, SectionLptScheduler, persistent_tile,
                             section_heads)

_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}


_pin_f32 = sc.pin_f32   # the stages pin what their write_p reads (block_overlap)


@dsl_user_op
def _pin_b32(x: Int32, *, loc=None, ip=None) -> Int32:
    return Int32(llvm.inline_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "", "=r,0",
                                 has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def fence_fragment(t: cute.Tensor):
    """Pin every register of a wgmma fragment at this point of the program.

    LLVM sees a wgmma as an ordinary asm statement that reads its operands and writes its
    accumulators on the spot; it may move arithmetic on the accumulators above the
    wgmma.wait_group that really makes them valid, or build the next P in the registers
    an in-flight wgmma still reads.  An empty volatile asm that 'modifies' each register,
    placed right after the wait, orders every later use after the wait.  (Without it
    ptxas saw such moves and serialised all wgmma of the kernel, C7513.)"""
    if cutlass.const_expr(t.element_type == Float32):
        for i in cutlass.range_constexpr(cute.size(t)):
            t[i] = _pin_f32(t[i])
    else:
        u = cute.recast_tensor(t, Int32)
        for i in cutlass.range_constexpr(cute.size(u)):
            u[i] = _pin_b32(u[i])




class AttnFwdSm90:
    num_threads_per_wg = 128
    num_producer_regs = 24    # 24 + 2*240 = 504 <= 512 regs/thread budget per SM quadrant
    MMA_REGS = {2: 240, 3: 160}   # consumer registers per thread by warpgroup count (24 + 3*160 = 504)

    def __init__(self, cfg: FwdConfig):
        check_fwd(cfg)
        self.cfg = cfg
        self.score = scores.device(cfg.score)
        self.dtype = _DTYPES[cfg.dtype]
        self.is_bf16 = cfg.dtype == "bf16"
        if cfg.score.kind == "sigmoid":
            self.score.check_dtype(self.is_bf16)
        self.head_dim = cfg.head_dim
        self.tile_m, self.tile_n = cfg.tile_m, cfg.tile_n
        self.num_stages = cfg.num_stages
        self.q_stages = cfg.q_stages
        self.causal = cfg.causal
        self.pingpong = cfg.pingpong
        self.num_mma_wg = self.tile_m // 64
        self.pack = cfg.pack_gqa   # > 1: packed GQA (_pack_rows); the tile holds tile_m / pack positions
        self.num_mma_regs = self.MMA_REGS[self.num_mma_wg]
        self.num_threads = self.num_threads_per_wg * (1 + self.num_mma_wg)
        # o_smem's staging tile: tile_m rows x o_cols columns, O written through it in
        # head_dim / o_cols passes (D = 256: two 128-column passes through a 32 KB tile, as a
        # whole 64 KB one does not fit beside Q and two K / V stages)
        self.o_cols = min(self.head_dim, 128)

    # o_tma's store box: 64 rows (a warpgroup's) x 64 columns (the 128-byte swizzle atom's width: a
    # 64-column block of the staging tile is one contiguous swizzled 8 KB tile)
    O_TMA_COLS = 64

    # ------------------------------------------------------------------ host side
    def _smem_layout(self, rows: int, stages_: Optional[int], cols: Optional[int] = None):
        """A K-major tile of rows x cols (default head_dim), staged or not, with the swizzle atom
        of its column count; o_smem's staging tile is (tile_m, o_cols): Q's layout up to D = 128."""
        cols = cols or self.head_dim
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, self.dtype, cols),
            self.dtype)
        shape = (rows, cols) if stages_ is None else (rows, cols, stages_)
        return cute.tile_to_shape(atom, shape, (0, 1) if stages_ is None else (0, 1, 2))

    def _tiled_mmas(self):
        qk = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
            Float32, (self.num_mma_wg, 1, 1), (64, self.tile_n))
        pv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN,
            Float32, (self.num_mma_wg, 1, 1), (64, self.head_dim), warpgroup.OperandSource.RMEM)
        return qk, pv

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                 win_left: Int32, win_right: Int32, ctas: Int32, l2_bytes: Int32, stream):
        self._launch(mQ, mK, mV, mO, mLSE, scale, softcap, bias, win_left, win_right, ctas, l2_bytes, None, stream)

    @cute.jit
    def _launch(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                mLSE: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                win_left: Int32, win_right: Int32, ctas: Int32, l2_bytes: Int32, aux, stream, varlen=None):
        """Host side.  The entry takes the call's own numbers (softmax scale, softcap, sigmoid
        bias; FP64, unused ones 0) and the score function encodes its four FP32 kernel arguments
        from them here, in FP64 then rounded once, as Python would (scores/*.fwd_scalars).
        ctas: the persistent grid's CTA count (the plan's AttnPlan.fwd_ctas, a runtime value so
        that balancing the snake for a shape compiles nothing new; unused by a CTA-per-tile build).
        l2_bytes: the LPT order's section size (AttnPlan.l2_section_mb in bytes, runtime for the same
        reason): the host turns it into the section width in (batch, head) units (_section_group),
        which the kernel takes as an argument."""
        p0, p1, p2, p3 = (Float32(p) for p in self.score.fwd_scalars(scale, softcap, bias))
        # torch (B, S, H, D) -> (S, D, H, B); LSE (B, H, S) -> (S, H, B)
        mQ, mK, mV, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))
                          for t in (mQ, mK, mV, mO)]
        mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))
        if cutlass.const_expr(self.pack > 1):
            mQ, mO, mLSE = (self._pack_rows(t) for t in (mQ, mO, mLSE))
        tiled_mma_qk, tiled_mma_pv = self._tiled_mmas()
        sQ_layout = self._smem_layout(self.tile_m, None if self.q_stages == 1 else self.q_stages)
        sQ_one = sQ_layout if cutlass.const_expr(self.q_stages == 1) else cute.select(sQ_layout, mode=[0, 1])
        sK_layout = self._smem_layout(self.tile_n, self.num_stages)
        sV_layout = self._smem_layout(self.tile_n, self.num_stages)
        load_op = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, mQ_tma = cpasync.make_tiled_tma_atom(load_op, mQ, sQ_one, (self.tile_m, self.head_dim))
        sK_one = cute.select(sK_layout, mode=[0, 1])
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(load_op, mK, sK_one, (self.tile_n, self.head_dim))
        tma_v, mV_tma = cpasync.make_tiled_tma_atom(load_op, mV, sK_one, (self.tile_n, self.head_dim))
        self.bytes_q = cute.size_in_bytes(self.dtype, sQ_one)
        self.bytes_kv = cute.size_in_bytes(self.dtype, sK_one)

        fields = {   # in smem order; cute.struct lays them out from the annotations
            "mbar_q": cute.struct.MemRange[cutlass.Int64, 2 * self.q_stages],
            "mbar_k": cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages],
            "mbar_v": cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages],
            "sQ": cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024],
            "sK": cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024],
            "sV": cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]}
        if cutlass.const_expr(self.cfg.o_smem):   # the epilogue's O staging tile (tile_m x o_cols)
            fields["sO"] = cute.struct.Align[
                cute.struct.MemRange[self.dtype, cute.cosize(self._smem_layout(self.tile_m, None, self.o_cols))], 1024]
        self.shared_storage = cute.struct(type("SharedStorage", (), {"__annotations__": fields}))
        num_m_blocks = cute.ceil_div(cute.size(mQ, mode=[0]), self.tile_m)
        num_batch = mQ.shape[3]
        if cutlass.const_expr(varlen is not None):   # (cu_seqlens_q, cu_seqlens_k, max_seqlen_q)
            num_m_blocks = cute.ceil_div(self._rows_q(varlen[2]), self.tile_m)
            num_batch = varlen[0].shape[0] - 1
        sched = SectionLptScheduler(reverse=self.causal)
        grid = SectionLptScheduler.grid(num_m_blocks, mQ.shape[2], num_batch)
        if cutlass.const_expr(self.cfg.persistent > 0):
            tiles = num_m_blocks * mQ.shape[2] * num_batch
            grid = (cutlass.min(tiles, ctas), 1, 1)
            # the persistent order's sections run over (batch, head) units
            rows = None if cutlass.const_expr(varlen is None) else varlen[2]
            group = self._section_group(mQ, mK, l2_bytes, mQ.shape[2] * num_batch, rows)
        else:
            group = self._section_group(mQ, mK, l2_bytes)
        o_store = None
        if cutlass.const_expr(self.cfg.o_tma):   # (atom, coordinate tensor) of a 64-row x 64-column TMA store
            o_store = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO,
                                                  self._smem_layout(64, None, self.O_TMA_COLS), (64, self.O_TMA_COLS))
        self.kernel(mQ_tma, mK_tma, mV_tma, mO, mLSE, tma_q, tma_k, tma_v,
                    tiled_mma_qk, tiled_mma_pv, sQ_layout, sK_layout, sV_layout,
                    (p0, p1, p2, p3), self._window_param(win_left, win_right), sched, group, aux, varlen,
                    o_store).launch(
            grid=grid,
            block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    def _pack_rows(self, t: cute.Tensor) -> cute.Tensor:
        """Packed GQA: the (S, ..., H_q, B) view of Q, O or LSE as ((pack, S), ..., H_q / pack, B),
        the group's heads fastest: row m of a KV head's rows is position m // pack of its query head
        h_kv * pack + m % pack (flash-attn's pack_gqa).  A 192-row tile then ends its causal range
        at 192 / pack positions, so fewer of its key blocks are cut by the diagonal.  The rows stay
        TMA-able: the Q box is (pack, tile_m / pack) positions of one KV head's group."""
        shape, stride = t.shape, t.layout.stride
        h = len(shape) - 2   # the head mode (Q / O: (S, D, H, B); LSE: (S, H, B))
        g = self.pack
        new_shape = ((g, shape[0]),) + tuple(shape[1:h]) + (shape[h] // g, shape[h + 1])
        new_stride = ((stride[h], stride[0]),) + tuple(stride[1:h]) + (stride[h] * g, stride[h + 1])
        return cute.make_tensor(t.iterator, cute.make_layout(new_shape, stride=new_stride))

    def _seqlen_q(self, mQ: cute.Tensor):
        """Query positions of mQ (packed GQA: its row mode is (pack, S))."""
        return mQ.shape[0][1] if cutlass.const_expr(self.pack > 1) else mQ.shape[0]

    def _rows_q(self, seqlen_q):
        """Packed rows of seqlen_q positions (the epilogue's bound)."""
        return seqlen_q * self.pack if cutlass.const_expr(self.pack > 1) else seqlen_q

    def _q_shift(self, seqlen_q):
        """q_bottom: the positions in front of the first tile's first row, (-S_q) mod (tile_m / pack),
        so the tiles end at S_q's end and the partial tile is the first (under the causal bound the one
        with the fewest key blocks); the Python int 0 otherwise (the top-aligned code as is).

        The shifted tiles are the top-aligned tiles of a query sequence with q_shift positions in front:
        the Q, O and LSE views are offset back by q_shift rows (_shift_rows) and the block ranges and
        masks take S_q + q_shift, which leaves every real row's causal bound (row - S_q + S_k) as it
        was.  Only the score hooks' query index and the epilogue's first stored row see the shift."""
        if not self.cfg.q_bottom:
            return 0
        tile_pos = self.tile_m // self.pack
        return (tile_pos - seqlen_q % tile_pos) % tile_pos

    def _shift_rows(self, q_shift, *tensors):
        """Q, O (S, D, H, B) and LSE (S, H, B) views whose row 0 is q_shift positions before the sequence's
        first (packed GQA: rows ((g, S), ...), offset in positions); as is when q_shift is the literal 0."""
        if mask_mod.is_zero(q_shift):
            return tensors
        row = (0, -q_shift) if cutlass.const_expr(self.pack > 1) else -q_shift
        return tuple(cute.domain_offset((row,) + (0,) * (cute.rank(t) - 1), t) for t in tensors)

    def _shift_o_store(self, q_shift):
        """o_tma's O coordinates offset like O's view (_shift_rows), so a warpgroup's box lands on its rows;
        a box that starts before the sequence's first row is not stored by TMA (store_o_staged)."""
        if self._o_store is not None:
            self._o_store = (self._o_store[0], self._shift_rows(q_shift, self._o_store[1])[0])

    def _window_param(self, win_left, win_right):
        """Window sizes reach the kernel only in windowed builds: unused kernel parameters
        still shift the parameter block and changed the unwindowed SASS (+1 LDC, reordering)."""
        if self.cfg.window_left or self.cfg.window_right:
            return (win_left, win_right)
        return (0, 0)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, tma_q: cute.CopyAtom, tma_k: cute.CopyAtom, tma_v: cute.CopyAtom,
               tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, params, window, sched: cutlass.Constexpr, group: Int32, aux,
               varlen, o_store=None):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        self._o_store = o_store   # o_tma's (TMA store atom, O coordinate tensor), set while the kernel is traced
        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v):
                cpasync.prefetch_descriptor(atom)
        storage = SmemAllocator().allocate(self.shared_storage)
        pipe_q, pipe_k, pipe_v = self._make_pipelines(storage)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        # the epilogue's O staging tile (o_smem), set while the kernel is traced
        self._sO = None
        if cutlass.const_expr(self.cfg.o_smem):
            sO_layout = self._smem_layout(self.tile_m, None, self.o_cols)
            self._sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))

        # positions per tile: packed GQA tiles hold tile_m / pack positions (of pack heads each)
        blocks = mask_mod.BlockRange(self.tile_m // self.pack, self.tile_n, self.causal,
                                     self.cfg.window_left, self.cfg.window_right)
        if cutlass.const_expr(self.cfg.persistent > 0):
            self.persistent_roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, tma_q, tma_k, tma_v,
                                  tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, params,
                                  window, sched, group, blocks, warp_idx, aux, varlen)
        else:
            self.single_tile_roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, tma_q, tma_k, tma_v,
                                   tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, params,
                                   window, sched, group, blocks, warp_idx, aux)

    def _section_group(self, mQ, mK, l2_bytes, units=None, rows=None):
        """LPT section width in query heads (units: of the persistent order's (batch, head)
        units, default the heads): the K and V rows of its KV heads (reused by the group's
        query heads and by every query tile) fit l2_bytes of L2; Q and O stream through once.
        rows: K rows per unit (default mK's; the varlen build passes the longest sequence's).
        Host side, once per launch: the kernel takes the width as an argument."""
        h_q = mQ.shape[2]
        return section_heads(h_q if units is None else units, mK.shape[0] if rows is None else rows,
                             self.head_dim * 4, h_q // mK.shape[2], l2_bytes)

    @cute.jit
    def _sequence(self, varlen, batch, mQ, mK, mV, mO, mLSE):
        """The varlen build's view of sequence `batch`: q, k, v, O (1, total, H, D) and LSE (1, H,
        total) offset to the sequence's first row (the TMA coordinate tensors too: a tile reaching
        past the sequence loads the next sequence's rows, which the sequence-length mask and the
        epilogue's row bound keep out, or TMA's zero fill past the tensor), its own lengths, and
        batch 0 (the packed tensors' only batch entry; check_fwd: no user score reads it)."""
        cu_q, cu_k = varlen[0], varlen[1]
        off_q, off_k = cu_q[batch], cu_k[batch]
        seqlen_q, seqlen_k = cu_q[batch + 1] - off_q, cu_k[batch + 1] - off_k
        row_q = (0, off_q) if cutlass.const_expr(self.pack > 1) else off_q   # packed GQA: ((g, S), ...) rows
        mQ, mO = (cute.domain_offset((row_q, 0, 0, 0), t) for t in (mQ, mO))
        mK, mV = (cute.domain_offset((off_k, 0, 0, 0), t) for t in (mK, mV))
        mLSE = cute.domain_offset((row_q, 0, 0), mLSE)
        # q_bottom: the sequence's own shift (its rows in front are the previous sequence's, or zeros)
        q_shift = self._q_shift(seqlen_q)
        mQ, mO, mLSE = self._shift_rows(q_shift, mQ, mO, mLSE)
        return mQ, mK, mV, mO, mLSE, Int32(0), seqlen_q, seqlen_k, q_shift

    def _key_range(self, blocks, m_block, seqlen_q, seqlen_k, window, q_shift=0):
        """(n_max, n_cnt): key blocks [n_max - n_cnt, n_max) are visited (n_cnt is n_max
        itself without a left window).  q_shift: q_bottom's positions in front (_q_shift)."""
        seqlen_q = mask_mod.add0(q_shift, seqlen_q)
        n_max = blocks.n_block_max(m_block, seqlen_q, seqlen_k, window[1])
        n_cnt = mask_mod.sub0(n_max, blocks.n_block_min(m_block, seqlen_q, seqlen_k, window[0]))
        return n_max, n_cnt

    def _tile(self, sched, t, num_m_blocks, h_q, num_batch, group, blocks, seqlen_q, seqlen_k, window, q_shift=0):
        """(m_block, head, batch, n_max, n_cnt) of linear tile t (persistent CTAs; every role
        decodes the tiles it walks itself)."""
        m_block, head, batch = sched.tile_at(t, num_m_blocks, h_q, num_batch, group)
        return (m_block, head, batch) + self._key_range(blocks, m_block, seqlen_q, seqlen_k, window, q_shift)

    @cute.jit
    def _varlen_tile(self, sched, t, num_m_blocks, h_q, num_batch, group, blocks, window, varlen,
                     mQ, mK, mV, mO, mLSE):
        """_tile of the varlen build: (m_block, head, batch 0, the tensors offset to the tile's
        sequence (_sequence), its lengths, n_max, n_cnt, live, q_shift); live is 1 for a query tile
        inside its sequence, 0 past its end (the roles skip it; the compact order has only live tiles)."""
        if cutlass.const_expr(self.cfg.varlen_compact):   # pair t // H_q of the table, head t % H_q
            pair = t // h_q
            head = t - pair * h_q
            e = varlen[3][pair + 1]
            m_block = e >> COMPACT_SEQ_BITS
            b = e & (COMPACT_MAX_SEQS - 1)
        else:
            m_block, head, b = sched.tile_at(t, num_m_blocks, h_q, num_batch, group)
        mQ, mK, mV, mO, mLSE, b, sq, sk, q_shift = self._sequence(varlen, b, mQ, mK, mV, mO, mLSE)
        n_max, n_cnt = self._key_range(blocks, m_block, sq, sk, window, q_shift)
        live = cutlass.min(cutlass.max(self._rows_q(mask_mod.add0(q_shift, sq)) - m_block * self.tile_m, 0), 1)
        return m_block, head, b, (mQ, mK, mV, mO, mLSE), sq, sk, n_max, n_cnt, live, q_shift

    @cute.jit
    def single_tile_roles(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, tma_q, tma_k, tma_v,
                          tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, params, window,
                          sched: cutlass.Constexpr, group, blocks, warp_idx, aux):
        """One CTA = one tile (the grid has a CTA per tile, in LPT order); dense calls only (the
        varlen build is persistent: config.check_fwd)."""
        num_m_blocks = cute.ceil_div(cute.size(mQ, mode=[0]), self.tile_m)
        m_block, head, batch = sched.work_tile(num_m_blocks, mQ.shape[2], group)
        seqlen_q, seqlen_k = self._seqlen_q(mQ), mK.shape[0]
        q_shift = self._q_shift(seqlen_q)
        mQ, mO, mLSE = self._shift_rows(q_shift, mQ, mO, mLSE)
        self._shift_o_store(q_shift)
        n_max, n_cnt = self._key_range(blocks, m_block, seqlen_q, seqlen_k, window, q_shift)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.num_producer_regs)
            if warp_idx == 0:
                head_kv = head // (mQ.shape[2] // mK.shape[2])
                self.load(mQ, mK, mV, sQ, sK, sV, tma_q, tma_k, tma_v, pipe_q, pipe_k, pipe_v,
                          m_block, head, head_kv, batch, n_max, n_cnt)
        else:
            cute.arch.setmaxregister_increase(self.num_mma_regs)
            self.mma(mO, mLSE, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v,
                     params, blocks, m_block, head, batch, n_max, seqlen_q, seqlen_k, window, n_cnt,
                     aux=aux, q_shift=q_shift)
            if cutlass.const_expr(self.cfg.o_tma):   # O's TMA store has read the staging tile
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def persistent_roles(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, tma_q, tma_k, tma_v,
                         tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, params, window,
                         sched: cutlass.Constexpr, group, blocks, warp_idx, aux, varlen=None):
        """Persistent CTAs: every role walks the same tiles (persistent_tile, snake order over
        the LPT order); the pipeline states run on across tiles, so the producer starts the
        next tile's K/V as stages free up and its Q once a Q buffer is free: with one buffer
        when the consumers release it (after their last QK GEMM of a tile), while they finish
        the last PV and the epilogue; with two (q_stages) as soon as the producer has issued
        the current tile's K/V, so at short sequences the next Q is in smem when the tile starts.

        varlen: the order runs over (sequence, head) units with the longest sequence's query
        tiles (for causal self-attention a tile's cost is its block index, whatever the
        sequence, so the order stays longest first); every role reads the tile's sequence
        offsets (_sequence) and skips a tile past its sequence's end, without a pipeline step."""
        num_m_blocks = cute.ceil_div(cute.size(mQ, mode=[0]), self.tile_m)
        h_q, num_batch = mQ.shape[2], mQ.shape[3]
        if cutlass.const_expr(varlen is not None):
            num_m_blocks = cute.ceil_div(self._rows_q(varlen[2]), self.tile_m)
            num_batch = varlen[0].shape[0] - 1
        tiles = num_m_blocks * h_q * num_batch
        if cutlass.const_expr(self.cfg.varlen_compact):
            tiles = varlen[3][0] * h_q        # the live pairs' tiles
        cta = cute.arch.block_idx()[0]
        num_ctas = cute.arch.grid_dim()[0]
        rounds = cute.ceil_div(tiles, num_ctas)
        seqlen_q, seqlen_k = self._seqlen_q(mQ), mK.shape[0]
        q_shift = 0
        if cutlass.const_expr(varlen is None):   # dense: one shift for every tile (varlen: per sequence)
            q_shift = self._q_shift(seqlen_q)
            mQ, mO, mLSE = self._shift_rows(q_shift, mQ, mO, mLSE)
            self._shift_o_store(q_shift)
        q_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        kv_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        q_cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        kv_cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.num_producer_regs)
            if warp_idx == 0:
                for r in cutlass.range(rounds, unroll=1):
                    t = persistent_tile(r, cta, num_ctas)
                    for _ in cutlass.range(cutlass.min(cutlass.max(tiles - t, 0), 1), unroll=1):
                        if cutlass.const_expr(varlen is None):
                            m_block, head, batch, n_max, n_cnt = self._tile(
                                sched, t, num_m_blocks, h_q, num_batch, group, blocks, seqlen_q, seqlen_k, window,
                                q_shift)
                            head_kv = head // (h_q // mK.shape[2])
                            q_prod, kv_prod = self.load(mQ, mK, mV, sQ, sK, sV, tma_q, tma_k, tma_v,
                                                        pipe_q, pipe_k, pipe_v, m_block, head, head_kv,
                                                        batch, n_max, n_cnt, q_prod, kv_prod)
                        else:
                            m_block, head, b, (mQt, mKt, mVt, _, _), _, _, n_max, n_cnt, live, _ = self._varlen_tile(
                                sched, t, num_m_blocks, h_q, num_batch, group, blocks, window, varlen,
                                mQ, mK, mV, mO, mLSE)
                            for _ in cutlass.range(live, unroll=1):
                                head_kv = head // (h_q // mK.shape[2])
                                q_prod, kv_prod = self.load(mQt, mKt, mVt, sQ, sK, sV, tma_q, tma_k, tma_v,
                                                            pipe_q, pipe_k, pipe_v, m_block, head, head_kv,
                                                            b, n_max, n_cnt, q_prod, kv_prod)
        else:
            cute.arch.setmaxregister_increase(self.num_mma_regs)
            wg = cute.arch.make_warp_uniform((cute.arch.thread_idx()[0] - self.num_threads_per_wg)
                                             // self.num_threads_per_wg)
            if cutlass.const_expr(self.pingpong):
                # warpgroup 0 issues its first GEMM first (once: turns run on across tiles)
                if wg == self.num_mma_wg - 1:
                    self.pingpong_arrive(0)
            for r in cutlass.range(rounds, unroll=1):
                t = persistent_tile(r, cta, num_ctas)
                for _ in cutlass.range(cutlass.min(cutlass.max(tiles - t, 0), 1), unroll=1):
                    if cutlass.const_expr(varlen is None):
                        m_block, head, batch, n_max, n_cnt = self._tile(
                            sched, t, num_m_blocks, h_q, num_batch, group, blocks, seqlen_q, seqlen_k, window,
                            q_shift)
                        kv_cons, q_cons = self.mma(mO, mLSE, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, pipe_q,
                                                   pipe_k, pipe_v, params, blocks, m_block, head, batch, n_max,
                                                   seqlen_q, seqlen_k, window, n_cnt, kv_cons, q_cons, aux,
                                                   q_shift)
                    else:
                        m_block, head, b, (_, _, _, mOt, mLSEt), sq, sk, n_max, n_cnt, live, qs = self._varlen_tile(
                            sched, t, num_m_blocks, h_q, num_batch, group, blocks, window, varlen,
                            mQ, mK, mV, mO, mLSE)
                        for _ in cutlass.range(live, unroll=1):
                            kv_cons, q_cons = self.mma(mOt, mLSEt, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv,
                                                       pipe_q, pipe_k, pipe_v, self.score.seq_params(params, sk),
                                                       blocks, m_block, head, b,
                                                       n_max, sq, sk, window, n_cnt, kv_cons, q_cons, aux, qs)
            if cutlass.const_expr(self.pingpong):
                if wg == 0:  # take the extra arrive of the start so barrier 0 ends balanced
                    self.pingpong_sync(0)
            if cutlass.const_expr(self.cfg.o_tma):   # the last tile's O store has read the staging tile
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    def _make_pipelines(self, storage):
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        # one release arrive per consumer warp (PipelineTmaAsync signals from lane 0)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * 4)
        make = lambda bar, n, nbytes: pipeline.PipelineTmaAsync.create(
            barrier_storage=bar.data_ptr(), num_stages=n, producer_group=producer,
            consumer_group=consumers, tx_count=nbytes, defer_sync=True)
        return (make(storage.mbar_q, self.q_stages, self.bytes_q), make(storage.mbar_k, self.num_stages, self.bytes_kv),
                make(storage.mbar_v, self.num_stages, self.bytes_kv))

    @cute.jit
    def load(self, mQ, mK, mV, sQ, sK, sV, tma_q, tma_k, tma_v, pipe_q, pipe_k, pipe_v,
             m_block: Int32, head: Int32, head_kv: Int32, batch: Int32, n_max: Int32, n_cnt: Int32,
             q_state=None, kv_state=None):
        """Producer warp: Q once, then (K, V) for key blocks n_max-1 .. n_max-n_cnt.
        Persistent CTAs pass their running pipeline states and get them back advanced."""
        gQ = cute.local_tile(mQ[None, None, head, batch], (self.tile_m, self.head_dim), (m_block, 0))
        gK = cute.local_tile(mK[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))
        gV = cute.local_tile(mV[None, None, head_kv, batch], (self.tile_n, self.head_dim), (None, 0))
        one = cute.make_layout(1)
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, one, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        if cutlass.const_expr(q_state is not None):
            for _ in cutlass.range(cutlass.min(n_max, 1), unroll=1):   # `if n_max > 0` that carries the states
                pipe_q.producer_acquire(q_state)
                cute.copy(tma_q, tQgQ, tQsQ if cutlass.const_expr(self.q_stages == 1) else tQsQ[None, q_state.index],
                          tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                q_state.advance()
                kv_state = self.load_kv(tma_k, tma_v, tKgK, tKsK, tVgV, tVsV, pipe_k, pipe_v, kv_state, n_max, n_cnt)
            return q_state, kv_state
        if n_max > 0:
            q_st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipe_q.producer_acquire(q_st)
            cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_st))
            kv_st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
            kv_st = self.load_kv(tma_k, tma_v, tKgK, tKsK, tVgV, tVsV, pipe_k, pipe_v, kv_st, n_max, n_cnt)

    @cute.jit
    def load_kv(self, tma_k, tma_v, tKgK, tKsK, tVgV, tVsV, pipe_k, pipe_v, kv_state, n_max: Int32, n_cnt: Int32):
        """(K, V) of key blocks n_max-1 .. n_max-n_cnt into the ring; returns the advanced state."""
        for i in cutlass.range(n_cnt, unroll=1):
            n_block = n_max - 1 - i
            pipe_k.producer_acquire(kv_state)
            cute.copy(tma_k, tKgK[None, n_block], tKsK[None, kv_state.index],
                      tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
            pipe_v.producer_acquire(kv_state)
            cute.copy(tma_v, tVgV[None, n_block], tVsV[None, kv_state.index],
                      tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
            kv_state.advance()
        return kv_state

    @cute.jit
    def mma(self, mO, mLSE, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v,
            params, blocks, m_block: Int32, head: Int32, batch: Int32, n_max: Int32,
            seqlen_q: Int32, seqlen_k: Int32, window, n_cnt: Int32, kv_run=None, q_run=None, aux=None,
            q_shift=0):
        """Consumer warpgroups: the main loop over key blocks, then the epilogue.  Persistent
        CTAs pass their running K/V and Q consumer states (kv_run, q_run) and get them back:
        Q is released after the tile's last QK GEMM, and the ping-pong turns are set up once
        per CTA by the caller instead of once per tile.  q_shift: q_bottom's positions in front of
        the sequence (_q_shift; mO and mLSE come offset by it): the block ranges and masks take
        S_q + q_shift, the score hooks and the epilogue the real rows."""
        persistent = q_run is not None
        tidx = cute.arch.thread_idx()[0] - self.num_threads_per_wg
        wg = cute.arch.make_warp_uniform(tidx // self.num_threads_per_wg)
        wg_mma_qk = tiled_mma_qk.get_slice(wg * self.num_threads_per_wg)
        wg_mma_pv = tiled_mma_pv.get_slice(wg * self.num_threads_per_wg)
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        # V is (tile_n, D) row-major in smem; PV wants B = V^T (D, tile_n), MN-major
        sVt = cute.composition(sV, cute.make_ordered_layout(
            (self.head_dim, self.tile_n, self.num_stages), order=(1, 0, 2)))
        tSrQ = wg_mma_qk.make_fragment_A(wg_mma_qk.partition_A(sQ))
        if cutlass.const_expr(self.q_stages > 1):   # persistent only (check_fwd): this tile's Q buffer
            tSrQ = tSrQ[None, None, None, q_run.index]
        tSrK = wg_mma_qk.make_fragment_B(wg_mma_qk.partition_B(sK))
        tOrV = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(wg_mma_pv.partition_shape_C((self.tile_m, self.head_dim)), Float32)
        tOrP = wg_mma_pv.make_fragment_A(wg_mma_pv.partition_shape_A((self.tile_m, self.tile_n)))
        s_shape = wg_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        tScS_mn = sc.acc_mn_view(thr_mma_qk.partition_C(
            cute.make_identity_tensor((self.tile_m, self.tile_n))))
        num_rows = cute.size(tScS_mn, mode=[0])
        fixed = self.score.fixed_lse(params) if self.cfg.fixed_max else None
        softmax = sc.OnlineSoftmax(num_rows, self.cfg.row_max_chains, self.cfg.row_sum_carry, fixed,
                                   self.cfg.rescale_threshold, self.cfg.exp2_fma, self.cfg.exp2_program)
        row_scale = cute.make_rmem_tensor((num_rows,), Float32)

        ctx = SimpleNamespace(
            tiled_mma_qk=tiled_mma_qk, tiled_mma_pv=tiled_mma_pv, tSrQ=tSrQ, tSrK=tSrK, tOrV=tOrV,
            tOrP=tOrP, acc_O=acc_O, s_shape=s_shape, tScS_mn=tScS_mn, softmax=softmax,
            row_scale=row_scale, params=params, pipe_k=pipe_k, pipe_v=pipe_v, m_block=m_block,
            seqlen_q=seqlen_q, seqlen_k=seqlen_k, wg=wg, n_max=n_max, window=window, head=head,
            batch=batch, aux=aux, seqlen_qv=mask_mod.add0(q_shift, seqlen_q),
            q0=mask_mod.sub0(m_block * self.tile_m, self._rows_q(q_shift)))
        seqlen_qv = ctx.seqlen_qv   # the shifted sequence's length: block ranges, masks, stored rows
        n_max_tile = n_max
        if cutlass.const_expr(self.cfg.wg_skip):
            n_skip, n_unmasked = self._wg_range(blocks, wg, m_block, seqlen_qv, seqlen_k, window, n_max, n_cnt,
                                                self._rows_q(q_shift))
            n_cnt = n_cnt - n_skip
            n_max = n_max - n_skip if n_cnt > 0 else 0   # no block left: the tile's no-key path
            n_unmasked = cutlass.min(n_unmasked, n_max)
        else:
            n_unmasked = cutlass.min(blocks.n_unmasked_end(m_block, seqlen_qv, seqlen_k, window[1]), n_max)
        # key blocks: first = n_max-1 (tail + diagonal, masked); then the ones crossing the
        # causal diagonal / right window edge (masked; none when not bounded); then the
        # interior [n_lo, ..) (mask-free); then the left window edge [n_min, n_lo) (masked).
        # Without a left window n_min = n_lo = 0 (Python ints: the unwindowed code as is).
        n_min = blocks.n_block_min(m_block, seqlen_qv, seqlen_k, window[0])
        n_lo = blocks.n_left_clean(m_block, seqlen_qv, seqlen_k, window[0])
        n_diag = n_max - 1 - cutlass.max(n_unmasked, n_min)
        n_diag_lo = cutlass.max(n_unmasked, n_min) if cutlass.const_expr(blocks.has_left) else n_unmasked
        n_inner = mask_mod.sub0(cutlass.min(n_unmasked, n_max - 1), n_lo)
        if cutlass.const_expr(persistent):
            kv = kv_run
        else:
            kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        if cutlass.const_expr(self.pingpong and not persistent):
            if wg == self.num_mma_wg - 1:  # warpgroup 0 issues its first GEMM first
                self.pingpong_arrive(0)
        # dynamic `for` loops of 0 or 1 trips stand in for `if` (a tile that sees no key
        # skips all work and still writes O = 0, LSE = -inf)
        q_state = q_run if cutlass.const_expr(persistent) else \
            pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        if cutlass.const_expr(self.cfg.wg_skip):
            # Q is waited for (and released below) by every warpgroup of a tile with keys; the
            # blocks above this warpgroup's own range pass without a GEMM
            for _ in cutlass.range(cutlass.min(n_max_tile, 1), unroll=1):
                pipe_q.consumer_wait(q_state)
            for _ in cutlass.range(n_skip, unroll=1):
                kv = self.skip_block(ctx, kv)
            for _ in cutlass.range(cutlass.min(n_max, 1), unroll=1):
                kv = self.first_block(ctx, kv, n_max - 1)
        else:
            for _ in cutlass.range(cutlass.min(n_max, 1), unroll=1):
                pipe_q.consumer_wait(q_state)
                kv = self.first_block(ctx, kv, n_max - 1)
        # The first PV product must overwrite O (zero-init is a compile-time flag: a
        # runtime one puts a predicate move inside the wgmma stage and ptxas then
        # serialises every wgmma, C7513), so the second block is peeled (kept masked).
        for _ in cutlass.range(cutlass.min(cutlass.max(n_cnt - 1, 0), 1), unroll=1):
            kv = self.block_overlap(ctx, kv, n_max - 2, True, True)
        n_diag = n_diag - 1
        n_inner = cutlass.min(n_inner, mask_mod.sub0(n_max - 2, n_lo))
        for i in cutlass.range(n_diag, unroll=1):
            kv = self.next_block(ctx, kv, n_diag_lo + n_diag - 1 - i, True)
        for i in cutlass.range(n_inner, unroll=1):
            kv = self.next_block(ctx, kv, mask_mod.add0(n_lo, n_inner) - 1 - i, False)
        if cutlass.const_expr(blocks.has_left):
            n_left_top = cutlass.min(n_lo, n_lo + n_inner)   # n_inner < 0: no interior
            for i in cutlass.range(n_left_top - n_min, unroll=1):
                kv = self.next_block(ctx, kv, n_left_top - 1 - i, True)
        if cutlass.const_expr(persistent):
            # every QK GEMM of the tile has completed (the loops end on wait_group 0): Q may be refilled
            for _ in cutlass.range(cutlass.min(n_max_tile, 1), unroll=1):
                pipe_q.consumer_release(q_run)
                q_run.advance()
        for _ in cutlass.range(cutlass.min(n_cnt, 1) - cutlass.min(cutlass.max(n_cnt - 1, 0), 1), unroll=1):
            kv = self.last_pv(ctx, kv, True)    # n_max == 1: O = P V
        for _ in cutlass.range(cutlass.min(cutlass.max(n_cnt - 1, 0), 1), unroll=1):
            kv = self.last_pv(ctx, kv, False)   # n_max >= 2: O += P V
        if cutlass.const_expr(self.pingpong and not persistent):
            if wg == 0:  # take the extra arrive of the start so barrier 0 ends balanced
                self.pingpong_sync(0)
        self.epilogue(acc_O, softmax, params, mO, mLSE, tiled_mma_pv, tidx, m_block, head, batch,
                      self._rows_q(seqlen_qv), n_max, self._rows_q(q_shift))
        if cutlass.const_expr(persistent):
            return kv, q_run

    @cute.jit
    def _wg_range(self, blocks, wg, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, window,
                  n_max: Int32, n_cnt: Int32, row_first=0):
        """wg_skip: (n_skip, n_unmasked) of this warpgroup's rows.  The tile's top n_skip key blocks
        are past its rows' causal / right-window bound (all n_cnt when its rows are past S_q: a
        192-row tile ends mid-sequence at S = 512 or 1k; or, q_bottom, all before the sequence's first
        row, row_first); n_unmasked counts from its first row.  Rows are positions under packed GQA
        (row r holds position r // pack)."""
        rows = self.tile_m // self.num_mma_wg
        row_lo = m_block * self.tile_m + wg * rows
        if cutlass.const_expr(self.pack > 1):
            pos_lo, pos_end = row_lo // self.pack, (row_lo + rows - 1) // self.pack + 1
        else:
            pos_lo, pos_end = row_lo, row_lo + rows
        n_skip = n_max - cutlass.min(n_max, blocks.n_block_end(pos_end, seqlen_q, seqlen_k, window[1]))   # end >= 0
        n_skip = cutlass.min(n_skip, n_cnt) if row_lo < self._rows_q(seqlen_q) else n_cnt
        if cutlass.const_expr(self.cfg.q_bottom):
            n_skip = n_skip if row_lo + rows > row_first else n_cnt
        return n_skip, blocks.n_unmasked_from(pos_lo, seqlen_q, seqlen_k, window[1])

    @cute.jit
    def skip_block(self, ctx, kv):
        """wg_skip: a key block of the tile that this warpgroup's rows do not see: its K and V stages
        are waited for (a release must follow the fill it frees) and released, and its turn passed on."""
        ctx.pipe_k.consumer_wait(kv)
        if cutlass.const_expr(self.pingpong):
            self.pingpong_sync(ctx.wg)
            self.pingpong_arrive(self.pingpong_next(ctx.wg))
        ctx.pipe_k.consumer_release(kv)
        ctx.pipe_v.consumer_wait(kv)
        ctx.pipe_v.consumer_release(kv)
        kv.advance()
        return kv

    # ---- warpgroup ping-pong: the consumer warpgroups take turns issuing GEMMs (round robin:
    # 0, 1[, 2]), so one runs its score stage (MUFU/FMA) while another's wgmma keep the tensor
    # cores busy.  Named barrier FwdBarrier.PINGPONG + w gates warpgroup w; 256 = its 128 waiting
    # + 128 arriving threads (its predecessor's); the last warpgroup opens the first turn.
    def pingpong_next(self, wg):
        """The warpgroup whose turn follows wg's."""
        if cutlass.const_expr(self.num_mma_wg == 2):
            return 1 - wg
        return (wg + 1) % self.num_mma_wg

    def pingpong_sync(self, wg):
        cute.arch.barrier(barrier_id=int(FwdBarrier.PINGPONG) + wg, number_of_threads=2 * self.num_threads_per_wg)

    def pingpong_arrive(self, wg):
        cute.arch.barrier_arrive(barrier_id=int(FwdBarrier.PINGPONG) + wg, number_of_threads=2 * self.num_threads_per_wg)

    @cute.jit
    def next_block(self, ctx, kv, n_block: Int32, masked: cutlass.Constexpr[bool]):
        return self.block_overlap(ctx, kv, n_block, masked, False)

    @cute.jit
    def scores_to_p(self, ctx, acc_S, n_block: Int32, is_first: cutlass.Constexpr[bool],
                    masked: cutlass.Constexpr[bool], tOrP_dst):
        """Score stage on S: transform, mask (diagonal/tail blocks only), P into tOrP_dst
        (None: P stays in acc_S for the stage's write_p after the PV wait); returns the score's
        carry for that write_p."""
        coords = sc.Coords(ctx.tScS_mn, ctx.q0, n_block * self.tile_n, ctx.batch,
                           ctx.head, sc.SeqlenInfo(ctx.seqlen_q, ctx.seqlen_k), ctx.aux)
        if cutlass.const_expr(self.cfg.fixed_max):
            self.score.transform_fixed(acc_S, ctx.params, coords)   # exp2 arguments against a constant max
        else:
            self.score.transform(acc_S, ctx.params, coords)
        if cutlass.const_expr(masked):
            mask_mod.apply_mask(sc.acc_mn_view(acc_S), ctx.tScS_mn, ctx.m_block, n_block,
                                ctx.seqlen_qv, ctx.seqlen_k, self.tile_m, self.tile_n, self.causal,
                                self.cfg.window_left, self.cfg.window_right, ctx.window[0], ctx.window[1],
                                self.cfg.mask_bits, self.pack)
        return self.score.probs(acc_S, tOrP_dst, ctx.softmax, ctx.params, is_first, masked,
                                ctx.row_scale, self.is_bf16)

    @cute.jit
    def rescale_o(self, ctx):
        if cutlass.const_expr(self.score.uses_online_softmax and not self.cfg.fixed_max):
            if cutlass.const_expr(self.cfg.rescale_threshold > 0.0):
                if ctx.softmax.rescale_needed(ctx.row_scale):
                    self._scale_o(ctx)
            else:
                self._scale_o(ctx)

    @cute.jit
    def _scale_o(self, ctx):
        o_mn = sc.acc_mn_view(ctx.acc_O)
        for r in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                o_mn[r, c] = o_mn[r, c] * ctx.row_scale[r]

    @cute.jit
    def qk_waited(self, ctx, kv):
        """S = Q K_kv^T, completed (wait_group 0) and K stage released; the ping-pong
        handshake brackets the issue so the other warpgroup's softmax overlaps it."""
        acc_S = cute.make_rmem_tensor(ctx.s_shape, Float32)
        ctx.pipe_k.consumer_wait(kv)
        if cutlass.const_expr(self.pingpong):
            self.pingpong_sync(ctx.wg)
        self.wgmma(ctx.tiled_mma_qk, acc_S, ctx.tSrQ, ctx.tSrK[None, None, None, kv.index], True)
        if cutlass.const_expr(self.pingpong):
            self.pingpong_arrive(self.pingpong_next(ctx.wg))
        warpgroup.wait_group(0)
        fence_fragment(acc_S)
        ctx.pipe_k.consumer_release(kv)
        return acc_S

    @cute.jit
    def first_block(self, ctx, kv, n_block: Int32):
        """Prologue of the overlapped loop: S and P of the first block (P packed into tOrP
        at once: no PV is in flight yet); its PV is issued by the next step."""
        acc_S = self.qk_waited(ctx, kv)
        self.scores_to_p(ctx, acc_S, n_block, True, True, ctx.tOrP)
        return kv

    def issue_qk_pv(self, ctx, kv, first_pv: bool):
        """Both GEMMs of an overlapped step, as two commit groups: S_n = Q K_n^T (kv advanced
        to n) and O (+)= P_{n-1} V_{n-1}; the ping-pong handshake brackets the issue.
        Returns (kv_prev, acc_S); kv is advanced in place (a plain method, traced inline by
        its jit callers, so the in-place advance is the caller's kv)."""
        kv_prev = kv.clone()
        kv.advance()
        acc_S = cute.make_rmem_tensor(ctx.s_shape, Float32)
        ctx.pipe_k.consumer_wait(kv)
        if cutlass.const_expr(self.pingpong):
            self.pingpong_sync(ctx.wg)
        self.wgmma(ctx.tiled_mma_qk, acc_S, ctx.tSrQ, ctx.tSrK[None, None, None, kv.index], True)
        ctx.pipe_v.consumer_wait(kv_prev)
        self.wgmma(ctx.tiled_mma_pv, ctx.acc_O, ctx.tOrP, ctx.tOrV[None, None, None, kv_prev.index],
                   first_pv)
        if cutlass.const_expr(self.pingpong):
            self.pingpong_arrive(self.pingpong_next(ctx.wg))
        return kv_prev, acc_S

    @cute.jit
    def block_overlap(self, ctx, kv, n_block: Int32, masked: cutlass.Constexpr[bool],
                      first_pv: cutlass.Constexpr[bool]):
        """One overlapped step: issue S_n = Q K_n^T and O += P_{n-1} V_{n-1} together; the
        score stage of S_n runs while PV is still on the tensor cores, leaving FP32 P_n in
        acc_S; after wait_group(0) P_n is packed into tOrP and O is rescaled.

        Why P_n is packed only after the PV wait (found by bisecting a wait_group 0 through
        the kept PTX under ptxas -v): packing P_n (cvt) while P_{n-1} V is in flight let
        ptxas copy-coalesce P_n into the A registers of that wgmma through the loop-back
        mov, and then serialise every wgmma of the kernel (C7513).  This order also needs no
        second 32-register P fragment and no 32 movs per block."""
        kv_prev, acc_S = self.issue_qk_pv(ctx, kv, first_pv)
        warpgroup.wait_group(1)   # S_n has landed (P_{n-1} V may still run)
        fence_fragment(acc_S)   # the score stage must not rise above wait_group(1); no PTX
        ctx.pipe_k.consumer_release(kv)
        carry = self.scores_to_p(ctx, acc_S, n_block, False, masked, None)
        warpgroup.wait_group(0)
        fence_fragment(ctx.acc_O)
        ctx.pipe_v.consumer_release(kv_prev)
        # P_n into the A fragment now that nothing reads it: the stage pins the acc_S
        # registers it reads (keeps its non-volatile asm below the wait) and packs them
        # (sigmoid/poly: the block's last squaring on its block pairs; fixed_max: the
        # row sum of the rounded P is taken here: common.write_p_fixed)
        if cutlass.const_expr(self.cfg.fixed_max):
            sc.write_p_fixed(acc_S, ctx.tOrP, ctx.softmax)
        else:
            self.score.write_p(acc_S, ctx.tOrP, self.is_bf16, carry)
        self.rescale_o(ctx)
        return kv

    @cute.jit
    def last_pv(self, ctx, kv, first_pv: cutlass.Constexpr[bool]):
        ctx.pipe_v.consumer_wait(kv)
        self.wgmma(ctx.tiled_mma_pv, ctx.acc_O, ctx.tOrP, ctx.tOrV[None, None, None, kv.index],
                   first_pv)
        warpgroup.wait_group(0)
        fence_fragment(ctx.acc_O)
        ctx.pipe_v.consumer_release(kv)
        kv.advance()
        return kv

    @cute.jit
    def wgmma(self, tiled_mma, acc, tA, tB, zero_init: cutlass.Constexpr[bool]):
        """acc (+)= A B over the k-blocks of the fragments; one commit group.  O is never
        zero-filled with register moves: its first PV product overwrites it (moves that
        define wgmma inputs inside a wgmma stage make ptxas serialise every wgmma, C7513)."""
        warpgroup.fence()
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
        for k in cutlass.range_constexpr(cute.size(tA.shape[2])):
            cute.gemm(atom, acc, tA[None, None, k], tB[None, None, k], acc)
            atom.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()

    @cute.jit
    def epilogue(self, acc_O, softmax, params, mO, mLSE, tiled_mma_pv, tidx: Int32,
                 m_block: Int32, head: Int32, batch: Int32, seqlen_q: Int32, n_max: Int32, row_first=0):
        """Normalise O (softmax modes), write O (rows < seqlen_q: the packed rows, pack x S_q, under
        packed GQA; and, q_bottom, rows >= row_first, the shift's rows in front) and LSE straight from
        registers."""
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        tOcO_mn = sc.acc_mn_view(thr_mma_pv.partition_C(
            cute.make_identity_tensor((self.tile_m, self.head_dim))))
        o_mn = sc.acc_mn_view(acc_O)
        num_rows = cute.size(o_mn, mode=[0])
        # a tile that sees no key never ran a PV product: acc_O is undefined, write zeros
        for i in cutlass.range_constexpr(cute.size(acc_O)):
            acc_O[i] = acc_O[i] if n_max > 0 else Float32(0.0)
        if cutlass.const_expr(self.score.uses_online_softmax):
            o_scale = cute.make_rmem_tensor((num_rows,), Float32)
            lse = cute.make_rmem_tensor((num_rows,), Float32)
            softmax.finalize(self.score.lse_scale(params), o_scale, lse)
            for r in cutlass.range_constexpr(num_rows):
                for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                    o_mn[r, c] = o_mn[r, c] * o_scale[r]
            gLSE = mLSE[None, head, batch]
            for r in cutlass.range_constexpr(num_rows):
                row = m_block * self.tile_m + tOcO_mn[r, 0][0]
                if tOcO_mn[0, 0][1] == 0 and row < seqlen_q:
                    if self._stored(row, row_first):
                        gLSE[row] = lse[r]
        gO = mO[None, None, head, batch]
        if cutlass.const_expr(self.cfg.o_smem):
            self.store_o_staged(acc_O, gO, tiled_mma_pv, tidx, m_block, seqlen_q, head, batch, row_first)
        else:
            for r in cutlass.range_constexpr(num_rows):
                row = m_block * self.tile_m + tOcO_mn[r, 0][0]
                if row < seqlen_q:
                    if self._stored(row, row_first):
                        for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                            gO[row, tOcO_mn[0, c][1]] = o_mn[r, c].to(self.dtype)

    def _stored(self, row, row_first):
        """Is the tile's row (below S_q) a row of the sequence: q_bottom's rows in front are not (the
        literal True without the shift: the top-aligned code as is)."""
        if mask_mod.is_zero(row_first):
            return True
        return row >= row_first

    @cute.jit
    def store_o_staged(self, acc_O, gO, tiled_mma_pv, tidx: Int32, m_block: Int32, seqlen_q: Int32,
                       head: Int32, batch: Int32, row_first=0):
        """o_smem: each consumer warpgroup writes its 64 rows of O (cast) into the staging tile with
        stmatrix, then stores them as 16-byte row chunks (a warp covers whole rows: full sectors),
        rows >= S_q skipped.  A named barrier per warpgroup before the writes (its threads have read
        the previous tile's rows) and before the reads (the rows are complete).  D = 256 goes
        through a 128-column tile in two passes (store_o_staged_passes)."""
        if cutlass.const_expr(self.o_cols != self.head_dim):
            self.store_o_staged_passes(acc_O, gO, tidx, m_block, seqlen_q, row_first)
        else:
            sO = self._sO
            wg = tidx // self.num_threads_per_wg
            bar = pipeline.NamedBarrier(barrier_id=int(FwdBarrier.EPILOGUE) + wg,
                                        num_threads=self.num_threads_per_wg)
            rO = cute.make_fragment_like(acc_O, self.dtype)
            rO.store(acc_O.load().to(self.dtype))
            r2s = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4),
                                    self.dtype),
                tiled_mma_pv)
            thr_r2s = r2s.get_slice(tidx)
            if cutlass.const_expr(self.cfg.o_tma):   # the previous tile's TMA store has read the rows
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            bar.arrive_and_wait()
            cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sO))
            if cutlass.const_expr(self.cfg.o_tma):
                cute.arch.fence_view_async_shared()   # stmatrix's writes visible to the TMA (async proxy)
                bar.arrive_and_wait()
                # q_bottom: a box that starts before the sequence's first row goes by row stores (with
                # such boxes stored by TMA, at negative row coordinates, the kernel stopped with an illegal
                # instruction; with row stores it passes); without the shift _stored is the literal True
                if self._stored(m_block * self.tile_m + wg * 64, row_first):
                    self.store_o_tma(sO, wg, tidx, m_block, head, batch)
                else:
                    self.store_o_rows(gO, sO, wg, tidx, m_block, seqlen_q, 0, row_first)
            else:
                bar.arrive_and_wait()
                self.store_o_rows(gO, sO, wg, tidx, m_block, seqlen_q, 0, row_first)

    @cute.jit
    def store_o_tma(self, sO, wg, tidx: Int32, m_block: Int32, head: Int32, batch: Int32):
        """o_tma: warp 0 of warpgroup wg stores its 64 staged rows by TMA, one 64 x 64 box per 64
        columns, and commits them as one bulk group; rows at or past S_q fall outside O's row extent
        and are clipped.  The group is waited for (read) before the staging rows are written again
        (the next tile's epilogue) and before the kernel exits."""
        tma_o, mO_tma = self._o_store
        if (tidx % self.num_threads_per_wg) // 32 == 0:
            gO = mO_tma[None, None, head, batch]
            for cb in cutlass.range_constexpr(self.head_dim // self.O_TMA_COLS):
                box = (64, self.O_TMA_COLS)
                tOsO, tOgO = cpasync.tma_partition(
                    tma_o, 0, cute.make_layout(1), cute.group_modes(cute.local_tile(sO, box, (wg, cb)), 0, 2),
                    cute.group_modes(cute.local_tile(gO, box, (m_block * (self.tile_m // 64) + wg, cb)), 0, 2))
                cute.copy(tma_o, tOsO, tOgO)
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def store_o_rows(self, gO, sO, wg, tidx: Int32, m_block: Int32, seqlen_q: Int32, col_block: cutlass.Constexpr,
                     row_first=0):
        """Warpgroup wg's 64 staged rows (o_cols columns) to O's column block col_block, as
        16-byte chunks: o_cols / 8 threads per row, 128 / (o_cols / 8) rows per pass."""
        chunks = self.o_cols // 8
        s2g = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128),
            cute.make_ordered_layout((self.num_threads_per_wg // chunks, chunks), order=(1, 0)),
            cute.make_layout((1, 8)))
        thr_s2g = s2g.get_slice(tidx - wg * self.num_threads_per_wg)
        rows = (64, self.o_cols)
        tOsO = thr_s2g.partition_S(cute.local_tile(sO, rows, (wg, 0)))
        tOgO = thr_s2g.partition_D(cute.local_tile(gO, rows, (m_block * (self.tile_m // 64) + wg, col_block)))
        tOcO = thr_s2g.partition_S(cute.make_identity_tensor(rows))
        tOrO = cute.make_fragment_like(tOsO, self.dtype)
        cute.autovec_copy(tOsO, tOrO)
        row0 = m_block * self.tile_m + wg * 64
        for i in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
            if row0 + tOcO[0, i, 0][0] < seqlen_q:
                if self._stored(row0 + tOcO[0, i, 0][0], row_first):
                    cute.copy(s2g, tOrO[None, i, None], tOgO[None, i, None])

    @cute.jit
    def store_o_staged_passes(self, acc_O, gO, tidx: Int32, m_block: Int32, seqlen_q: Int32, row_first=0):
        """o_smem at D = 256: the staging tile holds o_cols = 128 columns (a whole 64 KB tile does
        not fit beside Q and two K / V stages), so O goes through it in two passes.  The registers
        of pass p are the PV fragment's values 64p .. 64p + 63: the wgmma C layout is the same for
        every N (value group k holds columns 8k .. 8k + 7), so they are columns 128p .. 128p + 127
        in the order of an N = 128 fragment, which the pass's stmatrix copy is built from.  Each
        pass casts its own values (one cast of the whole fragment up front made ptxas spill 62
        words in the sigmoid builds)."""
        sO = self._sO
        wg = tidx // self.num_threads_per_wg
        bar = pipeline.NamedBarrier(barrier_id=int(FwdBarrier.EPILOGUE) + wg, num_threads=self.num_threads_per_wg)
        tiled_mma_o = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN,
            Float32, (self.num_mma_wg, 1, 1), (64, self.o_cols), warpgroup.OperandSource.RMEM)
        r2s = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype),
            tiled_mma_o)
        thr_r2s = r2s.get_slice(tidx)
        for p in cutlass.range_constexpr(self.head_dim // self.o_cols):
            rO_p = cute.make_rmem_tensor(
                tiled_mma_o.get_slice(tidx).partition_shape_C((self.tile_m, self.o_cols)), self.dtype)
            n = cute.size(rO_p)
            for i in cutlass.range_constexpr(n):
                rO_p[i] = acc_O[p * n + i].to(self.dtype)
            bar.arrive_and_wait()   # the previous pass's (or tile's) rows have been read
            cute.copy(r2s, thr_r2s.retile(rO_p), thr_r2s.partition_D(sO))
            bar.arrive_and_wait()
            self.store_o_rows(gO, sO, wg, tidx, m_block, seqlen_q, p, row_first)


class AttnFwdSm90Aux(AttnFwdSm90):
    """The build for a user score function that reads aux tensors: the host entry takes them
    as one more argument (a list of tensors), after the window sizes."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                 win_left: Int32, win_right: Int32, ctas: Int32, l2_bytes: Int32, aux: list, stream):
        self._launch(mQ, mK, mV, mO, mLSE, scale, softcap, bias, win_left, win_right, ctas, l2_bytes, aux, stream)


class AttnFwdSm90Varlen(AttnFwdSm90):
    """The varlen build (FwdConfig.varlen): packed sequences.  The host entry takes q, k, v, O
    as (1, total, H, D) and LSE as (1, H_q, total_q), then the int32 offsets cu_seqlens_q,
    cu_seqlens_k (batch + 1) and max_seqlen_q (the grid's query tiles per sequence)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, mCuSeqlensQ: cute.Tensor, mCuSeqlensK: cute.Tensor, max_seqlen_q: Int32,
                 scale: Float64, softcap: Float64, bias: Float64, win_left: Int32, win_right: Int32, ctas: Int32,
                 l2_bytes: Int32, stream):
        self._launch(mQ, mK, mV, mO, mLSE, scale, softcap, bias, win_left, win_right, ctas, l2_bytes, None, stream,
                     (mCuSeqlensQ, mCuSeqlensK, max_seqlen_q))


class AttnFwdSm90VarlenCompact(AttnFwdSm90):
    """The varlen build in the compact order (FwdConfig.varlen_compact): the entry also takes the
    order's table (kernels/tile_scheduler.compact_varlen_table) after max_seqlen_q."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, mCuSeqlensQ: cute.Tensor, mCuSeqlensK: cute.Tensor, max_seqlen_q: Int32,
                 mTiles: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64, win_left: Int32,
                 win_right: Int32, ctas: Int32, l2_bytes: Int32, stream):
        self._launch(mQ, mK, mV, mO, mLSE, scale, softcap, bias, win_left, win_right, ctas, l2_bytes, None, stream,
                     (mCuSeqlensQ, mCuSeqlensK, max_seqlen_q, mTiles))


# ---------------------------------------------------------------------- compile + torch entry
def _fake_args(cfg: FwdConfig):
    """Fake tensors with symbolic B/S/H and strides (D static): the signature the tvm-ffi
    entry checks the torch tensors against (dtype, rank, stride divisibility) and packs."""
    from cutlass.cute.runtime import make_fake_tensor

    dt = _DTYPES[cfg.dtype]
    # from_dlpack's dynamic layouts carry 32-bit shapes and 64-bit strides: the fake
    # signature must match bit for bit (a 32-bit stride here read garbage strides at run
    # time: illegal address).  q/k/v/o strides are multiples of 8 elements (16 B, a TMA rule
    # that attn_fwd checks).
    shp = lambda: cute.sym_int(32)
    st = lambda div=1: cute.sym_int64(divisibility=div)
    def qkv():
        return make_fake_tensor(dt, (shp(), shp(), shp(), shp()), (st(8), st(8), st(8), 1), assumed_align=16)
    lse = make_fake_tensor(Float32, (shp(), shp(), shp()), (st(), st(), 1), assumed_align=16)
    args = (qkv(), qkv(), qkv(), qkv(), lse)
    if cfg.varlen:   # cu_seqlens_q, cu_seqlens_k, max_seqlen_q
        cu = lambda: make_fake_tensor(Int32, (shp(),), (1,), assumed_align=4)
        args += (cu(), cu(), Int32(0))
        if cfg.varlen_compact:   # the compact order's table
            args += (cu(),)
    args += (Float64(1.0), Float64(1.0), Float64(0.0),   # scale, softcap, bias
             Int32(0), Int32(0),   # window (left, right) sizes
             Int32(0),             # the persistent grid's CTA count (AttnPlan.fwd_ctas)
             Int32(0))             # the LPT sections' bytes (AttnPlan.l2_section_mb << 20)
    if cfg.score.aux:
        args += (aux_fake_tensors(cfg.score.aux),)
    return args


def aux_fake_tensors(aux: tuple) -> list:
    """Fake tensors for a user score function's aux tensors ((dtype name, ndim) each): symbolic
    shapes and strides, unit innermost stride (the launch passes them contiguous)."""
    from cutlass.cute.runtime import make_fake_tensor

    out = []
    for dtype, ndim in aux:
        dt = AUX_DTYPES[dtype]
        shape = tuple(cute.sym_int(32) for _ in range(ndim))
        stride = tuple(cute.sym_int64() for _ in range(ndim - 1)) + (1,)
        out.append(make_fake_tensor(dt, shape, stride, assumed_align=dt.width // 8))
    return out


AUX_DTYPES = {"float32": Float32, "int32": Int32, "bfloat16": cutlass.BFloat16, "float16": cutlass.Float16,
              "int64": cutlass.Int64}   # kernels/config.AUX_DTYPES


def compile_attn_fwd(cfg: FwdConfig, *, options: str = ""):
    """cute.compile the kernel for cfg against fake tensors (works on a CPU machine with
    CUTE_DSL_ARCH=sm_90a), uncached: for inspection with compiler options (SASS, PTX).
    The build is the one attn_fwd runs (kernels/compile_cache.py launch path)."""
    return compile_cache.compile_tvm_ffi(kernel_for(cfg), _fake_args(cfg), options)


def _compiled(cfg: FwdConfig):
    """The cached build of cfg (memory, then disk, then compile)."""
    return compile_cache.compiled("attn_fwd", cfg, lambda: (kernel_for(cfg), _fake_args(cfg)))


def kernel_for(cfg: FwdConfig) -> AttnFwdSm90:
    if cfg.varlen:
        return AttnFwdSm90VarlenCompact(cfg) if cfg.varlen_compact else AttnFwdSm90Varlen(cfg)
    return (AttnFwdSm90Aux if cfg.score.aux else AttnFwdSm90)(cfg)
