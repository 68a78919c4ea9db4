"""Host launch overhead: compiled kernel with prebuilt arguments vs the torch wrappers on
the tvm-ffi fast path and on the old from_dlpack path (kernels/launch.py).

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
from flash_attn_poly.kernels import attn_fwd_sm90 as A, launch, score_stages as S  # noqa: E402


def _with_mode(mode: str, fn):
    """Time fn with FLASH_ATTN_POLY_LAUNCH=mode (set outside the timed loop)."""
    def timed(timing):
        old = os.environ.get(launch.ENV)
        os.environ[launch.ENV] = mode
        try:
            return time_alternating({"x": fn}, timing)["x"]
        finally:
            if old is None:
                os.environ.pop(launch.ENV, None)
            else:
                os.environ[launch.ENV] = old
    return timed


def attn_rows():
    import cuda.bindings.driver as cuda
    from cutlass import Float32

    b, s, hq, hkv, d = 1, 4096, 32, 8, 128
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(b, hq, s, device="cuda", dtype=torch.float32)
    stage = S.make_stage("softmax", "native")
    cfg = A.AttnFwdConfig.default(stage, "bf16", d, True)
    params = [float(x) for x in stage.host_scalars(d ** -0.5, s)]
    tensors = (q, k, v, out, lse)
    cute_args = [A._to_cute(t, t.dim() - 1) for t in tensors]
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    dl_fn, tvm_fn = A._compiled(cfg, False), A._compiled(cfg, True)
    f32 = [Float32(x) for x in params]
    wrapper = lambda: A.attn_fwd(q, k, v, causal=True, out=out, lse=lse)  # noqa: E731
    return "attn_fwd B1 S4096 H32/8 D128", {
        "compiled, prebuilt cute args (dlpack build)": lambda t: time_alternating(
            {"x": lambda: dl_fn(*cute_args, *f32, stream)}, t)["x"],
        "compiled tvm-ffi, torch tensors direct": lambda t: time_alternating(
            {"x": lambda: tvm_fn(*tensors, *params)}, t)["x"],
        "attn_fwd wrapper, tvm path": _with_mode("tvm", wrapper),
        "attn_fwd wrapper, dlpack path (old)": _with_mode("dlpack", wrapper),
    }


def silu_rows():
    import cuda.bindings.driver as cuda
    from cutlass import Int32
    from cutlass.cute.runtime import from_dlpack

    n = 4 * 1024 * 1024
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    cfg = ("silu_fwd", "bf16", "poly", "flat")
    tvm_fn, _ = act._compiled(*cfg)
    dl_fn, _ = act._compiled(*cfg, tvm_ffi=False)
    ints = (n, 1, act._grid(n, "silu_fwd", x.device.index or 0))
    flat = [x, x, x, y, y]
    cute_args = [from_dlpack(t, assumed_align=16).mark_layout_dynamic() for t in flat]
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    i32 = [Int32(i) for i in ints]
    raw_launch = lambda: act.launch("silu_fwd", "bf16", "poly", [x], [y])  # noqa: E731
    public = lambda: act.silu(x, evaluator="poly")  # noqa: E731
    return "silu poly 4M bf16", {
        "torch F.silu (reference)": lambda t: time_alternating({"x": lambda: F.silu(x)}, t)["x"],
        "compiled, prebuilt cute args (dlpack build)": lambda t: time_alternating(
            {"x": lambda: dl_fn(*cute_args, *i32, stream)}, t)["x"],
        "compiled tvm-ffi, torch tensors direct": lambda t: time_alternating(
            {"x": lambda: tvm_fn(*flat, *ints)}, t)["x"],
        "activations.launch, tvm path": _with_mode("tvm", raw_launch),
        "activations.launch, dlpack path (old)": _with_mode("dlpack", raw_launch),
        "silu() custom op, tvm path": _with_mode("tvm", public),
        "silu() custom op, dlpack path (old)": _with_mode("dlpack", public),
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
