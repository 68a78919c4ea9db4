"""The compile-time configurations of the attention kernels: pure data, no defaults.

`FwdConfig` and `BwdConfig` are what changes the generated code of the forward and the
backward kernel (the compile-cache keys; shapes, scales and window sizes are runtime
arguments).  Every field is set by flash_attn_poly.plan, which holds the defaults and the
reason for each; this module only says which combinations a kernel can build
(`check_fwd`, `check_bwd`, CUTLASS's can_implement).  Pure Python: the plan and the launch
path read it without importing cutlass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .scores import ScoreSpec, split_fits_block

DTYPES = ("bf16", "fp16")
# The varlen kernels' tile tables (kernels/tile_scheduler.py: the forward's compact order, the
# backward's CTAs) hold (block << COMPACT_SEQ_BITS) | sequence in one int32 word.
COMPACT_SEQ_BITS = 18
COMPACT_MAX_SEQS = 1 << COMPACT_SEQ_BITS
COMPACT_MAX_TILES = 1 << (31 - COMPACT_SEQ_BITS)
# the packed backward's CTA table orders (plan AttnPlan.varlen_bwd_order, tile_scheduler.varlen_bwd_table)
VARLEN_BWD_ORDERS = ("unit", "block")
# the most sequences whose tile tables (the backward's CTA table, the forward's compact order) one CTA
# builds (kernels/varlen_table_sm90.py: a thread per sequence); longer lists take the torch ops
# (tile_scheduler.varlen_bwd_table, compact_varlen_table)
VARLEN_TABLE_MAX_SEQS = 1024
HEAD_DIMS = (64, 128, 256)
SMEM_BYTES = 232448          # dynamic shared memory per CTA on sm_90 (227 KB)
FWD_CONSUMER_WARPGROUPS = (2, 3)
# dtypes of the aux tensors a user score function may read (torch dtype names)
AUX_DTYPES = ("float32", "int32", "int64", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class FwdConfig:
    """The forward kernel's build (kernels/attn_fwd_sm90.py)."""
    score: ScoreSpec
    dtype: str                # "bf16" | "fp16"
    head_dim: int
    causal: bool
    window_left: bool         # the sliding window has a left bound (its size is a runtime Int32)
    window_right: bool        # ... a right bound (non-causal only; causal is right = 0)
    tile_m: int               # query rows per tile: 64 per consumer warpgroup (128: two, 192: three)
    tile_n: int               # keys per block
    num_stages: int           # K/V shared-memory pipeline depth
    pingpong: bool            # the two consumer warpgroups take turns issuing their GEMMs
    persistent: int           # > 0: a persistent grid of at most this many CTAs (the launch's count is
                              # AttnPlan.fwd_ctas, a runtime argument); 0: a CTA per tile
    row_max_chains: int       # independent running row maxima (1, 2, 4 or 8; exact in any order)
    row_sum_carry: bool       # a block's row sum starts from the rescaled running sum
    rescale_threshold: float  # keep a stale row max until it grows by more than this (log2 units)
    fixed_max: bool           # softcap: a constant row max c - 20 (no max, no O rescale)
    exp2_fma: int             # fixed_max: column groups of 8 whose P = 2^a runs on the FMA pipe
    varlen: bool              # packed sequences (cu_seqlens offsets; kernels/attn_fwd_sm90.py AttnFwdSm90Varlen)
    varlen_compact: bool      # varlen: walk only the live (query tile, sequence) pairs, longest first,
                              # from a device-built table (kernels/tile_scheduler.py); a plan override
    o_smem: bool              # the epilogue stages O through shared memory (stmatrix) and stores it in
                              # 16-byte row chunks, instead of 4-byte stores from the MMA fragment
    mask_bits: bool           # masked blocks: one keep word per row and 32 columns (kernels/mask.py
                              # apply_mask_bits) instead of an add and a compare per score
    pack_gqa: int = 1         # > 1: the GQA group's query heads packed into the M tile (row m = position
                              # m // pack_gqa of query head h_kv * pack_gqa + m % pack_gqa); the group size
    o_tma: bool = False       # o_smem: each warpgroup's staged rows leave by a TMA store (rows past S_q
                              # clipped by the tensor bounds) instead of 16-byte stores from registers
    wg_skip: bool = False     # each consumer warpgroup runs only the key blocks its own rows see (its causal /
                              # right-window bound), none when its rows are past S_q; the tile's other blocks
                              # it waits for and releases without a GEMM (the producer loads the tile's range)
    q_bottom: bool = False    # causal (a left window or none): query tiles aligned to S_q's end, so the partial
                              # tile is the first (the one with the fewest key blocks) instead of the last (the
                              # most); its rows before position 0 load as zeros (or the previous sequence's rows)
                              # and are never stored
    q_stages: int = 1         # Q buffers (2: a persistent CTA loads the next tile's Q while the
                              # current tile still reads its own)
    exp2_program: Any = None  # exp2_fma > 0: the exp2_f32 program (asm.programs.ProgramSpec) whose
                              # block takes those columns' 2^a: the score's own program in the exp2 offload
                              # (beside another score only when a plan override names it)


@dataclass(frozen=True, kw_only=True)
class BwdConfig:
    """The backward kernel's build (kernels/attn_bwd_sm90.py)."""
    score: ScoreSpec
    dtype: str                # "bf16" | "fp16"
    head_dim: int
    causal: bool
    window_left: bool
    window_right: bool
    tile_m: int               # query rows per block (the N of S^T): 64
    tile_n: int               # key rows per CTA (the M of S^T; 64 per MMA warpgroup)
    stages: int               # Q / dO pipeline depth
    deterministic: bool       # ordered dQ/dK/dV adds: bitwise reproducible gradients
    dq_async: bool            # dQ staged in smem and added by warp 1's bulk reductions
    lpt: bool                 # LPT-ordered CTAs (key blocks of L2-sized head sections)
    head_loop: bool           # a CTA per (key block, KV head) runs the whole GQA group
    kv_sections: bool         # head_loop's LPT order in L2-sized sections of KV heads (else one section)
    dkv_smem: bool            # head_loop's dK / dV staged through the K / V smem tiles, 16-byte row stores
    dq_halves: bool           # dq_async's staged tile as two warpgroup halves, each with its own barriers and bulk add
    varlen: bool              # packed sequences (cu_seqlens; kernels/attn_bwd_sm90.py AttnBwdSm90Varlen)
    swap: bool                # D = 256: dK^T / dV^T with the head dim on M, 64-key tiles (kernels/attn_bwd_swap_sm90.py)
    dp_first: bool            # the red.global dQ path: dP^T before S^T, dO released after dV
    p_turns: bool             # the two MMA warpgroups run their P blocks in turns (named barriers P_TURN + w)
    dq_defer: bool            # each warpgroup's dQ of a query block issued in the next step, after its dK: no
                              # DS_READY barrier; sdS buffers behind mbarriers (full / free), the warpgroups unlocked


def pack_gqa_fits(group: int) -> bool:
    """Can the forward pack a GQA group of this size into its tiles (1: unpacked)?  A power of two up
    to 64: a tile's rows are whole positions of every head of the group, and so are the epilogue's
    64-row bands (o_smem)."""
    return 1 <= group <= 64 and not group & (group - 1)


def fwd_smem_bytes(tile_m: int, tile_n: int, num_stages: int, head_dim: int, o_smem: bool, q_stages: int) -> int:
    """Shared memory of the forward's tiles (16-bit): q_stages Q tiles, num_stages K and V tiles, and
    o_smem's staging tile of tile_m rows x min(D, 128) columns (D = 256 writes O in two passes)."""
    return 2 * ((q_stages * tile_m + 2 * num_stages * tile_n) * head_dim + (tile_m * min(head_dim, 128) if o_smem else 0))


def fwd_smem_fits(tile_m: int, tile_n: int, num_stages: int, head_dim: int, o_smem: bool, q_stages: int) -> bool:
    """Do the forward's tiles fit sm_90's shared memory beside the mbarriers?"""
    return fwd_smem_bytes(tile_m, tile_n, num_stages, head_dim, o_smem, q_stages) <= SMEM_BYTES - 1024


def check_fwd(c: FwdConfig) -> None:
    """ValueError naming the field when the forward kernel cannot build c."""
    if c.dtype not in DTYPES or c.head_dim not in HEAD_DIMS:
        raise ValueError(f"forward: dtype {c.dtype!r} / head_dim {c.head_dim} not in {DTYPES} / {HEAD_DIMS}")
    wgs, rem = divmod(c.tile_m, 64)
    if rem or wgs not in FWD_CONSUMER_WARPGROUPS:
        raise ValueError(f"tile_m must be 128 or 192 (2 or 3 consumer warpgroups), got {c.tile_m}")
    if c.tile_n % 16 or not 16 <= c.tile_n <= 256:
        # keys are the K of the PV wgmma (16 per instruction for 16-bit inputs) and the N of the
        # QK wgmma and the rows of a K/V TMA box (both at most 256)
        raise ValueError(f"tile_n must be a multiple of 16 in [16, 256], got {c.tile_n}")
    if c.num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {c.num_stages}")
    if c.o_tma and not (c.o_smem and not c.varlen and c.pack_gqa == 1 and c.head_dim <= 128):
        # TMA's bounds clip only the tensor's last rows: packed sequences and packed GQA rows need the
        # per-row bound; D = 256 stages O in two passes through one 128-column tile
        raise ValueError(f"o_tma (O by TMA store) needs o_smem, a dense unpacked call and head_dim <= 128, got "
                         f"o_smem={c.o_smem}, varlen={c.varlen}, pack_gqa={c.pack_gqa}, head_dim={c.head_dim}")
    if c.q_stages not in (1, 2) or (c.q_stages == 2 and not c.persistent):
        raise ValueError(f"q_stages must be 1, or 2 with a persistent grid (persistent > 0), got {c.q_stages} "
                         f"(persistent={c.persistent})")
    tiles = fwd_smem_bytes(c.tile_m, c.tile_n, c.num_stages, c.head_dim, c.o_smem, c.q_stages)
    if tiles > SMEM_BYTES - 1024:   # room for the mbarriers
        raise ValueError(f"forward config needs {tiles} bytes of shared memory for Q ({c.tile_m} x "
                         f"{c.head_dim}){', its O staging tile' if c.o_smem else ''} and {c.num_stages} K/V "
                         f"stages of {c.tile_n} rows; sm_90 has {SMEM_BYTES}: lower num_stages or tile_n"
                         f"{' or set o_smem=False' if c.o_smem else ''}")
    if c.row_max_chains not in (1, 2, 4, 8):
        raise ValueError(f"row_max_chains must be 1, 2, 4 or 8, got {c.row_max_chains}")
    if not 0.0 <= c.rescale_threshold <= 16.0:   # p <= 2^t: keep P and row sums far from overflow
        raise ValueError(f"rescale_threshold must be in [0, 16] (log2 units), got {c.rescale_threshold!r}")
    if c.persistent < 0:
        raise ValueError(f"persistent must be >= 0 CTAs, got {c.persistent}")
    s = c.score
    if c.fixed_max and (s.kind != "softcap" or c.dtype != "bf16"):
        raise ValueError(f"fixed_max needs the softcap score and BF16, got {s.kind}/{c.dtype}")
    if not 0 <= c.exp2_fma <= 8 or (c.exp2_fma and not (
            c.exp2_program is not None and c.exp2_program.is_exp2 and c.fixed_max)):
        # softcap under its constant max: a bounded exp2 argument in the mask-free blocks
        raise ValueError(f"exp2_fma (column groups of 8 on the FMA pipe) needs 0..8, an exp2_f32 program and "
                         f"fixed_max, got {c.exp2_fma} (fixed_max={c.fixed_max}, score={s.kind}, "
                         f"exp2_program={c.exp2_program})")
    if c.exp2_program is not None and not c.exp2_fma:
        raise ValueError(f"exp2_program is exp2_fma's block: without exp2_fma it must be None, got {c.exp2_program}")
    if c.varlen and s.kind == "user":
        raise ValueError("varlen: no user score function (its batch index would be the packed tensor's), "
                         f"got score {s.kind!r}")
    if c.q_bottom and not (c.causal and not c.window_right):
        # only the causal bound makes a tile's cost depend on where its rows start; a left window keeps its
        # bounds on the shifted rows as the causal bound does (row - S_q + S_k, with S_q + q_shift on both sides)
        raise ValueError(f"q_bottom (query tiles aligned to S_q's end) needs a causal call (a left window allowed), "
                         f"got causal={c.causal}, window_right={c.window_right}")
    if c.varlen_compact and not c.varlen:
        raise ValueError("varlen_compact: the compact order is the varlen forward's (varlen = True)")
    if c.varlen and c.persistent <= 0:
        raise ValueError("varlen: the varlen forward is a persistent grid (persistent = the CTA count), "
                         f"got persistent {c.persistent}")
    if not pack_gqa_fits(c.pack_gqa):
        raise ValueError(f"pack_gqa (query heads per KV head packed into a tile) must be a power of two "
                         f"up to 64 (1: off), got {c.pack_gqa}")
    if c.pack_gqa > 1 and s.kind == "user":
        raise ValueError("pack_gqa: built-in scores only (a user score reads the query head and position of "
                         f"a row), got score {s.kind!r}")
    if s.evaluator == "poly" and not split_fits_block(s.poly_split, c.tile_n):
        raise ValueError(f"poly_split {s.poly_split} repeats every {8 * s.poly_split[1]} keys, more than "
                         f"the forward's key block (tile_n {c.tile_n}): the forward could not send the "
                         f"key columns the backward recomputes through the block; use k <= {c.tile_n // 8}")


def check_bwd(c: BwdConfig) -> None:
    """ValueError naming the field when the backward kernel cannot build c."""
    if c.dtype not in DTYPES or c.head_dim not in HEAD_DIMS:
        raise ValueError(f"backward: dtype {c.dtype!r} / head_dim {c.head_dim} not in {DTYPES} / {HEAD_DIMS}")
    if c.swap:
        # the swapped build (kernels/attn_bwd_swap_sm90.py): a CTA per 64 keys of a KV head, all 256
        # columns, dQ by red.global; no ordered adds, packed tables or user score stage
        bad = [f"{k}={v!r}" for k, v, ok in (
            ("head_dim", c.head_dim, c.head_dim == 256), ("tile_m", c.tile_m, c.tile_m == 64),
            ("tile_n", c.tile_n, c.tile_n == 64), ("head_loop", c.head_loop, c.head_loop),
            ("deterministic", c.deterministic, not c.deterministic),
            ("score", c.score.kind, c.score.kind != "user"), ("dq_async", c.dq_async, not c.dq_async),
            ("dp_first", c.dp_first, not c.dp_first), ("dkv_smem", c.dkv_smem, c.dkv_smem)) if not ok]
        if bad:
            raise ValueError(f"swap (the D = 256 backward with all columns per CTA) needs head_dim=256, "
                             f"64 x 64 tiles, head_loop, a built-in score, red.global dQ and dK / dV stored "
                             f"through the K / V tiles (dkv_smem), without deterministic or dp_first; "
                             f"got {', '.join(bad)}")
    if c.dq_async and c.deterministic:
        raise ValueError("dq_async: not with deterministic (the ordered adds run in the MMA threads)")
    if c.dq_async and c.head_dim > 128:
        raise ValueError("dq_async: the staged dQ tile does not fit D = 256's shared memory")
    if c.lpt and c.deterministic:
        raise ValueError("lpt: not with deterministic (the turn order needs the grid order)")
    if c.head_loop and c.deterministic:
        raise ValueError("head_loop: not with deterministic")
    if c.dkv_smem and not c.head_loop:
        raise ValueError("dkv_smem: head_loop builds store dK / dV (the others add them to FP32 accumulators)")
    if c.kv_sections and not (c.head_loop and c.lpt):
        raise ValueError(f"kv_sections: sections of head_loop's LPT order (head_loop and lpt), got "
                         f"head_loop={c.head_loop}, lpt={c.lpt}")
    if c.stages < 1:
        raise ValueError(f"stages must be >= 1, got {c.stages}")
    if c.score.kind == "sigmoid" and c.score.evaluator == "poly" and c.score.grad_rule != "surrogate":
        raise ValueError(f"backward score: sigmoid poly runs the surrogate rule's block only (the product rule "
                         f"recomputes P natively), got grad_rule {c.score.grad_rule!r}")
    if c.tile_m == 128 and c.score.kind == "user":
        # the 128-row step keeps a non-softmax dS factor as FP16 pairs (attn_bwd_sm90 f_packed):
        # right for the built-in scores' factors in [0, 1], not for a user function's derivative
        raise ValueError("backward tile_m=128: not with a user score function (its dS factor is kept in FP16)")
    if not c.swap and (c.tile_m not in (64, 128) or c.tile_n != 128 or (c.tile_m == 128 and c.head_dim != 64)):
        # 64 key rows per MMA warpgroup; dQ's warpgroups split its columns (tile_m 128: D = 64
        # only, the warpgroups split dQ's rows; docs/NOTES_attn_bwd.md)
        raise ValueError(f"backward tile must be 64 query rows x 128 keys, or 128 x 128 at D = 64, "
                         f"got tile_m={c.tile_m}, tile_n={c.tile_n}, D={c.head_dim}")
    if c.p_turns and (c.swap or c.deterministic):
        raise ValueError(f"p_turns: the unswapped, non-deterministic build's two MMA warpgroups take turns, got "
                         f"swap={c.swap}, deterministic={c.deterministic}")
    if c.dq_defer and not c.dq_halves:
        # the warpgroups meet only at the sdS buffers' mbarriers: one shared staged dQ tile (its
        # 256-thread named barriers) would put them back in step
        raise ValueError(f"dq_defer: each warpgroup's deferred dQ goes to its own half of the staged tile "
                         f"(dq_halves, with dq_async), got dq_async={c.dq_async}, dq_halves={c.dq_halves}")
    if c.dq_halves and not c.dq_async:
        # the halves are the staged tile's (its warpgroups' rows at tile_m 128, columns at 64)
        raise ValueError(f"dq_halves: halves of the staged dQ tile by warpgroup need dq_async, got "
                         f"dq_async={c.dq_async}; set dq_halves=False with it")
    if c.dp_first and c.dq_async:
        raise ValueError("dp_first: the red.global dQ path's order (dq_async off), got dq_async=True")
    if c.varlen and (c.deterministic or c.lpt or c.score.kind == "user"):
        raise ValueError("varlen backward: a CTA per entry of its (key block, head, sequence) table, without "
                         "deterministic turns, lpt or a user score function (its batch index would be the "
                         f"packed tensor's), got deterministic={c.deterministic}, lpt={c.lpt}, "
                         f"score {c.score.kind!r}")


def window_sizes(window, causal: bool, seqlen_q: int, seqlen_k: int) -> tuple:
    """The runtime (left, right) window sizes of flash-attn's window_size=(left, right) (-1:
    unbounded; 0 where that bound is not compiled in).  Sizes are clamped to S_q + S_k: a larger
    window is unbounded in effect, and the clamp keeps i + s + right inside Int32.  Causal makes
    the right bound 0 (compiled in), so its flag is off."""
    left, right = (int(window[0]), int(window[1]))
    has_left, has_right = left >= 0, right >= 0 and not causal
    cap = seqlen_q + seqlen_k
    return (min(left, cap) if has_left else 0, min(right, cap) if has_right else 0)
