"""Re-run one correctness case under several evaluators / plan overrides on the same inputs, over
several input draws, and print each tensor's error / bound ratio (tests/rule_harness.py: the
FlashAttention rule; > 1 fails): whether a failing case is its build's or the shape's.

    python bench/tools/rule_probe.py --fuzz pinned:0 --variants poly,native,native+fwd.fixed_max=0 --draws 40

--fuzz SEED:INDEX picks the fuzz tier's draw (tests/cases.fuzz_cases), pinned:N a kept defect's draw
(tests/cases.FUZZ_PINNED: pinned:0 is the fixed-max softcap case once drawn as 20261201:208); --draws N adds N input
draws of the same case (the tag, hence the seed, changes; the shape and build stay).  --save PATH
writes (torch.save) the inputs of the case's own draw and of every failing draw, with each variant's
O, LSE and gradients, on the CPU: bench/tools/fixed_max_model.py --inputs PATH replays the model on
exactly those inputs (the GPU's generator draws other numbers than the CPU's).
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import protocol  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fuzz", required=True, help="SEED:INDEX of the fuzz tier's draw, or pinned:N (cases.FUZZ_PINNED)")
    ap.add_argument("--variants", default="poly,native",
                    help="comma-separated EVALUATOR[+fwd.FIELD=V...]: each runs on the same inputs per draw")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--save", default="", help="torch.save the drawn and the failing draws' inputs and outputs here")
    protocol.add_json_arg(ap, "rule_probe")
    a = ap.parse_args()
    import torch
    import cases
    import rule_harness as H
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    case = cases.fuzz_case(a.fuzz, sm_count=sm)
    print("case", case.id)
    from flash_attn_poly import testing
    from flash_attn_poly.kernels import dispatch
    variants = [v.split("+") for v in a.variants.split(",")]
    out = {"case": case.id, "rows": []}
    ratios = {v[0] + "".join("+" + o for o in v[1:]): {} for v in variants}
    fails = dict.fromkeys(ratios, 0)
    saved = []
    cpu = lambda t: None if t is None else t.detach().float().cpu()
    for d in range(a.draws + 1):
        c = case if d == 0 else cases.retarget(case, tag=f"{case.tag}probe{d}")
        q, k, v_, dout = (t.detach() for t in H.make_inputs(c))
        record = {"draw": d, "tag": c.tag, "dtype": c.dtype, "variants": {},
                  "inputs": [cpu(t) for t in (q, k, v_, dout)] if a.save else None}
        for var in variants:
            name = var[0] + "".join("+" + o for o in var[1:])
            ov = {}
            for o in var[1:]:
                key, val = o.split("=")
                ov[key] = {"0": False, "1": True}.get(val, val)
            p = testing.plan_for(q, k, v_, c.mode, var[0], overrides=ov, **c.kwargs())
            o_, lse = dispatch.forward(p, q, k, v_)
            grads = dispatch.backward(p, dout, q, k, v_, o_, lse)
            checks = H.judge_case(c, q, k, v_, dout, o_, lse if c.mode != "sigmoid" else None, grads)
            for n, ch in checks.items():
                ratios[name].setdefault(n, []).append(ch["ratio"])
            fails[name] += not all(ch["ok"] for ch in checks.values())
            if a.save:   # host copies only when they are kept
                record["variants"][name] = {"o": cpu(o_), "lse": cpu(lse), "grads": [cpu(g) for g in grads],
                                            "ratio": {n: ch["ratio"] for n, ch in checks.items()},
                                            "ok": all(ch["ok"] for ch in checks.values())}
            if d == 0:
                print(f"{name} drawn inputs:", {n: round(ch["ratio"], 3) for n, ch in checks.items()})
        if a.save and (d == 0 or not all(x["ok"] for x in record["variants"].values())):
            saved.append(record)
    if a.save:
        torch.save({"case": case.id, "fuzz": a.fuzz, "draws": saved}, a.save)
        print(f"saved {len(saved)} draws to {a.save}")
    for name, r in ratios.items():
        row = {"variant": name, "draws": a.draws + 1, "failed": fails[name],
               "max_ratio": {n: round(max(x), 3) for n, x in r.items()},
               "median_ratio": {n: round(sorted(x)[len(x) // 2], 3) for n, x in r.items()}}
        print(json.dumps(row))
        out["rows"].append(row)
    with open(protocol.output_path(a.json, "rule_probe"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
