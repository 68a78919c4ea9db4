"""compute-sanitizer (memcheck, racecheck, synccheck) over the attention forward and backward.

    python bench/tools/sanitize.py [--tools memcheck,racecheck,synccheck] [--out DIR]
                                   [--timeout S] [--shapes tail,gqa,d64,d256]
    python bench/tools/sanitize.py --calls [--shapes ...] [--scores ...]   # what the tools wrap

Issue 26, item 4.  The calls: attention() forward and backward (autograd) of softmax, softcap
and sigmoid, native and poly, at four tiny shapes (racecheck instruments every shared-memory
access, so a call costs seconds, not microseconds):

    tail   B=1 S_q=113 S_k=203 H=2/2 D=128, not causal: partial query and key blocks
    gqa    B=1 S=200 H_q=8 H_kv=2 D=128, causal: a GQA group and the causal diagonal
    d64    B=1 S=333 D=64: the D = 64 rows (the causal forward's three warpgroups in turns through
           named barriers, keep-word masks and O through smem; the 128-row backward step), causal
           and heads as the catalogue's D=64 variant of each score (three of the five causal)
    d256   B=1 S=77 D=256: the swapped backward (a CTA per 64 keys); causal and the heads of the
           catalogue's D=256 variant of each score (tests/cases.py), so every call runs a build the
           correctness tier already compiled (the kernels load from the disk cache)
    packed (not in the default set: its builds are not the catalogue's, the warm-up compiles them)
           attention_varlen at D = 256, sequences of 77, 0, 130 and 1 tokens, heads and causal flag
           as d256: the varlen forward and the swapped varlen backward (its CTA table, the sentinel
           entries past the table's count); sigmoid with an explicit bias (one for all sequences:
           the default -ln S_k runs each sequence as a dense launch)
    gqapack (not in the default set either) B=1 S=1100 H_q=8 H_kv=2 D=64, causal: past the short
           rows, so the D = 64 softmax and softcap forwards pack the GQA group into their tiles
           (plan rows fwd-pack-gqa: 48 positions of 4 heads per 192-row tile, Q by 5-D TMA boxes)

First the calls run once without a sanitizer (compiles into the disk cache, checks the
outputs are finite), then under each tool, the three at the same time (`compute-sanitizer --tool T
--error-exitcode 86`; memcheck with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so an access past a
tensor's end leaves its own allocation instead of landing in the caching allocator's pool).
Exit status 0 only when every tool ran and reported no error.  Writes two files to --out
(default $OUT, the device tool's folder, else bench/out): sanitize_summary.txt, one line per tool
(verdict, errors, racecheck's hazards, wall time) and the first reported errors, and
sanitize.log, every run's full output.  A machine where compute-sanitizer is missing or refuses the GPU (gVisor:
"Device not supported") is reported as such, with exit status 3.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOLS = ("memcheck", "racecheck", "synccheck")
SCORES = ("softmax/native", "softcap/native", "softcap/poly", "sigmoid/native", "sigmoid/poly")
SHAPES = ("tail", "gqa", "d64", "d256")
PACKED = "packed"                     # opt-in (--shapes packed): attention_varlen at D = 256
GQA_PACK = "gqapack"                  # opt-in (--shapes gqapack): the packed-GQA D = 64 forward
PACKED_LENS = (77, 0, 130, 1)
PACKED_SIGMOID_BIAS = -4.0
ERROR_EXIT = 86          # --error-exitcode: the tool found an error
UNAVAILABLE_EXIT = 3     # no compute-sanitizer, or it refuses the device
_SUMMARY_RE = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
_HAZARD_RE = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
_UNSUPPORTED = ("Device not supported", "not supported on this platform", "Unable to find injection library",
                "Target application terminated before first instrumented API call")


def _cases_module():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import cases
    return cases


def call_specs(shapes=SHAPES, scores=SCORES) -> list:
    """[(name, mode, evaluator, dict(b, s_q, s_k, hq, hkv, d, causal, dtype))] of the calls."""
    cases = _cases_module()
    out = []
    for shape in shapes:
        if shape not in SHAPES + (PACKED, GQA_PACK):
            raise ValueError(f"--shapes: unknown shape {shape!r}; known: {', '.join(SHAPES + (PACKED, GQA_PACK))}")
        for score in scores:
            if score not in SCORES:
                raise ValueError(f"--scores: unknown score {score!r}; known: {', '.join(SCORES)}")
            mode, ev = score.split("/")
            if shape == "tail":
                p = dict(b=1, s_q=113, s_k=203, hq=2, hkv=2, d=128, causal=False)
            elif shape == "gqa":
                p = dict(b=1, s_q=200, s_k=200, hq=8, hkv=2, d=128, causal=True)
            elif shape == GQA_PACK:
                p = dict(b=1, s_q=1100, s_k=1100, hq=8, hkv=2, d=64, causal=True)
            else:   # the catalogue's D = 64 / 256 BF16 variant of this score: its causal flag and head group
                d, s = (64, 333) if shape == "d64" else (256, max(PACKED_LENS) if shape == PACKED else 77)
                i, v = next((i, v) for i, v in enumerate(cases.VARIANTS) if (v.mode, v.evaluator, v.dtype,
                                                                             v.head_dim, v.window) ==
                            (mode, ev, "bf16", d, None))   # the first (softmax D = 64: the causal one)
                hq, hkv = (4, 1) if cases.head_groups(i, v) == "gqa" else (2, 2)
                p = dict(b=1, s_q=s, s_k=s, hq=hq, hkv=hkv, d=d, causal=v.causal)
                if shape == PACKED:
                    p["lens"] = PACKED_LENS
            out.append((f"{shape}:{score}", mode, ev, dict(p, dtype="bf16")))
    return out


def as_case(mode, ev, p):
    """The tests/cases.py Case of a call (for the build check and the inputs)."""
    cases = _cases_module()
    v = cases.Variant(mode, ev, p["dtype"], p["d"], p["causal"], None)
    return cases.Case(v, p["b"], p["s_q"], p["s_k"], p["hq"], p["hkv"],
                      softcap=cases.SOFTCAP if mode == "softcap" else None, tier="sanitize")


def run_calls(specs, backend: str = "cuda") -> int:
    """Forward + backward of each call (backend "cuda"; "reference": the same calls on the CPU,
    a dry run of this driver); prints a line per call; 1 if any output is not finite."""
    import torch
    import flash_attn_poly
    dev = "cuda" if backend == "cuda" else "cpu"
    bad = 0
    for name, mode, ev, p in specs:
        c = as_case(mode, ev, p)
        g = torch.Generator(device=dev).manual_seed(c.seed)
        mk = lambda s, h, a=1.0: (torch.randn(p["b"], s, h, p["d"], device=dev, generator=g) * a
                                  ).to(torch.bfloat16).requires_grad_()
        t0 = time.perf_counter()
        if "lens" in p:   # packed: (total, H, D) rows of every sequence, int32 offsets on the device
            total = sum(p["lens"])
            q = mk(total, p["hq"], c.softcap / 4 if c.softcap else 1.0)[0].detach().requires_grad_()
            k, v = (mk(total, p["hkv"])[0].detach().requires_grad_() for _ in range(2))
            cu = torch.tensor([0] + list(itertools.accumulate(p["lens"])), dtype=torch.int32, device=dev)
            out = flash_attn_poly.attention_varlen(
                q, k, v, cu, cu, max(p["lens"]), max(p["lens"]), mode, evaluator=ev, causal=p["causal"],
                softcap=c.softcap, sigmoid_bias=PACKED_SIGMOID_BIAS if mode == "sigmoid" else None, backend=backend)
        else:
            q = mk(p["s_q"], p["hq"], c.softcap / 4 if c.softcap else 1.0)
            k, v = mk(p["s_k"], p["hkv"]), mk(p["s_k"], p["hkv"])
            out = flash_attn_poly.attention(q, k, v, mode, evaluator=ev, causal=p["causal"], softcap=c.softcap,
                                            backend=backend)
        grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        if dev == "cuda":
            torch.cuda.synchronize()
        ok = all(torch.isfinite(t).all().item() for t in (out, *grads))
        bad += not ok
        print(f"{name:28s} {'ok' if ok else 'NON-FINITE'} {time.perf_counter() - t0:7.2f} s", flush=True)
    return 1 if bad else 0


def parse_report(text: str) -> dict:
    """{"errors": int or None (ERROR SUMMARY), "hazards": racecheck's (errors, warnings) or None,
    "unsupported": str or None, "first": [the first reported lines]}"""
    m = _SUMMARY_RE.findall(text)
    h = _HAZARD_RE.findall(text)
    unsupported = next((u for u in _UNSUPPORTED if u in text), None)
    first = [ln for ln in text.splitlines() if ln.startswith("=========") and
             any(w in ln for w in ("Invalid", "Error", "error", "Race", "hazard", "Barrier", "Divergent"))
             and "SUMMARY" not in ln][:8]
    return {"errors": int(m[-1]) if m else None, "hazards": (int(h[-1][1]), int(h[-1][2])) if h else None,
            "unsupported": unsupported, "first": first}


def _child_cmd(args) -> list:
    cmd = [sys.executable, os.path.abspath(__file__), "--calls", "--shapes", ",".join(args.shapes),
           "--scores", ",".join(args.scores)]
    return cmd


def run_tool(tool: str, args) -> tuple:
    """(result dict, the run's output text)."""
    exe = shutil.which("compute-sanitizer")
    res = {"tool": tool, "rc": None, "seconds": 0.0, "errors": None, "hazards": None, "unsupported": None,
           "first": []}
    if exe is None:
        res["unsupported"] = "compute-sanitizer not on PATH"
        return res, ""
    env = dict(os.environ)
    if tool == "memcheck":
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    cmd = [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "20"]
    if tool == "memcheck":
        cmd += ["--leak-check", "no"]
    t0 = time.time()
    try:
        p = subprocess.run(cmd + _child_cmd(args), env=env, capture_output=True, text=True, timeout=args.timeout)
        text, res["rc"] = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        res["rc"] = "timeout"
    res["seconds"] = round(time.time() - t0, 1)
    res.update(parse_report(text))
    return res, text


def verdict(r: dict) -> str:
    """"clean", "errors", "unavailable" or "failed" (the run did not finish cleanly).  Racecheck's
    hazard warnings alone (no error) are reported in the summary but do not fail."""
    if r["unsupported"]:
        return "unavailable"
    if (r["errors"] or 0) > 0 or (r["hazards"] or (0, 0))[0] > 0 or r["rc"] == ERROR_EXIT:
        return "errors"
    # racecheck reports a RACECHECK SUMMARY (hazards) and no ERROR SUMMARY line
    if r["rc"] == 0 and (r["errors"] == 0 or (r["errors"] is None and r["hazards"] is not None)):
        return "clean"
    return "failed"


def summary_lines(results: list, warm: dict) -> list:
    lines = [f"warm-up (no sanitizer): rc={warm['rc']} {warm['seconds']} s"]
    for r in results:
        lines.append(f"{r['tool']}: {verdict(r)} rc={r['rc']} errors={r['errors']} hazards={r['hazards']} "
                     f"{r['seconds']} s" + (f" ({r['unsupported']})" if r["unsupported"] else ""))
        lines += [f"    {ln}" for ln in r["first"]]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", action="store_true", help="run the calls in this process (what the tools wrap)")
    p.add_argument("--backend", default="cuda", choices=("cuda", "reference"),
                   help="with --calls: 'reference' runs them on the CPU (a dry run of the driver)")
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--scores", default=",".join(SCORES))
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per tool run")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "out"),
                   help="folder for sanitize_summary.txt and sanitize.log (default $OUT, else bench/out)")
    p.add_argument("--no-warm", action="store_true", help="skip the run without a sanitizer")
    p.add_argument("--warm-timeout", type=float, default=300.0,
                   help="seconds for the run without a sanitizer (it compiles what the disk cache lacks)")
    args = p.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.scores = [s for s in args.scores.split(",") if s]
    tools = [t for t in args.tools.split(",") if t]
    for t in tools:
        if t not in TOOLS:
            p.error(f"--tools: unknown tool {t!r}; known: {', '.join(TOOLS)}")
    specs = call_specs(args.shapes, args.scores)   # validates --shapes / --scores
    if args.calls:
        return run_calls(specs, args.backend)
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "sanitize.log"), "w")
    warm = {"rc": "skipped", "seconds": 0.0}
    if not args.no_warm:
        t0 = time.time()
        try:
            w = subprocess.run(_child_cmd(args), capture_output=True, text=True, timeout=args.warm_timeout)
            warm["rc"], text = w.returncode, w.stdout + w.stderr
        except subprocess.TimeoutExpired:
            warm["rc"], text = "timeout", ""
        warm["seconds"] = round(time.time() - t0, 1)
        log.write(f"==== warm-up (no sanitizer) rc={warm['rc']}\n{text}\n")
        log.flush()
    results = []
    if warm["rc"] in (0, "skipped") and tools:
        # the tools at once: independent processes, each under its own timeout
        with concurrent.futures.ThreadPoolExecutor(len(tools)) as pool:
            runs = list(pool.map(lambda t: run_tool(t, args), tools))
        for r, text in runs:
            results.append(r)
            log.write(f"==== {r['tool']} rc={r['rc']} {r['seconds']} s\n{text}\n")
    log.close()
    lines = summary_lines(results, warm)
    with open(os.path.join(args.out, "sanitize_summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    verdicts = {verdict(r) for r in results}
    if warm["rc"] not in (0, "skipped") or verdicts & {"errors", "failed"}:
        return 1
    if "unavailable" in verdicts:
        return UNAVAILABLE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
