"""How far issue 27's softcap goal (>= 1.8x FA4's softcap in every cell) can be reached, cell by
cell, from the sweep's own rows (CPU; no timing of its own).

    python bench/tools/softcap_bound.py [--sweep bench/results/sweep.json] [--json PATH]

A softcap backward (or forward) runs the same two (four) GEMMs as softmax plus the capped score's
elementwise work, so our softcap time is taken to be at least our softmax time at the same shape
(on the H200 it is 0.97-1.47x of it across the grid).  Under that bound the best ratio to FA4's
softcap a cell can show is FA4 softcap time / our softmax time; where that is below 1.8 the goal
needs our softcap faster than our own softmax.  FA4 softcap / FA4 softmax says what softcap costs
FA4 itself: the goal asks for 1.8x over an implementation whose softcap costs it ~1.0-1.1x its
softmax at D = 256 backward.

The rows of one cell come from one process, but a softcap cell and the softmax cell of the same
shape are different processes and may be different commits (`cells[].commit`): the commits are
printed beside each group.  Writes the Markdown beside --json.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
import protocol  # noqa: E402

GOAL = 1.8


def shape_key(r: dict) -> tuple:
    return (r["direction"], r["headdim"], r["causal"], r["hq"], r["hkv"], r["seqlen"], r["batch"])


def analyse(sweep: dict) -> dict:
    ms = {(r["impl"], r["mode"]) + shape_key(r): r["ms"] for r in sweep["rows"]}
    commit = {c["cell"]: c.get("commit", "?") for c in sweep["cells"]}
    cell_of = {(r["mode"],) + shape_key(r)[1:]: r["cell"] for r in sweep["rows"]}
    groups = collections.defaultdict(list)
    for (impl, mode, *shape), t in ms.items():
        if impl != "fa4" or mode != "softcap":
            continue
        shape = tuple(shape)
        ours_sc, ours_sm, fa4_sm = (ms.get(k + shape) for k in (("ours", "softcap"), ("ours", "softmax"),
                                                                  ("fa4", "softmax")))
        if None in (ours_sc, ours_sm, fa4_sm):
            continue
        d, hd = shape[0], shape[1]
        groups[(d, hd)].append({
            "shape": shape, "vs_fa4_softcap": t / ours_sc, "bound": t / ours_sm,
            "fa4_softcap_over_softmax": t / fa4_sm, "ours_softcap_over_softmax": ours_sc / ours_sm,
            "commits": sorted({commit.get(cell_of.get((m,) + shape[1:]), "?") for m in ("softcap", "softmax")})})
    out = []
    for (d, hd), v in sorted(groups.items()):
        rng = lambda k: [round(min(x[k] for x in v), 3), round(max(x[k] for x in v), 3)]
        out.append({"direction": d, "headdim": hd, "cells": len(v),
                    "vs_fa4_softcap": rng("vs_fa4_softcap"), "pass": sum(x["vs_fa4_softcap"] >= GOAL for x in v),
                    "bound": rng("bound"), "reachable": sum(x["bound"] >= GOAL for x in v),
                    "fa4_softcap_over_softmax": rng("fa4_softcap_over_softmax"),
                    "ours_softcap_over_softmax": rng("ours_softcap_over_softmax"),
                    "commits": sorted({c for x in v for c in x["commits"]})})
    return {"source": "bench/results/sweep.json", "sweep_date": sweep.get("date"), "goal": GOAL, "groups": out}


def markdown(res: dict) -> str:
    lines = ["# Softcap >= 1.8x FA4's softcap: what the sweep's rows allow", "",
             f"Derived on the CPU from {res['source']} (sweep date {res['sweep_date']}) by "
             "`python bench/tools/softcap_bound.py` (its docstring: the bound assumes our softcap is no faster "
             "than our softmax at the same shape; softcap and softmax cells are separate processes, commits "
             "listed).", "",
             "| direction | D | cells | ours softcap vs FA4 softcap | >= 1.8 | bound: FA4 softcap / ours softmax | "
             "bound >= 1.8 | FA4 softcap / FA4 softmax | ours softcap / ours softmax | commits |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for g in res["groups"]:
        f = lambda k: f"{g[k][0]:.2f}-{g[k][1]:.2f}"
        lines.append(f"| {g['direction']} | {g['headdim']} | {g['cells']} | {f('vs_fa4_softcap')} | {g['pass']} | "
                     f"{f('bound')} | {g['reachable']} | {f('fa4_softcap_over_softmax')} | "
                     f"{f('ours_softcap_over_softmax')} | {', '.join(g['commits'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", default=os.path.join(ROOT, "bench", "results", "sweep.json"))
    protocol.add_json_arg(p, "softcap_bound")
    args = p.parse_args(argv)
    with open(args.sweep) as f:
        res = analyse(json.load(f))
    path = protocol.output_path(args.json, "softcap_bound")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
