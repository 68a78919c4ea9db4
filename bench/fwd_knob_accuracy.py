"""Forward output error under the online-softmax knobs, against FP64 math of the exact function.

    python bench/fwd_knob_accuracy.py --json bench/results/fwd_knob_accuracy.json   # on the H200

The knobs that change how the forward normalises P (kernels/attn_fwd_sm90.AttnFwdConfig):
`fixed_max` (softcap: constant row max), `fixed_max_rsum` (its row sum over the BF16-rounded
P) and `rescale_threshold` (a stale row max kept until it is off by more than 2^t). For each
(mode, evaluator, spread) one causal GQA problem (bench/accuracy.py's shape and inputs: B=1
S=4096 H_q=8 H_kv=2 D=128 BF16, q and k scaled by the spread) runs through attn_fwd once per
knob setting; the table gives the rel L2 error of O and the max abs error of LSE against the
FP64 reference, and O's error relative to the first setting of the row (the online max).
Forward only: the backward reads O (through rowsum(dO * O)) and LSE, so its errors follow.
"""
from __future__ import annotations

import argparse
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402

SETTINGS = {
    "softcap": [("online", {"fixed_max": False}), ("fixed", {"fixed_max": True}),
                ("fixed+rsum", {"fixed_max": True, "fixed_max_rsum": True}),
                ("online+t8", {"fixed_max": False, "rescale_threshold": 8.0})],
    "softmax": [("online", {"rescale_threshold": 0.0}), ("online+t8", {"rescale_threshold": 8.0})],
}
ROWS = [("softmax", "native", 1.0), ("softmax", "native", 2.0),
        ("softcap", "native", 1.0), ("softcap", "native", 3.5), ("softcap", "native", 4.5),
        ("softcap", "poly", 3.5), ("softcap", "poly", 4.5)]


def one_row(args, mode, evaluator, spread):
    import torch
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd
    from flash_attn_poly.reference import attention_ref
    from flash_attn_poly.testing import rel_l2_err
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{mode} {spread}".encode()))
    mk = lambda h, a: (torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda", generator=g) * a).bfloat16()
    q, k, v = mk(args.hq, spread), mk(args.hkv, spread), mk(args.hkv, 1.0)
    kw = {"softcap": 50.0} if mode == "softcap" else {}
    ref, ref_lse = attention_ref(q, k, v, mode, causal=True, **kw)
    out = []
    for name, tuning in SETTINGS[mode]:
        o, lse = attn_fwd(q, k, v, mode=mode, evaluator=evaluator, causal=True, tuning=tuning, **kw)
        torch.cuda.synchronize()
        out.append({"mode": mode, "evaluator": evaluator, "spread": spread, "setting": name,
                    "O_rel_l2": rel_l2_err(o, ref),
                    "lse_max_abs": (lse.double() - ref_lse.double()).abs().max().item()})
    for r in out:
        r["O_vs_online"] = r["O_rel_l2"] / out[0]["O_rel_l2"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p, hq=8, hkv=2)
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = [r for m, e, s in ROWS for r in one_row(args, m, e, s)]
    hdr = protocol.header(protocol.Timing(0, 1, 1))
    hdr["protocol"] = (f"one forward per setting, B={args.batch} S={args.seqlen} H_q={args.hq} H_kv={args.hkv} D={args.headdim} "
                       "causal BF16, softcap 50; rel L2 of O and max |LSE error| vs the FP64 exact-function reference")
    md = [f"# Forward accuracy under the online-softmax knobs ({hdr['device']}, {hdr['date']}, commit {hdr['commit']})",
          "", f"Protocol: {hdr['protocol']}.", "",
          "| mode | evaluator | spread | setting | O rel L2 | O / online | LSE max abs |", "|---|---|---|---|---|---|---|"]
    md += [f"| {r['mode']} | {r['evaluator']} | {r['spread']} | {r['setting']} | {r['O_rel_l2']:.3e} | "
           f"{r['O_vs_online']:.2f} | {r['lse_max_abs']:.2e} |" for r in rows]
    text = "\n".join(md) + "\n"
    if args.json:
        protocol.write_results(args.json, {**hdr, "rows": rows}, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
