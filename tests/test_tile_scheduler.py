"""CPU tier: the CTA orders of kernels/tile_scheduler.py (host mirrors of the device code)."""
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
