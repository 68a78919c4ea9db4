"""Attention backward for Hopper (sm_90a) in CuTe DSL: dQ, dK, dV from Q, K, V, O, dO (+ LSE).

One CTA per (KV block of tile_n keys, query head, batch), iterating over the query blocks
that the causal mask leaves (tile skipping); head_loop builds: one CTA per (KV block, KV
head, batch) over the query heads of its GQA group (below).  384 threads: warp 0 issues TMA (K, V once,
on one barrier; Q+LSE and dO+D per query block, 2-stage pipelines); two MMA warpgroups each
own 64 of the tile_n key rows and compute, per query block,

    S^T  = K Q^T          (wgmma SS)      P^T = stage.prob(S^T)       in registers
    dP^T = V dO^T         (wgmma SS)      dS^T = stage.dscore(P, dP)  in registers
    dV  += P^T dO         (wgmma RS: P^T straight from the accumulator registers)
    dK  += dS^T Q         (wgmma RS)
    dQ   = dS K           (wgmma SS: dS^T goes to smem by stmatrix.trans) -> FP32 atomics

in the order S, dP, P, dV, dS, then dQ before dK where dQ goes through smem (dq_async: the
dQ tile is staged for warp 1's bulk reductions while dK runs; the red.global path runs dK,
then dQ); at D <= 128, D (and, with dq_async, LSE) are read into registers while the S and
dV products run (docs/NOTES_attn_bwd.md, "Main loop v2").

Computing the transposed scores puts the key index on the wgmma M axis, so P^T and dS^T
are already A operands of the dV/dK products (no smem round trip for P).  dK, dV are
accumulated over all query blocks in registers and added with FP32 atomics into
(B, S_k, H_kv, D) buffers, which reduces the GQA query heads of a KV head; dQ likewise
into (B, H_q, S_pad, D), a query block's rows contiguous, each 16-row band in the wgmma
fragment's order (kernels/prepost_launch.py, "The dQ accumulator").  The post kernel scales by softmax_scale,
casts and (dQ) reorders (attn_bwd_prepost.py).

Constraints: D in {64, 128, 256}; BF16/FP16; any S_q, S_k (TMA zero-fills tails; LSE padded
with +inf so out-of-range query rows have P = 0; keys past S_k are masked: mask_key_tail);
causal is bottom-right aligned.

dQ split.  dQ = dS K is tile_m x Dc per CTA (64 query rows): the two MMA warpgroups take
Dc / 2 columns each, reading all of dS and half of K^T; K^T is dQ's MN-major B operand, so a
half must be whole swizzle atoms: at D = 64 (32 columns) K and V use the 64-byte swizzle
instead of the 128-byte one (64 columns).  (A 128-row tile splitting dQ along M spilled at
D = 64 and was slower: docs/NOTES_attn_bwd.md, "D = 64 tile".)

Head dim 256.  dK and dV of a warpgroup's 64 key rows would take 2 x 64 x 256 / 128 = 256
FP32 registers per thread, above the 240 a consumer thread gets.  So each CTA owns one
128-column chunk c of the gradients (grid z = batch x 2 chunks): it computes S^T and dP^T
over the full D (Q, dO, K, V tiles are loaded whole), and runs the dV, dK, dQ products on
columns [128 c, 128 c + 128) of dO, Q and K^T, adding into the same columns of the FP32
accumulators.  The cost is recomputing S and dP once more per key block (7 GEMMs of
tile x 128 columns instead of 5 x 2 at D = 256, i.e. 1.4x the minimum), and one Q/dO stage
(full-D Q, dO, K, V and dS take 225 KB of the 227 KB of shared memory).

head_loop build (BwdConfig.head_loop, AttnBwdSm90HeadLoop).  The grid runs over KV heads: a
CTA owns (key block, KV head, batch) and runs the query blocks of its G = H_q / H_kv query
heads one after another in one flat (head, query block) loop (producer, MMA and dQ-reduce
warps alike), so dK and dV stay in registers across the whole group and are stored once,
times softmax_scale for dK and cast, with plain 32-bit stores: no FP32 dK/dV accumulators,
no zeroing or post pass for them, no atomics.  The grid is G times smaller; with LPT order
the causal staircase still packs (docs/NOTES_attn_bwd.md, "head_loop").

dQ/dK/dV reductions (the FP32 atomics, the staged dQ with bulk reductions of dq_async, and
the deterministic build's turn protocol) live in kernels/bwd_reduce.py, mixed in here.
"""

import functools
import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.memory import SmemAllocator
from cutlass import Float32, Float64, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import compile_cache, mask as mask_mod, scores
from .barriers import BwdBarrier
from .bwd_reduce import BwdReductions, acc_mn_view, dq_rank  # noqa: F401
from .config import BwdConfig, check_bwd
from .prepost_launch import VARLEN_PAD
from .scores import common as sc
from .tile_scheduler import BWD_TABLE_WORDS, COMPACT_MAX_SEQS, COMPACT_SEQ_BITS, SectionLptScheduler, section_heads

NUM_THREADS = 384          # 1 producer warpgroup + 2 MMA warpgroups
PRODUCER_REGS = 24         # producer only issues TMA
MMA_REGS = 240             # 2*240 + 24 <= 504 (65536 regs / 128 threads per warpgroup)


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """Swap the first two modes of a (possibly swizzled, staged) smem tensor."""
    modes = [1, 0] + list(range(2, cute.rank(t.layout)))
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


SMEM_CAPACITY = 232448   # bytes of dynamic shared memory per CTA on sm_90a (227 KB)


class AttnBwdSm90(BwdReductions):
    def __init__(self, cfg: BwdConfig):
        check_bwd(cfg)
        self.cfg = cfg
        head_dim, dq_async = cfg.head_dim, cfg.dq_async
        # per query block (docs/NOTES_attn_bwd.md, "Main loop v2"): LSE / D read into
        # registers while the S / dV GEMMs run, and (dq_async) dQ issued before dK so the dQ
        # tile is staged to smem while dK runs.  Register limits (CPU SASS): D = 256 keeps smem
        # reads (hoisted: 2 -> 4 spilled words); the red.global dQ path keeps LSE in smem
        # (softcap/poly 1/2 spills 2 words with it hoisted).
        self.hoist_dsum = head_dim <= 128
        self.hoist_lse = self.hoist_dsum and dq_async
        # tile_m 128 (D = 64, softmax): dV is issued after the dS math, and packed P^T and dS^T
        # are written pair by pair in that math (dscores_pack) from acc_S (which holds P: the
        # softmax dS factor) and acc_dP, so the FP32 tiles die as the packed operands grow.
        # Otherwise packed P^T (32 words) is live across the dS math and ptxas serialises every
        # wgmma (C7512, register resources) or spills (docs/NOTES_attn_bwd.md, "D = 64 tile").
        # At tile_m 64 (D = 128) this order measured no faster (docs/MEASURED.md, bwd-dv-late).
        self.p_late = cfg.tile_m == 128 and cfg.score.kind == "softmax"
        # tile_m 128, the other scores (their dS factor f is not P): probs packs f to FP16 pairs
        # (f_packed, 32 words) instead of keeping it in acc_S (64 FP32), which is then dead
        # before the dP wait; dscores_packed unpacks a pair, forms dS and packs it.  f lies in
        # [0, 1] (softcap: P (1 - t^2); sigmoid: p (1 - p)), so FP16 keeps 11 bits of it: below
        # the BF16 rounding of dS, equal to an FP16 one (tests/test_correctness_cpu.py emulates both).
        self.f_packed = cfg.tile_m == 128 and not self.p_late
        self.dq_early = dq_async
        # ordered (bitwise reproducible) dQ/dK/dV adds; kernels/bwd_reduce.py, "Deterministic mode"
        self.deterministic = cfg.deterministic
        # dQ tile -> smem -> warp 1's bulk reductions, instead of red.global from the MMA
        # threads (module docstring, "dQ reduction"); deterministic builds keep their turns
        self.dq_async = dq_async
        # CTA order (kernels/tile_scheduler.py): key blocks of L2-sized head sections, longest
        # (lowest n) first, heads fastest; the deterministic build keeps its launch order
        self.lpt = cfg.lpt
        # head_loop: one CTA per (key block, KV head) runs the query blocks of all G query heads
        # of the GQA group in turn, keeping dK/dV in registers throughout, and stores them
        # scaled and cast (no FP32 dK/dV accumulators, atomics or post pass): module docstring
        self.head_loop = cfg.head_loop
        self.kv_sections = cfg.kv_sections
        # where head_loop builds store dK / dV: in each branch of `if m_min < m_max` (the loop's
        # and the zeros'), or once after it.  At tile_m 128 the merged store made ptxas keep the
        # dK / dV accumulators in local memory (160 STL, every wgmma serialised; per branch: none);
        # at tile_m 64 both build spill-free and the merged store is ~250 instructions shorter.
        self.store_in_branch = cfg.tile_m == 128
        self.dtype = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}[cfg.dtype]
        self.D = head_dim
        self.is_causal = cfg.causal
        # sliding window: (has left bound, has right bound) compiled in, sizes are args[3:5]
        self.has_left, self.has_right = cfg.window_left, cfg.window_right and not cfg.causal
        self.stage = scores.device(cfg.score)
        # the two MMA warpgroups' P blocks in turns: one's MUFU work runs under the other's dS math and
        # GEMMs instead of both sharing MUFU while only dP^T is in flight (warpgroup 0 first; P_TURN + w
        # opens warpgroup w's turn: its 128 threads wait, the other's 128 arrive)
        self.p_turns = cfg.p_turns
        # dq_defer: warpgroup w's dQ of step j is issued in step j + 1, after its dK, so nothing makes
        # the two warpgroups meet at the end of a step (the DS_READY barrier): the whole dS tile that
        # dQ reads is behind sdS buffer b's mbarriers, DS_FULL[b] (both warpgroups' STSM done) and
        # DS_FREE[b] (both warpgroups' dQ that read it done), 256 thread arrivals each, phase
        # parity from the step count (step j uses buffer j % 2: phase j // 2)
        self.dq_defer = cfg.dq_defer
        # a sigmoid program's packed P is written to the dV operand: BF16 programs need BF16
        # inputs (its poly backward is the surrogate's coupled block: check_bwd)
        if cfg.score.kind == "sigmoid":
            self.stage.check_dtype(self.dtype is cutlass.BFloat16)
        self._aux = None   # a user score function's aux tensors (set while the kernel is traced)
        self._varlen = None   # a varlen build's (cu_seqlens_q, cu_seqlens_k, CTA table, grid) (set while traced)
        self.tile_m, self.tile_n, self.stages = cfg.tile_m, cfg.tile_n, cfg.stages
        # D = 256: each CTA accumulates one 128-wide column chunk of dQ/dK/dV (grid z =
        # batch x chunk) and recomputes S and dP over the full D ("Head dim 256" in the
        # module docstring); D <= 128: one chunk, the whole head.
        self.Dc = min(head_dim, 128)
        self.n_chunks = head_dim // self.Dc
        # dQ = dS K (tile_m x Dc): the two warpgroups split its columns (module docstring,
        # "dQ split").  K and V smem swizzle: dQ's B operand is K^T (MN-major), so a
        # warpgroup's Dc / 2 columns must be whole swizzle atoms: 64 16-bit columns for the
        # 128-byte swizzle, 32 (D = 64) for the 64-byte one
        # tile_m 128 (D = 64): the warpgroups split dQ's rows instead, 64 query rows x Dc each,
        # each reading only its own rows of dS (8 instead of 16 HGMMA, K in the 128-byte swizzle)
        self.dq_split_m = cfg.tile_m == 128
        self.kv_atom = (warpgroup.SmemLayoutAtomKind.K_SW64 if self.Dc // 2 < 64 and not self.dq_split_m
                        else warpgroup.SmemLayoutAtomKind.K_SW128)

    # ---------------------------------------------------------------- host side
    def _smem_layout(self, rows: int, stages: int | None, kind=warpgroup.SmemLayoutAtomKind.K_SW128):
        atom = warpgroup.make_smem_layout_atom(kind, self.dtype)
        shape = (rows, self.D) if stages is None else (rows, self.D, stages)
        return cute.tile_to_shape(atom, shape, (0, 1, 2) if stages else (0, 1))

    def _tiled_mmas(self):
        K, MN = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        dt = self.dtype
        wgs = (2, 1, 1)   # the MMA warpgroups stacked along the key rows of S^T, dP^T, dV, dK
        mma_sdp = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, wgs, (64, self.tile_m))
        mma_dkv = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, wgs, (64, self.Dc),
                                                    warpgroup.OperandSource.RMEM)
        if const_expr(self.dq_split_m):
            mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (2, 1, 1), (64, self.Dc))
        else:
            mma_dq = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (1, 2, 1), (64, self.Dc // 2))
        return mma_sdp, mma_dkv, mma_dq

    def _smem_layouts(self):
        """(sQ/sdO staged, sK/sV, sdS double-buffered): all K-major, 128B swizzle (sK/sV: kv_atom's)."""
        sds_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, self.dtype)
        sdS = cute.tile_to_shape(sds_atom, (self.tile_m, self.tile_n, 2), (0, 1, 2))
        return self._smem_layout(self.tile_m, self.stages), self._smem_layout(self.tile_n, None, self.kv_atom), sdS

    def _storage(self):
        dt, st, dq_defer = self.dtype, self.stages, self.dq_defer
        self.sQ_layout, self.sK_layout, self.sdS_layout = self._smem_layouts()

        @cute.struct
        class Storage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, st * 2]
            mbar_do: cute.struct.MemRange[cutlass.Int64, st * 2]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2]
            if dq_defer:   # DS_FULL[0], DS_FULL[1], DS_FREE[0], DS_FREE[1]
                mbar_ds: cute.struct.MemRange[cutlass.Int64, 4]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, self.tile_m * st], 128]
            sDsum: cute.struct.Align[cute.struct.MemRange[Float32, self.tile_m * st], 128]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sK_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(self.sdS_layout)], 1024]

        @cute.struct
        class StorageAux:
            base: Storage
            aux: cute.struct.Align[cute.struct.MemRange[Float32, max(1, self._aux_words())], 128]
        out = StorageAux if self._aux_words() else Storage
        if out.size_in_bytes() > SMEM_CAPACITY:   # fail at build, naming the config, not at launch
            raise ValueError(f"{type(self).__name__}: tile {self.tile_m}x{self.tile_n}, {st} Q/dO stages at "
                             f"D = {self.D} needs {out.size_in_bytes()} bytes of shared memory, more than "
                             f"the {SMEM_CAPACITY} of sm_90a")
        return out

    def _aux_words(self) -> int:
        """FP32 words of shared memory after the base storage (0: none): the staged dQ tile
        of dq_async (tile_m rows of Dc words, the accumulator's layout)."""
        return self.tile_m * self.Dc if self.dq_async else 0

    @staticmethod
    def _seq_major(t: cute.Tensor, order) -> cute.Tensor:
        return cute.make_tensor(t.iterator, cute.select(t.layout, mode=order))

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mDsum: cute.Tensor, mdQacc: cute.Tensor, mdKacc: cute.Tensor,
                 mdVacc: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                 win_left: Int32, win_right: Int32, stream):
        self._launch(mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc, (scale, softcap, bias),
                     win_left, win_right, (), stream)

    def _launch(self, mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc, scalars,
                win_left, win_right, extra, stream, aux=None, varlen=None):
        """Host-side body of __call__ (traced inside it); extra: kernel args after the window.
        scalars: the call's (softmax scale, softcap, sigmoid bias) in FP64; the score function
        encodes its three FP32 kernel arguments from them here (scores/*.bwd_scalars).
        varlen: (cu_seqlens_q, cu_seqlens_k, CTA table, CTAs) of a packed batch (AttnBwdSm90Varlen)."""
        scalars = tuple(Float32(a) for a in self.stage.bwd_scalars(*scalars))
        # (B, S, H, D) -> (S, D, H, B); the dQ accumulator (B, H, S_pad, D) -> (S_pad, D, H, B)
        # (kernels/prepost_launch.py, "The dQ accumulator"); stats (B, H, S_pad) -> (S_pad, H, B)
        mQ, mK, mV, mdO, mdKacc, mdVacc = [
            self._seq_major(t, [1, 3, 2, 0]) for t in (mQ, mK, mV, mdO, mdKacc, mdVacc)]
        mdQacc = self._seq_major(mdQacc, [2, 3, 1, 0])
        mLSE, mDsum = [self._seq_major(t, [2, 1, 0]) for t in (mLSE, mDsum)]
        mma_sdp, mma_dkv, mma_dq = self._tiled_mmas()
        Storage = self._storage()
        sQ1 = cute.select(self.sQ_layout, mode=[0, 1])
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, mQ, sQ1, (self.tile_m, self.D))
        tma_do, tdO = cpasync.make_tiled_tma_atom(g2s, mdO, sQ1, (self.tile_m, self.D))
        tma_k, tK = cpasync.make_tiled_tma_atom(g2s, mK, self.sK_layout, (self.tile_n, self.D))
        tma_v, tV = cpasync.make_tiled_tma_atom(g2s, mV, self.sK_layout, (self.tile_n, self.D))
        stat_layout = cute.make_layout((self.tile_m,))
        tma_lse, tLSE = cpasync.make_tiled_tma_atom(g2s, mLSE, stat_layout, (self.tile_m,))
        tma_dsum, tDsum = cpasync.make_tiled_tma_atom(g2s, mDsum, stat_layout, (self.tile_m,))
        elt = self.dtype.width // 8
        self.bytes_q = self.tile_m * self.D * elt
        self.bytes_kv = 2 * self.tile_n * self.D * elt
        self.bytes_stat = self.tile_m * 4
        n_blocks = cute.ceil_div(cute.size(mK.shape[0]), self.tile_n)
        grid_heads = cute.size((mK if const_expr(self.head_loop) else mQ).shape[2])
        grid = (n_blocks, grid_heads, cute.size(mQ.shape[3]) * self.n_chunks)
        if const_expr(varlen is not None):   # a CTA per entry of the live (key block, head, sequence) table
            grid = (varlen[3], 1, self.n_chunks)
        if const_expr(self.lpt):
            grid = SectionLptScheduler.grid(n_blocks, grid_heads, cute.size(mQ.shape[3]) * self.n_chunks)
        self.kernel(tQ, tK, tV, tdO, tLSE, tDsum, mdQacc, mdKacc, mdVacc,
                    tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum,
                    mma_sdp, mma_dkv, mma_dq, scalars + self._window_param(win_left, win_right) + extra,
                    Storage, aux, varlen).launch(
            grid=grid, block=[NUM_THREADS, 1, 1], stream=stream, min_blocks_per_mp=1)

    def _window_param(self, win_left, win_right):
        """Window sizes reach the kernel only in windowed builds (unused kernel parameters
        still shift the parameter block and change the unwindowed SASS)."""
        if self.has_left or self.has_right:
            return (win_left, win_right)
        return (0, 0)

    # ---------------------------------------------------------------- device side
    @cute.jit
    def m_block_range(self, n_block, seqlen_q, seqlen_k, args):
        """Query blocks that see key block n_block (causal: rows m with m + S_k - S_q >= n0;
        sliding window: kernels/mask.py)."""
        return mask_mod.query_block_range(n_block, seqlen_q, seqlen_k, self.tile_m, self.tile_n,
                                          self.is_causal, self.has_left, self.has_right, args[3], args[4])

    @cute.kernel
    def kernel(self, mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc,
               tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum,
               mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq: cute.TiledMma,
               args, Storage: cutlass.Constexpr, aux, varlen):
        self._aux = aux
        self._varlen = varlen   # (cu_seqlens_q, cu_seqlens_k, CTA table, CTAs) or None
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if const_expr(self.lpt and self.head_loop):
            # a CTA per KV head runs G times longer: one section (plain longest-first over all
            # KV heads), since L2-sized sections of 2 KV heads started long CTAs late
            # (docs/MEASURED.md)
            h_kv = mK.shape[2]
            group = h_kv
            if const_expr(self.kv_sections):
                # sections of KV heads whose G query heads' Q, dO (16-bit) and FP32 dQ
                # accumulator fit L2 (each longest first, heads fastest): the CTAs running at
                # once share fewer query heads' rows, so more of them read each row from L2
                group = section_heads(h_kv, mQ.shape[0] * (mQ.shape[2] // h_kv), self.D * 8, 1)
            n_block, head, batch = SectionLptScheduler(reverse=False).work_tile(
                cute.ceil_div(mK.shape[0], self.tile_n), h_kv, group)
        elif const_expr(self.lpt):
            # section working set per query head: Q, dO (16-bit) and the FP32 dQ accumulator
            h_q = mQ.shape[2]
            n_block, head, batch = SectionLptScheduler(reverse=False).work_tile(
                cute.ceil_div(mK.shape[0], self.tile_n), h_q, section_heads(h_q, mQ.shape[0], self.D * 8, 1))
        else:
            n_block, head, batch = cute.arch.block_idx()
        chunk = 0
        if const_expr(self.n_chunks > 1):
            chunk = cute.arch.make_warp_uniform(batch % self.n_chunks)
            batch = batch // self.n_chunks
        if const_expr(varlen is not None):   # blockIdx.x is an entry of the CTA table; batch: the sequence
            n_block, head, batch = self.varlen_tile(varlen[2], n_block)
        if const_expr(self.deterministic):
            # key blocks launch from the last one down: every turn wait targets an earlier CTA
            n_block = cute.ceil_div(mK.shape[0], self.tile_n) - 1 - n_block
        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum):
                cpasync.prefetch_descriptor(atom)
        smem = SmemAllocator()
        st = smem.allocate(Storage)
        aux_addr = Int32(0)   # the aux buffer (_aux_words): the staged dQ tile; args[-1] of mma
        if const_expr(self._aux_words() > 0):
            aux_addr = st.aux.data_ptr().toint()
            st = st.base
        mbar_ds = None
        if const_expr(self.dq_defer):
            mbar_ds = st.mbar_ds.data_ptr()
            if tidx == 0:   # made visible by pipe_kv's init fence and CTA sync (_make_pipelines)
                for b in cutlass.range_constexpr(4):
                    cute.arch.mbarrier_init(mbar_ds + b, 256)
        pipe_q, pipe_do, pipe_kv = self._make_pipelines(st)
        # layouts are rebuilt here: values made on the host side cannot enter the kernel region
        sQ_l, sK_l, sdS_l = self._smem_layouts()
        sQ = st.sQ.get_tensor(sQ_l.outer, swizzle=sQ_l.inner)
        sdO = st.sdO.get_tensor(sQ_l.outer, swizzle=sQ_l.inner)
        sK = st.sK.get_tensor(sK_l.outer, swizzle=sK_l.inner)
        sV = st.sV.get_tensor(sK_l.outer, swizzle=sK_l.inner)
        sdS = st.sdS.get_tensor(sdS_l.outer, swizzle=sdS_l.inner)
        stat_l = cute.make_layout((self.tile_m, self.stages))
        sLSE = st.sLSE.get_tensor(stat_l)
        sDsum = st.sDsum.get_tensor(stat_l)

        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        if const_expr(varlen is not None):
            # packed sequences (AttnBwdSm90Varlen): the grid's batch index is the sequence
            mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc, seqlen_q, seqlen_k = self.varlen_views(
                varlen, batch, mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc)
            batch = Int32(0)   # the packed tensors' only batch entry (check_bwd: no user score reads it)
            args = self.stage.seq_params(args, seqlen_k, backward=True)   # sigmoid's -ln S_k (spec.seq_bias)
        n_heads = 1   # query heads this CTA runs: head, head + 1, ... (head_loop: the GQA group)
        if const_expr(self.head_loop):
            n_heads = mQ.shape[2] // mK.shape[2]
            head_kv = head
            head = head_kv * n_heads
        else:
            head_kv = head // (mQ.shape[2] // mK.shape[2])
        if const_expr(self.deterministic):
            # args[6]: rank of this query head in its GQA group, from the division above
            # (recomputing it from other shape values costs a second integer division)
            args = args + (head - head_kv * (mQ.shape[2] // mK.shape[2]),)
        m_min, m_max = self.m_block_range(n_block, seqlen_q, seqlen_k, args)
        if const_expr(varlen is not None):
            if n_block * self.tile_n >= seqlen_k:   # past the sequence's keys (the grid is the longest's)
                m_max = m_min
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp_idx == 0:
                self.load(mQ, mK, mV, mdO, mLSE, mDsum, sQ, sK, sV, sdO, sLSE, sDsum,
                          tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum, pipe_q, pipe_do, pipe_kv,
                          n_block, head, head_kv, batch, m_min, m_max)
            if const_expr(self.dq_async):
                if warp_idx == 1:
                    self.reduce_dq(mdQacc, aux_addr, tidx % 32, head, batch, m_min, m_max, n_heads)
        else:
            cute.arch.setmaxregister_increase(MMA_REGS)
            self.mma(mma_sdp, mma_dkv, mma_dq, sQ, sK, sV, sdO, sdS, sLSE, sDsum,
                     pipe_q, pipe_do, pipe_kv, mdQacc, mdKacc, mdVacc, tidx - 128,
                     n_block, head, head_kv, batch, chunk, m_min, m_max, seqlen_q, seqlen_k,
                     args + (aux_addr,), mbar_ds)

    def _make_pipelines(self, st):
        """(Q, dO, K / V) TMA pipelines on st's mbarriers (traced inside the kernel): Q + LSE and dO
        + D in self.stages stages, K and V once; the producer thread fills, the 8 MMA warps arrive."""
        prod = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        cons = pipeline.CooperativeGroup(pipeline.Agent.Thread, 8)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_q.data_ptr(), num_stages=self.stages, producer_group=prod,
            consumer_group=cons, tx_count=self.bytes_q + self.bytes_stat, defer_sync=True)
        pipe_do = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_do.data_ptr(), num_stages=self.stages, producer_group=prod,
            consumer_group=cons, tx_count=self.bytes_q + self.bytes_stat, defer_sync=True)
        pipe_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_kv.data_ptr(), num_stages=1, producer_group=prod,
            consumer_group=cons, tx_count=self.bytes_kv, defer_sync=False)
        return pipe_q, pipe_do, pipe_kv

    @cute.jit
    def varlen_views(self, varlen, seq, mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc):
        """Sequence `seq` of a packed batch: q, dO (and their TMA coordinates) from row cu_q[seq],
        k, v from row cu_k[seq], LSE / dsum and the dQ accumulator from the padded offset
        (kernels/prepost_launch.py, "Packed sequences"), and the sequence's lengths.  The dK / dV
        accumulators are offset at the epilogue (varlen_dkv): a 64-bit pointer made here stays
        live through the main loop and spilled (D = 64: 12 -> 35 words).
        Query blocks past the sequence's end load the next sequence's Q / dO rows with the +inf
        / 0 padding statistics (P = 0: zero dQ adds, into the sequence's padding rows); the last key block's
        keys past S_k are masked as in the dense build (causal mask or mask_key_tail)."""
        cu_q, cu_k = varlen[0], varlen[1]
        off_q, off_k = cu_q[seq], cu_k[seq]
        seqlen_q, seqlen_k = cu_q[seq + 1] - off_q, cu_k[seq + 1] - off_k
        off_pad = (off_q + seq * VARLEN_PAD) // VARLEN_PAD * VARLEN_PAD   # prepost_launch.varlen_padded_offset
        mQ, mdO = (cute.domain_offset((off_q, 0, 0, 0), t) for t in (mQ, mdO))
        mdQacc = cute.domain_offset((off_pad, 0, 0, 0), mdQacc)
        mK, mV = (cute.domain_offset((off_k, 0, 0, 0), t) for t in (mK, mV))
        mLSE, mDsum = (cute.domain_offset((off_pad, 0, 0), t) for t in (mLSE, mDsum))
        return mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc, seqlen_q, seqlen_k

    @cute.jit
    def varlen_tile(self, table, j):
        """(key block, head, sequence) of CTA table entry j (kernels/tile_scheduler.py,
        varlen_bwd_table; the query head, the KV head in head_loop builds); an entry past the table's count (the grid is a host bound) gets a key
        block past every sequence's end (1 << 20 blocks: m_block_range then finds no query block)
        of sequence 0, so the CTA runs no block."""
        n_block, head, seq = Int32(1 << 20), Int32(0), Int32(0)
        if j < table[0]:
            w0 = table[1 + BWD_TABLE_WORDS * j]
            n_block = w0 >> COMPACT_SEQ_BITS
            seq = w0 & (COMPACT_MAX_SEQS - 1)
            head = table[2 + BWD_TABLE_WORDS * j]
        return (cute.arch.make_warp_uniform(n_block), cute.arch.make_warp_uniform(head),
                cute.arch.make_warp_uniform(seq))

    @cute.jit
    def varlen_dkv(self, mdKacc, mdVacc):
        """The dK / dV accumulators from this CTA's sequence's first key row (varlen builds, at
        the epilogue: the sequence index and its offset are read again, not kept in registers)."""
        seq = self._varlen[2][1 + BWD_TABLE_WORDS * cute.arch.block_idx()[0]] & (COMPACT_MAX_SEQS - 1)
        off_k = self._varlen[1][seq]
        return tuple(cute.domain_offset((off_k, 0, 0, 0), t) for t in (mdKacc, mdVacc))

    @cute.jit
    def _tma_tiles(self, atom, mX, sX, tile, coord):
        """TMA-partition global tiles of mX (indexed by coord) against the staged smem sX."""
        gX = cute.local_tile(mX, tile, coord)
        rank = len(tile)
        return cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                     cute.group_modes(sX, 0, rank), cute.group_modes(gX, 0, rank))

    @cute.jit
    def load(self, mQ, mK, mV, mdO, mLSE, mDsum, sQ, sK, sV, sdO, sLSE, sDsum,
             tma_q, tma_k, tma_v, tma_do, tma_lse, tma_dsum, pipe_q, pipe_do, pipe_kv,
             n_block, head, head_kv, batch, m_min, m_max):
        """Producer warp: K, V once, then Q + LSE and dO + D per query block (head_loop: of
        query heads head .. head + G - 1 in turn, the MMA warpgroups' order)."""
        qd = (self.tile_m, self.D)
        tKs, tKg = self._tma_tiles(tma_k, mK[None, None, head_kv, batch], sK, (self.tile_n, self.D), (n_block, 0))
        tVs, tVg = self._tma_tiles(tma_v, mV[None, None, head_kv, batch], sV, (self.tile_n, self.D), (n_block, 0))
        if const_expr(not self.head_loop):
            tQs, tQg = self._tma_tiles(tma_q, mQ[None, None, head, batch], sQ, qd, (None, 0))
            tOs, tOg = self._tma_tiles(tma_do, mdO[None, None, head, batch], sdO, qd, (None, 0))
            tLs, tLg = self._tma_tiles(tma_lse, mLSE[None, head, batch], sLSE, (self.tile_m,), (None,))
            tDs, tDg = self._tma_tiles(tma_dsum, mDsum[None, head, batch], sDsum, (self.tile_m,), (None,))
        if m_min < m_max:
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            pipe_kv.producer_acquire(kv_state)
            bar = pipe_kv.producer_get_barrier(kv_state)
            cute.copy(tma_k, tKg, tKs, tma_bar_ptr=bar)
            cute.copy(tma_v, tVg, tVs, tma_bar_ptr=bar)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            if const_expr(self.head_loop):
                nm = m_max - m_min
                # one flat loop over (head, query block): a pipeline state advanced inside a
                # nested loop (or a callee) is not carried across the outer loop (GPU: launch
                # failure)
                h, m_block = Int32(0), m_min
                for it in cutlass.range(nm * (mQ.shape[2] // mK.shape[2]), unroll=1):
                    self.load_block(mQ, mdO, mLSE, mDsum, sQ, sdO, sLSE, sDsum, tma_q, tma_do, tma_lse, tma_dsum,
                                    pipe_q, pipe_do, state, head + h, batch, m_block)
                    state.advance()
                    h, m_block = self.head_step(h, m_block, m_min, m_max)
            else:
                for m_block in cutlass.range(m_min, m_max, unroll=1):
                    self.load_q_do(pipe_q, pipe_do, state, m_block, (tma_q, tQg, tQs, tma_lse, tLg, tLs),
                                   (tma_do, tOg, tOs, tma_dsum, tDg, tDs))
                    state.advance()

    @cute.jit
    def head_step(self, h, m_block, m_min, m_max):
        """head_loop: the (query head offset, query block) after (h, m_block); every role
        (producer, MMA warpgroups, dQ writer) walks the same order from (0, m_min): heads in
        turn, each head's blocks ascending.  Carried through the flat loop rather than divided
        out of its counter: a runtime division per step put ~25 integer instructions (and a
        MUFU.RCP) on the MMA warps' path."""
        m_next, h_next = m_block + 1, h
        if m_next == m_max:
            m_next, h_next = m_min, h + 1
        return h_next, m_next

    @cute.jit
    def load_block(self, mQ, mdO, mLSE, mDsum, sQ, sdO, sLSE, sDsum, tma_q, tma_do, tma_lse, tma_dsum,
                   pipe_q, pipe_do, state, head, batch, m_block):
        """head_loop producer step: Q + LSE and dO + D of query head `head`, query block
        m_block, into stage state.index (the caller advances the state)."""
        qd = (self.tile_m, self.D)
        tQs, tQg = self._tma_tiles(tma_q, mQ[None, None, head, batch], sQ, qd, (None, 0))
        tOs, tOg = self._tma_tiles(tma_do, mdO[None, None, head, batch], sdO, qd, (None, 0))
        tLs, tLg = self._tma_tiles(tma_lse, mLSE[None, head, batch], sLSE, (self.tile_m,), (None,))
        tDs, tDg = self._tma_tiles(tma_dsum, mDsum[None, head, batch], sDsum, (self.tile_m,), (None,))
        self.load_q_do(pipe_q, pipe_do, state, m_block, (tma_q, tQg, tQs, tma_lse, tLg, tLs),
                       (tma_do, tOg, tOs, tma_dsum, tDg, tDs))

    @cute.jit
    def load_q_do(self, pipe_q, pipe_do, state, m_block, q, do):
        """Query block m_block's two loads into stage state.index: q = (tma_q, Q tiles (global,
        smem), tma_lse, LSE tiles), do the same for dO and D.  dO first under dp_first: its
        consumer frees dO before Q (one_m_block)."""
        first, second = (pipe_do, do), (pipe_q, q)
        if const_expr(not self.cfg.dp_first):
            first, second = second, first
        for pipe, (tma_x, tXg, tXs, tma_s, tSg, tSs) in (first, second):
            pipe.producer_acquire(state)
            bar = pipe.producer_get_barrier(state)
            cute.copy(tma_x, tXg[None, m_block], tXs[None, state.index], tma_bar_ptr=bar)
            cute.copy(tma_s, tSg[None, m_block], tSs[None, state.index], tma_bar_ptr=bar)

    @cute.jit
    def gemm(self, tiled_mma, acc, tA, tB, zero_init):
        """acc (+)= A B over all k blocks; one wgmma per k block (async, caller commits)."""
        for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            tiled_mma.set(warpgroup.Field.ACCUMULATE, (not zero_init) or k != 0)
            cute.gemm(tiled_mma, acc, tA[None, None, k], tB[None, None, k], acc)

    @cute.jit
    def gemm_acc(self, tiled_mma, acc, tA, tB, accumulate):
        for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            if const_expr(k == 0):
                tiled_mma.set(warpgroup.Field.ACCUMULATE, accumulate)
            else:
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            cute.gemm(tiled_mma, acc, tA[None, None, k], tB[None, None, k], acc)

    @cute.jit
    def mma(self, mma_sdp, mma_dkv, mma_dq, sQ, sK, sV, sdO, sdS, sLSE, sDsum,
            pipe_q, pipe_do, pipe_kv, mdQacc, mdKacc, mdVacc, tidx,
            n_block, head, head_kv, batch, chunk, m_min, m_max, seqlen_q, seqlen_k, args, mbar_ds=None):
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_layout = cute.make_layout(2, stride=128)
        wg_sdp = mma_sdp.get_slice(wg_layout(wg))
        wg_dkv = mma_dkv.get_slice(wg_layout(wg))
        wg_dq = mma_dq.get_slice(wg_layout(wg))
        thr_sdp = mma_sdp.get_slice(tidx)
        # S^T = K Q^T and dP^T = V dO^T: A = K/V rows of this warpgroup, B = Q/dO (K-major)
        tSrK = mma_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        tSrV = mma_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        tSrQ = mma_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tSrdO = mma_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        # dV += P^T dO, dK += dS^T Q: B = dO^T / Q^T (MN-major views of the same smem),
        # restricted to this CTA's column chunk
        tVrdOt = mma_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(self.d_chunk(sdO, chunk))))
        tKrQt = mma_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(self.d_chunk(sQ, chunk))))
        # dQ = dS K: A = dS (smem, K-major), B = K^T
        tQrdS = mma_dq.make_fragment_A(wg_dq.partition_A(sdS))
        tQrKt = mma_dq.make_fragment_B(wg_dq.partition_B(transpose_view(self.d_chunk(sK, chunk))))

        shape_s = (self.tile_n, self.tile_m)
        acc_dV = cute.make_rmem_tensor(mma_dkv.get_slice(tidx).partition_shape_C((self.tile_n, self.Dc)), Float32)
        acc_dK = cute.make_rmem_tensor(mma_dkv.get_slice(tidx).partition_shape_C((self.tile_n, self.Dc)), Float32)
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)
        # registers of P^T / dS^T as RS-wgmma A operands: same flat order as the C fragment
        shape_a = mma_dkv.get_slice(tidx).partition_shape_A((self.tile_n, self.tile_m))
        tScS = thr_sdp.partition_C(cute.make_identity_tensor(shape_s))
        # stmatrix.trans writes the (n, m) register tile into the m-major... n-contiguous sdS
        r2s = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype),
            mma_sdp)
        thr_r2s = r2s.get_slice(tidx)
        tRSsdS = thr_r2s.partition_D(transpose_view(sdS))
        pds_barrier = pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DS_READY), num_threads=256)

        # the loop sets ACCUMULATE on mma_dkv; partition the epilogue with an untouched copy
        mma_dkv_epi = self._tiled_mmas()[1]
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if m_min < m_max:
            pipe_kv.consumer_wait(kv_state)
            if const_expr(self.p_turns):
                if wg == 1:   # warpgroup 0 takes the first turn
                    cute.arch.barrier_arrive(barrier_id=int(BwdBarrier.P_TURN), number_of_threads=256)
            if const_expr(self.head_loop):
                nm = m_max - m_min
                # one flat loop over (head, query block), as the producer's (load)
                h, m_block = Int32(0), m_min
                for it in cutlass.range(nm * (mdQacc.shape[2] // mdKacc.shape[2]), unroll=1):
                    # sdS alternates per iteration, across heads too
                    self.one_m_block(mma_sdp, mma_dkv, mma_dq, tSrK, tSrV, tSrQ, tSrdO, tVrdOt, tKrQt,
                                     tQrdS, tQrKt, acc_dV, acc_dK, shape_a, tScS, thr_r2s, r2s, tRSsdS,
                                     sLSE, sDsum, pipe_q, pipe_do, state, pds_barrier, mdQacc, tidx,
                                     n_block, m_block, head + h, batch, chunk, seqlen_q, seqlen_k,
                                     args, it != 0, it % 2, sdO=sdO, step=it, mbar_ds=mbar_ds)
                    state.advance()
                    h, m_block = self.head_step(h, m_block, m_min, m_max)
                self.dq_last(mma_dq, tQrdS, tQrKt, tidx, nm * (mdQacc.shape[2] // mdKacc.shape[2]), mbar_ds,
                             args[-1])
                self.p_turns_close(wg)
                if const_expr(self.store_in_branch):
                    self.head_loop_store(mma_dkv_epi, acc_dK, acc_dV, mdKacc, mdVacc, tidx, n_block, head_kv,
                                         batch, chunk, seqlen_k, args, sK, sV)
            else:
                for m_block in cutlass.range(m_min, m_max, unroll=1):
                    self.one_m_block(mma_sdp, mma_dkv, mma_dq, tSrK, tSrV, tSrQ, tSrdO, tVrdOt, tKrQt,
                                     tQrdS, tQrKt, acc_dV, acc_dK, shape_a, tScS, thr_r2s, r2s, tRSsdS,
                                     sLSE, sDsum, pipe_q, pipe_do, state, pds_barrier, mdQacc, tidx,
                                     n_block, m_block, head, batch, chunk, seqlen_q, seqlen_k, args,
                                     m_block != m_min, (m_block - m_min) % 2 if const_expr(self.dq_defer) else None,
                                     sdO=sdO, step=m_block - m_min, mbar_ds=mbar_ds)
                    state.advance()
                self.dq_last(mma_dq, tQrdS, tQrKt, tidx, m_max - m_min, mbar_ds, args[-1])
                self.p_turns_close(wg)
                if const_expr(self.cfg.varlen):
                    mdK_seq, mdV_seq = self.varlen_dkv(mdKacc, mdVacc)
                    self.epilogue_dkv(mma_dkv_epi, acc_dK, acc_dV, mdQacc, mdK_seq, mdV_seq, tidx,
                                      n_block, head, head_kv, batch, chunk, seqlen_q, seqlen_k, args)
                else:
                    self.epilogue_dkv(mma_dkv_epi, acc_dK, acc_dV, mdQacc, mdKacc, mdVacc, tidx,
                                      n_block, head, head_kv, batch, chunk, seqlen_q, seqlen_k, args)
        else:
            # head_loop builds store dK and dV themselves (no zeroed accumulator behind them): a
            # key block that no query sees (a window, S_q < S_k) stores its zeros too
            if const_expr(self.store_in_branch):
                self.head_loop_store(mma_dkv_epi, acc_dK, acc_dV, mdKacc, mdVacc, tidx, n_block, head_kv,
                                     batch, chunk, seqlen_k, args, sK, sV)
        if const_expr(not self.store_in_branch):
            self.head_loop_store(mma_dkv_epi, acc_dK, acc_dV, mdKacc, mdVacc, tidx, n_block, head_kv, batch,
                                 chunk, seqlen_k, args, sK, sV)

    @cute.jit
    def p_turn_wait(self, tidx):
        """p_turns: wait for this warpgroup's turn at its P block.  Called before the wait for S^T:
        ptxas does not keep register work below a named barrier, but the P block reads the S^T
        accumulator, which the WARPGROUP.DEPBAR after this barrier releases."""
        if const_expr(self.p_turns):
            wg = cute.arch.make_warp_uniform(tidx // 128)
            cute.arch.barrier(barrier_id=int(BwdBarrier.P_TURN) + wg, number_of_threads=256)

    @cute.jit
    def p_turns_close(self, wg):
        """p_turns: warpgroup 0 takes warpgroup 1's last hand-over (no P block follows it), so every
        phase of P_TURN completes before the epilogue."""
        if const_expr(self.p_turns):
            if wg == 0:
                cute.arch.barrier(barrier_id=int(BwdBarrier.P_TURN), number_of_threads=256)

    @cute.jit
    def deferred_step(self, mma_dkv, mma_dq, acc_dK, rdS, tKrQt, tQrdS, tQrKt, pipe_q, pipe_do, state,
                      accumulate, buf, step, mbar_ds, tidx, sdQ_addr):
        """dq_defer, the end of step `step` (dS in sdS[buf], DS_FULL[buf] arrived): dK of this step,
        then the dQ of the previous one from the other buffer once both warpgroups' halves of it are
        in (DS_FULL), staged after dK has read Q; DS_FREE of that buffer once dQ has read it."""
        idx = state.index
        warpgroup.fence()
        self.gemm_acc(mma_dkv, acc_dK, rdS, tKrQt[None, None, None, idx], accumulate)
        warpgroup.commit_group()
        if step > 0:
            prev = 1 - buf
            cute.arch.mbarrier_wait(mbar_ds + prev, ((step - 1) // 2) % 2)
            acc_dQ = cute.make_rmem_tensor(mma_dq.get_slice(tidx).partition_shape_C((self.tile_m, self.Dc)), Float32)
            self.gemm(mma_dq, acc_dQ, tQrdS[None, None, None, prev], tQrKt, True)
            warpgroup.commit_group()
            warpgroup.wait_group(1)   # dV and dK done: Q and dO of this step are read
            pipe_do.consumer_release(state)
            pipe_q.consumer_release(state)
            warpgroup.wait_group(0)
            cute.arch.mbarrier_arrive(mbar_ds + 2 + prev)
            self.stage_dq(mma_dq, acc_dQ, sdQ_addr, tidx)
        else:
            warpgroup.wait_group(0)
            pipe_do.consumer_release(state)
            pipe_q.consumer_release(state)

    @cute.jit
    def dq_last(self, mma_dq, tQrdS, tQrKt, tidx, steps, mbar_ds, sdQ_addr):
        """dq_defer: after the loop of `steps` (>= 1) steps, the last step's dQ (buffer (steps - 1) % 2)."""
        if const_expr(self.dq_defer):
            last = (steps - 1) % 2
            cute.arch.mbarrier_wait(mbar_ds + last, ((steps - 1) // 2) % 2)
            warpgroup.fence()
            acc_dQ = cute.make_rmem_tensor(mma_dq.get_slice(tidx).partition_shape_C((self.tile_m, self.Dc)), Float32)
            self.gemm(mma_dq, acc_dQ, tQrdS[None, None, None, last], tQrKt, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            self.stage_dq(mma_dq, acc_dQ, sdQ_addr, tidx)

    @cute.jit
    def head_loop_store(self, mma_dkv_epi, acc_dK, acc_dV, mdKacc, mdVacc, tidx, n_block, head_kv, batch,
                        chunk, seqlen_k, args, sK, sV):
        """head_loop builds: dK and dV scaled, cast and stored (no-op in the other builds)."""
        if const_expr(self.head_loop):
            if const_expr(self.cfg.varlen):
                mdK_seq, mdV_seq = self.varlen_dkv(mdKacc, mdVacc)
                self.store_dkv(mma_dkv_epi, acc_dK, acc_dV, mdK_seq, mdV_seq, tidx, n_block, head_kv, batch,
                               chunk, seqlen_k, args[5], sK, sV)
            else:
                self.store_dkv(mma_dkv_epi, acc_dK, acc_dV, mdKacc, mdVacc, tidx, n_block, head_kv, batch,
                               chunk, seqlen_k, args[5], sK, sV)

    @cute.jit
    def d_chunk(self, s: cute.Tensor, chunk) -> cute.Tensor:
        """Columns [chunk * Dc, (chunk + 1) * Dc) of an smem tile (rows, D[, stages]).  Dc is
        a multiple of the 64-column swizzle atom, so the view starts on an atom boundary."""
        if const_expr(self.n_chunks == 1):
            return s
        rank = cute.rank(s.layout)
        tiler = (cute.size(s, mode=[0]), self.Dc) + tuple(cute.size(s, mode=[i]) for i in range(2, rank))
        return cute.local_tile(s, tiler, (0, chunk) + (0,) * (rank - 2))

    @cute.jit
    def one_m_block(self, mma_sdp, mma_dkv, mma_dq, tSrK, tSrV, tSrQ, tSrdO, tVrdOt, tKrQt,
                    tQrdS, tQrKt, acc_dV, acc_dK, shape_a, tScS, thr_r2s, r2s, tRSsdS,
                    sLSE, sDsum, pipe_q, pipe_do, state, pds_barrier, mdQacc, tidx,
                    n_block, m_block, head, batch, chunk, seqlen_q, seqlen_k, args, accumulate, buf=None, sdO=None,
                    step=None, mbar_ds=None):
        idx = state.index
        if const_expr(buf is None):   # sdS double buffer: alternates per query block
            buf = m_block % 2
        acc_S = cute.make_rmem_tensor(tScS.shape, Float32)
        acc_dP = cute.make_rmem_tensor(tScS.shape, Float32)
        if const_expr(self.cfg.dp_first):
            # dP^T first: dO is released after dV (below), so the producer has the next block's
            # dO in place by now and Q's load runs under this GEMM
            pipe_do.consumer_wait(state)
            if const_expr(self.cfg.varlen and not self.stage.needs_lse):
                self.zero_do_tail(sdO, idx, m_block, seqlen_q, tidx)
            warpgroup.fence()
            self.gemm(mma_sdp, acc_dP, tSrV, tSrdO[None, None, None, idx], True)
            warpgroup.commit_group()
            pipe_q.consumer_wait(state)
            self.gemm(mma_sdp, acc_S, tSrK, tSrQ[None, None, None, idx], True)
            warpgroup.commit_group()
            lse = self.col_stats(sLSE, idx, tScS, self.stage.needs_lse and self.hoist_lse)   # while S runs
            self.p_turn_wait(tidx)
            warpgroup.wait_group(0)
        else:
            pipe_q.consumer_wait(state)
            warpgroup.fence()
            self.gemm(mma_sdp, acc_S, tSrK, tSrQ[None, None, None, idx], True)
            warpgroup.commit_group()
            lse = self.col_stats(sLSE, idx, tScS, self.stage.needs_lse and self.hoist_lse)   # while S runs
            pipe_do.consumer_wait(state)
            if const_expr(self.cfg.varlen and not self.stage.needs_lse):
                self.zero_do_tail(sdO, idx, m_block, seqlen_q, tidx)
            self.gemm(mma_sdp, acc_dP, tSrV, tSrdO[None, None, None, idx], True)
            warpgroup.commit_group()
            self.p_turn_wait(tidx)
            warpgroup.wait_group(1)
        # rP: packed P^T (dV operand); acc_S keeps one FP32 dS factor per score, not P plus
        # an aux derivative (32 more live regs across the dP wait spilled 36-43 STL)
        rP = cute.make_rmem_tensor(shape_a, self.dtype)
        rF = cute.make_rmem_tensor(shape_a, self.dtype) if const_expr(self.f_packed) else None
        self.probs(acc_S, rP, tScS, lse, idx, n_block, m_block, seqlen_q, seqlen_k, args, head, batch, rF)
        if const_expr(self.p_turns):   # the other warpgroup's turn
            cute.arch.barrier_arrive(barrier_id=int(BwdBarrier.P_TURN) + 1 - cute.arch.make_warp_uniform(tidx // 128),
                                     number_of_threads=256)
        if const_expr(not self.p_late):
            warpgroup.fence()
            self.gemm_acc(mma_dkv, acc_dV, rP, tVrdOt[None, None, None, idx], accumulate)
            warpgroup.commit_group()
        dsum = self.col_stats(sDsum, idx, tScS, self.stage.needs_dsum and self.hoist_dsum)   # while dV, dP run
        # dP^T ready (the dV product may still run)
        warpgroup.wait_group(0 if const_expr(self.p_late) else 1)
        rdS = cute.make_rmem_tensor(shape_a, self.dtype)
        if const_expr(self.p_late):
            rP = cute.make_rmem_tensor(shape_a, self.dtype)   # probs' rP is dead: rebuilt from acc_S
            self.dscores_pack(acc_S, acc_dP, tScS, dsum, idx, rP, rdS)
            warpgroup.fence()
            self.gemm_acc(mma_dkv, acc_dV, rP, tVrdOt[None, None, None, idx], accumulate)
            warpgroup.commit_group()
        elif const_expr(self.f_packed):
            self.dscores_packed(rF, acc_dP, tScS, dsum, idx, rdS)
        else:
            self.dscores(acc_S, acc_dP, tScS, dsum, idx)
            cute.make_tensor(rdS.iterator, acc_dP.layout).store(acc_dP.load().to(self.dtype))
        if const_expr(self.dq_defer):
            if step >= 2:   # both warpgroups' dQ of step - 2 have read this buffer
                cute.arch.mbarrier_wait(mbar_ds + 2 + buf, ((step - 2) // 2) % 2)
        cute.copy(r2s, thr_r2s.retile(cute.make_tensor(rdS.iterator, acc_dP.layout)), tRSsdS[None, None, None, buf])
        cute.arch.fence_view_async_shared()
        if const_expr(self.dq_defer):
            cute.arch.mbarrier_arrive(mbar_ds + buf)   # this warpgroup's keys of dS are in smem
            self.deferred_step(mma_dkv, mma_dq, acc_dK, rdS, tKrQt, tQrdS, tQrKt, pipe_q, pipe_do, state,
                               accumulate, buf, step, mbar_ds, tidx, args[-1])
        else:
            pds_barrier.arrive_and_wait()   # both warpgroups' halves of dS are in smem
            warpgroup.fence()
            acc_dQ = cute.make_rmem_tensor(mma_dq.get_slice(tidx).partition_shape_C((self.tile_m, self.Dc)), Float32)
            if const_expr(self.dq_early):
                # dQ first: its tile goes to smem (and to warp 1's bulk adds) while dK runs
                self.gemm(mma_dq, acc_dQ, tQrdS[None, None, None, buf], tQrKt, True)
                warpgroup.commit_group()
                self.gemm_acc(mma_dkv, acc_dK, rdS, tKrQt[None, None, None, idx], accumulate)
                warpgroup.commit_group()
                warpgroup.wait_group(1)   # dV and dQ done, dK (reads Q) in flight
                pipe_do.consumer_release(state)
                self.stage_dq(mma_dq, acc_dQ, args[-1], tidx)
                warpgroup.wait_group(0)
                pipe_q.consumer_release(state)
            else:
                self.gemm_acc(mma_dkv, acc_dK, rdS, tKrQt[None, None, None, idx], accumulate)
                warpgroup.commit_group()
                self.gemm(mma_dq, acc_dQ, tQrdS[None, None, None, buf], tQrKt, True)
                warpgroup.commit_group()
                if const_expr(self.cfg.dp_first):
                    warpgroup.wait_group(2)   # dV has read dO: the next block's dO loads under dK and dQ
                    pipe_do.consumer_release(state)
                    warpgroup.wait_group(0)
                    pipe_q.consumer_release(state)
                else:
                    warpgroup.wait_group(0)
                    pipe_q.consumer_release(state)
                    pipe_do.consumer_release(state)
                self.add_dq(mma_dq, acc_dQ, mdQacc, tidx, n_block, m_block, head, batch, chunk, seqlen_q,
                            seqlen_k, args)

    @cute.jit
    def col_stats(self, sX, idx, tScS, hoist: cutlass.Constexpr[bool]):
        """The per-query statistic (LSE or D) of each column this thread holds,
        read from smem into registers right after a GEMM is issued, so the loads are off
        the path from the wgmma wait to the first use; not hoisted: sX itself."""
        if const_expr(not hoist):
            return sX
        c_mn = acc_mn_view(tScS)
        n = cute.size(c_mn, mode=[1])
        r = cute.make_rmem_tensor((n,), Float32)
        for c in cutlass.range_constexpr(n):
            r[c] = sX[c_mn[0, c][1], idx]
        return r

    @staticmethod
    def _stat(x, c: int, m, idx):
        """Column c's statistic: x is col_stats' register tensor (rank 1) or the smem tile."""
        return x[c] if const_expr(cute.rank(x.layout) == 1) else x[m, idx]

    @cute.jit
    def probs(self, acc_S, rP, tScS, sLSE, idx, n_block, m_block, seqlen_q, seqlen_k, args, head, batch,
              rF=None):
        """acc_S (raw S^T) -> dS factor f in place (f_packed: to rF, FP16 pairs), rP <- packed P^T;
        causal-masked -> 0."""
        rP32 = cute.recast_tensor(rP, Int32)   # word i = 16-bit elements 2i, 2i+1 of acc_S
        rF32 = cute.recast_tensor(rF, Int32) if const_expr(rF is not None) else None
        c_mn = acc_mn_view(tScS)
        rows = cute.size(c_mn, mode=[0])
        coords = sc.Coords(c_mn, m_block * self.tile_m, n_block * self.tile_n, batch, head,
                           sc.SeqlenInfo(seqlen_q, seqlen_k), self._aux, transposed=True)
        if const_expr(self._static_rows()):
            self.probs_rows(acc_S, rP32, c_mn, sLSE, idx, args, tuple(range(rows)), coords=coords, rF32=rF32)
        else:
            for r in cutlass.range_constexpr(rows):
                # S^T rows are keys: group (key // 8) % k differs between the warps of a
                # warpgroup for k >= 4 (a warp's 16 rows hold groups 2w, 2w+1): uniform branch
                if self.stage.uses_block((n_block * self.tile_n + c_mn[r, 0][0]) // 8):
                    self.probs_rows(acc_S, rP32, c_mn, sLSE, idx, args, (r,), True, coords, rF32)
                else:
                    self.probs_rows(acc_S, rP32, c_mn, sLSE, idx, args, (r,), False, coords, rF32)
        if const_expr(self.is_causal or self.has_left or self.has_right):
            self.mask_causal(acc_S, rP32, tScS, n_block, m_block, seqlen_q, seqlen_k, args, rF32)
        if const_expr(not self.is_causal):   # causal hides every key >= S_k already
            self.mask_key_tail(acc_S, rP32, tScS, n_block, seqlen_k, rF32)

    def _static_rows(self) -> bool:
        """Is the evaluator of every row known at compile time?  Rows r of the C fragment are
        keys lane/4 + 8 (r % 2) of a 16-aligned slice, so key group = r (mod 2): static for
        k <= 2 (and for all-block / all-MUFU splits)."""
        j, k = self.cfg.score.poly_split
        return self.cfg.score.evaluator != "poly" or j in (0, k) or k <= 2

    def _row_block(self, r: int) -> bool:
        return self.stage.uses_block(r % 2)   # valid when _static_rows()

    @cute.jit
    def probs_rows(self, acc_S, rP32, c_mn, sLSE, idx, args, rows, block=None, coords=None, rF32=None):
        """stage.prob2 on every column pair of the given rows (LSE loaded once per pair); f goes
        to acc_S, or packed to rF32 where given."""
        s_mn = acc_mn_view(acc_S)
        is_bf16 = self.dtype is cutlass.BFloat16
        for c in cutlass.range_constexpr(0, cute.size(s_mn, mode=[1]), 2):
            m0 = c_mn[0, c][1]
            lse0 = self._stat(sLSE, c, m0, idx) if const_expr(self.stage.needs_lse) else Float32(0.0)
            lse1 = self._stat(sLSE, c + 1, m0 + 1, idx) if const_expr(self.stage.needs_lse) else Float32(0.0)
            for i in cutlass.range_constexpr(len(rows)):
                r = rows[i]
                blk = self._row_block(r) if const_expr(block is None) else block
                p, f0, f1 = self.stage.prob2(s_mn[r, c], s_mn[r, c + 1], lse0, lse1, args, blk, is_bf16,
                                             coords, (r, c))
                w = cute.crd2idx((r, c), s_mn.layout) // 2
                rP32[w] = p
                if const_expr(rF32 is not None):
                    rF32[w] = sc.pack_f32x2(f0, f1, False)
                else:
                    s_mn[r, c], s_mn[r, c + 1] = f0, f1

    @cute.jit
    def mask_causal(self, acc_S, rP32, tScS, n_block, m_block, seqlen_q, seqlen_k, args, rF32=None):
        """Key n visible from query m iff n <= m + S_k - S_q (and inside the sliding window,
        kernels/mask.py); only diagonal / window-edge tiles need it.
        Masked scores: f = 0 and the P half-word = 0 (lo half = element 2i)."""
        shift = seqlen_k - seqlen_q
        n0 = n_block * self.tile_n
        m0 = m_block * self.tile_m
        win = (self.is_causal, self.has_left, self.has_right, args[3], args[4])
        if mask_mod.tile_needs_mask(n0, m0, shift, self.tile_m, self.tile_n, *win):
            for i in cutlass.range_constexpr(cute.size(acc_S) // 2):
                keep = Int32(-1)
                if mask_mod.key_hidden(n0 + tScS[2 * i][0], m0 + tScS[2 * i][1] + shift, *win):
                    if const_expr(rF32 is None):
                        acc_S[2 * i] = Float32(0.0)
                    keep = keep & Int32(-65536)   # 0xFFFF0000
                if mask_mod.key_hidden(n0 + tScS[2 * i + 1][0], m0 + tScS[2 * i + 1][1] + shift, *win):
                    if const_expr(rF32 is None):
                        acc_S[2 * i + 1] = Float32(0.0)
                    keep = keep & Int32(0xFFFF)
                rP32[i] = rP32[i] & keep
                if const_expr(rF32 is not None):
                    rF32[i] = rF32[i] & keep

    @cute.jit
    def mask_key_tail(self, acc_S, rP32, tScS, n_block, seqlen_k, rF32=None):
        """Keys at or past S_k (the last key block's zero-filled K and V rows): f = 0, P = 0.
        Unmasked, their P = exp(score(0) - LSE) is not small where a row's LSE is very negative
        (few keys, all with low logits): FP16 P overflows for LSE < -11, and inf times the zero
        K row is a NaN dQ.  Only the last key block can hold such keys (a uniform branch)."""
        n0 = n_block * self.tile_n
        if n0 + self.tile_n > seqlen_k:
            for i in cutlass.range_constexpr(cute.size(acc_S) // 2):
                keep = Int32(-1)
                if n0 + tScS[2 * i][0] >= seqlen_k:
                    if const_expr(rF32 is None):
                        acc_S[2 * i] = Float32(0.0)
                    keep = keep & Int32(-65536)   # 0xFFFF0000
                if n0 + tScS[2 * i + 1][0] >= seqlen_k:
                    if const_expr(rF32 is None):
                        acc_S[2 * i + 1] = Float32(0.0)
                    keep = keep & Int32(0xFFFF)
                rP32[i] = rP32[i] & keep
                if const_expr(rF32 is not None):
                    rF32[i] = rF32[i] & keep

    @cute.jit
    def zero_do_tail(self, sdO, idx, m_block, seqlen_q, tidx):
        """Varlen builds of a score without LSE (sigmoid): zero the rows of the staged dO tile at
        or past the sequence's S_q (the next sequence's rows; the dense build's TMA zero fill
        made them inert), so dP^T = V dO^T is 0 there, hence dS^T = 0 (no dK, dQ share) and
        P^T dO adds nothing to dV.  The softmax-like scores need none: their +inf padded LSE
        makes P = 0.  Only a sequence's last query block holds such rows (uniform branch); both
        MMA warpgroups zero the same rows (the 256 threads split them), then fence the generic
        writes for the async proxy and meet at a named barrier before either issues dP^T.
        (Masking P and the dS factor in registers instead spilled: D = 64 16 -> 45 words.)"""
        m0 = m_block * self.tile_m
        if m0 + self.tile_m > seqlen_q:
            first = cutlass.max(seqlen_q - m0, 0)
            n = (self.tile_m - first) * self.D
            for i in cutlass.range(tidx, n, 256, unroll=1):
                r = first + i // self.D
                sdO[r, i - (i // self.D) * self.D, idx] = self.dtype(0.0)
            cute.arch.fence_view_async_shared()
            pipeline.NamedBarrier(barrier_id=int(BwdBarrier.DO_TAIL), num_threads=256).arrive_and_wait()

    @cute.jit
    def dsum_pair(self, sDsum, c_mn, c, idx):
        """The dS statistic (rowsum(dO o O)) of accumulator columns c, c + 1 (0 where the score
        needs none)."""
        if const_expr(not self.stage.needs_dsum):
            return Float32(0.0), Float32(0.0)
        m0 = c_mn[0, c][1]
        return self._stat(sDsum, c, m0, idx), self._stat(sDsum, c + 1, m0 + 1, idx)

    @cute.jit
    def dscores(self, acc_F, acc_dP, tScS, sDsum, idx):
        """acc_dP (dP^T) -> dS^T / scale in place, from the dS factors acc_F."""
        f_mn, dp_mn, c_mn = acc_mn_view(acc_F), acc_mn_view(acc_dP), acc_mn_view(tScS)
        for c in cutlass.range_constexpr(0, cute.size(f_mn, mode=[1]), 2):
            d0, d1 = self.dsum_pair(sDsum, c_mn, c, idx)
            for r in cutlass.range_constexpr(cute.size(f_mn, mode=[0])):
                g0, g1 = self.stage.dscore2(f_mn[r, c], f_mn[r, c + 1], dp_mn[r, c], dp_mn[r, c + 1], d0, d1)
                dp_mn[r, c], dp_mn[r, c + 1] = g0, g1

    @cute.jit
    def dscores_pack(self, acc_P, acc_dP, tScS, sDsum, idx, rP, rdS):
        """p_late (softmax: acc_P holds P, the dS factor): dscores, writing packed P^T (rP)
        and dS^T (rdS) pair by pair instead of dS^T back into acc_dP."""
        f_mn, dp_mn, c_mn = acc_mn_view(acc_P), acc_mn_view(acc_dP), acc_mn_view(tScS)
        rP32, rdS32 = cute.recast_tensor(rP, Int32), cute.recast_tensor(rdS, Int32)
        is_bf16 = self.dtype is cutlass.BFloat16
        for c in cutlass.range_constexpr(0, cute.size(f_mn, mode=[1]), 2):
            d0, d1 = self.dsum_pair(sDsum, c_mn, c, idx)
            for r in cutlass.range_constexpr(cute.size(f_mn, mode=[0])):
                g0, g1 = self.stage.dscore2(f_mn[r, c], f_mn[r, c + 1], dp_mn[r, c], dp_mn[r, c + 1], d0, d1)
                w = cute.crd2idx((r, c), f_mn.layout) // 2   # packed word of elements (r, c), (r, c + 1)
                rP32[w] = sc.pack_f32x2(f_mn[r, c], f_mn[r, c + 1], is_bf16)
                rdS32[w] = sc.pack_f32x2(g0, g1, is_bf16)

    @cute.jit
    def dscores_packed(self, rF, acc_dP, tScS, sDsum, idx, rdS):
        """f_packed: dS^T from the FP16 pairs of f (rF) and acc_dP, packed pair by pair into rdS."""
        dp_mn, c_mn = acc_mn_view(acc_dP), acc_mn_view(tScS)
        rF32, rdS32 = cute.recast_tensor(rF, Int32), cute.recast_tensor(rdS, Int32)
        is_bf16 = self.dtype is cutlass.BFloat16
        for c in cutlass.range_constexpr(0, cute.size(dp_mn, mode=[1]), 2):
            d0, d1 = self.dsum_pair(sDsum, c_mn, c, idx)
            for r in cutlass.range_constexpr(cute.size(dp_mn, mode=[0])):
                w = cute.crd2idx((r, c), dp_mn.layout) // 2
                f0, f1 = sc.unpack_f16x2(rF32[w])
                g0, g1 = self.stage.dscore2(f0, f1, dp_mn[r, c], dp_mn[r, c + 1], d0, d1)
                rdS32[w] = sc.pack_f32x2(g0, g1, is_bf16)


class AttnBwdSm90Det(AttnBwdSm90):
    """Deterministic build: the host entry also takes the zeroed Int32 turn counters
    (attn_bwd_prepost.accumulators, n_counters) and passes them to the kernel as args[5]
    (args[0:3] stage scalars, args[3:5] window sizes)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mDsum: cute.Tensor, mdQacc: cute.Tensor, mdKacc: cute.Tensor,
                 mdVacc: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                 win_left: Int32, win_right: Int32, mSem: cute.Tensor, stream):
        self._launch(mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc, (scale, softcap, bias),
                     win_left, win_right, (mSem,), stream)


class AttnBwdSm90HeadLoop(AttnBwdSm90):
    """head_loop build: grid over KV heads; mdK/mdV are the dtype gradients themselves (not
    FP32 accumulators) and the entry takes dK's scale (softmax_scale) as args[5]."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mDsum: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                 win_left: Int32, win_right: Int32, dk_scale: Float32, stream):
        self._launch(mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdK, mdV, (scale, softcap, bias),
                     win_left, win_right, (dk_scale,), stream)


class AttnBwdSm90Aux(AttnBwdSm90):
    """A user score function with aux tensors: the entry takes them after the window sizes."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mDsum: cute.Tensor, mdQacc: cute.Tensor, mdKacc: cute.Tensor,
                 mdVacc: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                 win_left: Int32, win_right: Int32, aux: list, stream):
        self._launch(mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc, (scale, softcap, bias),
                     win_left, win_right, (), stream, aux)


class AttnBwdSm90DetAux(AttnBwdSm90Det):
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mDsum: cute.Tensor, mdQacc: cute.Tensor, mdKacc: cute.Tensor,
                 mdVacc: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                 win_left: Int32, win_right: Int32, mSem: cute.Tensor, aux: list, stream):
        self._launch(mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc, (scale, softcap, bias),
                     win_left, win_right, (mSem,), stream, aux)


class AttnBwdSm90Varlen(AttnBwdSm90):
    """The varlen build (BwdConfig.varlen): packed sequences.  The host entry takes q, k, v, dO
    and the FP32 dQ/dK/dV accumulators as (1, total, H, D), lse2 and dsum as (1, H_q, padded
    rows) (kernels/prepost_launch.preprocess_varlen), then cu_seqlens_q, cu_seqlens_k (int32,
    B + 1), the CTA table of the live (key block, query head, sequence) triples and its grid
    size (kernels/tile_scheduler.py varlen_bwd_table / varlen_bwd_ctas).  Grid (CTAs, 1, column
    chunks); the CTAs past the table's count run no block."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mDsum: cute.Tensor, mdQacc: cute.Tensor, mdKacc: cute.Tensor,
                 mdVacc: cute.Tensor, mCuSeqlensQ: cute.Tensor, mCuSeqlensK: cute.Tensor, mTable: cute.Tensor,
                 n_ctas: Int32, scale: Float64, softcap: Float64, bias: Float64, win_left: Int32,
                 win_right: Int32, stream):
        self._launch(mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdKacc, mdVacc, (scale, softcap, bias),
                     win_left, win_right, (), stream, None, (mCuSeqlensQ, mCuSeqlensK, mTable, n_ctas))


class AttnBwdSm90VarlenHeadLoop(AttnBwdSm90):
    """The varlen build with the per-KV-head loop (BwdConfig.varlen and head_loop): the entry
    of AttnBwdSm90Varlen with mdK / mdV the dtype gradients (total_k, H_kv, D) themselves and
    dK's scale after the window, as AttnBwdSm90HeadLoop's; its CTA table runs over KV heads."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mDsum: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, mCuSeqlensQ: cute.Tensor, mCuSeqlensK: cute.Tensor, mTable: cute.Tensor,
                 n_ctas: Int32, scale: Float64, softcap: Float64, bias: Float64, win_left: Int32,
                 win_right: Int32, dk_scale: Float32, stream):
        self._launch(mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdK, mdV, (scale, softcap, bias),
                     win_left, win_right, (dk_scale,), stream, None, (mCuSeqlensQ, mCuSeqlensK, mTable, n_ctas))


class AttnBwdSm90HeadLoopAux(AttnBwdSm90HeadLoop):
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mDsum: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64,
                 win_left: Int32, win_right: Int32, dk_scale: Float32, aux: list, stream):
        self._launch(mQ, mK, mV, mdO, mLSE, mDsum, mdQacc, mdK, mdV, (scale, softcap, bias),
                     win_left, win_right, (dk_scale,), stream, aux)


# -------------------------------------------------------------------- builds
def fake_args(cfg: BwdConfig):
    """Fake tensors for cute.compile: 32-bit symbolic shapes and 64-bit symbolic strides with a
    unit innermost stride (the layout the tvm-ffi entry checks torch tensors against; 32-bit
    fake strides misread the kernel-parameter struct: the first GPU run added every dQ row at
    the batch stride)."""
    from cutlass.cute.runtime import make_fake_tensor
    dt = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}[cfg.dtype]

    def mk(t, rank, div):
        shape = tuple(cute.sym_int(32) for _ in range(rank))
        stride = tuple(cute.sym_int64(divisibility=div) for _ in range(rank - 1)) + (1,)
        return make_fake_tensor(t, shape, stride, assumed_align=16)

    q, k, v, do = (mk(dt, 4, 8) for _ in range(4))      # TMA: strides multiple of 16 bytes
    lse, dsum = mk(Float32, 3, 4), mk(Float32, 3, 4)
    dq, dk, dv = (mk(Float32, 4, 2) for _ in range(3))  # red.v2: 8-byte aligned rows
    if cfg.head_loop:   # dK, dV: the dtype gradients (st.global.b32 pairs: 4-byte aligned rows;
        # dkv_smem's 16-byte row chunks: 16-byte aligned rows, as torch.empty_like allocates them)
        dk, dv = (mk(dt, 4, 8 if cfg.dkv_smem else 2) for _ in range(2))
    args = (q, k, v, do, lse, dsum, dq, dk, dv)
    if cfg.varlen:   # cu_seqlens_q, cu_seqlens_k, the CTA table, its grid
        cu = lambda: make_fake_tensor(Int32, (cute.sym_int(32),), (1,), assumed_align=4)
        args += (cu(), cu(), cu(), Int32(1))
    args += (Float64(1.0), Float64(1.0), Float64(0.0),   # scale, cap, bias
             Int32(0), Int32(0))   # window (left, right) sizes
    if cfg.head_loop:
        args += (Float32(1.0),)   # dK scale
    if cfg.deterministic:   # turn counters: a view into the zeroed accumulator buffer
        args += (make_fake_tensor(Int32, (cute.sym_int(32),), (1,), assumed_align=16),)
    if cfg.score.aux:
        from .attn_fwd_sm90 import aux_fake_tensors
        args += (aux_fake_tensors(cfg.score.aux),)
    return args


def kernel_for(cfg: BwdConfig) -> AttnBwdSm90:
    if cfg.swap:   # check_bwd: head_loop builds at D = 256
        from .attn_bwd_swap_sm90 import AttnBwdSm90Swap, AttnBwdSm90SwapVarlen
        return (AttnBwdSm90SwapVarlen if cfg.varlen else AttnBwdSm90Swap)(cfg)
    if cfg.varlen:   # check_bwd: not deterministic, lpt or a user score
        return AttnBwdSm90VarlenHeadLoop(cfg) if cfg.head_loop else AttnBwdSm90Varlen(cfg)
    if cfg.score.aux:
        cls = AttnBwdSm90DetAux if cfg.deterministic else AttnBwdSm90HeadLoopAux if cfg.head_loop else AttnBwdSm90Aux
    else:
        cls = AttnBwdSm90Det if cfg.deterministic else AttnBwdSm90HeadLoop if cfg.head_loop else AttnBwdSm90
    return cls(cfg)


def compile_bwd(cfg: BwdConfig, options: str = ""):
    """Compile for the current device (or CUTE_DSL_ARCH on a CPU machine), uncached: for
    inspection with compiler options (SASS).  The build is the one the launch runs."""
    return compile_cache.compile_tvm_ffi(kernel_for(cfg), fake_args(cfg), options)


def _compiled(cfg: BwdConfig):
    """The cached build of cfg (memory, then disk, then compile; kernels/compile_cache.py)."""
    return compile_cache.compiled("attn_bwd", cfg, lambda: (kernel_for(cfg), fake_args(cfg)))
