"""B1 SiLU, B4 fused SwiGLU, Gemma-2's GeGLU and the FP16 standalone sweep: poly vs native.

    python bench/elementwise.py            # H200: bench/out/elementwise.json (+ .md)
    python bench/elementwise.py --sections geglu   # the fused GeGLU (gelu_pytorch_tanh) rows only
    python bench/elementwise.py --graph    # bench/out/elementwise_graph.json
        # every implementation's timed calls captured in CUDA graphs: device time, no host
        # dispatch (the 4M-element sweep and the B4 fwd+bwd step are host-bound otherwise)
    python bench/elementwise.py --graph --json bench/results/elementwise_graph.json  # commit one

Rows: median per-round mean time (bench/protocol.py), achieved GB/s (bytes each call must
move: every input read once, every output written once) and the device copy bandwidth
measured in the same run (torch copy_ of 1 GiB, read + write), the physical limit here.
Backward rows exclude forward work except the B4 "fwd+bwd" rows, which time a full
autograd step (forward, then backward from a fixed dy), the training-relevant number.
Sweep note: native sigmoid/tanh backward consume the saved forward output y and apply
g*y*(1-y) / g*(1-y^2); the poly rows take x and evaluate direct D4 derivative fits, so
those two rows compare a direct derivative fit with the algebraic rule, not SFU with FMA.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402
from protocol import Timing, header, markdown_table  # noqa: E402

from flash_attn_poly import activations as act  # noqa: E402

B1_N = 58_720_256
B4_ROWS, B4_HIDDEN = 24_576, 1_280
SWEEP_SIZES = (4_194_304, 268_435_456)


_GRAPH = False   # --graph: protocol.time_alternating_graph instead of time_alternating


def _time(fns, timing):
    return (protocol.time_alternating_graph if _GRAPH else protocol.time_alternating)(fns, timing)


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def copy_bandwidth(timing: Timing) -> float:
    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    t = protocol.time_alternating({"copy": lambda: dst.copy_(src)},
                         Timing(timing.warmup, timing.rounds, max(timing.iters // 5, 5)))["copy"]
    return gbps(2 * src.numel() * 2, t)


def _rows(section, times, nbytes, copy_gbps, baseline):
    rows = []
    for name, ms in times.items():
        bw = gbps(nbytes[name], ms)
        rows.append({"section": section, "impl": name, "ms": ms, "GB/s": bw,
                     "% copy": 100 * bw / copy_gbps,
                     "speedup vs " + baseline: times[baseline] / ms})
    return rows


def bench_b1(timing, copy_gbps):
    x = torch.randn(B1_N, device="cuda").to(torch.bfloat16)
    g = torch.randn_like(x)
    n = x.numel() * 2
    fwd = {"torch F.silu": lambda: F.silu(x),
           "native (SFU) kernel": lambda: act._silu_fwd(x, "native"),
           "poly kernel": lambda: act._silu_fwd(x, "poly")}
    rows = _rows("B1 SiLU fwd", _time(fwd, timing), dict.fromkeys(fwd, 2 * n),
                 copy_gbps, "torch F.silu")
    bwd = {"torch silu_backward": lambda: torch.ops.aten.silu_backward(g, x),
           "native (SFU) kernel": lambda: act._silu_bwd(x, g, "native"),
           "poly kernel": lambda: act._silu_bwd(x, g, "poly")}
    rows += _rows("B1 SiLU bwd", _time(bwd, timing), dict.fromkeys(bwd, 3 * n),
                  copy_gbps, "torch silu_backward")
    return rows


def _eager_swiglu(g, u):
    return F.silu(g) * u


def bench_b4(timing, copy_gbps):
    shape = (B4_ROWS, B4_HIDDEN)
    gate = torch.randn(shape, device="cuda").to(torch.bfloat16).requires_grad_()
    up = torch.randn(shape, device="cuda").to(torch.bfloat16).requires_grad_()
    gate_up = torch.cat([gate.detach(), up.detach()], -1).requires_grad_()
    dy = torch.randn(shape, device="cuda").to(torch.bfloat16)
    compiled = torch.compile(_eager_swiglu)
    n = gate.numel() * 2
    with torch.no_grad():
        fwd = {"torch eager silu(g)*u": lambda: _eager_swiglu(gate, up),
               "torch.compile silu(g)*u": lambda: compiled(gate, up),
               "native (SFU) kernel": lambda: act.swiglu(gate, up, evaluator="native"),
               "poly kernel (gate, up)": lambda: act.swiglu(gate, up),
               "poly kernel [gate|up]": lambda: act.swiglu(gate_up)}
        rows = _rows("B4 SwiGLU fwd", _time(fwd, timing), dict.fromkeys(fwd, 3 * n),
                     copy_gbps, "torch eager silu(g)*u")

    # Backward kernels alone, from saved tensors (what autograd runs after the forward):
    # torch eager = mul backward (dy*up, dy*silu_saved) + aten.silu_backward.
    s_saved = F.silu(gate.detach())
    g_d, u_d = gate.detach(), up.detach()
    bwd = {"torch eager ops": lambda: (torch.ops.aten.silu_backward(dy * u_d, g_d), dy * s_saved),
           "native (SFU) kernel": lambda: act._swiglu_bwd(g_d, u_d, dy, "native"),
           "poly kernel (gate, up)": lambda: act._swiglu_bwd(g_d, u_d, dy, "poly"),
           "poly kernel [gate|up]": lambda: act._swiglu_concat_bwd(gate_up.detach(), dy, "poly")}
    rows += _rows("B4 SwiGLU bwd only", _time(bwd, timing),
                  dict.fromkeys(bwd, 5 * n), copy_gbps, "torch eager ops")

    def step(fn, *args):
        def run():   # forward, then the backward of both inputs from dy (returned, not accumulated)
            return torch.autograd.grad(fn(*args), args, dy)
        return run
    # Bytes of the fused pair: fwd reads 2, writes 1; bwd reads 3, writes 2 (per element).
    both = {"torch eager silu(g)*u": step(_eager_swiglu, gate, up),
            "torch.compile silu(g)*u": step(compiled, gate, up),
            "native (SFU) kernel": step(lambda g, u: act.swiglu(g, u, evaluator="native"), gate, up),
            "poly kernel (gate, up)": step(act.swiglu, gate, up),
            "poly kernel [gate|up]": step(act.swiglu, gate_up)}
    rows += _rows("B4 SwiGLU fwd+bwd", _time(both, timing),
                  dict.fromkeys(both, 8 * n), copy_gbps, "torch eager silu(g)*u")
    return rows


def _eager_geglu(g, u):
    return F.gelu(g, approximate="tanh") * u


def bench_geglu(timing, copy_gbps):
    """Gemma-2's MLP activation gelu_pytorch_tanh(gate) * up at the B4 shape: forward, and the
    training step (forward, then both gradients from dy)."""
    shape = (B4_ROWS, B4_HIDDEN)
    gate = torch.randn(shape, device="cuda").to(torch.bfloat16).requires_grad_()
    up = torch.randn(shape, device="cuda").to(torch.bfloat16).requires_grad_()
    dy = torch.randn(shape, device="cuda").to(torch.bfloat16)
    compiled = torch.compile(_eager_geglu)
    n = gate.numel() * 2
    impls = {"torch eager gelu_tanh(g)*u": _eager_geglu,
             "torch.compile gelu_tanh(g)*u": compiled,
             "native (SFU) kernel": lambda g, u: act.geglu(g, u, evaluator="native"),
             "poly kernel": act.geglu}
    with torch.no_grad():
        fwd = {k: (lambda f=f: f(gate, up)) for k, f in impls.items()}
        rows = _rows("GeGLU fwd", _time(fwd, timing), dict.fromkeys(fwd, 3 * n),
                     copy_gbps, "torch eager gelu_tanh(g)*u")
    both = {k: (lambda f=f: torch.autograd.grad(f(gate, up), (gate, up), dy)) for k, f in impls.items()}
    rows += _rows("GeGLU fwd+bwd", _time(both, timing), dict.fromkeys(both, 8 * n),
                  copy_gbps, "torch eager gelu_tanh(g)*u")
    return rows


_NATIVE_FWD = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu,
               "gelu": lambda x: F.gelu(x, approximate="none")}


def _native_bwd(fn, x, y, g):
    if fn == "sigmoid":
        return lambda: torch.ops.aten.sigmoid_backward(g, y)
    if fn == "tanh":
        return lambda: torch.ops.aten.tanh_backward(g, y)
    if fn == "silu":
        return lambda: torch.ops.aten.silu_backward(g, x)
    return lambda: torch.ops.aten.gelu_backward(g, x, approximate="none")


def bench_sweep(timing, copy_gbps, sizes):
    rows = []
    for n in sizes:
        x = torch.randn(n, device="cuda").to(torch.float16)
        g = torch.randn_like(x)
        for fn in act.SWEEP_FNS:
            y = _NATIVE_FWD[fn](x)
            fwd = {"native torch": lambda fn=fn: _NATIVE_FWD[fn](x),
                   "poly kernel": lambda fn=fn: act.sweep_forward(fn, x)}
            rows += _rows(f"sweep {fn} fwd n={n}", _time(fwd, timing),
                          dict.fromkeys(fwd, 4 * n), copy_gbps, "native torch")
            bwd = {"native torch": _native_bwd(fn, x, y, g),
                   "poly kernel": lambda fn=fn: act.sweep_backward(fn, x, g)}
            rows += _rows(f"sweep {fn} bwd n={n}", _time(bwd, timing),
                          dict.fromkeys(bwd, 6 * n), copy_gbps, "native torch")
            del y
        del x, g
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_json_arg(p, "elementwise")
    p.add_argument("--sections", default="b1,b4,sweep", help="comma-separated: b1, b4, geglu, sweep")
    protocol.add_timing_args(p, warmup=25, rounds=5, iters=100)
    p.add_argument("--sweep-warmup", type=int, default=1000)
    p.add_argument("--sweep-rounds", type=int, default=9)
    p.add_argument("--sweep-iters", type=int, default=1000)
    p.add_argument("--sweep-sizes", default=",".join(map(str, SWEEP_SIZES)))
    p.add_argument("--graph", action="store_true",
                   help="capture each implementation's timed calls in a CUDA graph (device time)")
    args = p.parse_args(argv)
    path = protocol.output_path(args.json, "elementwise_graph" if args.graph else "elementwise")
    global _GRAPH
    _GRAPH = args.graph
    sections = args.sections.split(",")
    timing = Timing(args.warmup, args.rounds, args.iters)
    sweep_timing = Timing(args.sweep_warmup, args.sweep_rounds, args.sweep_iters)
    copy_gbps = copy_bandwidth(timing)
    rows = []
    if "b1" in sections:
        rows += bench_b1(timing, copy_gbps)
    if "b4" in sections:
        rows += bench_b4(timing, copy_gbps)
    if "geglu" in sections:
        rows += bench_geglu(timing, copy_gbps)
    if "sweep" in sections:
        rows += bench_sweep(sweep_timing, copy_gbps,
                            [int(s) for s in args.sweep_sizes.split(",")])
    describe = (lambda t: protocol.GRAPH_PROTOCOL.format(warmup=t.warmup, rounds=t.rounds, iters=t.iters)) \
        if _GRAPH else Timing.describe
    out = {**header(timing), "protocol": describe(timing), "sweep_protocol": describe(sweep_timing),
           "timing": "cuda_graph" if _GRAPH else "eager",
           "copy_GBps": copy_gbps, "rows": rows,
           "notes": __doc__.split("\n\n", 2)[2].strip()}
    cols = ["section", "impl", "ms", "GB/s", "% copy"]
    table = markdown_table([{**r, "speedup": next(v for k, v in r.items() if k.startswith("speedup"))}
                            for r in rows], cols + ["speedup"])
    print(f"device copy bandwidth: {copy_gbps:.0f} GB/s")
    print(table)
    protocol.write_results(path, out,
                           f"# Elementwise benchmark ({out['device']}, {out['date']}, commit {out['commit']})\n\n"
                           f"Protocol: {out['protocol']}. Sweep: {out['sweep_protocol']}.\n"
                           f"Device copy bandwidth in the same run: {copy_gbps:.0f} GB/s. "
                           f"speedup = baseline time / row time (baseline: first row of each section).\n\n"
                           f"{out['notes']}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
