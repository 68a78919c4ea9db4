"""The default builds of the attention kernels, and a hash of each one's SASS.

The safety net of refactors: every build that a public `attention()` call can pick by default
is named here by the call that picks it (mode, evaluator, dtype, head dim, causal, window,
deterministic, and the shape where the backward's variant depends on it).  `sass_hash` compiles
it for sm_90a on the CPU and hashes its instruction text (labels, addresses and encodings
left out, so renaming a kernel class does not move it).  tests/fixtures/sass_defaults.json
holds the hashes; tests/test_sass_defaults_compile.py compares them.  A change that means to
alter code generation regenerates the fixture (`python tests/sass_catalogue.py --write`) and
says which builds moved and why.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "sass_defaults.json")
SM_COUNT = 132            # the H200's SMs: the persistent forward grid and the backward's head_loop rule
ANCHOR = (1, 4096, 32, 8)  # (B, S, H_q, H_kv) of the seed's shape
SMALL = (1, 1024, 32, 8)   # a shape whose backward grid is too small for the per-KV-head build

# (mode, evaluator) pairs: softcap poly resolves to the exp2 offload with BF16 inputs and cap <= 50
# (to native with FP16 inputs: plan.poly_outside_rule); sigmoid poly to the FP16 program with
# BF16 inputs (to native with FP16 inputs)
SCORES = (("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
          ("sigmoid", "native"), ("sigmoid", "poly"))


def _call(mode, evaluator, dtype="bf16", d=128, causal=True, window=(-1, -1), deterministic=False,
          shape=ANCHOR):
    tag = f"{mode}_{evaluator}_d{d}_{dtype}" + ("" if causal else "_noncausal")
    tag += "" if window == (-1, -1) else f"_win{window[0]}_{window[1]}"
    tag += "_det" if deterministic else ""
    tag += "" if shape == ANCHOR else f"_s{shape[1]}"
    return tag, dict(mode=mode, evaluator=evaluator, dtype=dtype, d=d, causal=causal, window=window,
                     deterministic=deterministic, shape=shape)


def builds() -> dict:
    """{name: call} of every default build this catalogue pins."""
    out = []
    for mode, ev in SCORES:
        for d in (64, 128, 256):
            out.append(_call(mode, ev, d=d))
        out.append(_call(mode, ev, dtype="fp16"))
        out.append(_call(mode, ev, causal=False))
        out.append(_call(mode, ev, window=(512, 0)))
    for mode, ev in (("softmax", "native"), ("softcap", "poly")):
        out.append(_call(mode, ev, deterministic=True))
        out.append(_call(mode, ev, shape=SMALL))
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")):
        out.append(_call(mode, ev, d=64, causal=False))   # the D = 64 non-causal forward's own rows
    for mode, ev in (("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")):
        out.append(_call(mode, ev, d=64, shape=SMALL))     # the short causal D = 64 forward's own row
    return dict(out)


# ------------------------------------------------------------------ the builds of a call
def plan_of(call, overrides=None):
    """The plan `attention()` resolves for call on an H200 (SM_COUNT SMs); a call may name a
    program ("program": a name or a ProgramSpec, e.g. a refit's: tests/test_refit_program.py),
    a softcap value ("softcap", default 50: the constant row max needs <= 50) and a sigmoid
    backward rule ("sigmoid_grad")."""
    from flash_attn_poly import plan
    b, s, h_q, h_kv = call["shape"]
    c = plan.AttnCall(mode=call["mode"], evaluator=call["evaluator"], dtype=call["dtype"], head_dim=call["d"],
                      batch=b, seqlen_q=s, seqlen_k=s, heads_q=h_q, heads_kv=h_kv, causal=call["causal"],
                      window=tuple(call["window"]), softmax_scale=call["d"] ** -0.5,
                      softcap=call.get("softcap", 50.0) if call["mode"] == "softcap" else None,
                      program=call.get("program"), deterministic=call["deterministic"],
                      sigmoid_grad=call.get("sigmoid_grad"))
    return plan.resolve(c, SM_COUNT, overrides)


def fwd_build(cfg):
    """(kernel object, compile args) of the forward build of a FwdConfig."""
    from flash_attn_poly.kernels import attn_fwd_sm90 as F
    return F.kernel_for(cfg), F._fake_args(cfg) + (F.cute.runtime.make_fake_stream(),)


def bwd_build(cfg):
    """(kernel object, compile args) of the backward build of a BwdConfig."""
    from flash_attn_poly.kernels import attn_bwd_sm90 as B
    return B.kernel_for(cfg), B.fake_args(cfg) + (B.cute.runtime.make_fake_stream(),)


def fwd_kernel(call, overrides=None):
    """(kernel object, compile args) of the forward build `attention()` picks for call."""
    return fwd_build(plan_of(call, overrides).fwd)


def bwd_kernel(call, overrides=None):
    """(kernel object, compile args) of the backward build `attention()` picks for call."""
    return bwd_build(plan_of(call, overrides).bwd)


# ------------------------------------------------------------------ hashing
_INSTR_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def instructions(sass_text: str) -> list[str]:
    """Instruction texts in program order (no addresses, encodings or labels)."""
    return [m.group(1) for m in _INSTR_LINE.finditer(sass_text)]


def sass_text(kernel_and_args) -> str:
    from flash_attn_poly.kernels import sass
    kernel, args = kernel_and_args
    return sass.sass_of(kernel, *args)


def sass_hash(text: str) -> str:
    return hashlib.sha256("\n".join(instructions(text)).encode()).hexdigest()[:16]


def snapshot(names=None, progress=True) -> dict:
    """{name: {"fwd": hash, "bwd": hash}} for the catalogue (or the given names)."""
    cat = builds()
    out = {}
    for i, name in enumerate(names or cat):
        call = cat[name]
        out[name] = {"fwd": sass_hash(sass_text(fwd_kernel(call))),
                     "bwd": sass_hash(sass_text(bwd_kernel(call)))}
        if progress:
            print(f"[{i + 1}/{len(cat)}] {name} {out[name]}", file=sys.stderr, flush=True)
    return out


def load_fixture() -> dict:
    with open(FIXTURE) as f:
        return json.load(f)["builds"]


if __name__ == "__main__":
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    snap = snapshot()
    if "--write" in sys.argv:
        with open(FIXTURE, "w") as f:
            json.dump({"generated_by": "python tests/sass_catalogue.py --write",
                       "builds": snap}, f, indent=1, sort_keys=True)
            f.write("\n")
    else:
        json.dump(snap, sys.stdout, indent=1, sort_keys=True)
