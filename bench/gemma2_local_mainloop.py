"""Backward mainloop v1 vs v2 at the Gemma-2 2B local-layer shape, head_dim 128.

    python bench/gemma2_local_mainloop.py [--json PATH]

Why: bench/gemma2.py at 010fa5c showed the D = 128 local-layer poly step at 1.411 ms
(1.281 at eebab6b, before mainloop v2) while the global layer improved; this times the
backward alone (attn_bwd, softcap 50, window (4095, 0), causal, B=1 S=8192 H 8/4) with
mainloop 1 and 2 side by side, alternating order (local and global layer).
"""
import argparse
import json
import statistics
import sys
import os

import torch

sys.path.insert(0, os.path.dirname(__file__))
from attn_bwd_check import bench  # noqa: E402
from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--evaluators", default="poly", help="comma-separated: native,poly")
    a = ap.parse_args()
    b, s, hq, hkv, d = 1, 8192, 8, 4, 128
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v, do, o = mk(hq), mk(hkv), mk(hkv), mk(hq), mk(hq)
    lse = torch.randn(b, hq, s, device="cuda") + 10.0
    fns = {}
    for ev in a.evaluators.split(","):
        for win in ((4095, 0), (-1, -1)):
            for ml in (1, 2):
                name = f"softcap/{ev} window={win} mainloop={ml}"
                fns[name] = (lambda ev=ev, win=win, ml=ml: attn_bwd(
                    do, q, k, v, o, lse, mode="softcap", evaluator=ev, causal=True, softcap=50.0,
                    window_size=win, mainloop=ml))
    per = {n: [] for n in fns}
    names = list(fns)
    for r in range(a.rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            per[n].append(bench(fns[n]))
    rows = [{"impl": n, "bwd_ms": statistics.median(v)} for n, v in per.items()]
    print("| backward, Gemma-2 2B shape at D = 128 (B=1 S=8192 H 8/4, softcap 50, causal) | ms |")
    print("|---|---:|")
    for r in rows:
        print(f"| {r['impl']} | {r['bwd_ms']:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "commit": os.environ.get("FAP_COMMIT", ""),
                       "protocol": f"{a.rounds} rounds, order reversed on odd rounds; per round the median of "
                                   "30 CUDA-event-timed calls after 5 warm-ups; row = median over rounds",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
