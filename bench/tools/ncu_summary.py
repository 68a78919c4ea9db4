"""Summarise an Nsight Compute round (`bash bench/round.sh ncu`) on the CPU.

    python bench/tools/ncu_summary.py DIR     # the unpacked round: bench/out/attn_ncu.json (+ .md)
    python bench/tools/ncu_summary.py DIR --json bench/results/attn_ncu.json   # commit it

Reads `<name>_raw.csv(.gz)` (ncu --page raw) and `<name>_sass.csv(.gz)` (ncu --page source
--print-source sass) of every profiled build in DIR (or those of --builds; a name starting
with bwd_ is a backward build) and writes one row per build: kernel cycles, the
tensor / MUFU (XU) / FMA / ALU pipes' busy share, issue-active share, and where the consumer
warps' stall samples fall in the mask-free key-block loop (the SASS lines executed as often,
within 10%, as the most executed HGMMA): MUFU instructions, the two wgmma waits (DEPBAR gsb0 0x1 = S landed,
0x0 = PV landed), HGMMA issue, mbarrier waits, the rest of the stage (forward builds only:
a backward's most executed lines are not one loop), and every warp's stall samples by ncu's
reason.

Every build, ours or a vendor's (a name of any form), also gets its samples split by phase: the
main loop is the address range of the HGMMA lines executed at least 3/4 as often as the most
executed HGMMA (widened to the loop's closing backward branch where ncu prints its target), so
a persistent kernel's per-tile set-up and a backward's first K / V / Q waits fall "before" and
the epilogue "after"; each phase's share of all samples and its hottest lines (address offset,
instruction, samples) tell where a gap between two builds lies (bench/results/
bwd_mha_short_ncu.md did this split by hand).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import protocol  # noqa: E402

METRICS = {
    "cycles": "gpc__cycles_elapsed.max",
    "tensor_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "mufu_pct": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "fma_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "alu_pct": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
}
# shared-memory traffic, where the raw page has them (names vary between ncu versions): whether the
# backward is bound by the banks' 128 B/clk (bench/tools/pipe_model.py's smem column, a hypothesis)
OPTIONAL_METRICS = {
    "smem_bank_reads_pct": "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed",
    "smem_bank_writes_pct": "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed",
    "smem_lsu_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex_throughput_pct": "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
}
SAMPLES = "Warp Stall Sampling (All Samples)"
DEVICE_NAME = "device__attribute_display_name"   # the GPU the report was taken on
PHASE_COLS = ("before_share", "loop_share", "after_share", "before_samples", "loop_samples", "after_samples",
              "loop_lines", "loop_executions")


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
    if len(rows) < 3 or not set(METRICS.values()) <= set(rows[0]):
        # ncu -i on a report that was never written prints its error here instead of the page
        raise ValueError(f"{name}: no metrics in {name}_raw.csv (the profiled run failed? its first line: "
                         f"{','.join(rows[0])[:160] if rows else '(empty)'})")
    vals = dict(zip(rows[0], rows[2]))
    out = {k: float(vals[m].replace(",", "")) for k, m in METRICS.items()}
    out.update({k: float(vals[m].replace(",", "")) for k, m in OPTIONAL_METRICS.items()
                if vals.get(m, "").replace(",", "").replace(".", "", 1).isdigit()})
    if vals.get(DEVICE_NAME):
        out["device"] = vals[DEVICE_NAME]
    return out


def stall_shares(folder: str, name: str) -> dict:
    """Every warp's stall samples (producer and writer warps included) by ncu's reason, as shares."""
    rows = _rows(_find(folder, f"{name}_raw"))
    pre = "smsp__pcsamp_warps_issue_stalled_"
    got = {h[len(pre):]: float(v.replace(",", "") or 0) for h, v in zip(rows[0], rows[2])
           if h.startswith(pre) and not h.endswith("_not_issued")}
    total = sum(got.values()) or 1.0
    return {k: v / total for k, v in got.items()}


def _header_row(rows: list[list[str]]) -> int:
    """The SASS page's column header (ncu prints a title line or more above it)."""
    for i, r in enumerate(rows):
        if "Source" in r and "Instructions Executed" in r and SAMPLES in r:
            return i
    raise ValueError(f"no SASS column header (Source, Instructions Executed, {SAMPLES}) on the page")


def loop_samples(folder: str, name: str) -> dict:
    rows = _rows(_find(folder, f"{name}_sass"))
    hdr_i = _header_row(rows)
    hdr, data = rows[hdr_i], rows[hdr_i + 1:]
    ix = {h: i for i, h in enumerate(hdr)}
    num = lambda r, h: float(r[ix[h]].replace(",", "") or 0) if ix[h] < len(r) else 0.0
    total = sum(num(r, SAMPLES) for r in data)
    # the key-block loop's lines run as often as its HGMMAs (the most executed lines can be a spin wait
    # elsewhere, e.g. a warp's mbarrier poll at short S); without HGMMA lines, the most executed lines
    mma = [num(r, "Instructions Executed") for r in data if len(r) > 1 and _op(r[1].strip()).startswith("HGMMA")]
    top = max(mma) if mma else max(num(r, "Instructions Executed") for r in data)
    loop = [r for r in data if 0.9 * top <= num(r, "Instructions Executed") <= 1.1 * top]
    cats: dict[str, float] = {}
    for r in loop:
        src = r[1].strip()
        op = _op(src)
        cat = ("wait S (DEPBAR 0x1)" if "DEPBAR" in src and src.endswith("0x1") else
               "wait PV (DEPBAR 0x0)" if "DEPBAR" in src else
               "mbarrier wait" if op == "BRA" else "HGMMA issue" if op.startswith("HGMMA") else
               "MUFU" if op.startswith("MUFU") else "rest of the stage")
        cats[cat] = cats.get(cat, 0.0) + num(r, SAMPLES)
    in_loop = sum(cats.values())
    out = {"loop_share_of_samples": in_loop / total if total else 0.0}
    if not in_loop:   # no samples on the hottest instructions (a source page without sampling data)
        return out
    out.update({k: v / in_loop for k, v in sorted(cats.items(), key=lambda kv: -kv[1])})
    return out


_HEX = re.compile(r"0x([0-9a-fA-F]+)")


def _sass_lines(folder: str, name: str) -> tuple[list[tuple], bool]:
    """[(address, instruction, executed, samples)] of a build's SASS page, in address order, and
    whether the page has an address column (else the lines are in page order, branch targets unknown)."""
    rows = _rows(_find(folder, f"{name}_sass"))
    hdr_i = _header_row(rows)
    hdr, data = rows[hdr_i], rows[hdr_i + 1:]
    ix = {h: i for i, h in enumerate(hdr)}
    num = lambda r, h: float(r[ix[h]].replace(",", "") or 0) if h in ix and ix[h] < len(r) else 0.0
    addr_i = next((i for i, h in enumerate(hdr) if "Address" in h), None)
    out = []
    for r in data:
        if len(r) <= ix["Source"] or not r[ix["Source"]].strip():
            continue
        m = _HEX.search(r[addr_i]) if addr_i is not None else None
        addr = int(m.group(1), 16) if m else len(out) * 16
        out.append((addr, r[ix["Source"]].strip(), num(r, "Instructions Executed"), num(r, SAMPLES)))
    return sorted(out), addr_i is not None


def _op(src: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", src).split()[0] if src else "?"


def phases(folder: str, name: str, top: int = 5) -> dict:
    """Samples before / in / after the main loop (module docstring) with each phase's hottest lines."""
    lines, has_addresses = _sass_lines(folder, name)
    total = sum(s for *_, s in lines) or 1.0
    mma = [(a, e) for a, src, e, _ in lines if _op(src).startswith("HGMMA")]
    if not mma:
        return {"error": "no HGMMA line on the SASS page"}
    emax = max(e for _, e in mma)
    core = [a for a, e in mma if e >= 0.75 * emax]
    lo, hi = min(core), max(core)
    for a, src, e, _ in lines if has_addresses else ():   # the loop's closing branch: the first later BRA back to lo or before
        if a > hi and _op(src) == "BRA":
            m = _HEX.search(src.split("BRA", 1)[1])
            if m and int(m.group(1), 16) <= lo:
                lo, hi = int(m.group(1), 16), a
                break
    base = lines[0][0]
    out = {"loop_executions": emax, "loop_lines": sum(1 for a, *_ in lines if lo <= a <= hi)}
    for ph, keep in (("before", lambda a: a < lo), ("loop", lambda a: lo <= a <= hi), ("after", lambda a: a > hi)):
        sel = [(a, src, s) for a, src, _, s in lines if keep(a)]
        out[f"{ph}_samples"] = sum(s for *_, s in sel)
        out[f"{ph}_share"] = out[f"{ph}_samples"] / total
        out[f"{ph}_top"] = [[f"+{a - base:#x}", src, s] for a, src, s in sorted(sel, key=lambda t: -t[2])[:top] if s]
    return out


def discover(folder: str) -> list[str]:
    """The builds profiled in folder (names of its <name>_raw.csv[.gz]), forward builds first."""
    names = {re.sub(r"_raw\.csv(\.gz)?$", "", f) for f in os.listdir(folder) if re.search(r"_raw\.csv(\.gz)?$", f)}
    return sorted(names, key=lambda n: (n.startswith("bwd_"), n))


def summarise(folder: str, builds: list[str]) -> list[dict]:
    rows = []
    for name in builds:
        row = {"build": name, **raw_metrics(folder, name)}
        if not name.startswith("bwd_"):   # a backward's most executed lines are not one loop: no loop split
            row.update({f"loop: {k}": v for k, v in loop_samples(folder, name).items()})
        row.update({f"stall: {k}": v for k, v in stall_shares(folder, name).items()})
        row["phases"] = phases(folder, name)
        rows.append(row)
    return rows


def markdown(folder: str, rows: list[dict], note: str) -> str:
    extra = [k for k in OPTIONAL_METRICS if any(k in r for r in rows)]
    table = protocol.markdown_table(rows, ["build"] + list(METRICS) + extra)
    cats = sorted({k for r in rows for k in r if k.startswith("loop: ")})
    fwd = [r for r in rows if not r["build"].startswith("bwd_")]
    table2 = protocol.markdown_table(fwd, ["build"] + cats) if fwd else ""
    stalls = sorted({k for r in rows for k, v in r.items() if k.startswith("stall: ") and v >= 0.04})
    table3 = protocol.markdown_table(rows, ["build"] + stalls) if stalls else ""
    ph = [{"build": r["build"], **{k: r["phases"].get(k) for k in PHASE_COLS}} for r in rows if "phases" in r]
    table4 = protocol.markdown_table(ph, ["build"] + list(PHASE_COLS)) if ph else ""
    hot = [f"- {r['build']} {p}: " + "; ".join(f"{a} `{src}` {s:,.0f}" for a, src, s in r["phases"].get(f"{p}_top", []))
           for r in rows if "phases" in r for p in ("before", "after") if r["phases"].get(f"{p}_top")]
    devices = ", ".join(sorted({r["device"] for r in rows if r.get("device")})) or "device not in the report"
    return (f"# Nsight Compute: one warm launch per build ({devices}, ncu --set full)\n\n"
            f"{protocol.doc_body(__doc__)}\n\nSource: `{folder}`. {note}\n\n{table}\n"
            + (f"\nConsumer-warp stall samples in the mask-free key-block loop (shares of the loop's "
               f"samples; `loop_share_of_samples` is the loop's share of all samples, producer warp "
               f"included; forward builds only):\n\n{table2}\n" if table2 else "")
            + (f"\nAll warps' stall samples by ncu's reason (shares; reasons with >= 4% in some build):"
               f"\n\n{table3}\n" if table3 else "")
            + (f"\nAll warps' samples by phase (before the main loop, in it, after it; the loop: module "
               f"docstring):\n\n{table4}\n\nHottest lines outside the loop (offset from the kernel's first "
               f"line, instruction, samples):\n\n" + "\n".join(hot) + "\n" if table4 else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="an unpacked ncu round: <build>_raw.csv[.gz] and <build>_sass.csv[.gz] files")
    p.add_argument("--builds", help="comma-separated build names (default: every build in the folder)")
    p.add_argument("--note", default=("ncu locks the SM clock, so cycles, not times, compare. Builds: "
                                      "bench/round.sh ncu (anchor B=1 S=4096 H 32/8 D=128 causal BF16, "
                                      "softcap 50; g256_*: Gemma-2 D = 256, B=1 S=8192 H 8/4)."),
                   help="the source/shape sentence of the Markdown")
    protocol.add_json_arg(p, "attn_ncu")
    args = p.parse_args(argv)
    builds = args.builds.split(",") if args.builds else discover(args.folder)
    if not builds:
        p.error(f"no <build>_raw.csv[.gz] in {args.folder}")
    path = protocol.output_path(args.json, "attn_ncu")
    failed = []
    for name in list(builds):   # a build whose profiled run failed is named, not a crash of the whole round
        try:
            raw_metrics(args.folder, name)
        except (ValueError, FileNotFoundError) as e:
            failed.append(str(e))
            builds.remove(name)
    if not builds:
        p.error("no build with metrics: " + "; ".join(failed))
    rows = summarise(args.folder, builds)
    note = args.note + ("" if not failed else " Not summarised: " + "; ".join(failed) + ".")
    md = markdown(args.folder, rows, note)
    print(md)
    protocol.write_results(path, {"source": args.folder, "generated_by": "bench/tools/ncu_summary.py", "rows": rows,
                                  "failed": failed}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
