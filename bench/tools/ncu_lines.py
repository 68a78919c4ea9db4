"""Line-level reading of Nsight Compute SASS pages (the `<name>_sass.csv(.gz)` files that
`bash bench/round.sh ncu` writes): where one build's warp stall samples fall, by opcode and by
line, with each hot line's top stall reasons; --range prints the lines of an address range
(offsets from the kernel's first line) as "opcode:samples", to compare the instruction order of
two builds' loops (e.g. ours vs FA4's exp block).  CPU only.

    python bench/tools/ncu_lines.py DIR/bwd_d64l_ours_sass.csv.gz DIR/bwd_d64l_fa4_sass.csv.gz
    python bench/tools/ncu_lines.py DIR/bwd_d64l_ours_sass.csv.gz --range 0x2a80 0x3100
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip


def load(path: str) -> tuple:
    """(header, rows as dicts, base address) of one SASS page (the kernel-name line skipped)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        r = csv.reader(f)
        next(r)
        head = next(r)
        rows = [dict(zip(head, x)) for x in r]
    return head, rows, int(rows[0]["Address"], 16)


def opcode(src: str) -> str:
    ops = [o for o in src.split() if not o.startswith("@")]
    return ops[0].split(".")[0] if ops else "?"


def samples(r: dict) -> int:
    return int(r.get("# Samples") or 0)


def summary(path: str, top: int) -> str:
    head, rows, base = load(path)
    stalls = [c for c in head if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(samples(r) for r in rows) or 1
    by_op = collections.Counter()
    for r in rows:
        by_op[opcode(r["Source"])] += samples(r)
    mufu = collections.Counter()
    for r in rows:
        if opcode(r["Source"]) == "MUFU":
            for c in stalls:
                mufu[c[6:]] += int(r[c] or 0)
    out = [f"== {path}: {total} samples",
           "by opcode: " + ", ".join(f"{k} {v / total:.3f}" for k, v in by_op.most_common(14)),
           "MUFU lines' stall reasons: " + ", ".join(f"{k} {v}" for k, v in mufu.most_common(5))]
    for r in sorted(rows, key=lambda r: -samples(r))[:top]:
        s = samples(r)
        why = sorted(((int(r[c] or 0), c[6:]) for c in stalls), reverse=True)[:3]
        out.append(f"+{int(r['Address'], 16) - base:#07x} {s:7d} {s / total:.3f} "
                   f"ex={r['Instructions Executed']:>8} {r['Source'].strip()[:60]:60s} "
                   + " ".join(f"{n}:{v}" for v, n in why))
    return "\n".join(out)


def sequence(path: str, lo: int, hi: int) -> str:
    _, rows, base = load(path)
    return " ".join(f"{opcode(r['Source'])}:{samples(r)}" for r in rows
                    if lo <= int(r["Address"], 16) - base <= hi)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pages", nargs="+", help="<name>_sass.csv(.gz) files")
    p.add_argument("--top", type=int, default=20, help="hottest lines per page")
    p.add_argument("--range", nargs=2, metavar=("LO", "HI"), help="print the lines of this offset range")
    a = p.parse_args(argv)
    for path in a.pages:
        if a.range:
            print(sequence(path, int(a.range[0], 16), int(a.range[1], 16)))
        else:
            print(summary(path, a.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
