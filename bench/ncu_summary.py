"""Summarise the Nsight Compute round (bench/h200_round.sh ncu28) on the CPU.

    python bench/ncu_summary.py bench/results/logs/round_ncu28_fc43451 --json bench/results/fwd_ncu.json

Reads `<name>_raw.csv(.gz)` (ncu --page raw) and `<name>_sass.csv(.gz)` (ncu --page source
--print-source sass) per profiled build and writes one row per build: kernel cycles, the
tensor / MUFU (XU) / FMA / ALU pipes' busy share, issue-active share, and where the consumer
warps' stall samples fall in the mask-free key-block loop (the SASS lines executed as often as
the most executed one): MUFU instructions, the two wgmma waits (DEPBAR gsb0 0x1 = S landed,
0x0 = PV landed), HGMMA issue, mbarrier waits, the rest of the stage.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402

BUILDS = ["softmax", "sigmoid_native", "softcap_native", "softcap_native_pp", "softcap_poly"]
METRICS = {
    "cycles": "gpc__cycles_elapsed.max",
    "tensor_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "mufu_pct": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "fma_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "alu_pct": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
}
SAMPLES = "Warp Stall Sampling (All Samples)"


def _rows(path: str) -> list[list[str]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return list(csv.reader(f))


def _find(folder: str, stem: str) -> str:
    for ext in (".csv.gz", ".csv"):
        if os.path.exists(os.path.join(folder, stem + ext)):
            return os.path.join(folder, stem + ext)
    raise FileNotFoundError(os.path.join(folder, stem + ".csv[.gz]"))


def raw_metrics(folder: str, name: str) -> dict:
    rows = _rows(_find(folder, f"{name}_raw"))
    vals = dict(zip(rows[0], rows[2]))
    return {k: float(vals[m].replace(",", "")) for k, m in METRICS.items()}


def stall_shares(folder: str, name: str) -> dict:
    """Every warp's stall samples (producer and writer warps included) by ncu's reason, as shares."""
    rows = _rows(_find(folder, f"{name}_raw"))
    pre = "smsp__pcsamp_warps_issue_stalled_"
    got = {h[len(pre):]: float(v.replace(",", "") or 0) for h, v in zip(rows[0], rows[2])
           if h.startswith(pre) and not h.endswith("_not_issued")}
    total = sum(got.values()) or 1.0
    return {k: v / total for k, v in got.items()}


def loop_samples(folder: str, name: str) -> dict:
    rows = _rows(_find(folder, f"{name}_sass"))
    hdr, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    num = lambda r, h: float(r[ix[h]].replace(",", "") or 0)
    total = sum(num(r, SAMPLES) for r in data)
    top = max(num(r, "Instructions Executed") for r in data)
    loop = [r for r in data if num(r, "Instructions Executed") >= 0.9 * top]
    cats: dict[str, float] = {}
    for r in loop:
        src = r[1].strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", src).split()[0] if src else "?"
        cat = ("wait S (DEPBAR 0x1)" if "DEPBAR" in src and src.endswith("0x1") else
               "wait PV (DEPBAR 0x0)" if "DEPBAR" in src else
               "mbarrier wait" if op == "BRA" else "HGMMA issue" if op.startswith("HGMMA") else
               "MUFU" if op.startswith("MUFU") else "rest of the stage")
        cats[cat] = cats.get(cat, 0.0) + num(r, SAMPLES)
    in_loop = sum(cats.values())
    out = {"loop_share_of_samples": in_loop / total}
    out.update({k: v / in_loop for k, v in sorted(cats.items(), key=lambda kv: -kv[1])})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--json")
    p.add_argument("--builds", help="comma-separated build names (default: ncu28's five forward builds); "
                                    "a name starting with bwd_ is a backward build")
    p.add_argument("--note", help="the source/shape paragraph of the Markdown (default: ncu28's)")
    args = p.parse_args(argv)
    builds = args.builds.split(",") if args.builds else BUILDS
    rows = []
    for name in builds:
        row = {"build": name, **raw_metrics(args.folder, name)}
        if not args.builds:
            row["cycles_per_key_block"] = row["cycles"] / (16896 / 132)   # causal anchor: 16,896 blocks on 132 SMs
        if not name.startswith("bwd_"):   # a backward's most executed lines are not one loop: no loop split
            row.update({f"loop: {k}": v for k, v in loop_samples(args.folder, name).items()})
        if args.builds:
            row.update({f"stall: {k}": v for k, v in stall_shares(args.folder, name).items()})
        rows.append(row)
    cols = ["build", "cycles"] + (["cycles_per_key_block"] if not args.builds else []) + list(METRICS)[1:]
    table = protocol.markdown_table(rows, cols)
    cats = sorted({k for r in rows for k in r if k.startswith("loop: ")})
    table2 = protocol.markdown_table([r for r in rows if not r["build"].startswith("bwd_")], ["build"] + cats)
    stalls = sorted({k for r in rows for k, v in r.items() if k.startswith("stall: ") and v >= 0.04})
    table3 = protocol.markdown_table(rows, ["build"] + stalls) if stalls else ""
    print(table + "\n\n" + table2 + ("\n\n" + table3 if table3 else ""))
    if args.json:
        payload = {"source": args.folder, "generated_by": "bench/ncu_summary.py", "rows": rows}
        note = args.note or (f"Source: `{args.folder}` (bench/h200_round.sh ncu28; ncu locks the "
                             f"SM clock, 1.32 GHz here, so cycles, not times, compare). Shape: B=1 S=4096 H 32/8 D=128 "
                             f"causal BF16, softcap 50, default builds (softcap_native_pp: pingpong=1).")
        md = (f"# Nsight Compute: one warm launch per build (H200, ncu --set full)\n\n"
              f"{protocol.doc_body(__doc__)}\n{note}\n\n"
              f"{table}\n\nConsumer-warp stall samples in the mask-free key-block loop (shares of the loop's "
              f"samples; `loop_share_of_samples` is the loop's share of all samples, producer warp included; "
              f"forward builds only):\n\n{table2}\n"
              + (f"\nAll warps' stall samples by ncu's reason (shares; reasons with >= 4% in some build):\n\n{table3}\n"
                 if table3 else ""))
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
        with open(os.path.splitext(args.json)[0] + ".md", "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
