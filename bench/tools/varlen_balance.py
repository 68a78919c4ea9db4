"""CPU: how evenly the varlen forward's persistent orders spread a ragged batch over the CTAs.

    python bench/tools/varlen_balance.py            # bench/varlen.py's ragged batches (seeds 0-2) and two equal ones

A host model of the persistent grid (min(tiles, SMs) CTAs, tile t of round r to CTA c in snake
order, kernels/tile_scheduler.persistent_tile): a causal query tile costs its key blocks plus a
fixed cost (--fixed, in key blocks), a skipped slot --dead.  For the plan's order (slots of the
longest sequence's query tiles over (sequence, head) units in L2 sections, the dead ones skipped:
SectionLptScheduler.tile_at) and the compact order (live pairs only, longest first:
compact_varlen_table) it prints the busiest CTA's work over the mean (1.0 = perfect balance), and
a greedy list schedule (each tile to the CTA free first) as the bound a dynamic scheduler reaches.

The backward (bwd_balance): a CTA per entry of the varlen backward's table (kernels/tile_scheduler.
varlen_bwd_table) in either order (bwd.varlen_order: unit, block), the hardware handing the next
CTA to the first free SM (a greedy list schedule in table order, one CTA per SM); a causal key
block costs the query blocks at and after it plus the fixed cost.  Printed for 8 KV heads (the
per-KV-head loop of 32/8: one section) and 32 query heads (a CTA per query head: L2-sized sections
at D = 128).
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def tile_cost(m: int, length: int, tile_m: int, tile_n: int, fixed: float) -> float:
    return fixed + -(-min((m + 1) * tile_m, length) // tile_n)


def balance(lens, heads=32, head_dim=128, sms=132, tile_m=128, tile_n=128, fixed=1.0, dead=0.02) -> dict:
    import numpy as np
    import torch
    from flash_attn_poly.kernels.tile_scheduler import (L2_SECTION_BYTES, compact_tile, compact_varlen_table,
                                                        persistent_lpt_tile, persistent_tile)
    b, mx = len(lens), max(lens)
    nb = -(-mx // tile_m)
    group = min(max((L2_SECTION_BYTES // (head_dim * 4)) // max(mx, 1) * 4, 1), heads * b)  # section_heads, GQA 4
    slots = nb * heads * b
    ctas = min(slots, sms)
    out = {}
    for name in ("slots", "compact"):
        if name == "slots":
            order, n = None, slots
        else:
            cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
            order = compact_varlen_table(cu, mx, tile_m)
            n = int(order[0]) * heads
        work, costs = np.zeros(ctas), []
        for c in range(ctas):
            for r in range(-(-n // ctas)):
                t = persistent_tile(r, c, ctas)
                if t >= n:
                    continue
                if order is None:
                    m, _, s = persistent_lpt_tile(t, nb, heads, b, group, True)
                else:
                    m, _, s = compact_tile(t, order, heads)
                if m * tile_m < lens[s]:
                    w = tile_cost(m, lens[s], tile_m, tile_n, fixed)
                    work[c] += w
                    costs.append(w)
                else:
                    work[c] += dead
        out[name] = float(work.max() / (sum(costs) / sms))
    heap = [0.0] * sms
    for w in sorted(costs, reverse=True):
        heapq.heappush(heap, heapq.heappop(heap) + w)
    out["greedy"] = max(heap) / (sum(costs) / sms)
    out["live_fraction"] = len(costs) / slots
    return out


def bwd_balance(lens, heads: int, order: str, head_loop: bool, head_dim=128, sms=132, tile_m=128, tile_n=128,
                fixed=1.0) -> float:
    """The busiest SM's work over the mean for the varlen backward's table in `order` (its sections
    as kernels/dispatch.backward_varlen cuts them: varlen_bwd_section)."""
    import torch
    from flash_attn_poly.kernels.tile_scheduler import varlen_bwd_section, varlen_bwd_table, varlen_bwd_tile
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    table = varlen_bwd_table(cu, max(lens), tile_n, heads, sum(lens),
                             varlen_bwd_section(order, head_loop, heads, max(lens), head_dim))
    work = []
    for j in range(int(table[0])):
        n, _, b = varlen_bwd_tile(j, table)
        work.append(fixed + -(-(lens[b] - n * tile_n) // tile_m))
    free = [0.0] * sms
    for w in work:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free) / (sum(work) / sms)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fixed", type=float, default=1.0, help="a live tile's fixed cost, in key blocks")
    p.add_argument("--dead", type=float, default=0.02, help="a skipped slot's cost, in key blocks")
    p.add_argument("--tile-m", type=int, default=128)
    a = p.parse_args(argv)
    from varlen import ragged_lengths
    cases = [(f"ragged 32k seed {s}", ragged_lengths(32768, s)) for s in (0, 1, 2)]
    cases += [("equal 8 x 4096", [4096] * 8), ("equal 16 x 1024", [1024] * 16)]
    print("busiest CTA's work / mean (H 32/8, D 128, 132 SMs, causal)")
    for name, lens in cases:
        r = balance(lens, tile_m=a.tile_m, fixed=a.fixed, dead=a.dead)
        print(f"{name:18s} live slots {r['live_fraction']:4.0%}  plan's order {r['slots']:.3f}  "
              f"compact {r['compact']:.3f}  greedy bound {r['greedy']:.3f}")
    print("backward: busiest SM's work / mean (causal, 128 x 128 blocks, 132 SMs, D 128), table order unit / block;"
          " 8 KV heads (head_loop), 32 query heads (a CTA per query head)")
    for name, lens in cases:
        cells = "  ".join(f"{h} heads {bwd_balance(lens, h, 'unit', h == 8):.3f} / "
                          f"{bwd_balance(lens, h, 'block', h == 8):.3f}" for h in (8, 32))
        print(f"{name:18s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
