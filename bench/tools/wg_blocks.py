"""Warpgroup-blocks a forward runs per query head (host count, no GPU): with the tile's key range every
consumer warpgroup of a tile runs every key block the tile's rows see; with `fwd.wg_skip` each runs only
the blocks its own 64 rows see, and none when its rows are past S_q (or, `fwd.q_bottom`, all before the
sequence's first row).  The ratio is the GEMM work the skip removes (what the tensor pipe would save if it
bound; the score stage's latency does not shrink with it).  --bottom: the tiles aligned to S_q's end
(q_bottom), so the partial tile is the first.

    python bench/tools/wg_blocks.py                 # the table of bench/results/fwd_wg_skip.md
    python bench/tools/wg_blocks.py --seqlen 1024 --tile 192x64 --causal --pack 1 [--bottom] [--left 255]
"""
from __future__ import annotations

import argparse

from flash_attn_poly.kernels.mask import key_block_range, q_bottom_shift

ROWS_PER_WG = 64


def count(seqlen: int, tile_m: int, tile_n: int, causal: bool, pack: int = 1, bottom: bool = False,
          left: int = -1) -> tuple[int, int]:
    """(tile range, own range) warpgroup-blocks over one (KV) head's query tiles, S_q = S_k = seqlen;
    pack > 1: packed GQA (row r holds position r // pack of the group's query heads); bottom: q_bottom's
    tiles (the kernel's: a query sequence of shift more positions in front, whose rows are never run);
    left >= 0: a left window (keys >= row - left; the tile's first block, the own range keeps it)."""
    tile_pos = tile_m // pack
    shift = q_bottom_shift(seqlen, tile_pos) if bottom else 0
    seq_v = seqlen + shift
    rows = seq_v * pack
    tile = own = 0
    for m in range(-(-rows // tile_m)):
        lo, hi = key_block_range(m, seq_v, seqlen, tile_pos, tile_n, causal, has_left=left >= 0, win_left=max(left, 0))
        n_tile = max(hi - lo, 0)
        tile += (tile_m // ROWS_PER_WG) * n_tile
        for w in range(tile_m // ROWS_PER_WG):
            r0 = m * tile_m + w * ROWS_PER_WG
            if r0 >= rows or r0 + ROWS_PER_WG <= shift * pack:
                continue
            pos_end = (r0 + ROWS_PER_WG - 1) // pack + 1
            n_own = min(hi, -(-(pos_end - shift) // tile_n)) if causal else hi   # real positions
            own += max(n_own - lo, 0)
    return tile, own


CELLS = [  # (label, S, tile_m, tile_n, causal, pack)
    ("softcap D=128 MHA causal", 512, 192, 64, True, 1), ("", 1024, 192, 64, True, 1), ("", 2048, 192, 64, True, 1),
    ("", 4096, 192, 64, True, 1),
    ("softcap D=128 MHA non-causal", 512, 192, 64, False, 1), ("", 1024, 192, 64, False, 1),
    ("softcap D=128 GQA 4 packed causal", 1024, 192, 64, True, 4), ("", 4096, 192, 64, True, 4),
    ("D=64 192x128 MHA causal", 2048, 192, 128, True, 1), ("", 4096, 192, 128, True, 1),
    ("D=64 192x128 non-causal", 512, 192, 128, False, 1),
    ("D=64 GQA 4 packed causal", 4096, 192, 128, True, 4),
    ("D=256 128x64 causal", 512, 128, 64, True, 1), ("", 2048, 128, 64, True, 1),
    ("D=128 128x128 causal", 1024, 128, 128, True, 1),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int)
    ap.add_argument("--tile", default="192x64", help="tile_m x tile_n")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--pack", type=int, default=1)
    ap.add_argument("--bottom", action="store_true", help="q_bottom's tiles (aligned to S_q's end)")
    ap.add_argument("--left", type=int, default=-1, help="a left window (window_size's left; -1: none)")
    a = ap.parse_args()
    cells = CELLS
    if a.seqlen:
        tm, tn = map(int, a.tile.split("x"))
        cells = [("", a.seqlen, tm, tn, a.causal, a.pack)]
    if a.bottom:
        print("Tiles aligned to S_q's end (q_bottom):\n")
    print("| build | S | tile | causal | pack | tile range | own range | own / tile |")
    print("|---|---|---|---|---|---|---|---|")
    for label, s, tm, tn, causal, pack in cells:
        t, o = count(s, tm, tn, causal, pack, a.bottom, a.left)
        print(f"| {label} | {s} | {tm} x {tn} | {causal} | {pack} | {t} | {o} | {o / t:.3f} |")


if __name__ == "__main__":
    main()
