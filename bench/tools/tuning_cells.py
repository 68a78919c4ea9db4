"""Several cells of one tuning tool in one device call: pre-build every cell in parallel, then time
them one after another under a time budget, and write one table of the knob / default ratios.

    python bench/tools/tuning_cells.py --tool fwd --budget-s 480 --out $OUT/d64 \
        --args "--headdim 64 --knob tile_m=128+num_stages=2+pingpong=0+mask_bits=0" \
        --cell "--batch 32 --seqlen 512" --cell "--batch 16 --seqlen 1024 --hkv 32"     # H200

--tool fwd or bwd runs bench/tools/fwd_tuning.py or bwd_tuning.py with `--args` plus each
`--cell`'s options.  Phase 1 runs every cell with --compile-only at once (CuTe DSL compiles on
the CPU: the device's cores build the cells side by side, and the kernels land in the disk
compile cache); phase 2 times the cells in the given order, one process each, so the timings
do not share the GPU, and stops starting cells once --budget-s has passed (a cell that was
not started is listed as such).  Writes per cell `<out>/cell_<i>.json` (+ .md, the tool's own
output) and its log, then `<out>/cells.json` + `cells.md`: every cell's "<row> / default"
ratios (knob time over the default's, measured side by side in that cell's process) and its
rows' times.  --dry-run prints the commands and runs nothing (CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = {"fwd": os.path.join(HERE, "fwd_tuning.py"), "bwd": os.path.join(HERE, "bwd_tuning.py")}


def commands(tool: str, args: str, cells: list, out: str) -> tuple[list, list]:
    """(compile commands, timed commands): one of each per cell, argv lists."""
    base = [sys.executable, TOOLS[tool], *shlex.split(args)]
    build = [base + shlex.split(c) + ["--compile-only"] for c in cells]
    timed = [base + shlex.split(c) + ["--json", os.path.join(out, f"cell_{i}.json")] for i, c in enumerate(cells)]
    return build, timed


def ratios(path: str) -> list:
    """The "<row> / default" rows of a tuning tool's JSON ([] if it did not write one)."""
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        return []
    return [r for r in res.get("rows", []) if r["row"].endswith(" / default")]


# the keys bench/protocol.header writes into every tuning tool's JSON
PROVENANCE = ("device", "date", "commit", "torch", "protocol")


def provenance(out: str, n: int) -> dict:
    """Device, date, commit, torch and timing protocol of the first cell that wrote its JSON (the
    cells of one call share them): the table's header, so that a committed table says where it ran."""
    for i in range(n):
        try:
            with open(os.path.join(out, f"cell_{i}.json")) as f:
                res = json.load(f)
        except (OSError, ValueError):
            continue
        return {k: res[k] for k in PROVENANCE if k in res}
    return {}


def markdown(tool: str, args: str, cells: list, status: list, out: str) -> str:
    prov = provenance(out, len(cells))
    head = f" ({prov.get('device', '?')}, {prov.get('date', '?')}, commit {prov.get('commit', '?')})" if prov else ""
    lines = [f"# {tool}_tuning cells{head}", "", f"Common options: `{args}`; one process per cell, timed one after another "
             "(each cell's ratios come from its own side-by-side run: bench/protocol.py"
             + (f": {prov['protocol']}" if "protocol" in prov else "") + ").", "",
             "| cell | status | row | knob / default |", "|---|---|---|---|"]
    for i, (cell, st) in enumerate(zip(cells, status)):
        rows = ratios(os.path.join(out, f"cell_{i}.json"))
        if not rows:
            lines.append(f"| {cell} | {st} | — | — |")
        for r in rows:
            lines.append(f"| {cell} | {st} | {r['row'][:-len(' / default')]} | {r['ms']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tool", choices=sorted(TOOLS), required=True)
    p.add_argument("--args", default="", help="options every cell passes to the tool (its knobs, modes, head dim)")
    p.add_argument("--cell", action="append", default=[], help="one cell's shape options; repeat")
    p.add_argument("--budget-s", type=float, default=480.0, help="no cell starts timing after this many seconds")
    p.add_argument("--cell-timeout-s", type=float, default=150.0)
    p.add_argument("--out", default=os.path.join("bench", "out", "cells"))
    p.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    a = p.parse_args(argv)
    if not a.cell:
        p.error("give at least one --cell (e.g. --cell \"--batch 16 --seqlen 1024\")")
    build, timed = commands(a.tool, a.args, a.cell, a.out)
    if a.dry_run:
        for cmd in build + timed:
            print(shlex.join(cmd))
        return 0
    os.makedirs(a.out, exist_ok=True)
    t0 = time.monotonic()
    logs = [open(os.path.join(a.out, f"build_{i}.log"), "w") for i in range(len(build))]
    procs = [subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT) for cmd, f in zip(build, logs)]
    for pr, f in zip(procs, logs):
        pr.wait()
        f.close()
    print(f"[{time.monotonic() - t0:.0f}s] built: rc {[pr.returncode for pr in procs]}", flush=True)
    status = []
    for i, cmd in enumerate(timed):
        if time.monotonic() - t0 > a.budget_s:
            status.append("not started (budget)")
            continue
        with open(os.path.join(a.out, f"cell_{i}.log"), "w") as f:
            try:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=a.cell_timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        status.append("ok" if rc == 0 else f"rc {rc}")
        print(f"[{time.monotonic() - t0:.0f}s] cell {i} ({a.cell[i]}): {status[-1]}", flush=True)
    md = markdown(a.tool, a.args, a.cell, status, a.out)
    with open(os.path.join(a.out, "cells.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "cells.json"), "w") as f:
        json.dump({**provenance(a.out, len(a.cell)), "tool": a.tool, "args": a.args, "cells": [
            {"cell": c, "status": s, "ratios": ratios(os.path.join(a.out, f"cell_{i}.json"))}
            for i, (c, s) in enumerate(zip(a.cell, status))]}, f, indent=1)
    print(md)
    return 0 if all(s == "ok" for s in status) else 1


if __name__ == "__main__":
    raise SystemExit(main())
