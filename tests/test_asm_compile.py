"""Compile-only tier: every block inlined into the self-test kernel builds for sm_90a on the
CPU, and its SASS runs on the FMA pipe (packed HFMA2, bf16 variants for bf16 blocks) with no
MUFU (SFU) instruction."""
import json
import os

import pytest

pytestmark = pytest.mark.compile

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "asm_programs.json")


def _table():
    from flash_attn_poly.asm import programs as PG

    try:
        return PG.load_table()
    except FileNotFoundError:
        return json.load(open(FIXTURE))


def _names():
    from flash_attn_poly.asm import blocks as B

    return list(B.MAIN_BLOCKS) + list(B.PART_BLOCKS)


@pytest.mark.parametrize("name", _names())
def test_block_sass_is_fma_pipe_only(name):
    pytest.importorskip("cutlass")
    from flash_attn_poly.asm import blocks as B
    import asm_selftest as sk
    from flash_attn_poly.kernels import sass

    table = _table()
    try:
        blk = B.get_block(name, table)
    except KeyError as err:
        pytest.skip(str(err))
    counts = sass.count_opcodes(sk.sass_of_selftest(blk))
    assert counts["MUFU"] == 0, counts
    fam = "FFMA" if blk.in_types == ("f32",) else "HFMA2" if "_f16x2" in name else "HFMA2.BF16"
    # every fma.rn becomes one packed HFMA2; ptxas may add HFMA2 moves, never remove FMAs
    assert counts[fam] >= blk.n_fma, counts
    assert counts["STL"] == 0 and counts["LDL"] == 0, counts


def test_b3_sass_shape():
    """sigmoid_fwd: one F2FP pack, 2 HMNMX2 clamps, 1 HSET2 mask, no MUFU; the 3 packed FMAs,
    the sub (u = xc - thr) and the squarings all on the half-precision pipe (ptxas may emit a
    bf16 sub/mul as HFMA2.BF16, HADD2 or HMUL2)."""
    pytest.importorskip("cutlass")
    from flash_attn_poly.asm import blocks as B, programs as PG
    import asm_selftest as sk
    from flash_attn_poly.kernels import sass

    blk = B.get_block("sigmoid_fwd", _table())
    counts = sass.count_opcodes(sk.sass_of_selftest(blk))
    assert counts["F2FP"] == 1 and counts["HMNMX2"] == 2 and counts["HSET2"] == 1
    pr = PG.entry(B.SIGMOID_ATTN, _table())["params"]
    n_arith = 3 + int(pr.get("squarings") or 0) + (1 if pr.get("shift") else 0)
    assert counts["HFMA2.BF16"] >= 3 and counts["MUFU"] == 0
    assert counts["HFMA2.BF16"] + counts["HMUL2"] + counts["HADD2"] == n_arith, counts
