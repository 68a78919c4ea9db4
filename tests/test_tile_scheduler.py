"""CPU tier: the CTA orders of kernels/tile_scheduler.py (host mirrors of the device code)."""
import os

import pytest

pytest.importorskip("cutlass")

from flash_attn_poly.kernels import tile_scheduler as T  # noqa: E402


@pytest.mark.parametrize("num_blocks,num_heads,group", [(32, 32, 8), (7, 5, 2), (1, 1, 1), (33, 12, 5),
                                                        (64, 8, 8), (3, 40, 32), (5, 8, 6)])
@pytest.mark.parametrize("reverse", [False, True])
def test_lpt_order_is_a_bijection(num_blocks, num_heads, group, reverse):
    tiles = [T.lpt_tile(i, num_blocks, num_heads, group, reverse) for i in range(num_blocks * num_heads)]
    assert sorted(tiles) == [(b, h) for b in range(num_blocks) for h in range(num_heads)]


def test_lpt_order_longest_first_inside_sections():
    # 8 heads, sections of 6 then 2: every head's first block before any head's second one
    tiles = [T.lpt_tile(i, 4, 8, 6, reverse=True) for i in range(32)]
    assert tiles[:6] == [(3, h) for h in range(6)]
    assert tiles[6:12] == [(2, h) for h in range(6)]
    assert tiles[24:] == [(3, 6), (3, 7), (2, 6), (2, 7), (1, 6), (1, 7), (0, 6), (0, 7)]


def test_heads_per_section():
    # backward at S=4096, D=128: Q + dO (16-bit) + FP32 dQ = 4 MB per head -> 8 heads in 32 MB
    assert T.heads_per_section(32, 4096, 128 * 8) == 8
    assert T.heads_per_section(32, 1 << 20, 128 * 8) == 1          # never below one head
    assert T.heads_per_section(4, 128, 128 * 8) == 4                # never above all heads
    # forward: K + V rows of a KV head, shared by its 4 query heads
    assert T.heads_per_section(32, 4096, 128 * 4, 4) == 32


@pytest.mark.parametrize("tiles,ctas", [(1024, 132), (512, 132), (5, 3), (7, 7), (100, 7), (1, 132), (133, 132)])
def test_persistent_tiles_cover_each_tile_once(tiles, ctas):
    """A persistent grid of min(tiles, ctas) CTAs, each walking rounds until its index passes
    the tile count (the kernel's loop), visits every tile exactly once."""
    g = min(tiles, ctas)
    rounds = -(-tiles // g)
    seen = [T.persistent_tile(r, c, g) for c in range(g) for r in range(rounds)]
    assert sorted(t for t in seen if t < tiles) == list(range(tiles))


def test_persistent_snake_balances_lpt_tiles():
    """Causal anchor shape (32 query tiles x 32 heads, LPT order: block-major, longest
    first): the snake walk's longest CTA is within 1% of the mean load (a plain round-robin's
    is 10% above it), counting a per-tile cost of one block."""
    lengths = [nb + 1 + 1 for nb in reversed(range(32)) for _ in range(32)]   # blocks + 1 per tile
    g = 132
    rounds = -(-len(lengths) // g)
    load = [sum(lengths[t] for r in range(rounds) if (t := T.persistent_tile(r, c, g)) < len(lengths))
            for c in range(g)]
    rr = [sum(lengths[t] for t in range(c, len(lengths), g)) for c in range(g)]
    mean = sum(lengths) / g
    assert max(load) <= 1.01 * mean and max(rr) >= 1.1 * mean, (max(load), max(rr), mean)


@pytest.mark.parametrize("num_blocks,num_heads,num_batch,group", [(8, 32, 16, 256), (7, 5, 3, 10), (4, 8, 2, 12),
                                                                  (1, 1, 1, 1), (32, 32, 1, 32)])
def test_persistent_order_is_a_bijection_over_batches(num_blocks, num_heads, num_batch, group):
    n = num_blocks * num_heads * num_batch
    tiles = [T.persistent_lpt_tile(i, num_blocks, num_heads, num_batch, group, True) for i in range(n)]
    assert sorted(tiles) == [(b, h, z) for b in range(num_blocks) for h in range(num_heads) for z in range(num_batch)]
    # heads of one batch stay adjacent (a KV head's query heads share its K/V in L2)
    k = min(4, num_heads, group)
    assert tiles[:k] == [(num_blocks - 1, hh, 0) for hh in range(k)]


def _makespan(order, ctas, cost):
    """Longest persistent CTA's load over the mean: CTA c walks persistent_tile(r, c, ctas)."""
    rounds = -(-len(order) // ctas)
    load = [sum(cost(order[t]) for r in range(rounds) if (t := T.persistent_tile(r, c, ctas)) < len(order))
            for c in range(ctas)]
    return max(load) / (sum(load) / ctas)


@pytest.mark.parametrize("batch,seqlen", [(16, 1024), (4, 4096), (8, 2048), (1, 4096)])
def test_persistent_order_balances_batched_causal_shapes(batch, seqlen):
    """Causal forward tiles of 128 rows, 32/8 heads, D = 128, 132 CTAs; a tile costs its key
    blocks plus 1.5 blocks of fixed cost.  Over (batch, head) units the snake keeps the longest
    CTA within 5% of the mean at every batch; an order that restarts longest-first in every
    batch (the batch as the slowest index) is 1.2x at B = 16, S = 1k."""
    nb, h = seqlen // 128, 32
    group = T.heads_per_section(h * batch, seqlen, 128 * 4, 4)
    cost = lambda tile: tile[0] + 1 + 1.5
    order = [T.persistent_lpt_tile(i, nb, h, batch, group, True) for i in range(nb * h * batch)]
    assert _makespan(order, 132, cost) <= 1.05
    if batch == 16:
        g1 = T.heads_per_section(h, seqlen, 128 * 4, 4)
        per_batch = [T.lpt_tile(i, nb, h, g1, True) for i in range(nb * h)]
        old = [(b, hh, z) for z in range(batch) for b, hh in per_batch]
        assert _makespan(old, 132, cost) >= 1.2


@pytest.mark.parametrize("lens,tile_m", [([1000, 0, 1, 128, 129, 4096, 300], 128), ([5, 0, 7], 192), ([0, 0], 128),
                                         ([4096] * 3, 128), ([1] * 40, 64)])
def test_compact_varlen_order_walks_every_live_tile_once_longest_first(lens, tile_m):
    """The compact varlen order (FwdConfig.varlen_compact): the table built from the offsets on
    the device side's torch ops, decoded by the host mirror of the kernel's decode, holds every
    (query tile, head, sequence) inside a sequence exactly once, none past its end, query tiles
    descending (a causal tile's cost), a sequence's heads adjacent."""
    import itertools
    import torch
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    table = T.compact_varlen_table(cu, max(lens), tile_m)
    assert table.dtype == torch.int32 and table.shape == (1 + -(-max(lens) // tile_m) * len(lens),)
    heads = 3
    tiles = [T.compact_tile(t, table, heads) for t in range(int(table[0]) * heads)]
    want = {(m, h, b) for b, n in enumerate(lens) for m in range(-(-n // tile_m)) for h in range(heads)}
    assert len(tiles) == len(want) and set(tiles) == want
    assert [m for m, _, _ in tiles] == sorted((m for m, _, _ in tiles), reverse=True)
    assert all(tiles[i][2] == tiles[i + 1][2] for i in range(0, len(tiles), heads) for i in range(i, i + heads - 1))


def test_compact_varlen_table_refuses_what_its_entries_cannot_hold():
    import torch
    with pytest.raises(ValueError, match="varlen_compact: at most"):
        T.compact_varlen_table(torch.zeros(3, dtype=torch.int32), T.COMPACT_MAX_TILES * 128 + 1, 128)


def test_varlen_balance_model_of_the_two_orders():
    """bench/tools/varlen_balance.py's host model, on bench/varlen.py's ragged batch (seed 0): the
    plan's slot order leaves the busiest CTA >= 5% above the mean work, the compact order within 2%
    (the reason for FwdConfig.varlen_compact; docs/NOTES_varlen.md cites 1.097-1.115 / 1.003-1.007)."""
    import os
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.join(root, "bench"), os.path.join(root, "bench", "tools")]
    try:
        import varlen_balance as vb
        from varlen import ragged_lengths
    finally:
        del sys.path[:2]
    r = vb.balance(ragged_lengths(32768, 0))
    assert r["slots"] > 1.05 and r["compact"] < 1.02 and r["greedy"] <= r["compact"] + 1e-9, r


@pytest.mark.parametrize("lens,tile_n,heads", [([300, 0, 1, 128, 129, 700], 128, 2), ([4096] * 3, 128, 4),
                                               ([0, 0], 128, 3), ([1] * 40, 128, 1), ([5278, 63, 1191], 128, 8)])
@pytest.mark.parametrize("order,section", [("unit", 1), ("block", 0), ("block", 3)])
def test_varlen_backward_table_walks_every_live_key_block_once(lens, tile_n, heads, order, section):
    """The varlen backward's CTA table (AttnBwdSm90Varlen): every (key block, query head,
    sequence) inside a sequence exactly once, none past its end, within the host's grid bound
    (which stays within the table, so the CTAs past the count read in bounds); sequences longest
    first, then (unit order) head, key blocks ascending inside a (sequence, head), or (block
    order) sections of `section` heads (0 here: all; the last one narrower), in each key block
    ascending, heads fastest; the unit order is the block order of one head per section."""
    import itertools
    import torch
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    mx = max(max(lens), 1)
    w = heads if section <= 0 else min(section, heads)
    table = T.varlen_bwd_table(cu, mx, tile_n, heads, sum(lens), w)
    ctas = T.varlen_bwd_ctas(sum(lens), len(lens), mx, tile_n, heads)
    count = int(table[0])
    assert table.dtype == torch.int32 and table.numel() == 1 + T.BWD_TABLE_WORDS * ctas
    assert count <= ctas <= -(-mx // tile_n) * len(lens) * heads
    tiles = [T.varlen_bwd_tile(j, table) for j in range(count)]
    want = {(n, h, b) for b, s in enumerate(lens) for n in range(-(-s // tile_n)) for h in range(heads)}
    assert len(tiles) == len(want) and set(tiles) == want
    rank = {b: r for r, b in enumerate(sorted(range(len(lens)), key=lambda b: -lens[b]))}
    key = [(rank[b], h, n) if order == "unit" else (rank[b], h // w, n, h) for n, h, b in tiles]
    assert key == sorted(key)


def test_varlen_backward_block_order_balances_equal_lengths():
    """The block order is the dense LPT grid's within a batch: on equal causal lengths a greedy
    list schedule of its entries (a CTA's work: the query blocks at and after its key block, plus
    one for its fixed cost) keeps the busiest of 132 SMs within 1% of the mean; the unit order
    (each head's key blocks longest first, then the next head's) leaves it 5-8% over with 8 heads
    (a KV head's CTAs: the head_loop builds), ~2% with 32; an unknown order is refused by name."""
    import heapq
    import itertools
    import torch
    for lens, heads in (([4096] * 8, 8), ([8192] * 4, 8), ([4096] * 8, 32)):
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
        spread = {}
        for order in T.VARLEN_BWD_ORDERS:
            table = T.varlen_bwd_table(cu, max(lens), 128, heads, sum(lens), 1 if order == "unit" else heads)
            work = [-(-lens[b] // 128) - n + 1 for n, h, b in (T.varlen_bwd_tile(j, table) for j in range(int(table[0])))]
            sms = [0.0] * 132
            for w in work:
                heapq.heappush(sms, heapq.heappop(sms) + w)
            spread[order] = max(sms) / (sum(work) / 132)
        assert spread["block"] < 1.01 and spread["unit"] > (1.05 if heads == 8 else 1.01), (lens, heads, spread)
    with pytest.raises(ValueError, match="bwd.varlen_order"):
        T.varlen_bwd_section("lpt", True, 8, 4096, 128)
    with pytest.raises(ValueError, match="section"):
        T.varlen_bwd_table(cu, 4096, 128, 8, sum(lens), 0)
    # the sections the dense LPT grid cuts: all KV heads in head_loop builds; L2-sized groups of query
    # heads otherwise (Q, dO and the FP32 dQ accumulator rows of the longest sequence)
    assert T.varlen_bwd_section("block", True, 8, 16384, 128) == 8
    assert T.varlen_bwd_section("block", False, 32, 4096, 128) == T.heads_per_section(32, 4096, 1024) == 8
    assert T.varlen_bwd_section("block", False, 32, 512, 64) == 32
    assert T.varlen_bwd_section("unit", True, 8, 16384, 128) == T.varlen_bwd_section("unit", False, 32, 512, 64) == 1


def _causal_costs(seqlen, tile_m, tile_n):
    nb = -(-seqlen // tile_m)
    return nb, [min(-(-seqlen // tile_n), -(-(m + 1) * tile_m // tile_n)) * tile_n + T.TILE_FIXED_KEYS
                for m in range(nb)]


@pytest.mark.parametrize("batch,seqlen,hq,hkv,d", [(1, 16384, 16, 16, 256), (4, 4096, 16, 16, 256),
                                                   (32, 512, 16, 16, 256), (1, 16384, 16, 8, 256),
                                                   (4, 4096, 32, 32, 128), (2, 8192, 32, 32, 128),
                                                   (1, 4096, 32, 8, 128), (16, 1024, 32, 8, 128),
                                                   (2, 8192, 32, 32, 64)])
def test_persistent_cta_count_balances_sectioned_causal_orders(batch, seqlen, hq, hkv, d):
    """The host model behind AttnPlan.fwd_ctas: the snake over the sectioned LPT order on all 132
    SMs leaves its busiest CTA 1.2-1.7x the mean where a section holds one to four rounds of tiles
    (causal D = 256, MHA); the count persistent_ctas picks keeps the busiest CTA within 1.035x of
    the 132-SM mean (the ideal) at every shape here, and is never worse than 132."""
    tile_m, tile_n = (192, 128) if d == 64 else (128, 64 if d == 256 else 128)
    nb, cost = _causal_costs(seqlen, tile_m, tile_n)
    units = hq * batch
    group = T.heads_per_section(units, seqlen, d * 4, hq // hkv)
    order = [T.persistent_lpt_tile(i, nb, hq, batch, group, True) for i in range(nb * units)]
    costs = [cost[b] for b, _, _ in order]
    ideal = sum(costs) / 132
    ctas = T.persistent_ctas(132, nb, units, group, cost, True)
    assert 116 <= ctas <= 132
    import torch
    busiest = lambda c: float(T.snake_loads(torch.tensor(costs, dtype=torch.float64), c).max())
    assert busiest(ctas) <= busiest(132) and busiest(ctas) <= 1.035 * ideal, (ctas, busiest(ctas) / ideal)
    if (d, hq) == (256, 16) and hkv == 16 and seqlen >= 4096:
        assert busiest(132) >= 1.4 * ideal        # the imbalance the count removes


def test_snake_loads_matches_the_walk():
    """snake_loads is the vectorised form of the persistent_tile walk."""
    import torch
    costs = [float((7 * i) % 13 + 1) for i in range(50)]
    for ctas in (1, 6, 7, 50, 64):
        walk = [0.0] * ctas
        for r in range(-(-50 // ctas)):
            for c in range(ctas):
                t = T.persistent_tile(r, c, ctas)
                if t < 50:
                    walk[c] += costs[t]
        assert T.snake_loads(torch.tensor(costs, dtype=torch.float64), ctas).tolist() == walk


def _visible_blocks(m, s_q, s_k, tm, tn, causal, has_left, has_right, wl, wr):
    """Key blocks holding a key that some row of query block m sees (every row of the tile,
    tail rows past S_q included, as the kernel's block range counts them), by brute force."""
    shift = s_k - s_q
    seen = set()
    for row in range(m * tm, (m + 1) * tm):
        for col in range(s_k):
            if (causal and col > row + shift) or (has_right and col > row + shift + wr) or \
                    (has_left and col < row + shift - wl):
                continue
            seen.add(col // tn)
    return seen


@pytest.mark.parametrize("s_q,s_k", [(256, 256), (200, 333), (333, 200), (64, 640), (700, 65)])
@pytest.mark.parametrize("causal,has_left,has_right,wl,wr", [
    (False, False, False, 0, 0), (True, False, False, 0, 0), (True, True, False, 100, 0),
    (False, True, True, 50, 7), (False, False, True, 0, 129), (False, True, False, 0, 0)])
def test_key_block_range_is_the_visible_blocks(s_q, s_k, causal, has_left, has_right, wl, wr):
    """kernels/mask.key_block_range (the host mirror of BlockRange.n_block_min / n_block_max,
    which the plan's CTA-count model counts with) spans exactly the key blocks a query block's
    rows see: first and one past the last, or an empty range where they see none."""
    from flash_attn_poly.kernels.mask import key_block_range
    tm, tn = 64, 128
    for m in range(-(-s_q // tm)):
        lo, hi = key_block_range(m, s_q, s_k, tm, tn, causal, has_left, has_right, wl, wr)
        seen = _visible_blocks(m, s_q, s_k, tm, tn, causal, has_left, has_right, wl, wr)
        if seen:
            assert (lo, hi) == (min(seen), max(seen) + 1), (m, lo, hi, sorted(seen))
        else:
            assert hi <= lo, (m, lo, hi)


@pytest.mark.parametrize("s_q,s_k", [(256, 256), (200, 333), (333, 200), (700, 65)])
@pytest.mark.parametrize("causal,has_left,has_right,wl,wr", [
    (True, False, False, 0, 0), (True, True, False, 100, 0), (False, True, True, 50, 7), (False, False, False, 0, 0)])
@pytest.mark.parametrize("g,tm", [(2, 128), (4, 192), (8, 128), (16, 192)])
def test_packed_gqa_block_range_counts_positions(s_q, s_k, causal, has_left, has_right, wl, wr, g, tm):
    """Packed GQA (kernels/attn_fwd_sm90.py builds BlockRange with tile_m / g positions per tile): the
    range of packed tile m is exactly the key blocks its rows' positions (row // g, rows m tm ..
    (m + 1) tm - 1 of the g S_q packed rows) see."""
    from flash_attn_poly.kernels.mask import key_block_range
    tn = 128
    for m in range(-(-(g * s_q) // tm)):
        lo, hi = key_block_range(m, s_q, s_k, tm // g, tn, causal, has_left, has_right, wl, wr)
        # the packed tile's positions are those of an unpacked tile of tm / g rows
        seen = _visible_blocks(m, s_q, s_k, tm // g, tn, causal, has_left, has_right, wl, wr)
        rows = {r // g for r in range(m * tm, (m + 1) * tm)}
        assert rows == set(range(m * (tm // g), (m + 1) * (tm // g)))
        if seen:
            assert (lo, hi) == (min(seen), max(seen) + 1), (m, lo, hi, sorted(seen))
        else:
            assert hi <= lo, (m, lo, hi)


def test_varlen_backward_table_of_equal_lengths_is_built_once():
    """Where the shapes say every sequence has max_seqlen_k keys (total_k = batch x max_seqlen_k),
    varlen_bwd_table returns one cached table per device and shape (no device ops per call), equal
    entry for entry to the general build's; any other batch is built per call from its offsets."""
    import torch
    T.equal_bwd_table.cache_clear()
    for b, s, tile_n, heads, w in ((8, 4096, 128, 8, 8), (3, 200, 64, 32, 5), (1, 1, 128, 2, 1)):
        cu = torch.arange(b + 1, dtype=torch.int32) * s
        got = T.varlen_bwd_table(cu, s, tile_n, heads, b * s, w)
        assert torch.equal(got, T._bwd_table(cu, s, tile_n, heads, b * s, w)), (b, s)
        assert T.varlen_bwd_table(cu, s, tile_n, heads, b * s, w) is got   # cached
    hits = T.equal_bwd_table.cache_info().hits
    ragged = torch.tensor([0, 100, 300], dtype=torch.int32)
    a = T.varlen_bwd_table(ragged, 200, 128, 8, 300, 8)
    assert a is not T.varlen_bwd_table(ragged, 200, 128, 8, 300, 8)
    assert T.equal_bwd_table.cache_info().hits == hits
    # an empty batch and empty sequences take the general build
    assert int(T.varlen_bwd_table(torch.zeros(3, dtype=torch.int32), 0, 128, 8, 0, 8)[0]) == 0
    # during a CUDA graph capture (no host-to-device copy allowed) equal lengths take the device build too
    import unittest.mock as mock
    with mock.patch.object(T, "_capturing", return_value=True):
        cu = torch.arange(9, dtype=torch.int32) * 4096
        assert T.varlen_bwd_table(cu, 4096, 128, 8, 8 * 4096, 8) is not T.varlen_bwd_table(cu, 4096, 128, 8, 8 * 4096, 8)
    assert not T._capturing(torch.device("cpu"))


def test_l2_order_counts_the_sharing_the_sections_give():
    """bench/tools/l2_order.py (the count behind docs/MEASURED.md fwd-l2-section): at MHA S = 512,
    D = 128 on 132 CTAs a 32 MB section reads each head's K / V by ~1 CTA a round and reuses it after
    32 MB; 8 MB shares it among >2 CTAs and halves the distance; GQA 32/8 shares among 4 whatever
    the section."""
    import importlib.util
    ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("l2_order", os.path.join(ROOT, "bench", "tools", "l2_order.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    s32 = m.order_stats(32, 512, 32, 32, 128, 32, 132)
    s8 = m.order_stats(32, 512, 32, 32, 128, 8, 132)
    gqa = m.order_stats(32, 512, 32, 8, 128, 32, 132)
    assert s32["section_heads"] == 128 and 1.0 < s32["sharers"] < 1.1 and s32["reuse_mb"] == 32.0
    assert s8["sharers"] > 2 and s8["reuse_mb"] == 16.0 and s8["kv_mb_if_missed"] < s32["kv_mb_if_missed"] / 2
    assert 4.0 < gqa["sharers"] < 4.2
