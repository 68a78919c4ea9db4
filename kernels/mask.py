"""Which key blocks a query tile visits, and the element mask for the blocks that need one.

Causal masking is aligned to the bottom-right corner, like flash-attn >= 2.1 and
`flash_attn_poly.reference.causal_mask`: query row i may see key column j iff
j <= i + (S_k - S_q).  With S_q > S_k the first S_q - S_k rows see no key at all:
the kernel writes a zero output row and LSE = -inf for them.

Key blocks are visited from the highest index down (n_max - 1, ..., n_min), so the
first block handled is the one holding the sequence tail and the causal diagonal:
only the first block and the blocks crossing the diagonal pay for the mask
(`n_unmasked_end` below), the interior blocks run mask-free.

Sliding window (flash-attn's window_size=(left, right), -1 = unbounded): with the same
shift s = S_k - S_q, row i sees key j iff i + s - left <= j <= i + s + right; causal is
right = 0 (the reference ANDs the two masks, so causal wins over any right >= 0).  Only
"is there a left / right bound" is compile-time (`has_left`, `has_right`); the sizes are
runtime Int32, so one build serves every window.  With a left bound the low key blocks
are skipped too (`n_block_min`) and the blocks at the window's left edge are masked
(`n_left_clean`).  Without a window every helper emits exactly the unwindowed code.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dataclass(frozen=True)
class BlockRange:
    """Compile-time tile sizes; the methods take the runtime sequence lengths."""

    tile_m: int
    tile_n: int
    causal: bool
    has_left: bool = False    # window_size[0] >= 0
    has_right: bool = False   # window_size[1] >= 0 and not causal (causal already bounds at 0)

    @property
    def bounds_right(self) -> bool:
        return self.causal or self.has_right

    @cute.jit
    def n_block_max(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32,
                    win_right: Int32 = 0) -> Int32:
        """One past the last key block that any row of m_block may see (can be <= 0)."""
        return self.n_block_end((m_block + 1) * self.tile_m, seqlen_q, seqlen_k, win_right)

    @cute.jit
    def n_block_end(self, row_end: Int32, seqlen_q: Int32, seqlen_k: Int32, win_right: Int32 = 0) -> Int32:
        """One past the last key block that any row below row_end may see (the rows of a tile, or of
        one consumer warpgroup: the bound is their last row's)."""
        n_max = cute.ceil_div(seqlen_k, self.tile_n)
        if cutlass.const_expr(self.bounds_right):
            # last visible column of the last row, + 1
            col_end = row_end + seqlen_k - seqlen_q
            if cutlass.const_expr(self.has_right):
                col_end = col_end + win_right
            n_max = cutlass.min(n_max, cute.ceil_div(cutlass.max(col_end, 0), self.tile_n))
        return n_max

    @cute.jit
    def n_unmasked_end(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32,
                       win_right: Int32 = 0) -> Int32:
        """Key blocks [0, n_unmasked_end) need no causal/right-window mask for any row of m_block.

        Block n is mask-free iff its last column (n+1)*tile_n - 1 is visible to the tile's
        first row m_block*tile_m, i.e. n < (m_block*tile_m + S_k - S_q + right + 1) / tile_n.
        """
        return self.n_unmasked_from(m_block * self.tile_m, seqlen_q, seqlen_k, win_right)

    @cute.jit
    def n_unmasked_from(self, row_lo: Int32, seqlen_q: Int32, seqlen_k: Int32, win_right: Int32 = 0) -> Int32:
        """n_unmasked_end for the rows from row_lo on (a tile's, or one consumer warpgroup's)."""
        n_end = cute.ceil_div(seqlen_k, self.tile_n)
        if cutlass.const_expr(self.bounds_right):
            first_row_end = row_lo + seqlen_k - seqlen_q + 1
            if cutlass.const_expr(self.has_right):
                first_row_end = first_row_end + win_right
            n_end = cutlass.max(first_row_end, 0) // self.tile_n
        return n_end

    def n_block_min(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, win_left: Int32):
        """First key block any row of m_block may see: the tile's first row sees columns
        >= m_block*tile_m + S_k - S_q - left.  The Python int 0 without a left bound, so
        offsets by it fold away at trace time."""
        if not self.has_left:
            return 0
        col_start = m_block * self.tile_m + seqlen_k - seqlen_q - win_left
        return cutlass.max(col_start, 0) // self.tile_n

    def n_left_clean(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32, win_left: Int32):
        """Key blocks >= n_left_clean need no left-window mask: their first column is seen by
        the tile's last row, n*tile_n >= m_block*tile_m + tile_m - 1 + S_k - S_q - left.
        Always >= n_block_min.  The Python int 0 without a left bound."""
        if not self.has_left:
            return 0
        col = (m_block + 1) * self.tile_m - 1 + seqlen_k - seqlen_q - win_left
        return cute.ceil_div(cutlass.max(col, 0), self.tile_n)

def key_block_range(m_block: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, causal: bool,
                    has_left: bool = False, has_right: bool = False, win_left: int = 0,
                    win_right: int = 0) -> tuple[int, int]:
    """Host mirror of BlockRange.n_block_min / n_block_max: (first, one past the last) key block
    that any row of query block m_block may see (the tile scheduling models of the plan; the
    range may be empty).  Same arithmetic on Python ints."""
    n_max = -(-seqlen_k // tile_n)
    if causal or has_right:
        col_end = (m_block + 1) * tile_m + seqlen_k - seqlen_q + (win_right if has_right else 0)
        n_max = min(n_max, -(-max(col_end, 0) // tile_n))
    n_min = max(m_block * tile_m + seqlen_k - seqlen_q - win_left, 0) // tile_n if has_left else 0
    return n_min, n_max


def is_zero(x) -> bool:
    """Is x the Python literal 0 that a build without the bound or shift passes (unwindowed, top-aligned
    tiles), so that an offset by it folds away at trace time and leaves the code as is?"""
    return isinstance(x, int) and x == 0


def sub0(a, b):
    """a - b, and just a when b is the literal 0 of an unwindowed build (keeps its code as is)."""
    return a if is_zero(b) else a - b


def add0(a, b):
    """a + b, and just b when a is the literal 0 of an unwindowed build."""
    return b if is_zero(a) else a + b


def q_bottom_shift(seqlen_q: int, tile_pos: int) -> int:
    """Host mirror of the forward's fwd.q_bottom shift (AttnFwdSm90._q_shift): the positions in front of
    the first tile's first row when tiles of tile_pos positions end at S_q's end."""
    return -seqlen_q % tile_pos


@cute.jit
def apply_mask(
    acc_S_mn: cute.Tensor,
    tScS_mn: cute.Tensor,
    m_block: Int32,
    n_block: Int32,
    seqlen_q: Int32,
    seqlen_k: Int32,
    tile_m: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    causal: cutlass.Constexpr[bool],
    has_left: cutlass.Constexpr[bool] = False,
    has_right: cutlass.Constexpr[bool] = False,
    win_left: Int32 = 0,
    win_right: Int32 = 0,
    bits: cutlass.Constexpr[bool] = False,
    pack: cutlass.Constexpr[int] = 1,
):
    """Set masked scores to -inf. acc_S_mn: (rows, cols) view of the S accumulator;
    tScS_mn: the same view of its (row, col) coordinates inside the tile.  Window bounds as
    in the module docstring (has_right is ignored when causal: the causal bound is tighter).
    bits: per row one keep mask of the thread's columns (apply_mask_bits) instead of one
    integer compare per score.  pack: the packed-GQA tile's heads per position (a row's query
    position is its packed row // pack; 1: rows are positions)."""
    if cutlass.const_expr(bits):
        apply_mask_bits(acc_S_mn, tScS_mn, m_block, n_block, seqlen_q, seqlen_k, tile_m, tile_n, causal,
                        has_left, has_right, win_left, win_right, pack)
        return
    col_base = n_block * tile_n
    for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
        row, col_end = row_key_end(tScS_mn, r, m_block, seqlen_q, seqlen_k, tile_m, causal, has_left,
                                   has_right, win_right, pack)
        col_end = col_end - col_base
        if cutlass.const_expr(has_left):
            # first visible column, tile-relative; one more compare per score on masked blocks
            col_start = row + seqlen_k - seqlen_q - win_left - col_base
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                if tScS_mn[0, c][1] >= col_end or tScS_mn[0, c][1] < col_start:
                    acc_S_mn[r, c] = -Float32.inf
        else:
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                if tScS_mn[0, c][1] >= col_end:
                    acc_S_mn[r, c] = -Float32.inf


@cute.jit
def row_key_end(tScS_mn, r: cutlass.Constexpr[int], m_block, seqlen_q, seqlen_k, tile_m: cutlass.Constexpr[int],
                causal: cutlass.Constexpr[bool], has_left: cutlass.Constexpr[bool],
                has_right: cutlass.Constexpr[bool], win_right, pack: cutlass.Constexpr[int] = 1):
    """(query row of the thread's row r, or None where no bound needs it; one past the last key
    that row sees: S_k without a right bound).  pack > 1 (packed GQA): the tile holds tile_m / pack
    positions of pack heads each, row m of the tile is position m // pack."""
    row = None
    end = seqlen_k
    if cutlass.const_expr(causal or has_right or has_left):
        if cutlass.const_expr(pack > 1):
            row = m_block * (tile_m // pack) + tScS_mn[r, 0][0] // pack
        else:
            row = m_block * tile_m + tScS_mn[r, 0][0]
    if cutlass.const_expr(causal):
        end = cutlass.min(row + 1 + seqlen_k - seqlen_q, seqlen_k)
    elif cutlass.const_expr(has_right):
        end = cutlass.min(row + 1 + seqlen_k - seqlen_q + win_right, seqlen_k)
    return row, end


@dsl_user_op
def keep_below(k: Int32, *, loc=None, ip=None) -> Int32:
    """A word with bits 0 .. k-1 set: 0 for k <= 0, all ones for k >= 32 (PTX shr clamps shift
    amounts above the width, which LLVM's shift would leave undefined)."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(k).ir_value(loc=loc, ip=ip)],
        "{ .reg .s32 t; .reg .b32 ones; sub.s32 t, 32, $1; max.s32 t, t, 0; mov.b32 ones, 0xffffffff; "
        "shr.b32 $0, ones, t; }", "=r,r", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def elements_below(limit: Int32) -> Int32:
    """How many of a thread's accumulator columns lie below `limit`, a column measured from the
    thread's first column: in acc_mn_view's column order a thread holds columns
    (c // 2) * 8 + c % 2 (pairs of adjacent columns, 8 apart), so the kept columns are a prefix
    of its elements, of length limit // 8 * 2 + min(limit % 8, 2) (0 for limit <= 0)."""
    lim = cutlass.max(limit, 0)
    return (lim // 8) * 2 + cutlass.min(lim % 8, 2)


@cute.jit
def apply_mask_bits(acc_S_mn, tScS_mn, m_block, n_block, seqlen_q, seqlen_k, tile_m: cutlass.Constexpr[int],
                    tile_n: cutlass.Constexpr[int], causal: cutlass.Constexpr[bool],
                    has_left: cutlass.Constexpr[bool], has_right: cutlass.Constexpr[bool], win_left, win_right,
                    pack: cutlass.Constexpr[int] = 1):
    """apply_mask with one keep word per row and 32 columns: the row's visible columns, a prefix
    (right bound) and a suffix (left bound) of the thread's elements, become a bit mask; each
    score tests its constant bit (ptxas moves a word's bits into predicates with R2P), so the
    per-score work is a predicated select instead of an add and a compare per column."""
    ncols = cute.size(acc_S_mn, mode=[1])
    assert ncols == tile_n // 4, "apply_mask_bits: a (64 x tile_n) wgmma C fragment, acc_mn_view order"
    col0 = n_block * tile_n + tScS_mn[0, 0][1]   # this thread's first column, in keys
    for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
        row, end = row_key_end(tScS_mn, r, m_block, seqlen_q, seqlen_k, tile_m, causal, has_left, has_right,
                               win_right, pack)
        k_end = elements_below(end - col0)
        if cutlass.const_expr(has_left):
            k_start = elements_below(row + seqlen_k - seqlen_q - win_left - col0)
        for s in cutlass.range_constexpr((ncols + 31) // 32):
            keep = keep_below(k_end - 32 * s)
            if cutlass.const_expr(has_left):
                keep = keep & ~keep_below(k_start - 32 * s)
            for i in cutlass.range_constexpr(min(32, ncols - 32 * s)):
                if keep & Int32(1 << i if i < 31 else -(1 << 31)) == 0:
                    acc_S_mn[r, 32 * s + i] = -Float32.inf


# ------------------------------------------------------------------ backward (key-major tiles)
@cute.jit
def query_block_range(n_block: Int32, seqlen_q: Int32, seqlen_k: Int32, tile_m: cutlass.Constexpr[int],
                      tile_n: cutlass.Constexpr[int], causal: cutlass.Constexpr[bool],
                      has_left: cutlass.Constexpr[bool] = False, has_right: cutlass.Constexpr[bool] = False,
                      win_left: Int32 = 0, win_right: Int32 = 0):
    """Query blocks [m_min, m_max) that see key block n_block (the backward's tile skipping).

    Key j is seen by rows j - s - right <= i <= j - s + left (s = S_k - S_q, causal: right
    = 0): the block's first key bounds m_min, its last key (+ left) bounds m_max."""
    m_max = cute.ceil_div(seqlen_q, tile_m)
    m_min = Int32(0)
    if cutlass.const_expr(causal or has_right):
        first_row = n_block * tile_n - (seqlen_k - seqlen_q)
        if cutlass.const_expr(has_right and not causal):
            first_row = first_row - win_right
        if first_row > 0:
            m_min = first_row // tile_m
    if cutlass.const_expr(has_left):
        rows_end = (n_block + 1) * tile_n - (seqlen_k - seqlen_q) + win_left   # last row + 1
        m_max = cutlass.min(m_max, cute.ceil_div(cutlass.max(rows_end, 0), tile_m))
    return m_min, m_max


@cute.jit
def tile_needs_mask(n0: Int32, m0: Int32, shift: Int32, tile_m: cutlass.Constexpr[int],
                    tile_n: cutlass.Constexpr[int], causal: cutlass.Constexpr[bool],
                    has_left: cutlass.Constexpr[bool], has_right: cutlass.Constexpr[bool],
                    win_left: Int32, win_right: Int32):
    """Does the (query rows m0.., keys n0..) tile hold a hidden (row, key) pair?  Right
    bound: the first row must see the last key; left bound: the last row must see the first."""
    need = False
    if cutlass.const_expr(causal):
        need = m0 + shift < n0 + tile_n - 1
    elif cutlass.const_expr(has_right):
        need = m0 + shift + win_right < n0 + tile_n - 1
    if cutlass.const_expr(has_left):
        need = need or n0 < m0 + tile_m - 1 + shift - win_left
    return need


@cute.jit
def key_hidden(key: Int32, row_s: Int32, causal: cutlass.Constexpr[bool],
               has_left: cutlass.Constexpr[bool], has_right: cutlass.Constexpr[bool],
               win_left: Int32, win_right: Int32):
    """Is key hidden from the query row whose shifted index is row_s = row + S_k - S_q?"""
    hidden = False
    if cutlass.const_expr(causal):
        hidden = key > row_s
    elif cutlass.const_expr(has_right):
        hidden = key > row_s + win_right
    if cutlass.const_expr(has_left):
        hidden = hidden or key < row_s - win_left
    return hidden
