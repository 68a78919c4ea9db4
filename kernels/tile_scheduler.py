"""Map a CTA to its (m_block, head, batch) work tile.

One CTA per (query tile, head, batch): grid = (ceil(S_q / tile_m), H_q, B).  For causal
attention the query tiles are handed out last-first, so the CTAs with the most key
blocks (the bottom rows of the causal triangle) start in the first wave and the short
ones fill the tail: at S=4096, tile 128, the longest tile has 32 key blocks, the
shortest 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@dataclass(frozen=True)
class SingleTileScheduler:
    longest_first: bool

    @staticmethod
    def grid(num_m_blocks, num_heads, batch):
        return (num_m_blocks, num_heads, batch)

    @cute.jit
    def work_tile(self):
        bx, head, batch = cute.arch.block_idx()
        m_block = bx
        if cutlass.const_expr(self.longest_first):
            gx, _, _ = cute.arch.grid_dim()
            m_block = gx - 1 - bx
        return Int32(m_block), Int32(head), Int32(batch)
