"""The varlen kernels' tile tables in one launch each (sm_90a CuTe DSL): the backward's CTA table
(BwdTableKernel) and the forward's compact order (CompactTableKernel, its docstring).

tile_scheduler.varlen_bwd_table's contract (the order, the entry words), built by one CTA of
TABLE_THREADS threads instead of some 40 small torch ops (a sort, a search, the section decode:
each a launch of its own between the pre and the main kernel).  Thread i < B owns sequence i:

1. its length S_i = cu[i + 1] - cu[i] and its entries (key blocks x heads) to shared memory;
2. its rank in the longest-first order (torch.sort(descending=True, stable=True): rank = the
   sequences longer than it, or as long and earlier) and, in the same pass over the lengths
   (broadcast reads), the entries of the sequences ahead of it; it writes its entries' end and
   its index at its rank;
3. every thread then walks the entries j < count (= the last end) strided by the CTA: the
   sequence by a binary search over the ends (searchsorted right), the (key block, head) by
   the same section decode as tile_scheduler.lpt_tiles.

Step 2 costs B iterations of ~14 instructions per owner thread, B^2 in all; step 3 ~200-275
instructions per entry (the search and the section decode's divisions), all on one SM: from a
hundred or so sequences the walk is most of the launch (docs/MEASURED.md varlen-table-kernel-cost).
At most TABLE_MAX_SEQS sequences take this kernel (the host builds longer lists with the torch
ops).  Entries past count are not written (the main kernel's CTAs past count exit before reading
theirs).  The table's words are int32: (key block << 18) |
sequence, then the head.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.memory import SmemAllocator

from .config import COMPACT_SEQ_BITS, VARLEN_TABLE_MAX_SEQS

TABLE_MAX_SEQS = VARLEN_TABLE_MAX_SEQS
TABLE_THREADS = TABLE_MAX_SEQS      # one sequence per thread in steps 1 and 2
SEARCH_STEPS = 11                   # binary search over <= 1024 ends: ceil(log2(1025))


class BwdTableKernel:
    """mCu (B + 1,) int32 offsets, mTable int32 of >= 1 + 2 x count words; tile_n, heads and
    group (heads per section, <= heads) are runtime values, so one build serves every shape."""

    @cute.kernel
    def kernel(self, mCu: cute.Tensor, mTable: cute.Tensor, tile_n: Int32, heads: Int32, group: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        b = mCu.shape[0] - 1
        smem = SmemAllocator()
        sLen = smem.allocate_tensor(Int32, cute.make_layout(TABLE_MAX_SEQS), byte_alignment=16)
        sEnd = smem.allocate_tensor(Int32, cute.make_layout(TABLE_MAX_SEQS), byte_alignment=16)
        sSeq = smem.allocate_tensor(Int32, cute.make_layout(TABLE_MAX_SEQS), byte_alignment=16)
        sEnt = smem.allocate_tensor(Int32, cute.make_layout(TABLE_MAX_SEQS), byte_alignment=16)
        if tidx < b:
            n = mCu[tidx + 1] - mCu[tidx]
            sLen[tidx] = n
            sEnt[tidx] = (n + tile_n - 1) // tile_n * heads    # its entries: key blocks x heads
        cute.arch.barrier()
        if tidx < b:
            own = sLen[tidx]
            rank = Int32(0)
            before = Int32(0)          # entries of the sequences ahead of this one
            for j in cutlass.range(b, unroll=1):
                other = sLen[j]
                if other > own or (other == own and j < tidx):
                    rank += 1
                    before += sEnt[j]
            sEnd[rank] = before + sEnt[tidx]
            sSeq[rank] = tidx
        cute.arch.barrier()
        count = Int32(0)
        if b > 0:
            count = sEnd[b - 1]
        if tidx == 0:
            mTable[0] = count
        for j in cutlass.range(tidx, count, TABLE_THREADS, unroll=1):
            lo = Int32(0)              # the first rank whose end exceeds j
            hi = b
            for _ in cutlass.range_constexpr(SEARCH_STEPS):
                if lo < hi:
                    mid = (lo + hi) // 2
                    if sEnd[mid] > j:
                        hi = mid
                    else:
                        lo = mid + 1
            seq = sSeq[lo]
            local = j - (sEnd[lo] - sEnt[seq])
            blocks = sEnt[seq] // heads
            per_section = group * blocks   # > 0: a sequence that owns entry j has a block
            section = local // per_section
            within = local - section * per_section
            width = heads - section * group
            if width > group:
                width = group
            block = within // width
            mTable[1 + 2 * j] = (block << COMPACT_SEQ_BITS) | seq
            mTable[2 + 2 * j] = section * group + (within - block * width)

    @cute.jit
    def __call__(self, mCu: cute.Tensor, mTable: cute.Tensor, tile_n: Int32, heads: Int32, group: Int32,
                 stream):
        self.kernel(mCu, mTable, tile_n, heads, group).launch(
            grid=(1, 1, 1), block=[TABLE_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        vec = lambda: cute.runtime.make_fake_tensor(Int32, (cute.sym_int(32),), (1,), assumed_align=4)  # noqa: E731
        return [vec(), vec(), Int32(128), Int32(1), Int32(1)]


class CompactTableKernel:
    """The varlen forward's compact order (tile_scheduler.compact_varlen_table's contract): mCu
    (B + 1,) int32 offsets, mTable int32 of >= 1 + levels x B words, tile_m and levels (query
    tiles of the longest sequence) runtime values.  Thread b < B owns sequence b and its query
    tiles ceil(S_b / tile_m); level by level, longest first, the CTA compacts the sequences that
    have a tile at that level in sequence order (a warp ballot and the warps' counts in shared
    memory: a block-wide prefix per level, two barriers), entry (m << 18) | b."""

    @cute.kernel
    def kernel(self, mCu: cute.Tensor, mTable: cute.Tensor, tile_m: Int32, levels: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // 32
        b = mCu.shape[0] - 1
        sWarp = SmemAllocator().allocate_tensor(Int32, cute.make_layout(TABLE_THREADS // 32), byte_alignment=16)
        tiles = Int32(0)
        if tidx < b:
            tiles = (mCu[tidx + 1] - mCu[tidx] + tile_m - 1) // tile_m
        below = cute.arch.lanemask_lt()
        pos = Int32(0)                 # entries of the levels above this one
        for level in cutlass.range(levels, unroll=1):
            m = levels - 1 - level
            live = tiles > m
            ballot = cute.arch.vote_ballot_sync(live)
            if tidx % 32 == 0:
                sWarp[warp] = cute.arch.popc(ballot)
            cute.arch.barrier()
            ahead = Int32(0)
            total = Int32(0)
            for w in cutlass.range_constexpr(TABLE_THREADS // 32):
                n = sWarp[w]
                total += n
                if w < warp:
                    ahead += n
            if live:
                mTable[1 + pos + ahead + cute.arch.popc(ballot & below)] = (m << COMPACT_SEQ_BITS) | tidx
            pos += total
            cute.arch.barrier()        # every warp has read sWarp before the next level writes it
        if tidx == 0:
            mTable[0] = pos

    @cute.jit
    def __call__(self, mCu: cute.Tensor, mTable: cute.Tensor, tile_m: Int32, levels: Int32, stream):
        self.kernel(mCu, mTable, tile_m, levels).launch(grid=(1, 1, 1), block=[TABLE_THREADS, 1, 1], stream=stream)

    def fake_args(self):
        vec = lambda: cute.runtime.make_fake_tensor(Int32, (cute.sym_int(32),), (1,), assumed_align=4)  # noqa: E731
        return [vec(), vec(), Int32(128), Int32(1)]


def build(key):
    """(kernel, compile args) of a TableKey: the compile cache's build."""
    kern = CompactTableKernel() if key.kind == "compact" else BwdTableKernel()
    return kern, kern.fake_args()
