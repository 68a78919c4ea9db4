"""The correctness tiers' results: merge the GPU tests' JSON lines into one JSON + Markdown table.

    python bench/correctness.py collect OUT_DIR --json bench/results/correctness.json

OUT_DIR holds the *.jsonl files that tests/test_correctness_gpu.py (catalogue) and
tests/test_fuzz_gpu.py (fuzz) append to when FAP_CORRECTNESS_OUT=OUT_DIR (one file per tier
and shard; bench/round.sh correctness runs them).  A case recorded twice (a rerun) counts once,
its last record.  Writes: device, date, commit (bench/protocol.commit_id), cases run / passed /
failed / raised per tier, and per mode x evaluator x direction (fwd O, LSE, dQ, dK, dV) the
largest error ratio to torch, ratio = err / (2 x torch_err + floor) (<= 1 passes, see
tests/rule_harness.py), with the case that has it; the worst case overall; every failure, those of
tests/cases.py KNOWN_DEFECTS (strict xfails) marked as known.  Exit status 1 when a failure is new or a
known defect passed, else 0.

Nothing runs on import; collect() and summarize() are the CPU-tested parts.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import math
import os
import re
import sys

DIRECTIONS = ("o", "lse", "dq", "dk", "dv")
DIRECTION_NAMES = {"o": "fwd O", "lse": "LSE", "dq": "dQ", "dk": "dK", "dv": "dV"}
TIERS = ("catalogue", "fuzz")
BENCH = os.path.dirname(os.path.abspath(__file__))


def read_records(out_dir: str) -> list:
    """Every record of OUT_DIR/*.jsonl, deduplicated by (tier, id) keeping the last (files in
    name order, lines in file order).  A line that does not parse raises, naming file and line."""
    files = sorted(glob.glob(os.path.join(out_dir, "*.jsonl")))
    if not files:
        raise FileNotFoundError(f"no *.jsonl files in {out_dir!r} (run the GPU tiers with FAP_CORRECTNESS_OUT={out_dir})")
    recs = {}
    for path in files:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not a JSON line ({e})") from None
                recs[(r.get("tier"), r.get("id"))] = r
    return list(recs.values())


def _score(r: dict) -> str:
    return f"{r.get('mode')}/{r.get('evaluator')}"


def summarize(records: list) -> dict:
    """The results payload (without the header) of a list of records."""
    tiers = {}
    for t in sorted({r.get("tier") for r in records} | set(TIERS), key=lambda t: (t not in TIERS, str(t))):
        mine = [r for r in records if r.get("tier") == t]
        count = lambda s: sum(1 for r in mine if r.get("status") == s)
        tiers[t] = {"run": len(mine), "passed": count("passed"), "failed": count("failed"),
                    "errors": count("error")}
    worst = {}   # score -> direction -> {"ratio", "id", "tier", "err", "torch_err", "floor"}
    overall = None
    for r in records:
        for d, c in (r.get("checks") or {}).items():
            ratio = c.get("ratio")
            ratio = math.inf if ratio is None else float(ratio)
            cell = worst.setdefault(_score(r), {}).get(d)
            if cell is None or ratio > cell["ratio"]:
                worst[_score(r)][d] = {"ratio": ratio, "id": r.get("id"), "tier": r.get("tier"),
                                       "err": c.get("err"), "torch_err": c.get("torch_err"),
                                       "floor": c.get("floor")}
            if overall is None or ratio > overall["ratio"]:
                overall = {"ratio": ratio, "direction": d, "id": r.get("id"), "tier": r.get("tier")}
    fails = [{"tier": r.get("tier"), "id": r.get("id"), "status": r.get("status"),
              "why": r.get("message") or "; ".join(f"{d}: {c.get('why')}" for d, c in (r.get("checks") or {}).items()
                                                  if not c.get("ok")),
              "known": "known_defect" in r}
             for r in records if r.get("status") != "passed"]
    # a KNOWN_DEFECTS case that passed: its strict xfail fails the shard; the entry is to go
    known_passed = sorted(str(r.get("id")) for r in records if r.get("status") == "passed" and "known_defect" in r)
    devices = sorted({r.get("device") for r in records if r.get("device")})
    seeds = sorted({int(m.group(1)) for r in records if r.get("tier") == "fuzz"
                    for m in [re.match(r"fuzz(\d+)_", str(r.get("id")))] if m})
    return {"devices": devices, "fuzz_seeds": seeds, "tiers": tiers, "max_ratio": worst, "worst": overall,
            "failures": sorted(fails, key=lambda f: (f["tier"] or "", f["id"] or "")),
            "known_passed": known_passed}


def _fmt(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.3f}"
    return str(x)


def markdown(payload: dict) -> str:
    lines = ["# Correctness: the FlashAttention rule on the GPU", "",
             f"Device: {payload.get('device')}; date {payload.get('date')}; commit {payload.get('commit')}.", "",
             "Rule per tensor: max |T - T_FP64| <= 2 x max |T_torch - T_FP64| + floor, T_torch the same "
             "math in torch at the input precision (tests/rule_harness.py). Ratio = err / bound: <= 1 passes.",
             "", "| tier | run | passed | failed | raised |", "|---|---|---|---|---|"]
    for t, s in payload["tiers"].items():
        lines.append(f"| {t} | {s['run']} | {s['passed']} | {s['failed']} | {s['errors']} |")
    if payload.get("fuzz_seeds"):
        lines += ["", f"Fuzz seed: {', '.join(map(str, payload['fuzz_seeds']))} (FAP_FUZZ_SEED reproduces the draws)."]
    lines += ["", "Largest error ratio to torch per score and direction (the case that has it below):", "",
              "| mode/evaluator | " + " | ".join(DIRECTION_NAMES[d] for d in DIRECTIONS) + " |",
              "|---|" + "---|" * len(DIRECTIONS)]
    for score in sorted(payload["max_ratio"]):
        row = payload["max_ratio"][score]
        lines.append(f"| {score} | " + " | ".join(_fmt(row[d]["ratio"]) if d in row else "—" for d in DIRECTIONS) + " |")
    lines += ["", "| mode/evaluator | direction | ratio | err | torch err | case |", "|---|---|---|---|---|---|"]
    for score in sorted(payload["max_ratio"]):
        row = payload["max_ratio"][score]
        d = max(row, key=lambda k: row[k]["ratio"])
        c = row[d]
        lines.append(f"| {score} | {DIRECTION_NAMES.get(d, d)} | {_fmt(c['ratio'])} | {_fmt(c['err'])} | "
                     f"{_fmt(c['torch_err'])} | `{c['id']}` |")
    w = payload.get("worst")
    if w:
        lines += ["", f"Worst case: `{w['id']}` ({w['tier']}), {DIRECTION_NAMES.get(w['direction'], w['direction'])} "
                      f"ratio {_fmt(w['ratio'])}."]
    if payload["failures"]:
        known = sum(1 for f in payload["failures"] if f.get("known"))
        lines += ["", f"Failures ({len(payload['failures'])}; {known} of them known defects, strict xfails in "
                      "tests/cases.py KNOWN_DEFECTS):", ""]
        lines += [f"- {f['tier']} `{f['id']}` {f['status']}{' (known defect)' if f.get('known') else ''}: {f['why']}"
                  for f in payload["failures"][:60]]
        if len(payload["failures"]) > 60:
            lines.append(f"- ... and {len(payload['failures']) - 60} more (correctness.json)")
    if payload.get("known_passed"):
        lines += ["", "Known defects that passed (their strict xfails fail; delete the KNOWN_DEFECTS entries): "
                  + ", ".join(f"`{i}`" for i in payload["known_passed"])]
    return "\n".join(lines) + "\n"


def _json_safe(x):
    """inf / nan as strings (strict JSON), recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def _protocol():
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    import protocol
    return protocol


def collect(out_dir: str, json_path: str = None, commit: str = None, date: str = None) -> dict:
    """Merge OUT_DIR's records, write json_path (default bench/out/correctness.json, scratch) and
    the Markdown beside it; return the payload."""
    protocol = _protocol()
    json_path = protocol.output_path(json_path, "correctness")
    payload = summarize(read_records(out_dir))
    payload = {"device": ", ".join(payload["devices"]) or "unknown",
               "date": date or _dt.date.today().isoformat(),
               "commit": commit or protocol.commit_id(), **payload}
    with open(json_path, "w") as f:
        json.dump(_json_safe(payload), f, indent=2)
        f.write("\n")
    with open(os.path.splitext(json_path)[0] + ".md", "w") as f:
        f.write(markdown(payload))
    return payload


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="merge OUT_DIR/*.jsonl into the results JSON + Markdown")
    c.add_argument("out_dir")
    protocol = _protocol()
    protocol.add_json_arg(c, "correctness")
    args = p.parse_args(argv)
    args.json = protocol.output_path(args.json, "correctness")
    payload = collect(args.out_dir, args.json)
    for t, s in payload["tiers"].items():
        print(f"{t}: {s['passed']}/{s['run']} passed, {s['failed']} failed, {s['errors']} raised")
    w = payload.get("worst")
    if w:
        print(f"worst: {w['id']} {w['direction']} ratio {_fmt(w['ratio'])}")
    print(f"wrote {args.json} and {os.path.splitext(args.json)[0]}.md")
    new = [f for f in payload["failures"] if not f.get("known")]
    if payload.get("known_passed"):
        print("known defects that passed (delete their KNOWN_DEFECTS entries): " + ", ".join(payload["known_passed"]))
    # exit 0 when every failure is a known defect (the tier's verdict: nothing new)
    return 0 if not new and not payload.get("known_passed") else 1


if __name__ == "__main__":
    sys.exit(main())
