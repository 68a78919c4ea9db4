"""Two source trees side by side: a change that is no plan knob (a layout, a kernel's code) timed
against the tree before it, in alternating processes of one device call.

    git archive <old sha> flash_attn_poly kernels asm bench ':(exclude)bench/results' | gzip > bench/out/old.tgz  # CPU
    # (carried: bench/results left out, ~6 MB that would push the carry past 64 MiB beside the payload)
    python bench/tools/ab_trees.py --old bench/out/old.tgz --tool bwd --budget-s 400 --out $OUT/ab \\
        --args "--modes softmax:native,softcap:poly --knob lpt=1" \\
        --cell "--headdim 128 --hq 32 --hkv 32 --batch 1 --seqlen 16384"                 # H200

--old is the old tree: a directory or a .tgz of it (`git archive`).  It runs from its own site
directory (the installed package's shape, as bench/device_env.sh lays out the current tree:
flash_attn_poly with kernels/ and asm/ inside), first on PYTHONPATH in place of the current tree's
entries, and its own compile cache (FLASH_ATTN_POLY_CACHE_DIR).  The new tree is the one this
file is in.

Phase 1 compiles every cell in both trees at once (the tool's --compile-only).  Phase 2 times each
cell in processes old, new, new, old (--reps 2; more reps repeat the pair, each starting with the
tree the last one ended on), one after another, with bench/tools/fwd_tuning.py or bwd_tuning.py
(bench/protocol.py inside: warm-up, rounds, median); they need a --knob, and a knob that resolves
to the default itself (bwd `lpt=1`) measures the in-process noise beside each default.  A cell's
time per mode is the median over its processes' default rows; the table is new / old.  Writes
<out>/ab.json (every process's rows) and <out>/ab.md.  --dry-run prints the commands (CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOLS = {"fwd": "fwd_tuning.py", "bwd": "bwd_tuning.py"}
SITE_DEFAULT = "/tmp/fap_site"   # bench/device_env.sh's site of the current tree


def order(reps: int) -> list:
    """Trees per process: old, new, new, old, old, new, ... (each pair ends where the next begins)."""
    out = []
    for r in range(reps):
        out += ["old", "new"] if r % 2 == 0 else ["new", "old"]
    return out


def old_layout(old: str, work: str) -> tuple:
    """(tree root, site directory) of the old tree; a .tgz is unpacked under work."""
    root = old
    if os.path.isfile(old):
        root = os.path.join(work, "old_tree")
        os.makedirs(root, exist_ok=True)
        with tarfile.open(old) as t:
            try:
                t.extractall(root, filter="data")
            except TypeError:     # Python without extraction filters
                t.extractall(root)
    site = os.path.join(work, "old_site")
    pkg = os.path.join(site, "flash_attn_poly")
    os.makedirs(pkg, exist_ok=True)
    src = os.path.join(root, "flash_attn_poly")
    links = [(os.path.join(src, e), e) for e in sorted(os.listdir(src))]
    links += [(os.path.join(root, "kernels"), "kernels"), (os.path.join(root, "asm"), "asm")]
    for target, name in links:
        dst = os.path.join(pkg, name)
        if not os.path.lexists(dst):
            os.symlink(target, dst)
    return root, site


def old_env(root: str, site: str, cache: str, env=None) -> dict:
    """The environment of an old-tree process: its site and root first on PYTHONPATH, the current
    tree's entries (the root, bench/device_env.sh's site) left out, its own compile cache."""
    env = dict(os.environ if env is None else env)
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.abspath(p) not in (ROOT, SITE_DEFAULT)]
    env["PYTHONPATH"] = os.pathsep.join([site, root] + keep)
    env["FLASH_ATTN_POLY_CACHE_DIR"] = cache
    return env


def commands(tool: str, args: str, cells: list, out: str, old_root: str, reps: int) -> tuple:
    """(compile commands, timed commands): each a (tree, cell index, argv, json path or None)."""
    script = {"new": os.path.join(HERE, TOOLS[tool]), "old": os.path.join(old_root, "bench", "tools", TOOLS[tool])}
    build, timed = [], []
    for i, c in enumerate(cells):
        for tree in ("old", "new"):
            build.append((tree, i, [sys.executable, script[tree], *shlex.split(args), *shlex.split(c), "--compile-only"],
                          None))
        for k, tree in enumerate(order(reps)):
            path = os.path.join(out, f"c{i}_{tree}_{k}.json")
            timed.append((tree, i, [sys.executable, script[tree], *shlex.split(args), *shlex.split(c), "--json", path],
                          path))
    return build, timed


def table(runs: list, cells: list) -> tuple:
    """(rows for ab.json, Markdown) from [(tree, cell index, tool JSON dict or None)]: per cell and
    mode the median of the default rows of each tree and new / old; the knob rows' ratios beside."""
    rows = []
    for tree, i, res in runs:
        for r in (res or {}).get("rows", []):
            rows.append({"cell": i, "tree": tree, "row": r["row"], "ms": r["ms"]})
    lines = ["| cell | mode | old ms | new ms | new / old | processes |", "|---|---|---|---|---|---|"]
    for i, c in enumerate(cells):
        # a default row is "<mode:evaluator> default"; "<mode> <knob> / default" rows are ratios
        modes = sorted({r["row"].split()[0] for r in rows if r["cell"] == i and r["row"].split()[1:] == ["default"]})
        for m in modes:
            t = {tree: [r["ms"] for r in rows if r["cell"] == i and r["tree"] == tree and r["row"] == f"{m} default"]
                 for tree in ("old", "new")}
            if t["old"] and t["new"]:
                o, n = statistics.median(t["old"]), statistics.median(t["new"])
                lines.append(f"| {c} | {m} | {o:.4f} | {n:.4f} | {n / o:.3f} | {len(t['old'])} + {len(t['new'])} |")
            else:
                lines.append(f"| {c} | {m} | — | — | — | {len(t['old'])} + {len(t['new'])} |")
    lines += ["", "Knob rows beside each default (in-process; a knob equal to the default shows the noise):", "",
              "| cell | tree | row | per process |", "|---|---|---|---|"]
    for i, c in enumerate(cells):
        for tree in ("old", "new"):
            for name in sorted({r["row"] for r in rows if r["cell"] == i and r["tree"] == tree
                                and r["row"].endswith(" / default")}):
                v = [f"{r['ms']:.3f}" for r in rows if r["cell"] == i and r["tree"] == tree and r["row"] == name]
                lines.append(f"| {c} | {tree} | {name} | {', '.join(v)} |")
    return rows, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="the old tree: a directory or a .tgz (git archive)")
    p.add_argument("--tool", choices=sorted(TOOLS), required=True)
    p.add_argument("--args", default="", help="options of every cell (modes, a --knob, head dim)")
    p.add_argument("--cell", action="append", default=[], help="one cell's shape options; repeat")
    p.add_argument("--reps", type=int, default=2, help="process pairs per cell (old, new, new, old, ...)")
    p.add_argument("--budget-s", type=float, default=420.0, help="no process starts after this many seconds")
    p.add_argument("--timeout-s", type=float, default=120.0, help="per timed process")
    p.add_argument("--out", default=os.path.join("bench", "out", "ab"))
    p.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    a = p.parse_args(argv)
    if not a.cell:
        p.error("give at least one --cell (e.g. --cell \"--headdim 128 --batch 4 --seqlen 4096\")")
    if "--knob" not in a.args:
        p.error("the tuning tools need a --knob in --args (one equal to the default, e.g. bwd lpt=1, shows the noise)")
    if a.reps < 1:
        p.error("--reps must be >= 1")
    work = os.path.abspath(a.out)
    old_root = a.old if os.path.isdir(a.old) else os.path.join(work, "old_tree")
    build, timed = commands(a.tool, a.args, a.cell, work, old_root, a.reps)
    if a.dry_run:
        for tree, _, cmd, _ in build + timed:
            print(tree, shlex.join(cmd))
        return 0
    os.makedirs(work, exist_ok=True)
    root, site = old_layout(a.old, work)
    envs = {"old": old_env(root, site, os.path.join(work, "old_cache")), "new": dict(os.environ)}
    t0 = time.monotonic()
    procs = [subprocess.Popen(cmd, env=envs[tree], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for tree, _, cmd, _ in build]
    rcs = [pr.wait() for pr in procs]
    print(f"[{time.monotonic() - t0:.0f}s] built: rc {rcs}", flush=True)
    runs = []
    for tree, i, cmd, path in timed:
        if time.monotonic() - t0 > a.budget_s:
            print(f"budget: cell {i} {tree} not started", flush=True)
            continue
        with open(path[:-5] + ".log", "w") as f:
            try:
                rc = subprocess.run(cmd, env=envs[tree], stdout=f, stderr=subprocess.STDOUT,
                                    timeout=a.timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        res = None
        if rc == 0:
            with open(path) as f:
                res = json.load(f)
        runs.append((tree, i, res))
        print(f"[{time.monotonic() - t0:.0f}s] cell {i} {tree}: rc {rc}", flush=True)
    rows, md = table(runs, a.cell)
    head = (f"# {a.tool}_tuning, old tree vs new tree\n\nOld: {a.old}; common options `{a.args}`; processes per cell "
            f"{' '.join(order(a.reps))}, one after another; each process bench/protocol.py's rounds; a cell's "
            f"time = the median over its processes' default rows.\n\n")
    with open(os.path.join(work, "ab.json"), "w") as f:
        json.dump({"tool": a.tool, "args": a.args, "old": a.old, "cells": a.cell, "order": order(a.reps),
                   "rows": rows}, f, indent=1)
    with open(os.path.join(work, "ab.md"), "w") as f:
        f.write(head + md)
    print(head + md)
    return 0 if all(r is not None for _, _, r in runs) and len(runs) == len(timed) else 1


if __name__ == "__main__":
    raise SystemExit(main())
