"""The sigmoid poly forward's O against the FlashAttention rule on the GPU, per draw, across S_k.

    python bench/tools/sigmoid_tail_gpu.py --sk 130,162,256,1024 --draws 40 --evaluators poly,native   # H200 / H100

The GPU side of bench/tools/sigmoid_tail_model.py (the CPU model of the kernel's P): each draw is
a tests/cases.Case of the fuzz tier's shape (BF16, D = 128, 2 / 2 heads, causal, packed_qkv
layout, S_q = --sq or S_k), run through attention() and judged by tests/rule_harness.run_case (O's
ratio err / bound; > 1 misses the rule), the default bias -ln S_k.  Its draws are tagged
`tail<S_k>x<S_q>_<i>`, so every draw has its own inputs (Case.seed).  Prints per (S_k, S_q,
evaluator) the draws failing, the largest and the median ratio; --json writes every ratio.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.dirname(HERE)]   # tests (cases, rule_harness), bench
import protocol  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sk", default="130,162,256,1024", help="comma-separated key lengths")
    p.add_argument("--sq", default="28", help="comma-separated query lengths, or 'sk' for S_q = S_k")
    p.add_argument("--draws", type=int, default=40)
    p.add_argument("--evaluators", default="poly,native")
    p.add_argument("--backend", default="cuda", help="cuda, or reference (a CPU check of the harness)")
    protocol.add_json_arg(p, "sigmoid_tail_gpu")
    a = p.parse_args(argv)
    import cases as C
    import rule_harness as H
    warnings.filterwarnings("ignore", category=UserWarning)
    rows = []
    for sk in (int(x) for x in a.sk.split(",")):
        for sq in (sk if x == "sk" else int(x) for x in a.sq.split(",")):
            for ev in a.evaluators.split(","):
                v = C.Variant("sigmoid", ev, "bf16", 128, True, None)
                rs = [H.run_case(C.Case(v, 1, sq, sk, 2, 2, (-1, -1), "packed_qkv", None, tier="fuzz",
                                        tag=f"tail{sk}x{sq}_{i}"), a.backend)["checks"]["o"]["ratio"]
                      for i in range(a.draws)]
                rows.append(dict(seqlen_k=sk, seqlen_q=sq, evaluator=ev, fail=sum(r > 1 for r in rs),
                                 draws=len(rs), max=max(rs), median=statistics.median(rs), ratios=rs))
                protocol.progress(f"S_k {sk} S_q {sq} {ev}: fail {rows[-1]['fail']} / {len(rs)}, "
                                  f"max {rows[-1]['max']:.3f}, median {rows[-1]['median']:.3f}")
    if a.json:
        res = {**protocol.header(protocol_text="one attention() call per draw, judged by tests/rule_harness"),
               "rows": rows}
        protocol.report(a.json, res, protocol.markdown_table(
            [{k: r[k] for k in r if k != "ratios"} for r in rows],
            ["seqlen_k", "seqlen_q", "evaluator", "fail", "draws", "max", "median"]),
            "Sigmoid poly O against the FlashAttention rule by S_k", doc=__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
