"""Host launch overhead: the compiled tvm-ffi kernel called with torch tensors directly vs the
torch wrappers around it (kernels/compile_cache.py is the one launch path).

Shapes: attention forward B=1 S=4096 Hq=32 Hkv=8 D=128 bf16 causal softmax (the kernel
is 0.266 ms prebuilt; the old wrapper measured 0.375 ms back to back) and SiLU (poly)
over 4M bf16 elements (old wrapper ~19 us vs torch ~9 us).  Timing: bench/protocol.py
(100 back-to-back calls between CUDA events, median of 5 rounds); back-to-back calls make
the host the bottleneck whenever its per-call work exceeds the kernel time.

Run on the H200:  python bench/launch_overhead.py   (writes bench/results/launch_overhead.json)
"""
from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from protocol import Timing, header, markdown_table, time_alternating, write_json  # noqa: E402

from flash_attn_poly import activations as act  # noqa: E402
from flash_attn_poly.kernels import attn_fwd_sm90 as A, score_stages as S  # noqa: E402


def _timed(fn):
    return lambda timing: time_alternating({"x": fn}, timing)["x"]


def attn_rows():
    b, s, hq, hkv, d = 1, 4096, 32, 8, 128
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(b, hq, s, device="cuda", dtype=torch.float32)
    stage = S.make_stage("softmax", "native")
    cfg = A.AttnFwdConfig.default(stage, "bf16", d, True)
    params = [float(x) for x in stage.host_scalars(d ** -0.5, s)]
    tensors = (q, k, v, out, lse)
    fn = A._compiled(cfg)
    return "attn_fwd B1 S4096 H32/8 D128", {
        "compiled tvm-ffi, torch tensors direct": _timed(lambda: fn(*tensors, *params, 0, 0)),
        "attn_fwd wrapper": _timed(lambda: A.attn_fwd(q, k, v, causal=True, out=out, lse=lse)),
    }


def silu_rows():
    n = 4 * 1024 * 1024
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    fn = act._compiled(act._key("silu_fwd", "bf16", "poly", "flat"))
    ints = (n, 1, act._grid(n, "silu_fwd", x.device.index or 0))
    flat = [x, x, x, y, y]
    return "silu poly 4M bf16", {
        "torch F.silu (reference)": _timed(lambda: F.silu(x)),
        "compiled tvm-ffi, torch tensors direct": _timed(lambda: fn(*flat, *ints)),
        "activations.launch": _timed(lambda: act.launch("silu_fwd", "bf16", "poly", [x], [y])),
        "silu()": _timed(lambda: act.silu(x, evaluator="poly")),
    }


def main():
    timing = Timing()
    rows = []
    for make in (attn_rows, silu_rows):
        try:
            shape, variants = make()
        except Exception:  # keep the other half of the table
            traceback.print_exc()
            continue
        for name, timed in variants.items():
            try:
                ms = timed(timing)
                rows.append({"shape": shape, "variant": name, "us_per_call": f"{ms * 1e3:.1f}"})
            except Exception as e:  # one broken path must not hide the others
                rows.append({"shape": shape, "variant": name, "us_per_call": f"error: {type(e).__name__}: {e}"[:120]})
    print(header(timing))
    print(markdown_table(rows, ["shape", "variant", "us_per_call"]))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "launch_overhead.json")
    write_json(out, {**header(timing), "rows": rows})


if __name__ == "__main__":
    main()
