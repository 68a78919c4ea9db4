"""Re-run one correctness case (by its id's fields) under several evaluators and input draws,
and print each tensor's error / bound ratio (tests/rule_harness.py: the FlashAttention rule;
> 1 fails): whether a failing case is its evaluator's or the shape's.

    python bench/tools/rule_probe.py --fuzz 20261201:208 --evaluators poly,native --draws 40   # H200

--fuzz SEED:INDEX picks the fuzz tier's draw (tests/cases.fuzz_cases); --draws N adds N input
draws of the same case (the tag, hence the seed, changes; the shape and build stay).
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fuzz", required=True, help="SEED:INDEX of the fuzz tier's draw")
    ap.add_argument("--evaluators", default="poly,native")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch
    import cases
    import rule_harness as H
    seed, index = (int(x) for x in a.fuzz.split(":"))
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    case = cases.fuzz_cases(seed, count=index + 1, sm_count=sm)[index]
    print("case", case.id)
    out = {"case": case.id, "rows": []}
    for ev in a.evaluators.split(","):
        ratios, fails = {}, 0
        for d in range(a.draws + 1):
            c = cases.retarget(case, evaluator=ev, tag=case.tag if d == 0 else f"{case.tag}probe{d}")
            rec = H.run_case(c, "cuda")
            for n, ch in rec["checks"].items():
                ratios.setdefault(n, []).append(ch["ratio"])
            fails += rec["status"] != "passed"
            if d == 0:
                print(f"{ev} drawn inputs:", {n: round(ch["ratio"], 3) for n, ch in rec["checks"].items()})
        row = {"evaluator": ev, "draws": a.draws + 1, "failed": fails,
               "max_ratio": {n: round(max(r), 3) for n, r in ratios.items()},
               "median_ratio": {n: round(sorted(r)[len(r) // 2], 3) for n, r in ratios.items()}}
        print(json.dumps(row))
        out["rows"].append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
