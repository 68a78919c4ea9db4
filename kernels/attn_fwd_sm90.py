"""Attention forward for Hopper (sm_90a) in CuTe DSL, with pluggable score stages.

O = stage(Q K^T) V for q (B, S_q, H_q, D), k/v (B, S_k, H_kv, D) (flash_attn_func layout),
H_q a multiple of H_kv (GQA/MQA), D in {64, 128, 256}, BF16 or FP16, any S and B,
causal (bottom-right aligned, see kernels/mask.py) or not.  Softmax-type stages also
write LSE (FP32, (B, H_q, S_q), natural log; -inf for a row that sees no key).

Structure (a tile = one 128-row query tile of one head; by default the grid is persistent,
one CTA per SM walking tiles in snake order over the LPT order, AttnFwdConfig.persistent):
  * warpgroup 0 is the producer: one warp issues TMA loads of Q (once per tile) and of K, V
    tiles into `num_stages`-deep shared-memory rings (separate K and V mbarrier
    pipelines, so QK^T of a block can start before its V has landed); it gives its
    registers away (setmaxnreg 24).
  * warpgroups 1 and 2 are consumers (setmaxnreg 240), 64 query rows each: per key
    block S = Q K^T (wgmma, SS, FP32 accumulators), the score stage turns S into P in
    registers, O += P V (wgmma with A = P from registers).  The loop is overlapped: step n
    issues S_n = Q K_n^T and P_{n-1} V_{n-1} together and runs the score stage of S_n while
    PV is on the tensor cores (block_overlap); with ping-pong (AttnFwdConfig.pingpong) the
    two consumer warpgroups also take turns issuing their GEMMs.
  * key blocks run from the diagonal down to 0: the first block and the ones crossing
    the causal diagonal are masked, interior blocks are not; blocks above the diagonal
    are never loaded.

Usage: `attn_fwd(q, k, v, mode="softmax", causal=True)` -> (o, lse).
Compile-only (no GPU): CUTE_DSL_ARCH=sm_90a python -m flash_attn_poly.kernels.attn_fwd_sm90
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from functools import lru_cache
from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

try:  # installed package layout
    from flash_attn_poly.kernels import mask as mask_mod
    from flash_attn_poly.kernels import score_stages as stages
    from flash_attn_poly.kernels.tile_scheduler import SectionLptScheduler, persistent_tile, section_heads
    from flash_attn_poly.kernels import compile_cache
except ImportError:  # running from the repository root
    from kernels import mask as mask_mod
    from kernels import score_stages as stages
    from kernels.tile_scheduler import SectionLptScheduler, persistent_tile, section_heads
    from kernels import compile_cache

_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
DEFAULT_PERSISTENT_CTAS = 132   # SMs of an H100 / H200 SXM; attn_fwd uses the device's own count


_pin_f32 = stages.pin_f32   # the stages pin what their write_p reads (block_overlap)


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


@dataclass(frozen=True)
class AttnFwdConfig:
    """Everything that changes the compiled code (the compile-cache key)."""

    stage: object                 # a frozen stage from score_stages (mode, evaluator, program)
    dtype: str = "bf16"           # "bf16" | "fp16"
    head_dim: int = 128
    causal: bool = True
    tile_m: int = 128             # consumer warpgroups x 64 rows (wgmma M = 64): 128 (2) or 192 (3)
    tile_n: int = 128
    num_stages: int = 2
    pingpong: bool = True         # consumer warpgroups alternate GEMM issue
    window_left: bool = False     # sliding window has a left bound (size: runtime Int32, kernels/mask.py)
    window_right: bool = False    # ... a right bound (non-causal only; causal is right = 0)
    # online softmax: independent running maxima per row (1 = one serial FMNMX chain of
    # tile_n / 4 - 1 per row; 4: four chains then a 2-level tree).  The max is exact in any
    # order, so outputs are bitwise equal
    row_max_chains: int = 1
    # online softmax: each block's row sum starts from the rescaled running sum (FA-style) so
    # the O-rescale factor is computed first and the O rescale can follow the PV wait at once
    # (stages.OnlineSoftmax sum_carry; same sum, another rounding order)
    row_sum_carry: bool = False
    # softcap, BF16, cap <= score_stages.FIXED_MAX_CAP: a constant row max instead of the
    # online one (no max reduction, no O rescale; SoftcapStage.fixed_lse says why it is
    # safe).  attn_fwd turns it on per call, where the cap value is known
    fixed_max: bool = False
    # online softmax (softmax, and softcap without fixed_max): keep a row's stale max until a
    # block raises it by more than this many log2 units (p <= 2^t), and skip the O rescale of
    # a warp whose rows all kept theirs; 0.0 = rescale on every new max
    rescale_threshold: float = 0.0
    # > 0: a persistent grid of at most this many CTAs (attn_fwd puts the device's SM count
    # here); each CTA walks LPT-ordered tiles in snake order (tile_scheduler.persistent_tile),
    # so the producer loads the next tile's Q, K and V while the consumers finish the current
    # one (the per-CTA fixed cost).  0 = one CTA per tile, in the same LPT order
    persistent: int = 0
    # fixed_max only: in mask-free key blocks, n of every 8 key column groups (g % 8 >= 8 - n)
    # compute P = 2^a on the FMA pipe (score_stages.exp2_fma: 3 FADD, 3 FFMA, 1 IMAD) instead
    # of MUFU.EX2, moving part of softcap's second MUFU op per score
    exp2_fma: int = 0

    @staticmethod
    def default(stage, dtype="bf16", head_dim=128, causal=True, **kw):
        """The measured default config of a stage (each choice: docs/MEASURED.md, ## Forward);
        kw overrides fields (a tuning)."""
        # smem: Q tile_m*D + 2 stages * (K + V) tile_n*D, 16-bit:
        #   D=64/128: tile_n 128 -> 32 + 128 KB at D=128;  D=256: tile_n 64 -> 64 + 128 KB
        tile_n = stages.default_key_block(head_dim)
        ev = getattr(stage, "evaluator", "")
        mode = getattr(stage, "mode", "")
        # ping-pong: the poly stages; persistent grid: everywhere (attn_fwd puts the device's
        # SM count here, a direct default() call gets H100/H200 SXM's 132)
        base = dict(pingpong=ev == "poly", persistent=DEFAULT_PERSISTENT_CTAS)
        if mode == "softmax":
            base.update(rescale_threshold=8.0)
        if mode == "softmax" and head_dim == 128:
            base.update(pingpong=True, row_sum_carry=True, row_max_chains=4)
        elif mode == "softcap" and head_dim == 256:
            base.update(row_sum_carry=True)
        # softcap under the constant row max at D = 128: three consumer warpgroups, tile 192 x 64,
        # 4 K/V stages, no ping-pong.  A tuning that sets tile_m, tile_n or pingpong gets the
        # two-warpgroup base instead.
        if (mode == "softcap" and head_dim == 128 and kw.get("fixed_max")
                and not {"tile_m", "tile_n", "pingpong"} & set(kw)):
            base.update(tile_m=192, tile_n=64, num_stages=4, pingpong=False)
        # the exp2 offload of an exp2_f32 softcap program (score_stages.make_stage) runs where
        # the constant row max bounds the exp2 argument; elsewhere every P stays on MUFU
        if getattr(stage, "exp2_split", ()) and kw.get("fixed_max"):
            base.update(exp2_fma=stages.exp2_groups(stage.exp2_split))
        kw = dict(base, **kw)
        kv_stages = kw.pop("num_stages", 2)   # K/V pipeline depth (a timing knob; 3 fills 224 KB at D = 128)
        tile_n = kw.pop("tile_n", tile_n)   # a timing knob (64 at D = 128: half the stage per block)
        tile_m = kw.pop("tile_m", 128)      # a timing knob (192: three consumer warpgroups, no ping-pong)
        return AttnFwdConfig(stage, dtype, head_dim, causal, tile_m, tile_n, kv_stages, **kw)


SMEM_BYTES = 232448   # shared memory per CTA on sm_90 (227 KB)


class AttnFwdSm90:
    num_threads_per_wg = 128
    num_producer_regs = 24    # 24 + 2*240 = 504 <= 512 regs/thread budget per SM quadrant
    MMA_REGS = {2: 240, 3: 160}   # consumer registers per thread by warpgroup count (24 + 3*160 = 504)

    def __init__(self, cfg: AttnFwdConfig):
        self.cfg = cfg
        self.stage = cfg.stage
        self.dtype = _DTYPES[cfg.dtype]
        self.is_bf16 = cfg.dtype == "bf16"
        if cfg.stage.mode == "sigmoid":
            cfg.stage.check_dtype(self.is_bf16)
        if not 0.0 <= cfg.rescale_threshold <= 16.0:   # p <= 2^t: keep P and row sums far from overflow
            raise ValueError(f"rescale_threshold must be in [0, 16] (log2 units), got {cfg.rescale_threshold!r}")
        if cfg.persistent < 0:
            raise ValueError(f"persistent must be >= 0 (a CTA count; 0 = one CTA per tile), got {cfg.persistent!r}")
        if not 0 <= cfg.exp2_fma <= 8 or (cfg.exp2_fma and not cfg.fixed_max):
            raise ValueError(f"exp2_fma (column groups of 8 on the FMA pipe) needs 0..8 and fixed_max, "
                             f"got {cfg.exp2_fma} (fixed_max={cfg.fixed_max})")
        if cfg.fixed_max and (cfg.stage.mode != "softcap" or not self.is_bf16):
            raise ValueError(f"fixed_max needs the softcap stage and BF16, got {cfg.stage.mode}/{cfg.dtype}")
        self.head_dim = cfg.head_dim
        self.tile_m, self.tile_n = cfg.tile_m, cfg.tile_n
        self.num_stages = cfg.num_stages
        self.causal = cfg.causal
        self.pingpong = cfg.pingpong
        self.num_mma_wg = self.tile_m // 64
        if self.tile_m % 64 or self.num_mma_wg not in self.MMA_REGS:
            raise ValueError(f"tile_m must be 128 or 192 (2 or 3 consumer warpgroups), got {self.tile_m}")
        if self.num_mma_wg != 2 and cfg.pingpong:
            raise ValueError("ping-pong pairs two consumer warpgroups: tile_m 192 needs pingpong=False")
        split = getattr(cfg.stage, "poly_split", None)
        if cfg.stage.evaluator == "poly" and split is not None and not stages.split_fits_block(split, self.tile_n):
            raise ValueError(f"poly_split {split} repeats every {8 * split[1]} keys, more than the forward's "
                             f"key block (tile_n {self.tile_n}): the forward could not send the key columns "
                             f"the backward recomputes through the block; use k <= {self.tile_n // 8}")
        self.num_mma_regs = self.MMA_REGS[self.num_mma_wg]
        self.num_threads = self.num_threads_per_wg * (1 + self.num_mma_wg)
        tiles = 2 * (self.tile_m + 2 * self.num_stages * self.tile_n) * self.head_dim   # 16-bit Q, K, V
        if tiles > SMEM_BYTES - 1024:   # leave room for the mbarriers
            raise ValueError(f"forward config needs {tiles} bytes of shared memory for Q ({self.tile_m} x "
                             f"{self.head_dim}) and {self.num_stages} K/V stages of {self.tile_n} rows; "
                             f"sm_90 has {SMEM_BYTES}: lower num_stages or tile_n")

    # ------------------------------------------------------------------ host side
    def _smem_layout(self, rows: int, stages_: Optional[int]):
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, self.dtype, self.head_dim),
            self.dtype)
        shape = (rows, self.head_dim) if stages_ is None else (rows, self.head_dim, stages_)
        return cute.tile_to_shape(atom, shape, (0, 1) if stages_ is None else (0, 1, 2))

    def _tiled_mmas(self):
        qk = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            Float32, (self.num_mma_wg, 1, 1), (64, self.tile_n))
        pv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN,
            Float32, (self.num_mma_wg, 1, 1), (64, self.head_dim), warpgroup.OperandSource.RMEM)
        return qk, pv

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, p0: Float32, p1: Float32, p2: Float32, p3: Float32,
                 win_left: Int32, win_right: Int32, stream):
        # torch (B, S, H, D) -> (S, D, H, B); LSE (B, H, S) -> (S, H, B)
        mQ, mK, mV, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))
                          for t in (mQ, mK, mV, mO)]
        mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))
        tiled_mma_qk, tiled_mma_pv = self._tiled_mmas()
        sQ_layout = self._smem_layout(self.tile_m, None)
        sK_layout = self._smem_layout(self.tile_n, self.num_stages)
        sV_layout = self._smem_layout(self.tile_n, self.num_stages)
        load_op = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, mQ_tma = cpasync.make_tiled_tma_atom(load_op, mQ, sQ_layout, (self.tile_m, self.head_dim))
        sK_one = cute.select(sK_layout, mode=[0, 1])
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(load_op, mK, sK_one, (self.tile_n, self.head_dim))
        tma_v, mV_tma = cpasync.make_tiled_tma_atom(load_op, mV, sK_one, (self.tile_n, self.head_dim))
        self.bytes_q = cute.size_in_bytes(self.dtype, sQ_layout)
        self.bytes_kv = cute.size_in_bytes(self.dtype, sK_one)

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]

        self.shared_storage = SharedStorage
        num_m_blocks = cute.ceil_div(mQ.shape[0], self.tile_m)
        sched = SectionLptScheduler(reverse=self.causal)
        grid = SectionLptScheduler.grid(num_m_blocks, mQ.shape[2], mQ.shape[3])
        if cutlass.const_expr(self.cfg.persistent > 0):
            tiles = num_m_blocks * mQ.shape[2] * mQ.shape[3]
            grid = (cutlass.min(tiles, self.cfg.persistent), 1, 1)
        self.kernel(mQ_tma, mK_tma, mV_tma, mO, mLSE, tma_q, tma_k, tma_v,
                    tiled_mma_qk, tiled_mma_pv, sQ_layout, sK_layout, sV_layout,
                    (p0, p1, p2, p3), self._window_param(win_left, win_right), sched).launch(
            grid=grid,
            block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

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
               sV_layout: cute.ComposedLayout, params, window, sched: cutlass.Constexpr):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v):
                cpasync.prefetch_descriptor(atom)
        storage = SmemAllocator().allocate(self.shared_storage)
        pipe_q, pipe_k, pipe_v = self._make_pipelines(storage)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))

        blocks = mask_mod.BlockRange(self.tile_m, self.tile_n, self.causal,
                                     self.cfg.window_left, self.cfg.window_right)
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        if cutlass.const_expr(self.cfg.persistent > 0):
            self.persistent_roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, tma_q, tma_k, tma_v,
                                  tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, params,
                                  window, sched, blocks, warp_idx)
        else:
            self.single_tile_roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, tma_q, tma_k, tma_v,
                                   tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, params,
                                   window, sched, blocks, warp_idx)

    def _section_group(self, mQ, mK):
        """LPT section width: the K and V rows of its KV heads (reused by the group's query
        heads and by every query tile) fit L2; Q and O stream through once."""
        h_q = mQ.shape[2]
        return section_heads(h_q, mK.shape[0], self.head_dim * 4, h_q // mK.shape[2])

    def _key_range(self, blocks, m_block, seqlen_q, seqlen_k, window):
        """(n_max, n_cnt): key blocks [n_max - n_cnt, n_max) are visited (n_cnt is n_max
        itself without a left window)."""
        n_max = blocks.n_block_max(m_block, seqlen_q, seqlen_k, window[1])
        n_cnt = mask_mod.sub0(n_max, blocks.n_block_min(m_block, seqlen_q, seqlen_k, window[0]))
        return n_max, n_cnt

    def _tile(self, sched, t, num_m_blocks, h_q, group, blocks, seqlen_q, seqlen_k, window):
        """(m_block, head, batch, n_max, n_cnt) of linear tile t (persistent CTAs; every role
        decodes the tiles it walks itself)."""
        m_block, head, batch = sched.tile_at(t, num_m_blocks, h_q, group)
        return (m_block, head, batch) + self._key_range(blocks, m_block, seqlen_q, seqlen_k, window)

    @cute.jit
    def single_tile_roles(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, tma_q, tma_k, tma_v,
                          tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, params, window,
                          sched: cutlass.Constexpr, blocks, warp_idx):
        """One CTA = one tile (the grid has a CTA per tile, in LPT order)."""
        m_block, head, batch = sched.work_tile(cute.ceil_div(mQ.shape[0], self.tile_m), mQ.shape[2],
                                               self._section_group(mQ, mK))
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        n_max, n_cnt = self._key_range(blocks, m_block, seqlen_q, seqlen_k, window)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.num_producer_regs)
            if warp_idx == 0:
                head_kv = head // (mQ.shape[2] // mK.shape[2])
                self.load(mQ, mK, mV, sQ, sK, sV, tma_q, tma_k, tma_v, pipe_q, pipe_k, pipe_v,
                          m_block, head, head_kv, batch, n_max, n_cnt)
        else:
            cute.arch.setmaxregister_increase(self.num_mma_regs)
            self.mma(mO, mLSE, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v,
                     params, blocks, m_block, head, batch, n_max, seqlen_q, seqlen_k, window, n_cnt)

    @cute.jit
    def persistent_roles(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, tma_q, tma_k, tma_v,
                         tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, params, window,
                         sched: cutlass.Constexpr, blocks, warp_idx):
        """Persistent CTAs: every role walks the same tiles (persistent_tile, snake order over
        the LPT order); the pipeline states run on across tiles, so the producer starts the
        next tile's K/V as stages free up and its Q once the consumers release Q (after
        their last QK GEMM of a tile), while they finish the last PV and the epilogue."""
        num_m_blocks = cute.ceil_div(mQ.shape[0], self.tile_m)
        h_q = mQ.shape[2]
        group = self._section_group(mQ, mK)
        tiles = num_m_blocks * h_q * mQ.shape[3]
        cta = cute.arch.block_idx()[0]
        num_ctas = cute.arch.grid_dim()[0]
        rounds = cute.ceil_div(tiles, num_ctas)
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        q_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        q_cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.num_producer_regs)
            if warp_idx == 0:
                for r in cutlass.range(rounds, unroll=1):
                    t = persistent_tile(r, cta, num_ctas)
                    for _ in cutlass.range(cutlass.min(cutlass.max(tiles - t, 0), 1), unroll=1):
                        m_block, head, batch, n_max, n_cnt = self._tile(sched, t, num_m_blocks, h_q, group,
                                                                        blocks, seqlen_q, seqlen_k, window)
                        head_kv = head // (h_q // mK.shape[2])
                        q_prod, kv_prod = self.load(mQ, mK, mV, sQ, sK, sV, tma_q, tma_k, tma_v,
                                                    pipe_q, pipe_k, pipe_v, m_block, head, head_kv,
                                                    batch, n_max, n_cnt, q_prod, kv_prod)
        else:
            cute.arch.setmaxregister_increase(self.num_mma_regs)
            wg = cute.arch.make_warp_uniform((cute.arch.thread_idx()[0] - self.num_threads_per_wg)
                                             // self.num_threads_per_wg)
            if cutlass.const_expr(self.pingpong):
                if wg == 1:  # warpgroup 0 issues its first GEMM first (once: turns run on across tiles)
                    self.pingpong_arrive(0)
            for r in cutlass.range(rounds, unroll=1):
                t = persistent_tile(r, cta, num_ctas)
                for _ in cutlass.range(cutlass.min(cutlass.max(tiles - t, 0), 1), unroll=1):
                    m_block, head, batch, n_max, n_cnt = self._tile(sched, t, num_m_blocks, h_q, group,
                                                                    blocks, seqlen_q, seqlen_k, window)
                    kv_cons, q_cons = self.mma(mO, mLSE, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, pipe_q,
                                               pipe_k, pipe_v, params, blocks, m_block, head, batch, n_max,
                                               seqlen_q, seqlen_k, window, n_cnt, kv_cons, q_cons)
            if cutlass.const_expr(self.pingpong):
                if wg == 0:  # take the extra arrive of the start so barrier 0 ends balanced
                    self.pingpong_sync(0)

    def _make_pipelines(self, storage):
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        # one release arrive per consumer warp (PipelineTmaAsync signals from lane 0)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * 4)
        make = lambda bar, n, nbytes: pipeline.PipelineTmaAsync.create(
            barrier_storage=bar.data_ptr(), num_stages=n, producer_group=producer,
            consumer_group=consumers, tx_count=nbytes, defer_sync=True)
        return (make(storage.mbar_q, 1, self.bytes_q), make(storage.mbar_k, self.num_stages, self.bytes_kv),
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
                cute.copy(tma_q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
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
            seqlen_q: Int32, seqlen_k: Int32, window, n_cnt: Int32, kv_run=None, q_run=None):
        """Consumer warpgroups: the main loop over key blocks, then the epilogue.  Persistent
        CTAs pass their running K/V and Q consumer states (kv_run, q_run) and get them back:
        Q is released after the tile's last QK GEMM, and the ping-pong turns are set up once
        per CTA by the caller instead of once per tile."""
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
        tSrK = wg_mma_qk.make_fragment_B(wg_mma_qk.partition_B(sK))
        tOrV = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(wg_mma_pv.partition_shape_C((self.tile_m, self.head_dim)), Float32)
        tOrP = wg_mma_pv.make_fragment_A(wg_mma_pv.partition_shape_A((self.tile_m, self.tile_n)))
        s_shape = wg_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        tScS_mn = stages.acc_mn_view(thr_mma_qk.partition_C(
            cute.make_identity_tensor((self.tile_m, self.tile_n))))
        num_rows = cute.size(tScS_mn, mode=[0])
        fixed = self.stage.fixed_lse(params) if self.cfg.fixed_max else None
        softmax = stages.OnlineSoftmax(num_rows, self.cfg.row_max_chains, self.cfg.row_sum_carry, fixed,
                                       self.cfg.rescale_threshold, self.cfg.exp2_fma,
                                       stages.exp2_program_of(self.stage))
        row_scale = cute.make_rmem_tensor((num_rows,), Float32)

        ctx = SimpleNamespace(
            tiled_mma_qk=tiled_mma_qk, tiled_mma_pv=tiled_mma_pv, tSrQ=tSrQ, tSrK=tSrK, tOrV=tOrV,
            tOrP=tOrP, acc_O=acc_O, s_shape=s_shape, tScS_mn=tScS_mn, softmax=softmax,
            row_scale=row_scale, params=params, pipe_k=pipe_k, pipe_v=pipe_v, m_block=m_block,
            seqlen_q=seqlen_q, seqlen_k=seqlen_k, wg=wg, n_max=n_max, window=window)
        n_unmasked = cutlass.min(blocks.n_unmasked_end(m_block, seqlen_q, seqlen_k, window[1]), n_max)
        # key blocks: first = n_max-1 (tail + diagonal, masked); then the ones crossing the
        # causal diagonal / right window edge (masked; none when not bounded); then the
        # interior [n_lo, ..) (mask-free); then the left window edge [n_min, n_lo) (masked).
        # Without a left window n_min = n_lo = 0 (Python ints: the unwindowed code as is).
        n_min = blocks.n_block_min(m_block, seqlen_q, seqlen_k, window[0])
        n_lo = blocks.n_left_clean(m_block, seqlen_q, seqlen_k, window[0])
        n_diag = n_max - 1 - cutlass.max(n_unmasked, n_min)
        n_diag_lo = cutlass.max(n_unmasked, n_min) if cutlass.const_expr(blocks.has_left) else n_unmasked
        n_inner = mask_mod.sub0(cutlass.min(n_unmasked, n_max - 1), n_lo)
        if cutlass.const_expr(persistent):
            kv = kv_run
        else:
            kv = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        if cutlass.const_expr(self.pingpong and not persistent):
            if wg == 1:  # warpgroup 0 issues its first GEMM first
                self.pingpong_arrive(0)
        # dynamic `for` loops of 0 or 1 trips stand in for `if` (a tile that sees no key
        # skips all work and still writes O = 0, LSE = -inf)
        for _ in cutlass.range(cutlass.min(n_max, 1), unroll=1):
            pipe_q.consumer_wait(q_run if cutlass.const_expr(persistent)
                                 else pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1))
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
            for _ in cutlass.range(cutlass.min(n_max, 1), unroll=1):
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
                      seqlen_q, n_max)
        if cutlass.const_expr(persistent):
            return kv, q_run

    # ---- warpgroup ping-pong: the two consumer warpgroups take turns issuing GEMMs, so one
    # runs its score stage (MUFU/FMA) while the other's wgmma keep the tensor cores busy.
    # Named barrier 1 + w gates warpgroup w; 256 = its 128 waiting + 128 arriving threads.
    def pingpong_sync(self, wg):
        cute.arch.barrier(barrier_id=1 + wg, number_of_threads=2 * self.num_threads_per_wg)

    def pingpong_arrive(self, wg):
        cute.arch.barrier_arrive(barrier_id=1 + wg, number_of_threads=2 * self.num_threads_per_wg)

    @cute.jit
    def next_block(self, ctx, kv, n_block: Int32, masked: cutlass.Constexpr[bool]):
        return self.block_overlap(ctx, kv, n_block, masked, False)

    @cute.jit
    def scores_to_p(self, ctx, acc_S, n_block: Int32, is_first: cutlass.Constexpr[bool],
                    masked: cutlass.Constexpr[bool], tOrP_dst):
        """Score stage on S: transform, mask (diagonal/tail blocks only), P into tOrP_dst
        (None: P stays in acc_S for the stage's write_p after the PV wait)."""
        if cutlass.const_expr(self.cfg.fixed_max):
            self.stage.transform_fixed(acc_S, ctx.params)   # exp2 arguments against a constant max
        else:
            self.stage.transform(acc_S, ctx.params)
        if cutlass.const_expr(masked):
            mask_mod.apply_mask(stages.acc_mn_view(acc_S), ctx.tScS_mn, ctx.m_block, n_block,
                                ctx.seqlen_q, ctx.seqlen_k, self.tile_m, self.tile_n, self.causal,
                                self.cfg.window_left, self.cfg.window_right, ctx.window[0], ctx.window[1])
        self.stage.probs(acc_S, tOrP_dst, ctx.softmax, ctx.params, is_first, masked,
                         ctx.row_scale, self.is_bf16)

    @cute.jit
    def rescale_o(self, ctx):
        if cutlass.const_expr(self.stage.uses_online_softmax and not self.cfg.fixed_max):
            if cutlass.const_expr(self.cfg.rescale_threshold > 0.0):
                if ctx.softmax.rescale_needed(ctx.row_scale):
                    self._scale_o(ctx)
            else:
                self._scale_o(ctx)

    @cute.jit
    def _scale_o(self, ctx):
        o_mn = stages.acc_mn_view(ctx.acc_O)
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
            self.pingpong_arrive(1 - ctx.wg)
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
            self.pingpong_arrive(1 - ctx.wg)
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
        self.scores_to_p(ctx, acc_S, n_block, False, masked, None)
        warpgroup.wait_group(0)
        fence_fragment(ctx.acc_O)
        ctx.pipe_v.consumer_release(kv_prev)
        # P_n into the A fragment now that nothing reads it: the stage pins the acc_S
        # registers it reads (keeps its non-volatile asm below the wait) and packs them
        # (sigmoid/poly: the block's last squaring on its block pairs)
        self.stage.write_p(acc_S, ctx.tOrP, self.is_bf16)
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
                 m_block: Int32, head: Int32, batch: Int32, seqlen_q: Int32, n_max: Int32):
        """Normalise O (softmax modes), write O (rows < S_q) and LSE straight from registers."""
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        tOcO_mn = stages.acc_mn_view(thr_mma_pv.partition_C(
            cute.make_identity_tensor((self.tile_m, self.head_dim))))
        o_mn = stages.acc_mn_view(acc_O)
        num_rows = cute.size(o_mn, mode=[0])
        # a tile that sees no key never ran a PV product: acc_O is undefined, write zeros
        for i in cutlass.range_constexpr(cute.size(acc_O)):
            acc_O[i] = acc_O[i] if n_max > 0 else Float32(0.0)
        if cutlass.const_expr(self.stage.uses_online_softmax):
            o_scale = cute.make_rmem_tensor((num_rows,), Float32)
            lse = cute.make_rmem_tensor((num_rows,), Float32)
            softmax.finalize(self.stage.lse_scale(params), o_scale, lse)
            for r in cutlass.range_constexpr(num_rows):
                for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                    o_mn[r, c] = o_mn[r, c] * o_scale[r]
            gLSE = mLSE[None, head, batch]
            for r in cutlass.range_constexpr(num_rows):
                row = m_block * self.tile_m + tOcO_mn[r, 0][0]
                if tOcO_mn[0, 0][1] == 0 and row < seqlen_q:
                    gLSE[row] = lse[r]
        gO = mO[None, None, head, batch]
        for r in cutlass.range_constexpr(num_rows):
            row = m_block * self.tile_m + tOcO_mn[r, 0][0]
            if row < seqlen_q:
                for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                    gO[row, tOcO_mn[0, c][1]] = o_mn[r, c].to(self.dtype)


# ---------------------------------------------------------------------- compile + torch entry
def _fake_args(cfg: AttnFwdConfig):
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
    return (qkv(), qkv(), qkv(), qkv(), lse, Float32(1.0), Float32(1.0), Float32(1.0), Float32(1.0),
            Int32(0), Int32(0))   # window (left, right) sizes


def compile_attn_fwd(cfg: AttnFwdConfig, *, options: str = ""):
    """cute.compile the kernel for cfg against fake tensors (works on a CPU machine with
    CUTE_DSL_ARCH=sm_90a), uncached: for inspection with compiler options (SASS, PTX).
    The build is the one attn_fwd runs (kernels/compile_cache.py launch path)."""
    return compile_cache.compile_tvm_ffi(AttnFwdSm90(cfg), _fake_args(cfg), options)


def _compiled(cfg: AttnFwdConfig):
    """The cached build of cfg (memory, then disk, then compile)."""
    return compile_cache.compiled("attn_fwd", cfg, lambda: (AttnFwdSm90(cfg), _fake_args(cfg)))


@lru_cache(maxsize=None)
def _stage_and_config(mode, evaluator, dtype, d, causal, tuning_items, program=None):
    """Stage + config per call signature: building them costs ~7 us a call (CPU timing,
    docs/NOTES.md), a few % of the kernel's time when calls run back to back."""
    kw = {"program": program} if program is not None and evaluator == "poly" else {}
    stage = stages.make_stage(mode, evaluator, key_block=stages.default_key_block(d), **kw)
    cfg = AttnFwdConfig.default(stage, dtype, d, causal, **dict(tuning_items))
    if stage.evaluator == "poly" and not stages.split_fits_block(stage.poly_split, cfg.tile_n):
        # a tuning with a shorter key block: the default split coarsened to fit it
        stage = stages.make_stage(mode, evaluator, key_block=cfg.tile_n, **kw)
        cfg = AttnFwdConfig.default(stage, dtype, d, causal, **dict(tuning_items))
    return stage, cfg


def _config_for_stage(stage, dtype, d, causal, tuning_items):
    """The default config for a caller's stage; a poly split the default key block cannot
    repeat (1/16 under softcap's 64-key three-warpgroup tile at D = 128) takes the head dim's
    plain key block instead (AttnFwdSm90 refuses it where none fits: 1/16 at D = 256)."""
    cfg = AttnFwdConfig.default(stage, dtype, d, causal, **dict(tuning_items))
    split = getattr(stage, "poly_split", None)
    if (stage.evaluator == "poly" and split is not None and not stages.split_fits_block(split, cfg.tile_n)
            and "tile_n" not in dict(tuning_items)):
        cfg = AttnFwdConfig.default(stage, dtype, d, causal, **dict(tuning_items, tile_n=stages.default_key_block(d)))
    return cfg


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    import torch
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@lru_cache(maxsize=None)
def _default_tuning(device_index: int) -> dict:
    return {"persistent": _sm_count(device_index)}   # read only: callers copy before adding keys


def _persistent_tuning(tuning: Optional[dict], device) -> Optional[dict]:
    """The persistent grid (the default) sized to this device's SMs: tuning persistent
    absent / True / 1 -> the SM count, False / 0 -> one CTA per tile, n > 1 -> n.
    A call without tuning (the API's) gets one cached dict per device."""
    if not tuning:
        return _default_tuning(device.index if device.index is not None else 0)
    t = dict(tuning)
    p = t.get("persistent", True)
    if p is True or p == 1:
        t["persistent"] = _sm_count(device.index if device.index is not None else 0)
    elif p is False:
        t["persistent"] = 0
    return t


def _fixed_max_kw(mode: str, dtype: str, cap: float, tuning: Optional[dict]) -> dict:
    """{"fixed_max": True} where the constant row max is safe (softcap, BF16, cap in
    (0, FIXED_MAX_CAP]) and tuning does not set it; an explicit fixed_max=True elsewhere is an error."""
    ok = mode == "softcap" and dtype == "bf16" and 0.0 < cap <= stages.FIXED_MAX_CAP
    asked = (tuning or {}).get("fixed_max")
    if asked and not ok:
        raise ValueError(f"fixed_max needs mode='softcap', BF16 and 0 < softcap <= {stages.FIXED_MAX_CAP}, "
                         f"got mode={mode!r}, {dtype}, softcap={cap}")
    return {"fixed_max": True} if ok and asked is None else {}


def attn_fwd(q, k, v, *, mode: str = "softmax", evaluator: str = "native", causal: bool = True,
             softmax_scale: Optional[float] = None, softcap: Optional[float] = None,
             sigmoid_bias: Optional[float] = None, stage=None, out=None, lse=None,
             tuning: Optional[dict] = None, window_size=(-1, -1), program=None):
    """Torch entry: q (B, S_q, H_q, D), k/v (B, S_k, H_kv, D), CUDA, bf16/fp16, last dim
    contiguous.  Returns (o like q, lse (B, H_q, S_q) FP32 or None for sigmoid).
    tuning: AttnFwdConfig field overrides (tile_m, tile_n, num_stages, pingpong, persistent, ...).
    program: the poly stage's program, a name of the committed coefficient table or a
    ProgramSpec of any table (None: the mode's default program).
    window_size: (left, right) sliding window, flash-attn semantics (-1 = unbounded); only
    "bounded or not" is compiled in, the sizes are runtime arguments (kernels/mask.py).
    Launch: torch tensors and floats straight into the tvm-ffi build (kernels/compile_cache.py)."""
    import torch

    b, s_q, h_q, d = q.shape
    s_k = k.shape[1]
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[q.dtype]
    if d not in (64, 128, 256) or h_q % k.shape[2]:
        raise ValueError(f"need D in (64, 128, 256) and H_q % H_kv == 0, got D={d}, H={h_q}/{k.shape[2]}")
    # TMA: last dim contiguous, other strides multiples of 16 bytes
    q, k, v = [t if t.stride(-1) == 1 and all(st % 8 == 0 for st in t.stride()[:-1]) else t.contiguous()
               for t in (q, k, v)]
    (has_l, has_r), window = mask_mod.window_args(window_size, causal, s_q, s_k)
    # window flags join the key only when set: the unwindowed key (and cache entry) is unchanged
    win_kw = {k: True for k, on in (("window_left", has_l), ("window_right", has_r)) if on}
    cap = softcap if softcap is not None else 50.0
    tuning = _persistent_tuning(tuning, q.device)
    fixed_kw = _fixed_max_kw(mode if stage is None else stage.mode, dtype, cap, tuning)
    tuning_items = tuple(sorted(dict(tuning or {}, **win_kw, **fixed_kw).items()))
    if stage is None:
        stage, cfg = _stage_and_config(mode, evaluator, dtype, d, causal, tuning_items, program)
    else:
        cfg = _config_for_stage(stage, dtype, d, causal, tuning_items)
    if stage.mode == "sigmoid":
        stage.check_dtype(dtype == "bf16")   # BF16 P programs: BF16 inputs only
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    params = [float(x) for x in stage.host_scalars(
        scale, s_k, softcap=cap, sigmoid_bias=sigmoid_bias)]
    if out is None:
        out = torch.empty_like(q)
    lse_t = lse if lse is not None else torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    tensors = (q, k, v, out, lse_t)
    _compiled(cfg)(*tensors, *params, *window)
    return out, (lse_t if stage.has_lse else None)


if __name__ == "__main__":
    import os, sys, time
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    t0 = time.time()
    mode = sys.argv[1] if len(sys.argv) > 1 else "softmax"
    ev = sys.argv[2] if len(sys.argv) > 2 else "native"
    compile_attn_fwd(AttnFwdConfig.default(stages.make_stage(mode, ev)))
    print(f"compiled {mode}/{ev} in {time.time() - t0:.1f}s")
