"""Attention backward at D = 256 without recompute: dK^T and dV^T with the head dim on the wgmma
M axis (BwdConfig.swap; FA4's sm90 dKV_swapAB design, docs/NOTES_attn_bwd.md "D = 256 backward:
FA4's sm90 design beside ours"): the plan's D = 256 row for dense calls of the built-in scores.

The chunked build (kernels/attn_bwd_sm90.py, "Head dim 256") cannot keep dK and dV of a
warpgroup's 64 keys over all 256 columns in registers, so it splits the columns over two CTAs
and recomputes S and dP in both (1.4x the tensor work).  Here a CTA owns tile_n = 64 keys and
all 256 columns; the two MMA warpgroups split the work so that every accumulator fits:

    S  = Q K^T, dP = dO V^T   (64 queries x 64 keys, K = 256): warpgroup w the keys [32 w, 32 w + 32)
    P, f = stage.prob(S); dS = stage.dscore(f, dP)   in registers, then P and dS to smem (stmatrix)
    dV^T += dO^T P            (256 x 64, K = 64 queries): warpgroup w the columns [128 w, 128 w + 128)
    dK^T += Q^T dS            (the same split)
    dQ    = dS K              (64 x 256, K = 64 keys): two passes of 128 columns, warpgroup w 64 of
                              each pass's columns; both passes' GEMMs are issued before dV^T and
                              dK^T, so every dQ atomic is issued while those run

Registers per MMA thread: dV^T and dK^T 64 + 64, dQ 32 per pass (both live while their atomics are
issued; S and dP are dead by then), S and dP 16 + 16.  Shared memory:
Q and dO 32 KB per stage (2 stages), K and V 32 KB each, P and dS 8 KB each (double buffered: the
other warpgroup may still read the previous block's tiles), about 208 KB.  (FA4's 48-key tile, dQ
in one pass, and a staged dQ tile at one Q / dO stage were slower: docs/MEASURED.md bwd-d256-swap.)

The grid is head_loop's (a CTA per (key block, KV head, batch) over the GQA group's query heads),
so dK and dV leave the CTA once, scaled and cast, through the K and V tiles (stmatrix.trans: the
fragments are transposed) and 16-byte row stores; dQ goes to the FP32 accumulator with
red.global.add.v4 (BwdReductions.atomic_tile in the accumulator's fragment order).

Packed sequences (BwdConfig.varlen, AttnBwdSm90SwapVarlen): a CTA per entry of the (64-key block, KV
head, sequence) table, the sequence's rows of the packed tensors (AttnBwdSm90.varlen_views), as the
chunked varlen build.  Not in this build: deterministic turns, user score functions.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator

from . import mask as mask_mod
from .attn_bwd_sm90 import (AttnBwdSm90HeadLoop, AttnBwdSm90VarlenHeadLoop, MMA_REGS, NUM_THREADS,
                            PRODUCER_REGS, SMEM_CAPACITY, transpose_view)
from .barriers import BwdBarrier
from .bwd_reduce import acc_mn_view
from .scores import common as sc
from .tile_scheduler import SectionLptScheduler, section_heads

DQ_PASSES = 2      # dV^T + dK^T take 128 accumulator registers: dQ's 64 run as two passes of 32


class AttnBwdSm90Swap(AttnBwdSm90HeadLoop):
    """The swapped D = 256 build (module docstring); the host entry is head_loop's."""

    def __init__(self, cfg):
        super().__init__(cfg)   # config.check_bwd has refused what this build cannot take
        self.Dc, self.n_chunks = self.D, 1     # one CTA owns all 256 columns
        self.half = self.D // 2                # columns per MMA warpgroup of dK^T, dV^T, dQ
        self.dq_passes = DQ_PASSES

    # ---------------------------------------------------------------- host side
    def _layout(self, kind, rows, cols, stages=None):
        atom = warpgroup.make_smem_layout_atom(kind, self.dtype)
        shape = (rows, cols) if stages is None else (rows, cols, stages)
        return cute.tile_to_shape(atom, shape, (0, 1, 2) if stages is not None else (0, 1))

    def _swap_layouts(self):
        """(Q / dO staged, K / V, P / dS double buffer): K-major; P and dS (queries x keys, keys
        contiguous) in the interleaved atom (8 x 16-byte rows, conflict-free for stmatrix), so the same
        tile is dQ's K-major A and (transposed) dV^T's / dK^T's MN-major B."""
        K128 = warpgroup.SmemLayoutAtomKind.K_SW128
        return (self._layout(K128, self.tile_m, self.D, self.stages), self._layout(K128, self.tile_n, self.D),
                self._layout(warpgroup.SmemLayoutAtomKind.K_INTER, self.tile_m, self.tile_n, 2))

    def _tiled_mmas(self):
        K, MN = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        dt = self.dtype
        # S, dP: the warpgroups side by side along the keys (N)
        mma_s = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, (1, 2, 1), (64, self.tile_n // 2))
        # dV^T, dK^T: the warpgroups stacked along the head dim (M); each repeats its 64-row atom twice
        mma_dkv = sm90_utils.make_trivial_tiled_mma(dt, dt, MN, MN, Float32, (2, 1, 1), (64, self.tile_n))
        # dQ: the warpgroups side by side along the head dim (N)
        mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (1, 2, 1),
                                                   (64, self.half // self.dq_passes))
        return mma_s, mma_dkv, mma_dq

    def _storage(self):
        dt, st = self.dtype, self.stages
        lq, lk, lx = self._swap_layouts()

        @cute.struct
        class Storage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, st * 2]
            mbar_do: cute.struct.MemRange[cutlass.Int64, st * 2]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, self.tile_m * st], 128]
            sDsum: cute.struct.Align[cute.struct.MemRange[Float32, self.tile_m * st], 128]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(lq)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(lq)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(lk)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(lk)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(lx)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(lx)], 1024]

        if Storage.size_in_bytes() > SMEM_CAPACITY:
            raise ValueError(f"swap build needs {Storage.size_in_bytes()} bytes of shared memory")
        return Storage

    def _launch(self, mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdK, mdV, scalars,
                win_left, win_right, extra, stream, aux=None, varlen=None):
        scalars = tuple(Float32(a) for a in self.stage.bwd_scalars(*scalars))
        mQ, mK, mV, mdO, mdK, mdV = [self._seq_major(t, [1, 3, 2, 0]) for t in (mQ, mK, mV, mdO, mdK, mdV)]
        mdQacc = self._seq_major(mdQacc, [2, 3, 1, 0])
        mLSE, mDsum = [self._seq_major(t, [2, 1, 0]) for t in (mLSE, mDsum)]
        mma_s, mma_dkv, mma_dq = self._tiled_mmas()
        Storage = self._storage()
        lq, lk, _ = self._swap_layouts()
        q1 = cute.select(lq, mode=[0, 1])
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        m, n = self.tile_m, self.tile_n
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, mQ, q1, (m, self.D))
        tma_do, tdO = cpasync.make_tiled_tma_atom(g2s, mdO, q1, (m, self.D))
        tma_k, tK = cpasync.make_tiled_tma_atom(g2s, mK, lk, (n, self.D))
        tma_v, tV = cpasync.make_tiled_tma_atom(g2s, mV, lk, (n, self.D))
        stat = cute.make_layout((m,))
        tma_lse, tLSE = cpasync.make_tiled_tma_atom(g2s, mLSE, stat, (m,))
        tma_dsum, tDsum = cpasync.make_tiled_tma_atom(g2s, mDsum, stat, (m,))
        elt = self.dtype.width // 8
        self.bytes_q = m * self.D * elt
        self.bytes_kv = 2 * n * self.D * elt
        self.bytes_stat = m * 4
        n_blocks = cute.ceil_div(cute.size(mK.shape[0]), n)
        grid = (n_blocks, cute.size(mK.shape[2]), cute.size(mQ.shape[3]))
        if const_expr(self.lpt):
            grid = SectionLptScheduler.grid(n_blocks, cute.size(mK.shape[2]), cute.size(mQ.shape[3]))
        if const_expr(varlen is not None):   # a CTA per entry of the (key block, KV head, sequence) table
            grid = (varlen[3], 1, 1)
        self.kernel(tQ, tK, tV, tdO, tLSE, tDsum, mdQacc, mdK, mdV,
                    tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum,
                    mma_s, mma_dkv, mma_dq, scalars + self._window_param(win_left, win_right) + extra,
                    Storage, aux, varlen).launch(
            grid=grid, block=[NUM_THREADS, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdK, mdV,
               tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum,
               mma_s: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq: cute.TiledMma,
               args, Storage: cutlass.Constexpr, aux, varlen):
        self._aux, self._varlen = None, varlen   # varlen: (cu_seqlens_q, cu_seqlens_k, CTA table, CTAs)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        h_kv = mK.shape[2]
        if const_expr(self.lpt):
            group = h_kv
            if const_expr(self.kv_sections):
                group = section_heads(h_kv, mQ.shape[0] * (mQ.shape[2] // h_kv), self.D * 8, 1)
            n_block, head_kv, batch = SectionLptScheduler(reverse=False).work_tile(
                cute.ceil_div(mK.shape[0], self.tile_n), h_kv, group)
        else:
            n_block, head_kv, batch = cute.arch.block_idx()
        if const_expr(varlen is not None):   # blockIdx.x is an entry of the CTA table; batch: the sequence
            n_block, head_kv, batch = self.varlen_tile(varlen[2], n_block)
        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum):
                cpasync.prefetch_descriptor(atom)
        st = SmemAllocator().allocate(Storage)
        pipe_q, pipe_do, pipe_kv = self._make_pipelines(st)
        lq, lk, lx = self._swap_layouts()
        sQ = st.sQ.get_tensor(lq.outer, swizzle=lq.inner)
        sdO = st.sdO.get_tensor(lq.outer, swizzle=lq.inner)
        sK = st.sK.get_tensor(lk.outer, swizzle=lk.inner)
        sV = st.sV.get_tensor(lk.outer, swizzle=lk.inner)
        sP = st.sP.get_tensor(lx.outer, swizzle=lx.inner)
        sdS = st.sdS.get_tensor(lx.outer, swizzle=lx.inner)
        stat_l = cute.make_layout((self.tile_m, self.stages))
        sLSE = st.sLSE.get_tensor(stat_l)
        sDsum = st.sDsum.get_tensor(stat_l)
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        if const_expr(varlen is not None):   # the sequence's rows of the packed tensors (dK / dV: at the store)
            mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdK, mdV, seqlen_q, seqlen_k = self.varlen_views(
                varlen, batch, mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdK, mdV)
            batch = Int32(0)
            args = self.stage.seq_params(args, seqlen_k, backward=True)   # sigmoid's -ln S_k (spec.seq_bias)
        n_heads = mQ.shape[2] // h_kv
        head = head_kv * n_heads
        m_min, m_max = self.m_block_range(n_block, seqlen_q, seqlen_k, args)
        if const_expr(varlen is not None):
            if n_block * self.tile_n >= seqlen_k:   # varlen_tile's sentinel (an entry past the table's count)
                m_max = m_min
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp_idx == 0:
                self.load(mQ, mK, mV, mdO, mLSE, mDsum, sQ, sK, sV, sdO, sLSE, sDsum,
                          tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum, pipe_q, pipe_do, pipe_kv,
                          n_block, head, head_kv, batch, m_min, m_max)
        else:
            cute.arch.setmaxregister_increase(MMA_REGS)
            self.mma_swap(mma_s, mma_dkv, mma_dq, sQ, sK, sV, sdO, sP, sdS, sLSE, sDsum, pipe_q, pipe_do, pipe_kv,
                          mdQacc, mdK, mdV, tidx - 128, n_block, head, head_kv, batch, m_min, m_max,
                          seqlen_q, seqlen_k, n_heads, args)

    @cute.jit
    def mma_swap(self, mma_s, mma_dkv, mma_dq, sQ, sK, sV, sdO, sP, sdS, sLSE, sDsum, pipe_q, pipe_do, pipe_kv,
                 mdQacc, mdK, mdV, tidx, n_block, head, head_kv, batch, m_min, m_max, seqlen_q, seqlen_k,
                 n_heads, args):
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_layout = cute.make_layout(2, stride=128)
        wg_s, wg_dkv, wg_dq = (t.get_slice(wg_layout(wg)) for t in (mma_s, mma_dkv, mma_dq))
        # S = Q K^T, dP = dO V^T: A = Q / dO (K-major), B = this warpgroup's keys of K / V
        tSrQ = mma_s.make_fragment_A(wg_s.partition_A(sQ))
        tSrdO = mma_s.make_fragment_A(wg_s.partition_A(sdO))
        tSrK = mma_s.make_fragment_B(wg_s.partition_B(sK))
        tSrV = mma_s.make_fragment_B(wg_s.partition_B(sV))
        # dV^T = dO^T P, dK^T = Q^T dS: A = dO^T / Q^T (MN-major views), B = P / dS seen (keys, queries)
        tVrdOt = mma_dkv.make_fragment_A(wg_dkv.partition_A(transpose_view(sdO)))
        tKrQt = mma_dkv.make_fragment_A(wg_dkv.partition_A(transpose_view(sQ)))
        tVrP = mma_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(sP)))
        tKrdS = mma_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(sdS)))
        # dQ = dS K: A = dS (K-major), B = K^T (MN-major view)
        tQrdS = mma_dq.make_fragment_A(wg_dq.partition_A(sdS))
        cols = self.D // self.dq_passes   # dQ columns per pass
        tQrKt = tuple(mma_dq.make_fragment_B(wg_dq.partition_B(
            cute.local_tile(transpose_view(sK), (cols, self.tile_n), (p, 0)))) for p in range(self.dq_passes))

        thr_s = mma_s.get_slice(tidx)
        tScS = thr_s.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
        shape_dkv = mma_dkv.get_slice(tidx).partition_shape_C((self.D, self.tile_n))
        acc_dVt = cute.make_rmem_tensor(shape_dkv, Float32)
        acc_dKt = cute.make_rmem_tensor(shape_dkv, Float32)
        acc_dVt.fill(0.0)
        acc_dKt.fill(0.0)
        r2s = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=1), self.dtype),
            mma_s)
        thr_r2s = r2s.get_slice(tidx)
        tRsP = thr_r2s.partition_D(sP)
        tRsdS = thr_r2s.partition_D(sdS)
        barrier = pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DS_READY), num_threads=256)
        mma_dkv_epi = self._tiled_mmas()[1]
        if m_min < m_max:
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            pipe_kv.consumer_wait(kv_state)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            h, m_block = Int32(0), m_min
            for it in cutlass.range((m_max - m_min) * n_heads, unroll=1):
                self.swap_block(mma_s, mma_dkv, mma_dq, tSrQ, tSrdO, tSrK, tSrV, tVrdOt, tKrQt, tVrP, tKrdS,
                                tQrdS, tQrKt, tScS, acc_dVt, acc_dKt, thr_r2s, r2s, tRsP, tRsdS, barrier,
                                sLSE, sDsum, sdO, pipe_q, pipe_do, state, mdQacc, tidx, n_block, m_block, head + h,
                                batch, seqlen_q, seqlen_k, args, it != 0, it % 2)
                state.advance()
                h, m_block = self.head_step(h, m_block, m_min, m_max)
            # stored in each branch: one store after the branch kept the accumulators in local memory
            # (ptxas spilled them and serialised every wgmma, as the chunked build's tile_m 128 did)
            self.store_dkv_t(mma_dkv_epi, acc_dKt, acc_dVt, mdK, mdV, sK, sV, tidx, n_block, head_kv, batch,
                             seqlen_k, args[5])
        else:   # a key block no query sees: its dK, dV are zero
            self.store_dkv_t(mma_dkv_epi, acc_dKt, acc_dVt, mdK, mdV, sK, sV, tidx, n_block, head_kv, batch,
                             seqlen_k, args[5])

    @cute.jit
    def swap_block(self, mma_s, mma_dkv, mma_dq, tSrQ, tSrdO, tSrK, tSrV, tVrdOt, tKrQt, tVrP, tKrdS,
                   tQrdS, tQrKt, tScS, acc_dVt, acc_dKt, thr_r2s, r2s, tRsP, tRsdS, barrier,
                   sLSE, sDsum, sdO, pipe_q, pipe_do, state, mdQacc, tidx, n_block, m_block, head, batch,
                   seqlen_q, seqlen_k, args, accumulate, buf):
        idx = state.index
        acc_S = cute.make_rmem_tensor(tScS.shape, Float32)
        acc_dP = cute.make_rmem_tensor(tScS.shape, Float32)
        pipe_q.consumer_wait(state)
        warpgroup.fence()
        self.gemm(mma_s, acc_S, tSrQ[None, None, None, idx], tSrK, True)
        warpgroup.commit_group()
        pipe_do.consumer_wait(state)
        if const_expr(self.cfg.varlen and not self.stage.needs_lse):
            self.zero_do_tail(sdO, idx, m_block, seqlen_q, tidx)   # sigmoid: the next sequence's dO rows
        self.gemm(mma_s, acc_dP, tSrdO[None, None, None, idx], tSrV, True)
        warpgroup.commit_group()
        warpgroup.wait_group(1)
        rP = cute.make_rmem_tensor(tScS.shape, self.dtype)
        self.probs_s(acc_S, rP, tScS, sLSE, idx, n_block, m_block, seqlen_q, seqlen_k, args, head, batch)
        cute.copy(r2s, thr_r2s.retile(rP), tRsP[None, None, None, buf])
        warpgroup.wait_group(0)
        rdS = cute.make_rmem_tensor(tScS.shape, self.dtype)
        self.dscores_s(acc_S, acc_dP, tScS, sDsum, idx, rdS)
        cute.copy(r2s, thr_r2s.retile(rdS), tRsdS[None, None, None, buf])
        cute.arch.fence_view_async_shared()
        barrier.arrive_and_wait()   # both warpgroups' keys of P and dS are in smem
        warpgroup.fence()
        # dQ's passes first, then dV^T and dK^T: each pass's atomics run while the later GEMMs do
        cols = self.D // self.dq_passes
        acc_dQ = [cute.make_rmem_tensor(mma_dq.get_slice(tidx).partition_shape_C((self.tile_m, cols)), Float32)
                  for _ in range(self.dq_passes)]
        for p in cutlass.range_constexpr(self.dq_passes):
            self.gemm(mma_dq, acc_dQ[p], tQrdS[None, None, None, buf], tQrKt[p], True)
            warpgroup.commit_group()
        self.gemm_acc(mma_dkv, acc_dVt, tVrdOt[None, None, None, idx], tVrP[None, None, None, buf], accumulate)
        warpgroup.commit_group()
        self.gemm_acc(mma_dkv, acc_dKt, tKrQt[None, None, None, idx], tKrdS[None, None, None, buf], accumulate)
        warpgroup.commit_group()
        for p in cutlass.range_constexpr(self.dq_passes):
            warpgroup.wait_group(self.dq_passes - 1 - p + 2)
            self.atomic_tile(mma_dq, acc_dQ[p], mdQacc[None, None, head, batch], (self.tile_m, cols), m_block,
                             seqlen_q, tidx, p * cols, dq_order=True)
        warpgroup.wait_group(0)
        pipe_q.consumer_release(state)
        pipe_do.consumer_release(state)

    @cute.jit
    def probs_s(self, acc_S, rP, tScS, sLSE, idx, n_block, m_block, seqlen_q, seqlen_k, args, head, batch):
        """acc_S (raw S: rows queries, columns keys) -> the dS factor f in place, rP <- P (the
        16-bit operand type); masked (causal, keys >= S_k) -> 0.  The poly split's key groups are
        the columns' (8-column steps: uniform across the warp)."""
        s_mn, c_mn = acc_mn_view(acc_S), acc_mn_view(tScS)
        rP32 = cute.recast_tensor(rP, Int32)
        is_bf16 = self.dtype is cutlass.BFloat16
        m0, n0 = m_block * self.tile_m, n_block * self.tile_n
        coords = sc.Coords(c_mn, m0, n0, batch, head, sc.SeqlenInfo(seqlen_q, seqlen_k), None, transposed=False)
        j, k = self.cfg.score.poly_split
        static = self.cfg.score.evaluator != "poly" or j in (0, k)
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            lse = sLSE[c_mn[r, 0][0], idx] if const_expr(self.stage.needs_lse) else Float32(0.0)
            for c in cutlass.range_constexpr(0, cute.size(s_mn, mode=[1]), 2):
                w = cute.crd2idx((r, c), s_mn.layout) // 2
                if const_expr(static):
                    p, f0, f1 = self.stage.prob2(s_mn[r, c], s_mn[r, c + 1], lse, lse, args, self.stage.uses_block(0),
                                                 is_bf16, coords, (r, c))
                    rP32[w] = p
                    s_mn[r, c], s_mn[r, c + 1] = f0, f1
                else:
                    if self.stage.uses_block((n0 + c_mn[0, c][1]) // 8):
                        p, f0, f1 = self.stage.prob2(s_mn[r, c], s_mn[r, c + 1], lse, lse, args, True, is_bf16,
                                                     coords, (r, c))
                        rP32[w] = p
                        s_mn[r, c], s_mn[r, c + 1] = f0, f1
                    else:
                        p, f0, f1 = self.stage.prob2(s_mn[r, c], s_mn[r, c + 1], lse, lse, args, False, is_bf16,
                                                     coords, (r, c))
                        rP32[w] = p
                        s_mn[r, c], s_mn[r, c + 1] = f0, f1
        shift = seqlen_k - seqlen_q
        win = (self.is_causal, self.has_left, self.has_right, args[3], args[4])
        masked = self.is_causal or self.has_left or self.has_right
        need = n0 + self.tile_n > seqlen_k
        if const_expr(masked):
            need = need | mask_mod.tile_needs_mask(n0, m0, shift, self.tile_m, self.tile_n, *win)
        if need:
            for i in cutlass.range_constexpr(cute.size(acc_S) // 2):
                keep = Int32(-1)
                for e in cutlass.range_constexpr(2):
                    key = n0 + tScS[2 * i + e][1]
                    hidden = key >= seqlen_k
                    if const_expr(masked):
                        hidden = hidden | mask_mod.key_hidden(key, m0 + tScS[2 * i + e][0] + shift, *win)
                    if hidden:
                        acc_S[2 * i + e] = Float32(0.0)
                        keep = keep & (Int32(-65536) if e == 0 else Int32(0xFFFF))
                rP32[i] = rP32[i] & keep

    @cute.jit
    def dscores_s(self, acc_F, acc_dP, tScS, sDsum, idx, rdS):
        """dS (rows queries) from the dS factors acc_F and acc_dP, packed into rdS; D per row."""
        f_mn, dp_mn, c_mn = acc_mn_view(acc_F), acc_mn_view(acc_dP), acc_mn_view(tScS)
        rdS32 = cute.recast_tensor(rdS, Int32)
        is_bf16 = self.dtype is cutlass.BFloat16
        for r in cutlass.range_constexpr(cute.size(f_mn, mode=[0])):
            d = sDsum[c_mn[r, 0][0], idx] if const_expr(self.stage.needs_dsum) else Float32(0.0)
            for c in cutlass.range_constexpr(0, cute.size(f_mn, mode=[1]), 2):
                g0, g1 = self.stage.dscore2(f_mn[r, c], f_mn[r, c + 1], dp_mn[r, c], dp_mn[r, c + 1], d, d)
                rdS32[cute.crd2idx((r, c), f_mn.layout) // 2] = sc.pack_f32x2(g0, g1, is_bf16)

    @cute.jit
    def store_dkv_t(self, mma_dkv, acc_dKt, acc_dVt, mdK, mdV, sK, sV, tidx, n_block, head_kv, batch,
                    seqlen_k, dk_scale):
        """dK (times dk_scale) and dV cast, from the transposed fragments (rows: the head dim) into
        the K / V tiles by stmatrix.trans (free once every wgmma of the loop has read them), then
        16-byte row chunks to global memory (rows >= S_k skipped)."""
        if const_expr(self.cfg.varlen):   # the sequence's first key row (read again here, not kept live)
            mdK, mdV = self.varlen_dkv(mdK, mdV)
        pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DKV_STAGED), num_threads=256).arrive_and_wait()
        r2s = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype),
            mma_dkv)
        thr = r2s.get_slice(tidx)
        rK = cute.make_fragment_like(acc_dKt, self.dtype)
        rK.store((acc_dKt.load() * dk_scale).to(self.dtype))
        rV = cute.make_fragment_like(acc_dVt, self.dtype)
        rV.store(acc_dVt.load().to(self.dtype))
        cute.copy(r2s, thr.retile(rK), thr.partition_D(transpose_view(sK)))
        cute.copy(r2s, thr.retile(rV), thr.partition_D(transpose_view(sV)))
        pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DKV_STAGED), num_threads=256).arrive_and_wait()
        self.store_rows(((sK, mdK[None, None, head_kv, batch]), (sV, mdV[None, None, head_kv, batch])),
                        (self.tile_n, self.D), (0, 0), (n_block, 0), tidx, 256, seqlen_k)


class AttnBwdSm90SwapVarlen(AttnBwdSm90Swap):
    """The swapped build over packed sequences, entered as AttnBwdSm90VarlenHeadLoop is (q, k, v, dO
    as (1, total, H, D), dK / dV the dtype gradients, cu_seqlens, the CTA table and its grid)."""

    __call__ = AttnBwdSm90VarlenHeadLoop.__call__
