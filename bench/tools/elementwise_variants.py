"""Elementwise tuning variants (kernels/elementwise.py ElementwiseTune), side by side, one call.

    python bench/tools/elementwise_variants.py          # H200: bench/out/elementwise_variants.json (+ .md)
    python bench/tools/elementwise_variants.py --quick  # fewer rounds/calls, same checks
    python bench/tools/elementwise_variants.py --kinds swiglu_fwd,swiglu_bwd    # B4 SwiGLU

1. Builds every variant (tvm-ffi, cubin kept: registers -> resident 256-thread blocks/SM).
2. Bit-exact check: each variant's outputs equal the "default" build's (ElementwiseTune(),
   "default" grid policy) on random inputs of sizes 1, 7, 1023, 2^20+3 and the section's
   size; a mismatch is reported and the variant is left out of the timing.
3. Times each kind (poly, BF16; B1 SiLU: 58,720,256 elements, B4 SwiGLU: 24,576 x 1,280,
   flat two-tensor layout) for every variant with torch's eager op(s) and a device copy of
   the same bytes (torch copy_ of every input and output element's bytes),
   bench/protocol.py time_alternating. "% copy" = same-bytes copy time / row time; "% copy
   1G" = vs the 1 GiB copy bandwidth measured in the same run (the reference of
   bench/results/elementwise.md).
Kinds with more than one input use each variant's tune without the unroll override (U = 2),
deduplicated. "default" is the untuned launch; the API's policy per kind is
kernels/elementwise.GRID_POLICY (SiLU forward: "balanced").
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol, elementwise)
import protocol  # noqa: E402
from protocol import Timing, header, markdown_table, time_alternating  # noqa: E402
from elementwise import copy_bandwidth, gbps  # noqa: E402  (the 1 GiB copy of bench/elementwise.py)

from flash_attn_poly.kernels import elementwise as ew  # noqa: E402
from flash_attn_poly.kernels import elementwise_ops as ops  # noqa: E402
from flash_attn_poly.kernels import sass  # noqa: E402

B1_N = 58_720_256
B4_N = 24_576 * 1_280
CHECK_SIZES = (1, 7, 1023, 2**20 + 3, B1_N)
SECTIONS = {"silu_fwd": ("B1 SiLU fwd", B1_N), "silu_bwd": ("B1 SiLU bwd", B1_N),
            "swiglu_fwd": ("B4 SwiGLU fwd", B4_N), "swiglu_bwd": ("B4 SwiGLU bwd", B4_N)}
T = ew.ElementwiseTune
VARIANTS = {                     # name -> forward tune (~8: compile is ~1 s each)
    "default": T(),
    "balanced": T(grid="balanced"),
    "resident pred": T(grid="resident", remainder="pred"),
    "pred": T(remainder="pred"),
    "u2 balanced": T(unroll=2, grid="balanced"),
    "u8 resident pred": T(unroll=8, grid="resident", remainder="pred"),
    "stream balanced": T(cache="stream", grid="balanced"),
    "stream resident pred": T(cache="stream", grid="resident", remainder="pred"),
    "stream_na resident pred": T(cache="stream_na", grid="resident", remainder="pred"),
}


class Variant:
    """One compiled kernel + its launch policy; call(ins, outs) runs it on flat tensors."""

    def __init__(self, kind: str, tune: ew.ElementwiseTune, sm_count: int):
        key = ew.ElementwiseKey(kind, "bf16", "poly", "flat",
                                ew.program_bits(kind, "bf16", "poly"), tune)
        self.kernel = ew.ElementwiseKernel(key)
        dump = tempfile.mkdtemp(prefix="fap_var_")
        t0 = time.time()
        try:
            self.fn = self.kernel.compile(options=f"--keep-cubin --dump-dir={dump}")
        finally:
            shutil.rmtree(dump, ignore_errors=True)
        self.compile_s = time.time() - t0
        cubin = self.fn.artifacts.CUBIN
        self.regs = max(sass.registers(cubin).values())
        counts = sass.count_opcodes(sass.disassemble(cubin))
        self.sass = {k: counts[k] for k in ("LDG.128", "STG.128", "STL", "LDL")}
        self.resident = ew.resident_blocks(self.regs)
        self.tune, self.sm_count, self._grids = tune, sm_count, {}

    def grid(self, n: int) -> int:
        if n not in self._grids:
            self._grids[n] = ew.grid_size(n // ew.CHUNK, self.kernel.unroll, self.sm_count,
                                          self.tune.grid, self.resident)
        return self._grids[n]

    def __call__(self, ins: list, outs: list) -> None:
        n = outs[0].numel()
        tensors = ins + [ins[0]] * (3 - len(ins)) + outs + [outs[0]] * (2 - len(outs))
        self.fn(*tensors, n, 1, self.grid(n))


def _bits(t):
    return t.view(torch.int16)


def check(kind: str, variants: dict, sizes) -> dict:
    """name -> list of failed sizes (empty = bit-exact with variants['default'])."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    failed = {name: [] for name in variants}
    n_in, n_out = ops.ARITY[kind]
    for n in sizes:
        ins = [(torch.randn(n, device="cuda", generator=gen) * 4).to(torch.bfloat16)
               for _ in range(n_in)]
        refs = [torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16)
                for _ in range(n_out)]
        variants["default"](ins, refs)
        for name, v in variants.items():
            outs = [torch.full((n,), -7.0, device="cuda", dtype=torch.bfloat16)   # poison
                    for _ in range(n_out)]
            v(ins, outs)
            if not all(torch.equal(_bits(o), _bits(r)) for o, r in zip(outs, refs)):
                failed[name].append(n)
    torch.cuda.synchronize()
    return failed


def _swiglu_bwd_torch(dy, g, u):
    s = torch.sigmoid(g)
    return dy * u * s * (1 + g * (1 - s)), dy * g * s


def _torch_rows(kind: str, ins: list) -> dict:
    """torch's eager op(s) for the kind, on the same inputs (ins in the kernel's order)."""
    if kind == "silu_fwd":
        return {"torch F.silu": lambda: F.silu(ins[0])}
    if kind == "silu_bwd":
        return {"torch silu_backward": lambda: torch.ops.aten.silu_backward(ins[1], ins[0])}
    if kind == "swiglu_fwd":
        return {"torch eager silu(g)*u": lambda: F.silu(ins[0]) * ins[1]}
    return {"torch eager ops": lambda: _swiglu_bwd_torch(*ins)}


def time_section(section, kind, n, variants, timing, copy1g):
    n_in, n_out = ops.ARITY[kind]
    ins = [torch.randn(n, device="cuda").to(torch.bfloat16) for _ in range(n_in)]
    outs = [torch.empty_like(ins[0]) for _ in range(n_out)]
    n_io = n_in + n_out                                       # tensors moved
    src = torch.empty(n_io * n // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    fns = {"device copy (same bytes)": lambda: dst.copy_(src), **_torch_rows(kind, ins)}
    for name, v in variants.items():
        fns[name] = (lambda v=v: v(ins, outs))
    times = time_alternating(fns, timing)
    nbytes = n_io * n * 2
    rows = []
    for name, ms in times.items():
        v = variants.get(name)
        rows.append({"section": section, "impl": name, "ms": ms, "GB/s": gbps(nbytes, ms),
                     "% copy": 100 * times["device copy (same bytes)"] / ms,
                     "% copy 1G": 100 * gbps(nbytes, ms) / copy1g,
                     "grid": v.grid(n) if v else None, "U": v.kernel.unroll if v else None,
                     "regs": v.regs if v else None, "blocks/SM": v.resident if v else None})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_json_arg(p, "elementwise_variants")
    p.add_argument("--quick", action="store_true", help="10 warm-ups, 3 rounds x 30 calls")
    p.add_argument("--kinds", default="silu_fwd,silu_bwd",
                   help="comma-separated subset of: " + ", ".join(SECTIONS))
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma-separated subset of: " + ", ".join(VARIANTS))
    args = p.parse_args(argv)
    path = protocol.output_path(args.json, "elementwise_variants")
    timing = Timing(10, 3, 30) if args.quick else Timing(25, 5, 100)
    names = ["default"] + [v for v in args.variants.split(",") if v and v != "default"]
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in SECTIONS:
            p.error(f"unknown kind {k!r}; known: {', '.join(SECTIONS)}")
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.time()

    built = {}
    for kind in kinds:
        built[kind] = {}
        seen = set()
        for name in names:
            tune = VARIANTS[name]
            if ops.ARITY[kind][0] > 1:
                tune = dataclasses.replace(tune, unroll=0)
            if tune in seen:
                continue
            seen.add(tune)
            built[kind][name] = v = Variant(kind, tune, sm_count)
            print(f"built {kind:8s} {name:20s} U={v.kernel.unroll} regs={v.regs} "
                  f"blocks/SM={v.resident} grid={v.grid(SECTIONS[kind][1])} {v.sass} "
                  f"{v.compile_s:.1f}s", flush=True)

    copy1g = copy_bandwidth(timing)

    rows, failures = [], {}
    for kind in kinds:
        section, n = SECTIONS[kind]
        sizes = CHECK_SIZES[:-1] + (n,)
        failed = check(kind, built[kind], sizes)
        for name, bad in failed.items():
            if bad:
                failures[f"{kind} {name}"] = bad
                print(f"NOT BIT-EXACT: {kind} {name} at n = {bad}", flush=True)
        ok = {k: v for k, v in built[kind].items() if not failed[k]}
        print(f"{kind}: {len(ok)}/{len(built[kind])} variants bit-exact with default on "
              f"n = {sizes}", flush=True)
        rows += time_section(section, kind, n, ok, timing, copy1g)

    cols = ["section", "impl", "ms", "GB/s", "% copy", "% copy 1G", "U", "grid", "regs",
            "blocks/SM"]
    table = markdown_table(rows, cols)
    print(f"1 GiB device copy: {copy1g:.0f} GB/s; SMs: {sm_count}; {time.time() - t0:.0f}s")
    print(table)
    if failures:
        print("FAILURES:", failures)
    out = {**header(timing), "copy_1GiB_GBps": copy1g, "sm_count": sm_count,
           "check_sizes": list(CHECK_SIZES[:-1]) + ["section size"], "failures": failures,
           "variants": {k: {n: {"tune": vars(v.tune), "U": v.kernel.unroll, "regs": v.regs,
                                "resident_blocks": v.resident, "sass": v.sass}
                            for n, v in vs.items()} for k, vs in built.items()},
           "rows": rows}
    protocol.write_results(path, out,
                           f"# Elementwise tuning variants ({out['device']}, {out['date']}, "
                           f"commit {out['commit']})\n\nProtocol: {out['protocol']}.\n"
                           f"1 GiB device copy in the same run: {copy1g:.0f} GB/s; {sm_count} SMs. "
                           f"Bit-exact vs default on n = {list(CHECK_SIZES[:-1])} and the section's "
                           f"size; failures: "
                           f"{failures or 'none'}.\n\n{__doc__.split(chr(10) * 2, 1)[1].strip()}\n\n"
                           f"{table}\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
