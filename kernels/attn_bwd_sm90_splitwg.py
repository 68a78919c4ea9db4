"""Attention backward at head dim 256 without recomputation: the two MMA warpgroups split
the work of a 64-key x 64-query tile instead of its key rows.

    warpgroup 0: S^T = K Q^T -> P^T (registers), dS factor f -> smem;  dV += P^T dO
    warpgroup 1: dP^T = V dO^T;  dS^T = f o (dP^T - D) (f from smem) -> smem; dK += dS^T Q
    both:        dQ = dS K, columns [0, 128) on warpgroup 0 and [128, 256) on warpgroup 1

Each accumulator holds 64 keys x 256 columns = 128 FP32 registers per thread: one of dV or
dK per warpgroup. The chunked build (AttnBwdSm90 at D = 256) needs both per warpgroup, so
it splits D and computes S and dP twice. Registers per thread: warpgroup 0 holds dV 128,
S/f 32, packed P 16 and dQ 64. Shared memory: Q and dO in 2 stages (128 KB), K and V
(64 KB), dS double-buffered (16 KB), f (16 KB).

Per query block, three hand-offs on named barriers (256 threads each: one warpgroup arrives,
the other waits):
  F_FREE   warpgroup 1 has read f of the previous block (it pre-arrives once; the last
           block's arrival is left out, since nobody waits for it)
  F_READY  warpgroup 0 has written f
  DS_READY warpgroup 1 has written dS (and fenced it for the async proxy: both dQ products
           read it with wgmma)
f is stored as f_word(i, t): t is the thread in its warpgroup and i the C-fragment index, 4
values per 16-byte access. Both warpgroups' 64 x 64 fragments share one layout, so warpgroup 1's
thread t reads exactly the scores it computes dP for.

Not in this build: deterministic adds, dq_async (its staging buffer does not fit).
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op

try:  # installed package layout
    from flash_attn_poly.kernels.attn_bwd_sm90 import PDS_BARRIER_ID, AttnBwdSm90, transpose_view
except ImportError:  # running from the repository root
    from kernels.attn_bwd_sm90 import PDS_BARRIER_ID, AttnBwdSm90, transpose_view

F_READY_BARRIER_ID = 5
F_FREE_BARRIER_ID = 6


@dsl_user_op
def st_shared_v4_f32(addr: Int32, a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None):
    llvm.inline_asm(None, [Int32(addr).ir_value(loc=loc, ip=ip)] + [Float32(x).ir_value(loc=loc, ip=ip)
                                                                   for x in (a, b, c, d)],
                    "st.shared.v4.f32 [$0], {$1, $2, $3, $4};", "r,f,f,f,f", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def ld_shared_v4_f32(addr: Int32, *, loc=None, ip=None):
    ret = llvm.StructType.get_literal([T.f32()] * 4)
    res = llvm.inline_asm(ret, [Int32(addr).ir_value(loc=loc, ip=ip)],
                          "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,r",
                          has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return tuple(Float32(llvm.extractvalue(T.f32(), res, [i])) for i in range(4))


def f_word(i: int, t):
    """Word of fragment value i of thread t in the f buffer: 4 consecutive values per thread
    (one 16-byte access), threads side by side (a warp covers 512 contiguous bytes)."""
    return (i // 4) * 512 + t * 4 + i % 4


class AttnBwdSm90SplitWG(AttnBwdSm90):
    # one warpgroup each: S^T (or dP^T) = 64 keys x 64 queries, dV (or dK) = 64 keys x 256;
    # both: dQ = 64 queries x 256 split along the columns (the base's dq_split_n tiled MMA)
    key_row_wgs = 1

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        assert self.D == 256 and (self.tile_m, self.tile_n) == (64, 64), "split-warpgroup build: D 256, tile 64 x 64"
        assert not self.deterministic and not self.dq_async, "split-warpgroup build: no deterministic / dq_async"
        self.Dc, self.n_chunks, self.dq_split_n = self.D, 1, True   # whole rows: no column chunks

    def _aux_words(self) -> int:
        return self.tile_n * self.tile_m          # f: one FP32 dS factor per score

    @cute.jit
    def mma(self, mma_sdp, mma_dkv, mma_dq, sQ, sK, sV, sdO, sdS, sLSE, sDsum,
            pipe_q, pipe_do, pipe_kv, mdQacc, mdKacc, mdVacc, tidx,
            n_block, head, head_kv, batch, chunk, m_min, m_max, seqlen_q, seqlen_k, args):
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_dq = mma_dq.get_slice(cute.make_layout(2, stride=128)(wg))
        tQrdS = mma_dq.make_fragment_A(wg_dq.partition_A(sdS))
        tQrKt = mma_dq.make_fragment_B(wg_dq.partition_B(transpose_view(sK)))
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        if m_min < m_max:
            pipe_kv.consumer_wait(kv_state)
            if wg == 0:
                self.loop_p(mma_sdp, mma_dkv, mma_dq, sQ, sK, sdO, sLSE, tQrdS, tQrKt, pipe_q, pipe_do,
                            mdQacc, mdVacc, tidx, n_block, head, head_kv, batch, m_min, m_max,
                            seqlen_q, seqlen_k, args)
            else:
                self.loop_ds(mma_sdp, mma_dkv, mma_dq, sQ, sV, sdO, sdS, sDsum, tQrdS, tQrKt, pipe_q,
                             pipe_do, mdQacc, mdKacc, tidx, n_block, head, head_kv, batch, m_min, m_max,
                             seqlen_q, seqlen_k, args)

    def _barriers(self):
        return (pipeline.NamedBarrier(barrier_id=F_FREE_BARRIER_ID, num_threads=256),
                pipeline.NamedBarrier(barrier_id=F_READY_BARRIER_ID, num_threads=256),
                pipeline.NamedBarrier(barrier_id=PDS_BARRIER_ID, num_threads=256))

    @cute.jit
    def dq_block(self, mma_dq, tQrdS, tQrKt, buf, mdQacc, tidx, m_block, head, batch, seqlen_q):
        """Both warpgroups: this one's 128 columns of dQ = dS K, then their FP32 adds."""
        acc_dQ = cute.make_rmem_tensor(mma_dq.get_slice(tidx).partition_shape_C((self.tile_m, self.D)), Float32)
        self.gemm(mma_dq, acc_dQ, tQrdS[None, None, None, buf], tQrKt, True)
        warpgroup.commit_group()
        warpgroup.wait_group(0)
        return acc_dQ

    def _wg_operands(self, sA, sB, sBt, t):
        """One warpgroup's operands: S^T-like product A B^T (A = sA rows = keys, B = sB rows =
        queries), the 64 x 256 accumulator product's B = sBt^T, the C-fragment coordinates,
        the register A-operand shape and the zeroed 64 x 256 accumulator.  Fresh TiledMma
        objects: the loop sets ACCUMULATE on them, and a value set inside one warpgroup's
        branch must not reach the other's."""
        mma_sdp, mma_dkv, mma_dq = self._tiled_mmas()
        wg_s, wg_d = mma_sdp.get_slice(0), mma_dkv.get_slice(0)
        tSrA = mma_sdp.make_fragment_A(wg_s.partition_A(sA))
        tSrB = mma_sdp.make_fragment_B(wg_s.partition_B(sB))
        tBt = mma_dkv.make_fragment_B(wg_d.partition_B(transpose_view(sBt)))
        thr_s, thr_d = mma_sdp.get_slice(t), mma_dkv.get_slice(t)
        tScS = thr_s.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_m)))
        shape_a = thr_d.partition_shape_A((self.tile_n, self.tile_m))
        acc = cute.make_rmem_tensor(thr_d.partition_shape_C((self.tile_n, self.D)), Float32)
        acc.fill(0.0)
        return (mma_sdp, mma_dkv, mma_dq, self._tiled_mmas()[1]), tSrA, tSrB, tBt, tScS, shape_a, acc

    @cute.jit
    def loop_p(self, mma_sdp, mma_dkv, mma_dq, sQ, sK, sdO, sLSE, tQrdS, tQrKt, pipe_q, pipe_do,
               mdQacc, mdVacc, tidx, n_block, head, head_kv, batch, m_min, m_max, seqlen_q, seqlen_k, args):
        """Warpgroup 0: S^T, P^T and f, dV += P^T dO, its half of dQ; dV added at the end."""
        t = tidx % 128
        f_addr = args[-1]
        f_free, f_ready, ds_ready = self._barriers()
        mmas, tSrK, tSrQ, tVrdOt, tScS, shape_a, acc_dV = self._wg_operands(sK, sQ, sdO, t)
        mma_sdp, mma_dkv, mma_dq, mma_dkv_epi = mmas
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for m_block in cutlass.range(m_min, m_max, unroll=1):
            idx = state.index
            acc_S = cute.make_rmem_tensor(tScS.shape, Float32)
            pipe_q.consumer_wait(state)
            warpgroup.fence()
            self.gemm(mma_sdp, acc_S, tSrK, tSrQ[None, None, None, idx], True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            rP = cute.make_rmem_tensor(shape_a, self.dtype)
            self.probs(acc_S, rP, tScS, sLSE, idx, n_block, m_block, seqlen_q, seqlen_k, args)
            f_free.arrive_and_wait()
            for i in cutlass.range_constexpr(0, cute.size(acc_S), 4):
                st_shared_v4_f32(f_addr + f_word(i, t) * 4, acc_S[i], acc_S[i + 1], acc_S[i + 2], acc_S[i + 3])
            f_ready.arrive()
            pipe_do.consumer_wait(state)
            warpgroup.fence()
            self.gemm_acc(mma_dkv, acc_dV, rP, tVrdOt[None, None, None, idx], m_block != m_min)
            warpgroup.commit_group()
            ds_ready.arrive_and_wait()
            acc_dQ = self.dq_block(mma_dq, tQrdS, tQrKt, m_block % 2, mdQacc, tidx, m_block, head, batch, seqlen_q)
            pipe_q.consumer_release(state)
            pipe_do.consumer_release(state)
            self.atomic_tile(mma_dq, acc_dQ, mdQacc[None, None, head, batch], (self.tile_m, self.D),
                             m_block, seqlen_q, tidx, 0)
            state.advance()
        self.atomic_tile(mma_dkv_epi, acc_dV, mdVacc[None, None, head_kv, batch], (self.tile_n, self.D),
                         n_block, seqlen_k, t, 0)

    @cute.jit
    def loop_ds(self, mma_sdp, mma_dkv, mma_dq, sQ, sV, sdO, sdS, sDsum, tQrdS, tQrKt, pipe_q, pipe_do,
                mdQacc, mdKacc, tidx, n_block, head, head_kv, batch, m_min, m_max, seqlen_q, seqlen_k, args):
        """Warpgroup 1: dP^T, dS^T (f from smem) to registers and smem, dK += dS^T Q, its half
        of dQ; dK added at the end."""
        t = tidx % 128
        f_addr = args[-1]
        f_free, f_ready, ds_ready = self._barriers()
        mmas, tSrV, tSrdO, tKrQt, tScS, shape_a, acc_dK = self._wg_operands(sV, sdO, sQ, t)
        mma_sdp, mma_dkv, mma_dq, mma_dkv_epi = mmas
        r2s = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype),
            mma_sdp)
        thr_r2s = r2s.get_slice(t)
        tRSsdS = thr_r2s.partition_D(transpose_view(sdS))
        f_free.arrive()                              # the f buffer starts free
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for m_block in cutlass.range(m_min, m_max, unroll=1):
            idx = state.index
            buf = m_block % 2
            acc_dP = cute.make_rmem_tensor(tScS.shape, Float32)
            pipe_do.consumer_wait(state)
            warpgroup.fence()
            self.gemm(mma_sdp, acc_dP, tSrV, tSrdO[None, None, None, idx], True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            acc_F = cute.make_rmem_tensor(tScS.shape, Float32)
            f_ready.arrive_and_wait()
            for i in cutlass.range_constexpr(0, cute.size(acc_F), 4):
                acc_F[i], acc_F[i + 1], acc_F[i + 2], acc_F[i + 3] = ld_shared_v4_f32(f_addr + f_word(i, t) * 4)
            if m_block < m_max - 1:
                f_free.arrive()
            self.dscores(acc_F, acc_dP, tScS, sDsum, idx)
            rdS = cute.make_rmem_tensor(shape_a, self.dtype)
            cute.make_tensor(rdS.iterator, acc_dP.layout).store(acc_dP.load().to(self.dtype))
            cute.copy(r2s, thr_r2s.retile(cute.make_tensor(rdS.iterator, acc_dP.layout)), tRSsdS[None, None, None, buf])
            cute.arch.fence_view_async_shared()
            ds_ready.arrive()
            pipe_q.consumer_wait(state)
            warpgroup.fence()
            self.gemm_acc(mma_dkv, acc_dK, rdS, tKrQt[None, None, None, idx], m_block != m_min)
            warpgroup.commit_group()
            acc_dQ = self.dq_block(mma_dq, tQrdS, tQrKt, buf, mdQacc, tidx, m_block, head, batch, seqlen_q)
            pipe_q.consumer_release(state)
            pipe_do.consumer_release(state)
            self.atomic_tile(mma_dq, acc_dQ, mdQacc[None, None, head, batch], (self.tile_m, self.D),
                             m_block, seqlen_q, tidx, 0)
            state.advance()
        self.atomic_tile(mma_dkv_epi, acc_dK, mdKacc[None, None, head_kv, batch], (self.tile_n, self.D),
                         n_block, seqlen_k, t, 0)
