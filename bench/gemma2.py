"""Gemma-2-2B attention, forward+backward step time: ours (native / poly softcap) vs FA4 softcap
vs torch eager (transformers' eager math) vs sdpa (no softcap: a lower bound, not the same math).

Shapes of Gemma-2 2B attention (issue 6): H_q = 8, H_kv = 4, softcap 50, scale D^-0.5,
S = 8192, global layers (causal) and local layers (causal + sliding window 4096, i.e.
window_size = (4095, 0): transformers' window w lets query i see keys i - w < j <= i).
head_dim: Gemma-2 uses 256 (the default here; forward and backward on our kernels since the
D = 256 backward landed); pass --headdim 128 for D = 128.  A path that raises
NotImplementedError for the backward reports its forward time and "n/a" for the step.
Local layers use our sliding-window kernels (GPU-verified: tests/test_window_gpu.py).
Protocol: bench/protocol.py.

    python bench/gemma2.py                  # H200, D = 256: bench/out/gemma2_d256.json (+ .md)
    python bench/gemma2.py --headdim 128    # bench/out/gemma2_d128.json
    python bench/gemma2.py --json bench/results/gemma2_d256.json   # commit a result

bench/results/gemma2.md is the hand-kept summary of the committed tables.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402

SOFTCAP = 50.0
WINDOW = 4096


def _window(local: bool):
    return (WINDOW - 1, 0) if local else (-1, -1)


def ours(evaluator, local, program=None):
    import flash_attn_poly
    kw = {"program": program} if program else {}
    return lambda q, k, v: flash_attn_poly.attention(
        q, k, v, "softcap", causal=True, softcap=SOFTCAP, evaluator=evaluator,
        window_size=_window(local), backend="cuda", **kw)


def fa4(local):
    from flash_attn.cute import flash_attn_func
    return lambda q, k, v: flash_attn_func(q, k, v, causal=True, softcap=SOFTCAP, window_size=_window(local))


def _mask(s, local, device):
    from flash_attn_poly import reference
    m = reference.causal_mask(s, s, device) & reference.window_mask(s, s, *_window(local), device)
    return m


def eager(local):
    """transformers' eager Gemma-2 path: bf16 matmuls, softcap, additive mask, FP32 softmax."""
    import torch
    cache = {}

    def f(q, k, v):
        b, s, hq, d = q.shape
        if s not in cache:
            cache[s] = _mask(s, local, q.device)
        g = hq // k.shape[2]
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(g, 1), v.transpose(1, 2).repeat_interleave(g, 1)
        x = (qt @ kt.transpose(-1, -2)) * d ** -0.5
        x = torch.tanh(x / SOFTCAP) * SOFTCAP
        x = x.masked_fill(~cache[s], float("-inf"))
        p = torch.softmax(x, dim=-1, dtype=torch.float32).to(q.dtype)
        return (p @ vt).transpose(1, 2)
    return f


def sdpa(local):
    """torch sdpa without softcap (sdpa has no softcap): a speed floor, different math."""
    import torch
    import torch.nn.functional as F
    cache = {}

    def f(q, k, v):
        s = q.shape[1]
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if not local:
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True).transpose(1, 2)
        if s not in cache:
            cache[s] = _mask(s, True, q.device)
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=cache[s], enable_gqa=True).transpose(1, 2)
    return f


def rows(local, programs=(), impls=None):
    """name -> row maker; programs: extra ours/poly rows with these table programs; impls: keep
    the rows whose name starts with one of these prefixes (e.g. "ours"; None: all)."""
    out = {"ours/native": lambda: ours("native", local), "ours/poly": lambda: ours("poly", local)}
    for prog in programs:
        out[f"ours/poly {prog}"] = lambda prog=prog: ours("poly", local, prog)
    out.update({"fa4/softcap": lambda: fa4(local), "eager/softcap": lambda: eager(local),
                "sdpa/no-softcap": lambda: sdpa(local)})
    if impls:
        out = {n: f for n, f in out.items() if n.split("/")[0] in impls}
    return out


def _step(make, args):
    """fwd+bwd step callable (and a forward-only one) on fresh inputs; raises if unsupported."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g).requires_grad_()
    q, k, v = mk(args.hq), mk(args.hkv), mk(args.hkv)
    fn = make()

    def fwd():
        with torch.no_grad():
            fn(q, k, v)
    fwd()
    try:
        out = fn(q, k, v)
    except NotImplementedError as e:   # a forward-only path
        print(f"  forward only: {str(e)[:200]}")
        return fwd, None
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn_like(out)

    def step():
        o = fn(q, k, v)
        o = o[0] if isinstance(o, tuple) else o
        torch.autograd.grad(o, (q, k, v), dout)
    step()
    return fwd, step


def attended_pairs(s, local):
    """(query, key) pairs a causal (+ window) layer computes: the FLOP count's area."""
    if not local:
        return s * (s + 1) / 2
    w = WINDOW
    return sum(min(i + 1, w) for i in range(s)) if s <= 65536 else s * w


def run(args):
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)
    result = {**protocol.header(timing), "shape": vars(args).copy(), "layers": {}}
    for layer in ("global", "local"):
        local = layer == "local"
        fwd_fns, step_fns, skipped = {}, {}, {}
        for name, make in rows(local, args.programs, args.impls).items():
            try:
                fwd_fns[name], st = _step(make, args)
                if st is not None:
                    step_fns[name] = st
            except Exception as e:  # noqa: BLE001 - a path that cannot run is reported, not fatal
                skipped[name] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"skip {layer} {name}: {skipped[name]}")
        fwd, fwd_clk = protocol.time_with_clocks(fwd_fns, timing, args.clocks)
        step, step_clk = protocol.time_with_clocks(step_fns, timing, args.clocks)
        f = 4 * args.batch * args.hq * args.headdim * attended_pairs(args.seqlen, local)
        table = [{"impl": n, "fwd_ms": fwd[n], "fwd_bwd_ms": step.get(n), "fwd_tflops": f / fwd[n] / 1e9,
                  "fwd_bwd_tflops": 3.5 * f / step[n] / 1e9 if n in step else None} for n in fwd_fns]
        for r in table:   # --clocks: mean SM clock / power over the samples inside the row's segments
            for pre, clk in (("fwd", fwd_clk), ("fwd_bwd", step_clk)):
                if r["impl"] in clk:
                    r[f"{pre}_sm_mhz"] = clk[r["impl"]]["sm_mhz"]
                    r[f"{pre}_power_w"] = clk[r["impl"]]["power_w"]
        result["layers"][layer] = {"rows": table, "skipped": skipped, "window_size": list(_window(local))}
        print(f"\n{layer} layer (window {_window(local)}):")
        print(protocol.markdown_table(table, _columns(args.clocks)))
    return result


def _columns(clocks: bool) -> list[str]:
    extra = ["fwd_sm_mhz", "fwd_power_w", "fwd_bwd_sm_mhz", "fwd_bwd_power_w"] if clocks else []
    return ["impl", "fwd_ms", "fwd_bwd_ms", "fwd_tflops", "fwd_bwd_tflops"] + extra


def markdown(res: dict) -> str:
    sh = res["shape"]
    lines = [f"# Gemma-2 attention step, head_dim {sh['headdim']} ({res['device']}, {res['date']}, "
             f"commit {res['commit']}, torch {res['torch']})", "",
             f"B={sh['batch']} S={sh['seqlen']} H_q={sh['hq']} H_kv={sh['hkv']}, softcap {SOFTCAP:g}, causal; "
             f"the local layer adds a sliding window of {WINDOW}. Protocol: {res['protocol']}. "
             "fwd_bwd = forward + torch.autograd.grad of q, k, v; TFLOP/s counts the attended pairs only."]
    for layer, data in res["layers"].items():
        lines += ["", f"## {layer} layer (window_size {tuple(data['window_size'])})", "",
                  protocol.markdown_table(data["rows"], _columns(bool(sh.get("clocks"))))]
        lines += [f"- skipped {name}: {why}" for name, why in data["skipped"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--hq", type=int, default=8)
    p.add_argument("--hkv", type=int, default=4)
    p.add_argument("--headdim", type=int, default=256)
    protocol.add_timing_args(p, warmup=5, rounds=5, iters=10)
    p.add_argument("--programs", type=lambda s: [x for x in s.split(",") if x], default=[],
                   help="extra ours/poly rows with these programs, e.g. softcap_c50_f16")
    p.add_argument("--impls", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="rows of these implementations only: ours, fa4, eager, sdpa (default: all)")
    p.add_argument("--order", default="alternate", choices=sorted(protocol.ORDERS),
                   help="row order per round (bench/protocol.py): the seed's alternation or a seeded shuffle")
    p.add_argument("--clocks", action="store_true",
                   help="SM clock / power per row from nvidia-smi samples inside its timed segments (bench/tools/clocks.py)")
    protocol.add_json_arg(p, "gemma2_d256")
    args = p.parse_args(argv)
    path = protocol.output_path(args.json, f"gemma2_d{args.headdim}")
    res = run(args)
    protocol.write_results(path, res, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
