"""Named barrier ids of the attention kernels, one enum per kernel so that no two uses collide.

Id 0 is the CTA-wide barrier (__syncthreads); the pipelines' mbarriers live in shared memory
and are not counted here.  A named barrier synchronises the threads that arrive at it: the
thread count is passed at each use.
"""
from __future__ import annotations

import enum


class FwdBarrier(enum.IntEnum):
    """kernels/attn_fwd_sm90.py."""
    # ping-pong: warpgroup w may issue its GEMMs once the other has arrived at PINGPONG + w
    # (its 128 waiting threads + the other's 128 arriving)
    PINGPONG = 1          # PINGPONG + w: consumer warpgroup w's turn (w < 3: ids 1-3)
    # o_smem: consumer warpgroup w's 128 threads around its staged O rows (EPILOGUE + w, w < 3)
    EPILOGUE = 4


class BwdBarrier(enum.IntEnum):
    """kernels/attn_bwd_sm90.py and kernels/bwd_reduce.py."""
    DS_READY = 1          # dS tile complete in smem (the 256 MMA threads)
    TURN = 2              # deterministic builds: counter seen / adds issued (256 MMA threads)
    DQ_FULL = 3           # dq_async: dQ tile staged in smem (256 MMA threads arrive, warp 1 waits)
    DQ_EMPTY = 4          # dq_async: warp 1 has read the staged tile (it arrives, MMA threads wait)
    DO_TAIL = 5           # varlen sigmoid: dO rows past the sequence zeroed in smem (256 MMA threads)
    # dkv_smem: every wgmma of the loop has read K and V (256 MMA threads), then warpgroup w's
    # 64 rows of dK / dV are staged (DKV_STAGED + 1 + w, its 128 threads)
    DKV_STAGED = 6
    # dq_halves: warpgroup w's half of the staged dQ tile (its 128 threads + warp 1): written
    # (DQ_FULL_HALF + w), read by warp 1's bulk add (DQ_EMPTY_HALF + w); ids 9-12
    DQ_FULL_HALF = 9
    DQ_EMPTY_HALF = 11
    # p_turns: warpgroup w runs its P block once the other's is done (P_TURN + w: its 128 waiting
    # threads + the other's 128 arriving; ids 13, 14)
    P_TURN = 13
