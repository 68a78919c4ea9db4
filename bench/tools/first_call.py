"""Time to the first attention call of a new process, cold and warm (issue 25: warm < 2 s).

Every measurement runs in its own Python process (nothing imported, nothing compiled):
  cold  a fresh, empty compile-cache directory (FLASH_ATTN_POLY_CACHE_DIR): every kernel the
        call needs is compiled, then written to the cache;
  warm  a second process on the same directory: every kernel is loaded from the cache.

GPU (default; one row per mode and state):
    python bench/tools/first_call.py [--modes softmax,softcap,sigmoid] [--shape 1,4096,32,8,128]
                                     [--json PATH]
  import_s   `import torch` + `import flash_attn_poly`
  cuda_s     CUDA context and the inputs (torch.randn on the device, synchronised)
  fwd_s      first `attention(q, k, v, mode)` with q, k, v requiring grad, synchronised
  bwd_s      its first backward, synchronised
  total_s    first statement of the process -> first backward done (the goal's number)
  process_s  wall time of the whole process as the parent sees it (interpreter start and exit)
  builds, loads, load_ms, build_s: kernels compiled / loaded from the cache by the process
             (kernels/compile_cache.py counters) and the time spent doing so
  again_ms   a second forward + backward in the same process (the steady state)

CPU machine (no GPU; CUTE_DSL_ARCH=sm_90a): where the time of a warm first call goes apart
from CUDA:
    python bench/tools/first_call.py --cpu [--json PATH]
  imports of torch and flash_attn_poly, the plan, then the softmax forward + backward builds
  (forward, backward, pre, post) through the compile cache as kernels/dispatch.py asks for
  them: cold (compile + write) and warm (load); cutlass_imported says whether the process
  imported cutlass (a warm one need not).

Results print as a Markdown table; --json PATH also writes them (nothing is written otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import datetime

# before bench/protocol.py, which imports torch: the children's import phase counts it
_T0 = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import protocol  # noqa: E402  (bench/protocol.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ("softmax", "softcap", "sigmoid")


# ------------------------------------------------------------------------------ children
def child_gpu(mode: str, shape: tuple) -> dict:
    t0 = _T0
    import torch
    import flash_attn_poly
    from flash_attn_poly.kernels import compile_cache as cc
    t_import = time.perf_counter()
    b, s, h_q, h_kv, d = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (h_q, h_kv, h_kv))
    do = torch.randn(b, s, h_q, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    torch.cuda.synchronize()
    t_cuda = time.perf_counter()
    kw = {"softcap": 50.0} if mode == "softcap" else {}
    o = flash_attn_poly.attention(q, k, v, mode, **kw)
    torch.cuda.synchronize()
    t_fwd = time.perf_counter()
    o.backward(do)
    torch.cuda.synchronize()
    t_bwd = time.perf_counter()
    first = dict(cc.counters), dict(cc.seconds)
    for t in (q, k, v):
        t.grad = None
    flash_attn_poly.attention(q, k, v, mode, **kw).backward(do)
    torch.cuda.synchronize()
    t_again = time.perf_counter()
    counters, seconds = first
    return dict(mode=mode, import_s=t_import - t0, cuda_s=t_cuda - t_import, fwd_s=t_fwd - t_cuda,
                bwd_s=t_bwd - t_fwd, total_s=t_bwd - t0, again_ms=(t_again - t_bwd) * 1e3,
                builds=counters.get("build", 0), loads=counters.get("load", 0),
                load_ms=seconds.get("load", 0.0) * 1e3, build_s=seconds.get("build", 0.0),
                out_sum=float(o.float().sum()), dq_sum=float(q.grad.float().sum()),
                device=torch.cuda.get_device_name())


def child_cpu() -> dict:
    """What a process pays before its first call apart from CUDA: imports, the plan, then the
    softmax forward + backward builds (forward, backward, pre, post) through the compile cache
    as kernels/dispatch.py asks for them (a cached process imports no kernel module, and no
    cutlass where the entries' shared libraries load)."""
    t0 = _T0
    marks = {}
    import torch
    marks["import torch"] = time.perf_counter()
    import flash_attn_poly  # noqa: F401
    marks["import flash_attn_poly"] = time.perf_counter()
    import functools

    from flash_attn_poly import testing
    from flash_attn_poly.kernels import compile_cache as cc, dispatch, prepost_launch as P
    cc.fingerprint()
    marks["fingerprint"] = time.perf_counter()
    # the softmax plan at the anchor shape on an H200 (132 SMs): persistent forward, per-KV-head
    # backward; meta tensors carry the shapes (no GPU)
    q, k, v = (torch.empty(1, 4096, h, 128, dtype=torch.bfloat16, device="meta") for h in (32, 8, 8))
    plan = testing.plan_for(q, k, v, "softmax", "native")
    marks["plan"] = time.perf_counter()
    cc.compiled("attn_fwd", plan.fwd, functools.partial(dispatch._fwd_build, plan.fwd))
    marks["attn_fwd"] = time.perf_counter()
    cc.compiled("attn_bwd", plan.bwd, functools.partial(dispatch._bwd_build, plan.bwd))
    marks["attn_bwd"] = time.perf_counter()
    P.get_compiled(P.PreKey("bf16", 128, True, True, "e", plan.zero_dq_in_pre))
    P.get_compiled(P.PostKey("bf16"))
    marks["pre + post"] = time.perf_counter()
    phases, last = {}, t0
    for name, t in marks.items():
        phases[name] = t - last
        last = t
    return dict(phases=phases, total_s=last - t0, builds=cc.counters.get("build", 0),
                loads=cc.counters.get("load", 0), load_ms=cc.seconds.get("load", 0.0) * 1e3,
                build_s=cc.seconds.get("build", 0.0), export_ms=cc.seconds.get("export", 0.0) * 1e3,
                cutlass_imported=int("cutlass" in sys.modules))


# ------------------------------------------------------------------------------ parent
def _package_root() -> str:
    """The folder this process imports flash_attn_poly from (the device machine lays the package
    out under /tmp/fap_site; the repository root itself has no kernels/ inside the package)."""
    import flash_attn_poly
    return os.path.dirname(os.path.dirname(os.path.abspath(flash_attn_poly.__file__)))


def _spawn(args: list, cache_dir: str) -> dict:
    env = dict(os.environ, FLASH_ATTN_POLY_CACHE_DIR=cache_dir,
               PYTHONPATH=_package_root() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], env=env,
                          capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-4000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["process_s"] = wall
    return row


def run_gpu(modes, shape) -> list:
    rows = []
    with tempfile.TemporaryDirectory(prefix="fap_first_call_") as tmp:
        for mode in modes:
            cache = os.path.join(tmp, mode)          # empty: the cold process compiles
            for state in ("cold", "warm"):
                row = _spawn(["gpu", mode, ",".join(map(str, shape))], cache)
                row["state"] = state
                rows.append(row)
                print(f"{mode:8s} {state}: total {row['total_s']:.2f} s (import {row['import_s']:.2f}, "
                      f"fwd {row['fwd_s']:.2f}, bwd {row['bwd_s']:.2f}; builds {row['builds']}, "
                      f"loads {row['loads']})", file=sys.stderr, flush=True)
    return rows


def run_cpu() -> list:
    rows = []
    with tempfile.TemporaryDirectory(prefix="fap_first_call_") as tmp:
        for state in ("cold", "warm"):
            row = _spawn(["cpu"], tmp)
            row["state"] = state
            rows.append(row)
            print(f"cpu {state}: {row['total_s']:.2f} s", file=sys.stderr, flush=True)
    return rows


def table_gpu(rows) -> str:
    cols = ("mode", "state", "import_s", "cuda_s", "fwd_s", "bwd_s", "total_s", "process_s",
            "builds", "loads", "load_ms", "build_s", "again_ms")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])
                                       for c in cols) + " |")
    return "\n".join(lines)


def table_cpu(rows) -> str:
    names = list(rows[0]["phases"])
    lines = ["| phase | " + " | ".join(r["state"] for r in rows) + " |", "|---|" + "---|" * len(rows)]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{r['phases'][n]:.3f}" for r in rows) + " |")
    for c in ("total_s", "process_s", "builds", "loads", "load_ms", "build_s", "export_ms", "cutlass_imported"):
        lines.append(f"| {c} | " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])
                                              for r in rows) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--shape", default="1,4096,32,8,128", help="B,S,H_q,H_kv,D")
    ap.add_argument("--cpu", action="store_true", help="CPU breakdown: imports, compile vs load")
    protocol.add_json_arg(ap, "first_call")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        kind = a.child[0]
        row = child_cpu() if kind == "cpu" else child_gpu(a.child[1], tuple(int(x) for x in a.child[2].split(",")))
        print(json.dumps(row))
        return
    if a.cpu:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        rows = run_cpu()
        table = table_cpu(rows)
    else:
        modes = [m for m in a.modes.split(",") if m]
        bad = [m for m in modes if m not in MODES]
        if bad:
            raise SystemExit(f"--modes: unknown {bad}; known: {MODES}")
        rows = run_gpu(modes, tuple(int(x) for x in a.shape.split(",")))
        table = table_gpu(rows)
    print(table)
    protocol.write_results(protocol.output_path(a.json, "first_call"),
                           dict(tool="bench/tools/first_call.py", machine=platform.node(),
                                commit=protocol.commit_id(), date=datetime.date.today().isoformat(),
                                python=platform.python_version(), cpu=a.cpu, rows=rows), table + "\n")


if __name__ == "__main__":
    main()
