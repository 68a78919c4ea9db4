"""Which key blocks a query tile visits, and the element mask for the blocks that need one.

Causal masking is aligned to the bottom-right corner, like flash-attn >= 2.1 and
`flash_attn_poly.reference.causal_mask`: query row i may see key column j iff
j <= i + (S_k - S_q).  With S_q > S_k the first S_q - S_k rows see no key at all:
the kernel writes a zero output row and LSE = -inf for them.

Key blocks are visited from the highest index down (n_max - 1, ..., n_min), so the
first block handled is the one holding the sequence tail and the causal diagonal:
only the first block and the blocks crossing the diagonal pay for the mask
(`n_unmasked_end` below), the interior blocks run mask-free.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32


@dataclass(frozen=True)
class BlockRange:
    """Compile-time tile sizes; the methods take the runtime sequence lengths."""

    tile_m: int
    tile_n: int
    causal: bool

    @cute.jit
    def n_block_max(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32) -> Int32:
        """One past the last key block that any row of m_block may see (can be <= 0)."""
        n_max = cute.ceil_div(seqlen_k, self.tile_n)
        if cutlass.const_expr(self.causal):
            # last visible column of the tile's last row, + 1
            col_end = (m_block + 1) * self.tile_m + seqlen_k - seqlen_q
            n_max = cutlass.min(n_max, cute.ceil_div(cutlass.max(col_end, 0), self.tile_n))
        return n_max

    @cute.jit
    def n_unmasked_end(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32) -> Int32:
        """Key blocks [0, n_unmasked_end) need no causal mask for any row of m_block.

        Block n is mask-free iff its last column (n+1)*tile_n - 1 is visible to the tile's
        first row m_block*tile_m, i.e. n < (m_block*tile_m + S_k - S_q + 1) / tile_n.
        """
        n_end = cute.ceil_div(seqlen_k, self.tile_n)
        if cutlass.const_expr(self.causal):
            first_row_end = m_block * self.tile_m + seqlen_k - seqlen_q + 1
            n_end = cutlass.max(first_row_end, 0) // self.tile_n
        return n_end


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
):
    """Set masked scores to -inf. acc_S_mn: (rows, cols) view of the S accumulator;
    tScS_mn: the same view of its (row, col) coordinates inside the tile."""
    col_base = n_block * tile_n
    for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
        col_end = seqlen_k
        if cutlass.const_expr(causal):
            row = m_block * tile_m + tScS_mn[r, 0][0]
            col_end = cutlass.min(row + 1 + seqlen_k - seqlen_q, seqlen_k)
        col_end = col_end - col_base
        for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
            if tScS_mn[0, c][1] >= col_end:
                acc_S_mn[r, c] = -Float32.inf
