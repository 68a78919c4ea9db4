"""flash-attn-4's Blackwell (sm_100a) kernels with our score functions, compiled on the CPU.

`sass(name)` returns the forward and backward SASS of one build of BUILDS: attention(q, k, v,
mode, evaluator=..., backend="fa4") at the seed's shape class (batch 1, 4096 tokens, 32 query
and 8 KV heads, head_dim 128, causal, BF16), the score functions exactly as
flash_attn_poly.fa4 hands them to FA4 (plan.resolve_fa4 -> fa4.score_mods).  Each build runs in
a child process (`python tests/fa4_builds.py NAME OUTDIR ARCH`) under FA4's documented CPU-only
compilation (FLASH_ATTENTION_ARCH=sm_100, CUTE_DSL_ARCH=sm_100a, FLASH_ATTENTION_NUM_SMS=148,
torch's FakeTensorMode: no GPU, no memory), with the DSL keeping its cubins
(CUTE_DSL_KEEP=cubin); nvdisasm (nvidia-cuda-nvdisasm, which knows SM100a) disassembles them.
The SASS text is cached under $FAP_SM100_CACHE (default /tmp/fap_sm100_sass), keyed by the
sources that generate code and the FA4 / CuTe DSL versions: an sm_100a build takes ~20-60 s here.

The forward goes through FA4's public flash_attn_func.  The backward calls
`flash_attn.cute.interface._flash_attn_bwd`, the function flash_attn_func's autograd backward
calls, with the forward's arguments: a CPU-only torch cannot record autograd on fake CUDA tensors.

Per-score counts: FA4's native softcap applies one tanh.approx per score, in the forward's
score_mod and once per recomputed score in the backward, so the native softcap build's
MUFU.TANH count is the number of score sites of the static code (`sites`); every build here
shares FA4's kernel configuration (a score_mod never changes FA4's tiles), so a count divided by
the sites is per score.

Run `python bench/tools/sm100_sass.py` for the table (bench/results/sm100_sass.md and .json).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (1, 4096, 32, 8, 128)    # (B, S, H_q, H_kv, D): the seed's B2/B3 shape
SOFTCAP = 50.0
# name -> attention() options (mode, evaluator, program or None for the plan's)
BUILDS = {
    "softmax": ("softmax", "native", None),
    "softcap_native": ("softcap", "native", None),
    "softcap_poly": ("softcap", "poly", None),
    "softcap_poly_bf16": ("softcap", "poly", "softcap_c50"),   # the seed's B2 program (block-rule backward)
    "sigmoid_native": ("sigmoid", "native", None),
    "sigmoid_poly": ("sigmoid", "poly", None),
}
SITES_BUILD = "softcap_native"
# the opcode families of the tables (families()): tcgen05 MMA, then these opcodes with any modifiers
OPCODES = ("MUFU.TANH", "MUFU.EX2", "MUFU.LG2", "MUFU", "FFMA", "FFMA2", "HFMA2", "STL")
# arch -> (FA4's kernel selection, its SM count, the forward / backward kernel classes' cubin names);
# sm_90a: the Hopper builds of the same calls, for the throughput model's check against the H200
ARCHS = {"sm_100a": ("sm_100", "148", "flash_fwd_sm100", "flash_bwd_sm100"),
         "sm_90a": ("sm_90", "132", "flash_fwd_sm90", "flash_bwd_sm90")}


def cache_dir() -> str:
    return os.environ.get("FAP_SM100_CACHE", os.path.join(tempfile.gettempdir(), "fap_sm100_sass"))


def _fingerprint() -> str:
    """Hash of what generates the builds' code: our score sources, the table, FA4 and the DSL."""
    from importlib import metadata
    h = hashlib.sha256()
    paths = [os.path.join(ROOT, p) for p in ("flash_attn_poly/fa4.py", "flash_attn_poly/plan.py",
                                              "flash_attn_poly/data/programs.json", "tests/fa4_builds.py")]
    for d in ("kernels/scores", "asm"):
        paths += sorted(os.path.join(ROOT, d, f) for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".py"))
    for p in paths:
        h.update(p.encode())
        with open(p, "rb") as f:
            h.update(f.read())
    for dist in ("flash-attn-4", "nvidia-cutlass-dsl"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=?".encode())
    return h.hexdigest()[:20]


def sass(name: str, arch: str = "sm_100a") -> dict:
    """{"fwd": SASS text, "bwd": SASS text, "registers": {kernel: regs}} of BUILDS[name] for arch."""
    if name not in BUILDS:
        raise KeyError(f"unknown build {name!r}; builds: {sorted(BUILDS)}")
    out = os.path.join(cache_dir(), _fingerprint(), arch, name)
    if not os.path.exists(os.path.join(out, "done")):
        os.makedirs(out, exist_ok=True)
        fa4_arch, sms = ARCHS[arch][:2]
        env = dict(os.environ, FLASH_ATTENTION_ARCH=fa4_arch, CUTE_DSL_ARCH=arch, FLASH_ATTENTION_NUM_SMS=sms,
                   CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=os.path.join(out, "dump"))
        env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        r = subprocess.run([sys.executable, os.path.abspath(__file__), name, out, arch], env=env,
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"{arch} build {name} failed:\n{r.stderr[-4000:]}")
    res = {}
    for part in ("fwd", "bwd"):
        with open(os.path.join(out, f"{part}.sass")) as f:
            res[part] = f.read()
    with open(os.path.join(out, "registers.json")) as f:
        res["registers"] = json.load(f)
    return res


def families(*extra: str) -> dict:
    """{family: regex} for kernels/sass.count_opcodes: "UTCMMA (tcgen05.mma)" (every tcgen05 MMA
    opcode), then OPCODES and `extra` (kernels/sass.families).  Imported when asked: the build's
    child process imports FA4 before flash_attn_poly (import_fa4_on_cpu)."""
    from flash_attn_poly.kernels import sass as sass_mod
    return {"UTCMMA (tcgen05.mma)": r"UTC[A-Z]*MMA(\..*)?", **sass_mod.families(*OPCODES, *extra)}


def counts(text: str) -> dict:
    from flash_attn_poly.kernels import sass as sass_mod
    return sass_mod.count_opcodes(text, families())


def per_score(name: str, arch: str = "sm_100a") -> dict:
    """{"fwd"|"bwd": {family: count / sites}} with sites from SITES_BUILD (see the docstring)."""
    sites = {p: counts(sass(SITES_BUILD, arch)[p])["MUFU.TANH"] for p in ("fwd", "bwd")}
    b = sass(name, arch)
    return {p: {k: v / sites[p] for k, v in counts(b[p]).items()} for p in ("fwd", "bwd")}


def import_fa4_on_cpu():
    """flash_attn.cute on a CPU-only torch.  quack (an FA4 dependency) imports triton at import
    time for its autotuner, which no compile here uses; a CPU torch ships no triton, so a stub
    module stands in whose entry points raise.  torch._dynamo is imported first so that torch
    itself sees no triton."""
    import types
    import torch._dynamo  # noqa: F401
    try:
        import triton  # noqa: F401
    except ImportError:
        def _absent(*a, **k):
            raise RuntimeError("triton is not installed (a CPU-only torch): FA4 autotuning is unavailable")
        tr, rt, ca, te = (types.ModuleType(n) for n in ("triton", "triton.runtime", "triton.runtime.cache",
                                                          "triton.testing"))
        ca.FileCacheManager = type("FileCacheManager", (), {"__init__": _absent})
        te.do_bench = _absent
        tr.runtime, rt.cache, tr.testing = rt, ca, te
        sys.modules.update({"triton": tr, "triton.runtime": rt, "triton.runtime.cache": ca, "triton.testing": te})
    import flash_attn.cute
    return flash_attn.cute


def _build(name: str, out: str, arch: str) -> None:
    """Child process: compile BUILDS[name] forward and backward for arch, disassemble."""
    import glob
    import shutil

    import_fa4_on_cpu()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from flash_attn.cute.interface import _flash_attn_bwd

    from flash_attn_poly import fa4, interface, plan as plan_mod
    from flash_attn_poly.kernels import sass as sass_mod

    mode, evaluator, program = BUILDS[name]
    b, s, hq, hkv, d = SHAPE
    dump = os.environ["CUTE_DSL_DUMP_DIR"]
    shutil.rmtree(dump, ignore_errors=True)
    os.makedirs(dump)
    regs = {}

    def take(pattern, part):
        hits = glob.glob(os.path.join(dump, f"*{pattern}*.cubin"))
        if len(hits) != 1:
            raise RuntimeError(f"{name} {part}: expected one {pattern} cubin, found {hits}")
        with open(hits[0], "rb") as f:
            cubin = f.read()
        regs.update({k[:80]: v for k, v in sass_mod.registers(cubin).items()})
        with open(os.path.join(out, f"{part}.sass"), "w") as f:
            f.write(sass_mod.disassemble(cubin))
        for h in glob.glob(os.path.join(dump, "*.cubin")):
            os.remove(h)

    with FakeTensorMode():
        q = torch.empty(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.empty(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        call = interface.validate(q, k, v, mode, evaluator, True, SOFTCAP if mode == "softcap" else None,
                                  program=program)
        p = plan_mod.resolve_fa4(call)
        fa4.attention(q, k, v, p, return_lse=True)
        take(ARCHS[arch][2], "fwd")
        # the backward of flash_attn_func (FlashAttnFunc.backward's call), on fake tensors
        fwd, bwd, cap = fa4.score_mods(p)
        o, lse = torch.empty_like(q), torch.empty(b, hq, s, device="cuda", dtype=torch.float32)
        _flash_attn_bwd(q, k, v, o, torch.empty_like(o), lse, p.softmax_scale, True, cap,
                        score_mod=fwd, score_mod_bwd=bwd)
        take(ARCHS[arch][3], "bwd")
    with open(os.path.join(out, "registers.json"), "w") as f:
        json.dump(regs, f, indent=1)
    shutil.rmtree(dump, ignore_errors=True)
    with open(os.path.join(out, "done"), "w") as f:
        f.write(name)


if __name__ == "__main__":
    _build(sys.argv[1], sys.argv[2], sys.argv[3])
