"""Map a CTA to its (block, head, batch) work tile.

SectionLptScheduler (the forward's order; `lpt=True` in the backward key): the heads are cut
into sections whose working set fits a share of L2 (`heads_per_section`, computed in the
kernel from the runtime shapes), and inside a section the CTAs go out block-major, heads
fastest, longest block first.  Over the whole grid this is longest-processing-time-first
for causal attention, so the short CTAs fill the tail of every section, while the CTAs
that run together touch the tensors of a few heads only.  (A plain per-head order, query
tiles of head 0 first, starts the last head's longest CTA about when the grid is nearly
done: a late long job.)  grid = (num_blocks * H, 1, B).  The backward's deterministic build
keeps the plain launch order (blockIdx), which its turn protocol relies on.

persistent_tile: the forward's persistent grid (min(tiles, SMs) CTAs) walks one linear order,
CTA c taking one tile per round in snake order (SectionLptScheduler.tile_at decodes it).  That
order runs over (batch, head) units, heads fastest, cut into L2 sections across batches: with
the batch as the slowest index (the non-persistent grid's z), every batch would restart the
longest-first order, and the snake (which balances a monotonically shortening sequence) would
hand some CTAs two of the longest tiles per period and others two of the shortest.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .config import COMPACT_MAX_SEQS, COMPACT_MAX_TILES, COMPACT_SEQ_BITS  # noqa: F401 (the kernels import them here)
from .config import VARLEN_BWD_ORDERS, VARLEN_TABLE_MAX_SEQS

# Bytes of per-head working set a section may keep in L2 (sm_90 parts have 50 MB of L2).
L2_SECTION_BYTES = 32 << 20


def heads_per_section(num_heads: int, rows: int, bytes_per_row: int, heads_per_unit: int = 1,
                      section_bytes: int = L2_SECTION_BYTES) -> int:
    """Host mirror of section_heads (tests, notes)."""
    g = (section_bytes // bytes_per_row) // max(rows, 1) * heads_per_unit
    return max(1, min(num_heads, g))


@cute.jit
def section_heads(num_heads: Int32, rows: Int32, bytes_per_row: cutlass.Constexpr[int],
                  heads_per_unit: Int32, section_bytes=L2_SECTION_BYTES) -> Int32:
    """Heads per section: units of `heads_per_unit` heads whose `rows` rows of
    `bytes_per_row` bytes fit section_bytes (a constant, or the forward's runtime Int32 below
    2^31), at least 1 head, at most all (no 32-bit overflow: the bytes are divided first)."""
    budget = Int32(section_bytes // bytes_per_row) if cutlass.const_expr(isinstance(section_bytes, int)) \
        else section_bytes // bytes_per_row   # rows of the section
    g = budget // cutlass.max(rows, Int32(1)) * heads_per_unit
    return cutlass.min(cutlass.max(g, Int32(1)), num_heads)


def lpt_tile(lin: int, num_blocks: int, num_heads: int, group: int, reverse: bool) -> tuple[int, int]:
    """Host mirror of SectionLptScheduler.work_tile: (block, head) of linear CTA index lin."""
    per_section = group * num_blocks
    section, within = divmod(lin, per_section)
    head0 = section * group
    width = min(group, num_heads - head0)
    block, head = divmod(within, width)
    return (num_blocks - 1 - block if reverse else block), head0 + head


@dataclass(frozen=True)
class SectionLptScheduler:
    reverse: bool     # True: block num_blocks - 1 is the longest (causal forward query tiles)

    @staticmethod
    def grid(num_blocks, num_heads, batch):
        return (num_blocks * num_heads, 1, batch)

    @cute.jit
    def work_tile(self, num_blocks: Int32, num_heads: Int32, group: Int32):
        """(block, head, batch) of this CTA; group = heads per section (section_heads)."""
        lin, _, batch = cute.arch.block_idx()
        return self.decode(lin, batch, num_blocks, num_heads, group)

    @cute.jit
    def tile_at(self, t: Int32, num_blocks: Int32, num_heads: Int32, num_batch: Int32, group: Int32):
        """(block, head, batch) of linear tile t of the persistent forward's order: the LPT order
        over units u = batch * num_heads + head, sections of `group` units (section_heads over
        num_heads * num_batch: units of one KV head's query heads stay together, since
        num_heads is a multiple of that group)."""
        block, unit, _ = self.decode(t, Int32(0), num_blocks, num_heads * num_batch, group)
        batch = unit // num_heads
        return block, unit - batch * num_heads, batch

    @cute.jit
    def decode(self, lin: Int32, batch: Int32, num_blocks: Int32, num_heads: Int32, group: Int32):
        per_section = group * num_blocks
        section = lin // per_section
        within = lin - section * per_section
        head0 = section * group
        width = cutlass.min(group, num_heads - head0)      # the last section may be narrower
        block = within // width
        head = head0 + (within - block * width)
        if cutlass.const_expr(self.reverse):
            block = num_blocks - 1 - block
        return Int32(block), Int32(head), Int32(batch)


def lpt_tiles(lin, num_blocks, num_heads: int, group: int):
    """lpt_tile over a tensor of linear indices (torch, int64): (block, head) tensors, blocks not
    reversed.  num_blocks may be a tensor of the same shape (each index's own block count; an
    index past the count of a sequence with no block decodes to garbage, not a division by 0)."""
    import torch
    per_section = torch.clamp(torch.as_tensor(group * num_blocks), min=1)
    section = lin // per_section
    within = lin - section * per_section
    width = (num_heads - section * group).clamp(min=1, max=group)   # the last section may be narrower
    return within // width, section * group + within % width


def persistent_lpt_tile(t: int, num_blocks: int, num_heads: int, num_batch: int, group: int,
                        reverse: bool) -> tuple[int, int, int]:
    """Host mirror of SectionLptScheduler.tile_at: (block, head, batch) of linear tile t."""
    block, unit = lpt_tile(t, num_blocks, num_heads * num_batch, group, reverse)
    return block, unit % num_heads, unit // num_heads


# The persistent forward's CTA count (persistent_ctas): the snake balances a sequence of tiles that
# shortens monotonically, but the sectioned LPT order shortens within each section and starts
# over at the next, and where a section holds about one to four rounds of tiles the snake hands
# some CTAs the long tiles of two sections in a row (host model: the busiest CTA 1.2-1.7x the
# mean at causal D = 256 and MHA shapes on 132 SMs).  A few SMs fewer, so that a round is a whole
# share of a section, balances it again (128 CTAs: within 1.03x of the 132-SM mean there).
PERSISTENT_MIN_SHARE = 7 / 8      # the fewest CTAs the model may choose, as a share of the SMs
TILE_FIXED_KEYS = 192             # a tile's fixed cost (Q load, epilogue) in key columns' worth


def snake_loads(costs, ctas: int):
    """Per-CTA load of the snake walk (persistent_tile) over tiles of the given costs (a 1-D
    float64 torch tensor in the linear order): a (ctas,) tensor."""
    import torch
    t = torch.arange(costs.numel())
    r = t // ctas
    p = t - r * ctas
    cta = torch.where(r % 2 == 1, ctas - 1 - p, p)
    return torch.zeros(ctas, dtype=costs.dtype).index_add_(0, cta, costs)


def persistent_ctas(max_ctas: int, num_blocks: int, units: int, group: int, block_cost,
                    reverse: bool) -> int:
    """CTA count of the persistent forward (at most max_ctas, the SMs): the count in
    [PERSISTENT_MIN_SHARE * max_ctas, max_ctas] whose snake over the sectioned LPT order
    (persistent_lpt_tile) has the lightest busiest CTA; block_cost[m] is query block m's cost
    (its key columns + TILE_FIXED_KEYS).  Equal costs (non-causal) give max_ctas."""
    import torch
    tiles = num_blocks * units
    if tiles <= max_ctas or len(set(block_cost)) <= 1:
        return max_ctas
    block, _ = lpt_tiles(torch.arange(tiles), num_blocks, units, group)
    if reverse:
        block = num_blocks - 1 - block
    costs = torch.tensor(block_cost, dtype=torch.float64)[block]
    best, best_load = max_ctas, None
    for c in range(max_ctas, max(1, math.ceil(PERSISTENT_MIN_SHARE * max_ctas)) - 1, -1):
        load = float(snake_loads(costs, c).max())
        if best_load is None or load < best_load * (1 - 1e-9):
            best, best_load = c, load
    return best


def section_ctas(max_ctas: int, num_blocks: int, units: int, group: int) -> int:
    """The largest CTA count in [PERSISTENT_MIN_SHARE * max_ctas, max_ctas] that divides every
    section's tile count (group units of num_blocks tiles; the last section's too) or is a
    multiple of a whole section's (the last, partial section ends the order), so that the
    snake's rounds walk whole sections: the CTAs of a round then read the K / V of the round's
    sections' heads only, and a head's query tiles run in the same or the next rounds while its
    K / V is in L2.  A count that cuts sections across rounds re-reads K / V that a whole round
    would have shared, which the balance model (persistent_ctas) does not see (docs/MEASURED.md
    fwd-l2-section).  0 where no count in the range does."""
    full = group * num_blocks
    sizes = {full}
    if units % group:
        sizes.add(units % group * num_blocks)
    lo = max(1, math.ceil(PERSISTENT_MIN_SHARE * max_ctas))
    for c in range(max_ctas, lo - 1, -1):
        if all(n % c == 0 for n in sizes) or c % full == 0:
            return c
    return 0


def persistent_tile(round_: int, cta: int, num_ctas: int) -> int:
    """Linear tile of a persistent CTA in a round: snake order (rounds alternate direction),
    so over LPT-sorted tiles every CTA's total stays near the mean (a plain round-robin hands
    CTA 0 the longest tile of every round: 10-25% longer makespan at causal shapes).  Host
    mirror and device code (plain integer arithmetic works on Int32 too)."""
    odd = round_ % 2
    return round_ * num_ctas + cta + odd * (num_ctas - 1 - 2 * cta)


# ---- the compact varlen order (FwdConfig.varlen_compact) ----------------------------------------
# The plan's varlen order walks (query tile, sequence, head) slots sized by the longest sequence
# and skips the slots past a sequence's end: on a ragged batch most of them, and the live ones
# land on the CTAs unevenly (bench/tools/varlen_balance.py models the busiest CTA's work against
# the mean for both orders; docs/NOTES_varlen.md).  The compact order walks a table of the live
# (query tile, sequence) pairs, query tile descending (a causal tile's cost), sequence
# ascending, built on the device from the offsets (no host sync); linear tile t is pair
# t // H_q, head t % H_q, so the heads of one KV head stay adjacent (K and V reused from L2).
# (Cutting the sequences into L2 sections, as the dense order cuts its heads, was slower on a
# ragged batch: docs/MEASURED.md varlen-compact.)


def table_levels(b: int, max_len: int, tile: int, what: str) -> int:
    """Blocks per sequence of a varlen table (ceil(max_len / tile)), refused where its int32
    entries cannot hold b sequences of that many blocks."""
    levels = -(-max_len // tile)
    if b > COMPACT_MAX_SEQS or levels > COMPACT_MAX_TILES:
        raise ValueError(f"{what}: at most {COMPACT_MAX_SEQS} sequences and {COMPACT_MAX_TILES} blocks per "
                         f"sequence, got {b} and {levels} (longest sequence {max_len}, tile {tile})")
    return levels


def compact_varlen_table(cu_seqlens_q, max_seqlen_q: int, tile_m: int):
    """The compact order's table (int32, on cu_seqlens_q's device): [count, entries...], count
    live pairs, entry j = (m << COMPACT_SEQ_BITS) | b for the j-th pair (m query tile of
    sequence b) in the order above; 1 + levels x sequences long (the tail past count unread).  On a
    GPU with at most VARLEN_TABLE_MAX_SEQS sequences one kernel builds it (its tail unwritten);
    otherwise ~18 torch ops (the CPU reference, and longer lists)."""
    import torch
    b = cu_seqlens_q.shape[0] - 1
    levels = table_levels(b, max_seqlen_q, tile_m, "varlen_compact")
    dev = cu_seqlens_q.device
    if dev.type == "cuda" and b <= VARLEN_TABLE_MAX_SEQS:   # one launch (kernels/varlen_table_sm90.py)
        table = torch.empty(1 + levels * b, dtype=torch.int32, device=dev)
        _table_fn("compact")(cu_seqlens_q.contiguous(), table, tile_m, levels)
        return table
    return _compact_table(cu_seqlens_q, levels, tile_m)


def _compact_table(cu_seqlens_q, levels: int, tile_m: int):
    import torch
    b = cu_seqlens_q.shape[0] - 1
    dev = cu_seqlens_q.device
    lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int32)
    m = torch.arange(levels - 1, -1, -1, dtype=torch.int32, device=dev)           # descending
    live = (lens[None, :] > m[:, None] * tile_m).flatten()                       # (levels x b)
    order = torch.sort((~live).to(torch.uint8), stable=True).indices              # live first, in order
    ent = (m.repeat_interleave(b) << COMPACT_SEQ_BITS) | torch.arange(b, dtype=torch.int32, device=dev).repeat(levels)
    return torch.cat([live.sum(dtype=torch.int32).view(1), ent[order]])


# ---- the varlen backward's CTA table (AttnBwdSm90Varlen) -----------------------------------------
# A grid sized by the longest sequence (key blocks x heads x sequences) launches a CTA for every
# key block past a shorter sequence's end: on a ragged batch most of the grid, each paying its
# launch, pipeline setup and offset loads for nothing.  The table lists the live (key block,
# head, sequence) triples instead (the query head; the KV head in head_loop builds), built on
# the device from the offsets (no host sync), for a grid of at most (total_k // tile_n + sequences) x H_q CTAs (a host bound on the live key
# blocks); CTAs past the table's count exit.  Sequences go longest first (the short ones fill
# the tail).  Within a sequence, two orders (the plan's bwd.varlen_order):
#   "unit"   head, then key block ascending: the key blocks of one (sequence, head) run together
#            (they read the same Q, dO from L2, as the dense launch order's key blocks do) and the
#            query heads of a KV head follow one another (its K, V stay in L2);
#   "block"  key block ascending, then head: the dense LPT grid's order within a batch (heads
#            fastest, in its sections of heads: one over all KV heads in head_loop builds, L2-sized
#            ones of query heads otherwise), so causal work falls monotonically over a section's
#            entries instead of once per head (a greedy list schedule of 8 x 4096 at 32/8 heads: the
#            busiest SM's work 1.068x the mean in unit order, 1.002x in block order:
#            bench/tools/varlen_balance.py).
# Both are lpt_tiles over a sequence's entries; the unit order is the one with one head per section
# (varlen_bwd_section turns the order into that width).
# Sorting all entries by their work (LPT across sequences) splits the sequences' key blocks apart
# and measured slower (docs/MEASURED.md varlen-bwd-lpt).  Every entry is its own CTA's work, so
# an order is a permutation of the same table: results differ only in the order of dQ's adds.
BWD_TABLE_WORDS = 2            # an entry is ((key block << 18) | sequence, head)


def varlen_bwd_ctas(total_k: int, batch: int, max_seqlen_k: int, tile_n: int, heads: int) -> int:
    """Host bound on the varlen backward's live CTAs (its grid): sum over sequences of
    ceil(S_k(b) / tile_n) <= total_k // tile_n + batch key blocks, each for every head."""
    levels = -(-max_seqlen_k // tile_n)
    return min(levels * batch, total_k // tile_n + batch) * heads


def varlen_bwd_table(cu_seqlens_k, max_seqlen_k: int, tile_n: int, heads: int, total_k: int, section: int):
    """The varlen backward's CTA table (int32, on the offsets' device): [count, entries...], entry
    j (BWD_TABLE_WORDS words) = ((n << COMPACT_SEQ_BITS) | b, h) for the j-th live triple (key
    block n of sequence b, head h of `heads`), varlen_bwd_ctas(...) entries (the grid; those past
    count are unread).  Order (above): sequences longest first, in each the dense LPT grid's order
    (lpt_tiles) over sections of `section` heads (varlen_bwd_section: 1 is the unit order).  O(grid
    + sequences) work, no host sync: CTA j finds its sequence by a search over their cumulative
    entries.  Where the shapes say every sequence has max_seqlen_k keys (total_k = batch x
    max_seqlen_k), the table depends on host integers only and is built once per device and shape
    (equal_bwd_table); on a GPU with at most VARLEN_TABLE_MAX_SEQS sequences one kernel builds it
    (kernels/varlen_table_sm90.py; its entries past count are left unwritten); otherwise some 40
    small torch ops (the sort alone several: the CPU reference, and lists too long for one CTA)."""
    if section < 1:
        raise ValueError(f"varlen_bwd_table: section (heads per section) must be >= 1, got {section}")
    b = cu_seqlens_k.shape[0] - 1
    table_levels(b, max_seqlen_k, tile_n, "varlen backward")
    dev = cu_seqlens_k.device
    if b > 0 and max_seqlen_k > 0 and total_k == b * max_seqlen_k and not _capturing(dev):
        return equal_bwd_table(dev, b, max_seqlen_k, tile_n, heads, section)
    if dev.type == "cuda" and b <= VARLEN_TABLE_MAX_SEQS:
        return bwd_table_kernel(cu_seqlens_k, max_seqlen_k, tile_n, heads, total_k, section)
    return _bwd_table(cu_seqlens_k, max_seqlen_k, tile_n, heads, total_k, section)


@dataclass(frozen=True)
class TableKey:
    """The compile-cache key of a one-launch table build (one build serves every shape): kind
    "bwd" (the backward's CTA table) or "compact" (the forward's compact order)."""
    kind: str


def _table_fn(kind: str):
    from . import compile_cache
    key = TableKey(kind)

    def build():
        from . import varlen_table_sm90
        return varlen_table_sm90.build(key)
    return compile_cache.compiled("varlen_table", key, build)


def bwd_table_kernel(cu_seqlens_k, max_seqlen_k: int, tile_n: int, heads: int, total_k: int, section: int):
    """varlen_bwd_table by one kernel launch (kernels/varlen_table_sm90.py): int32 offsets on a GPU,
    at most VARLEN_TABLE_MAX_SEQS sequences; the words past 1 + BWD_TABLE_WORDS x count unwritten."""
    import torch
    b = cu_seqlens_k.shape[0] - 1
    if b > VARLEN_TABLE_MAX_SEQS or cu_seqlens_k.dtype != torch.int32:
        raise ValueError(f"bwd_table_kernel: int32 offsets of at most {VARLEN_TABLE_MAX_SEQS} sequences, "
                         f"got {cu_seqlens_k.dtype} offsets of {b}")
    ctas = varlen_bwd_ctas(total_k, b, max_seqlen_k, tile_n, heads)
    table = torch.empty(1 + BWD_TABLE_WORDS * ctas, dtype=torch.int32, device=cu_seqlens_k.device)
    _table_fn("bwd")(cu_seqlens_k.contiguous(), table, tile_n, heads, min(section, heads))
    return table


def _capturing(device) -> bool:
    """A CUDA graph capture is under way on the current stream: the cached table's first host-to-device
    copy is not allowed there, so the table is built from the offsets by device ops (as ragged ones are)."""
    import torch
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@functools.lru_cache(maxsize=64)
def equal_bwd_table(device, batch: int, seqlen_k: int, tile_n: int, heads: int, section: int):
    """varlen_bwd_table of `batch` sequences of `seqlen_k` keys each, built on the host by the same
    code and copied to `device` once (cached: read-only to the kernel, reused by every call of that
    shape on that device)."""
    import torch
    cu = torch.arange(batch + 1, dtype=torch.int32) * seqlen_k
    return _bwd_table(cu, seqlen_k, tile_n, heads, batch * seqlen_k, section).to(device)


def _bwd_table(cu_seqlens_k, max_seqlen_k: int, tile_n: int, heads: int, total_k: int, section: int):
    import torch
    b = cu_seqlens_k.shape[0] - 1
    dev = cu_seqlens_k.device
    ctas = varlen_bwd_ctas(total_k, b, max_seqlen_k, tile_n, heads)
    lens = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int64)
    seqs = torch.sort(lens, descending=True, stable=True).indices                 # sequences, longest first
    blocks = (-(-lens // tile_n))[seqs]
    ends = torch.cumsum(blocks * heads, 0)
    j = torch.arange(ctas, dtype=torch.int64, device=dev)
    u = torch.searchsorted(ends, j, right=True).clamp_(max=max(b - 1, 0))   # past the count: unread
    n, head = lpt_tiles(j - (ends[u] - blocks[u] * heads), blocks[u], heads, min(section, heads))
    count = ends[-1] if b else torch.zeros((), dtype=torch.int64, device=dev)
    ent = torch.stack([(n << COMPACT_SEQ_BITS) | seqs[u], head], dim=1).flatten().to(torch.int32)
    return torch.cat([count.to(torch.int32).view(1), ent])


def varlen_bwd_section(order: str, head_loop: bool, heads: int, max_seqlen_q: int, head_dim: int) -> int:
    """Heads per section of the varlen backward's table in `order` (the plan's bwd.varlen_order):
    "unit" 1 (each head's key blocks together); "block" as the dense LPT grid cuts them: head_loop
    builds one section over all KV heads, a CTA per query head sections whose rows of Q, dO (16-bit)
    and the FP32 dQ accumulator fit L2_SECTION_BYTES (of the longest sequence's rows here)."""
    if order not in VARLEN_BWD_ORDERS:
        raise ValueError(f"bwd.varlen_order: one of {VARLEN_BWD_ORDERS}, got {order!r}")
    if order == "unit":
        return 1
    return heads if head_loop else heads_per_section(heads, max_seqlen_q, head_dim * 8)


def varlen_bwd_tile(j: int, table) -> tuple[int, int, int]:
    """Host mirror of the device decode: (key block, head, sequence) of CTA j."""
    w0 = int(table[1 + BWD_TABLE_WORDS * j])
    return w0 >> COMPACT_SEQ_BITS, int(table[2 + BWD_TABLE_WORDS * j]), w0 & (COMPACT_MAX_SEQS - 1)


def compact_tile(t: int, table, num_heads: int) -> tuple[int, int, int]:
    """Host mirror of the device decode: (query tile, head, sequence) of linear tile t."""
    pair, head = divmod(t, num_heads)
    e = int(table[1 + pair])
    return e >> COMPACT_SEQ_BITS, head, e & (COMPACT_MAX_SEQS - 1)
