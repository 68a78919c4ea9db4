"""Compile-tier builds, one compile per build per pytest session.

Many compile tests read the SASS of the same kernel (the default softmax forward is read by the
SASS-defaults test, the persistent test, the window test, ...).  A build is named by its kernel
config (kernels.config.FwdConfig / BwdConfig, the compile-cache key: equal configs generate
equal code) and the extra compiler options; `fwd(cfg)` / `bwd(cfg)` compile it for sm_90a on
the CPU the first time they are asked (~5-15 s each) and hand every later caller the same
`Build`.  The compile is tests/sass_catalogue.py's (`sass.compile_sm90` of the kernel with a
plain fake stream; the device code is the tvm-ffi launch build's), so the SASS-defaults test
hashes these very builds.

`plan(...)` names a build by the call that picks it: the `attention()` arguments that matter
for code generation, at the catalogue's anchor shape on an H200, with plan overrides
("fwd.<field>", "bwd.<field>", "poly_split", "grad_rule") for the non-default builds a test
compares against.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import tempfile

import sass_catalogue as cat

ANCHOR = cat.ANCHOR

# the chunked D = 256 backward (two 128-column CTAs per key block, kernels/attn_bwd_sm90.py) on a
# dense call: the plan builds it for packed, deterministic and user-score calls and the swapped
# build for the rest; tests of the chunked build's code on dense calls name it by these overrides
CHUNKED_D256 = {"bwd.swap": False, "bwd.tile_n": 128, "bwd.stages": 1, "bwd.dp_first": True}


def plan(mode="softmax", evaluator="native", *, d=128, dtype="bf16", causal=True, window=(-1, -1),
         deterministic=False, shape=ANCHOR, program=None, softcap=None, sigmoid_grad=None, overrides=None):
    """The AttnPlan of attention(q, k, v, mode, evaluator=..., ...) at `shape` (B, S, H_q, H_kv)
    on an H200, with `overrides` applied after the plan's rows.  softcap: the cap (None: 50, the
    largest with the constant row max; a larger one resolves the online-max softcap builds)."""
    call = dict(mode=mode, evaluator=evaluator, dtype=dtype, d=d, causal=causal, window=tuple(window),
                deterministic=deterministic, shape=tuple(shape), program=program, sigmoid_grad=sigmoid_grad)
    if softcap is not None:
        call["softcap"] = softcap
    return cat.plan_of(call, overrides)


class Build:
    """One compiled kernel: its SASS text and PTX, opcode counts on demand."""

    def __init__(self, sass_text: str, ptx: str, cubin: bytes):
        self.sass, self.ptx, self.cubin = sass_text, ptx, cubin
        self._counts: dict = {}

    def counts(self, families=None) -> dict:
        """Opcode family counts (kernels.sass.FAMILIES, or the given families)."""
        from flash_attn_poly.kernels import sass
        key = None if families is None else tuple(sorted(families.items()))
        if key not in self._counts:
            self._counts[key] = sass.count_opcodes(self.sass, families)
        return self._counts[key]

    def ptxas_log(self) -> str:
        """`ptxas -arch=sm_90a -v` of the PTX (register use, spills, wgmma serialisation
        warnings C7512-C7514); skips the test where no ptxas binary is installed."""
        if not hasattr(self, "_ptxas"):
            self._ptxas = _ptxas_v(self.ptx)
        return self._ptxas

    def depbar(self) -> int:
        """WARPGROUP.DEPBAR count (the wgmma waits; one per HGMMA means ptxas serialised them)."""
        from flash_attn_poly.kernels import sass
        return sum(op.startswith("WARPGROUP.DEPBAR") for op in sass.opcodes(self.sass))


def _compile(kernel_and_args, options: str) -> Build:
    from flash_attn_poly.kernels import sass
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    kernel, args = kernel_and_args
    c = sass.compile_sm90(kernel, *args, options=options)
    if not c.artifacts.CUBIN:
        raise RuntimeError("cute.compile returned no cubin (is --keep-cubin honoured?)")
    return Build(sass.disassemble(c.artifacts.CUBIN), c.artifacts.PTX or "", c.artifacts.CUBIN)


@functools.lru_cache(maxsize=None)
def fwd(cfg, options: str = "") -> Build:
    """The forward build of a FwdConfig (compiled once per session)."""
    return _compile(cat.fwd_build(cfg), options)


@functools.lru_cache(maxsize=None)
def bwd(cfg, options: str = "") -> Build:
    """The backward build of a BwdConfig (compiled once per session)."""
    return _compile(cat.bwd_build(cfg), options)


def varlen_plan(mode, evaluator, d, causal, window, softcap, dtype="bf16", overrides=None, sigmoid_bias=-4.0):
    """The plan of a packed call (8 sequences of at most 4096 tokens, H_q 32, H_kv 8) on an H200
    (the varlen compile tests' call), with plan overrides (e.g. {"fwd.varlen": True}); sigmoid with
    the given bias (None: the default -ln S_k of each sequence, added in the kernels)."""
    from flash_attn_poly import plan
    call = plan.AttnCall(mode=mode, evaluator=evaluator, dtype=dtype, head_dim=d, batch=8, seqlen_q=4096,
                         seqlen_k=4096, heads_q=32, heads_kv=8, causal=causal, window=tuple(window),
                         softmax_scale=d ** -0.5, softcap=softcap,
                         sigmoid_bias=sigmoid_bias if mode == "sigmoid" else None, varlen=True)
    return plan.resolve(call, cat.SM_COUNT, overrides or None)


def _ptxas_candidates() -> list:
    """ptxas binaries, the pip-installed ones (nvidia-cuda-nvcc: setup.cfg pins the version the
    DSL embeds) before the one on PATH (a system CUDA may be older than the DSL's PTX)."""
    import site
    import sysconfig
    roots = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    pip = sorted(p for r in roots for p in glob.glob(os.path.join(r, "nvidia", "*", "bin", "ptxas")))
    return pip + [p for p in [shutil.which("ptxas")] if p and p not in pip]


def _ptxas_v(ptx: str) -> str:
    """stderr of `ptxas -arch=sm_90a -v` on ptx, from the first ptxas that accepts its PTX version;
    skips the test where none does."""
    import pytest
    if not ptx:
        raise RuntimeError("the build kept no PTX (is --keep-ptx honoured?)")
    tried = []
    with tempfile.TemporaryDirectory(prefix="fap_ptxas_") as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        for ptxas in _ptxas_candidates():
            log = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                                 capture_output=True, text=True).stderr
            if "Unsupported .version" not in log:
                return log
            tried.append(ptxas)
    pytest.skip(f"no ptxas accepts this PTX's version (tried {tried or 'none'}; "
                "pip install nvidia-cuda-nvcc==13.4.59, the ptxas the cu13 DSL embeds)")
