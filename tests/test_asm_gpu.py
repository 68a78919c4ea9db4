"""GPU tier: every block, inlined through CuTe DSL into the self-test kernel, gives the same
bits as the emulator for all 65,536 16-bit patterns in both lanes (NaN inputs included).

    pytest -m gpu tests/test_asm_gpu.py        # on the H200
    python tests/test_asm_gpu.py               # same check, prints a table
"""
import json
import os
import sys
import time
import warnings

import numpy as np
import pytest

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "asm_programs.json")


def _tables():
    """(id, table): the committed table if present, and the fixture, whose B3 program has
    the region shift (exercises the lop3 + sub.rn.bf16x2 path the committed one may lack)."""
    from flash_attn_poly.asm import programs as PG

    out = []
    try:
        out.append(("programs.json", PG.load_table()))
    except FileNotFoundError:
        pass
    out.append(("fixture", json.load(open(FIXTURE))))
    return out


def compare_block(name: str, table: dict) -> dict:
    """Run block ``name`` on GPU and emulator; mismatch counts per output and lane."""
    from flash_attn_poly.asm import blocks as B
    from flash_attn_poly.asm import emulator as em
    from flash_attn_poly.asm import fpbits as fb
    import asm_reference as R
    import asm_selftest as sk

    blk = B.get_block(name, table)
    ins = R.block_inputs(blk, R.block_dtype(blk, table))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = em.run_block(blk, *ins)
    t0 = time.perf_counter()
    got = sk.run_selftest(blk, ins)
    secs = time.perf_counter() - t0
    rows = []
    for j, (g, w) in enumerate(zip(got, want)):
        for k in (0, 1):
            gl, wl = fb.lanes(g)[k], fb.lanes(w)[k]
            bad = np.flatnonzero(gl != wl)
            rows.append({"out": j, "lane": k, "mismatches": int(bad.size),
                         "examples": [(int(i), hex(int(gl[i])), hex(int(wl[i])))
                                      for i in bad[:4]]})
    return {"block": name, "instructions": blk.n_instructions, "fma": blk.n_fma,
            "rows": rows, "seconds": secs}


def _cases():
    from flash_attn_poly.asm import blocks as B

    cases = []
    for tid, table in _tables():
        for name in B.MAIN_BLOCKS:
            try:
                B.get_block(name, table)
            except KeyError:
                continue
            cases.append(pytest.param(tid, name, id=f"{tid}-{name}"))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("tid,name", _cases())
def test_gpu_bits_equal_emulator(tid, name):
    pytest.importorskip("cutlass")
    table = dict(_tables())[tid]
    res = compare_block(name, table)
    bad = [r for r in res["rows"] if r["mismatches"]]
    assert not bad, bad


def main() -> int:
    from flash_attn_poly.asm import blocks as B

    print(f"{'table':14s} {'block':22s} {'instr':>5s} {'fma':>3s} {'mismatch(out.lane)':>28s} {'s':>6s}")
    failed = 0
    for tid, table in _tables():
        for name in B.MAIN_BLOCKS:
            try:
                res = compare_block(name, table)
            except KeyError:
                continue
            mm = " ".join(f"{r['out']}.{r['lane']}:{r['mismatches']}" for r in res["rows"])
            print(f"{tid:14s} {name:22s} {res['instructions']:5d} {res['fma']:3d} {mm:>28s} "
                  f"{res['seconds']:6.2f}")
            for r in res["rows"]:
                if r["mismatches"]:
                    failed += 1
                    print("    first (index, gpu, emulator):", r["examples"])
    print("ALL BIT-EXACT" if not failed else f"{failed} output lanes differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
