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

# (mode, evaluator) pairs: softcap poly resolves to the exp2 offload with BF16 inputs, to the
# FP16 tanh program with FP16 inputs; sigmoid poly to the FP16 program
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
    return dict(out)


# ------------------------------------------------------------------ the builds of a call
def _program(call):
    """The program attention() runs for call; a call may name one ("program": a name or a
    ProgramSpec, e.g. a refit's: tests/test_refit_program.py builds with it)."""
    from flash_attn_poly.kernels import score_stages
    if call["evaluator"] != "poly" or call["mode"] == "softmax":
        return None
    if call.get("program") is not None:
        return call["program"]
    return score_stages.default_program(call["mode"], "bf16" if call["dtype"] == "bf16" else "f16", 50.0)


def fwd_kernel(call):
    """(kernel object, compile args) of the forward build `attention()` picks for call."""
    from flash_attn_poly.kernels import attn_fwd_sm90 as F, mask
    b, s, h_q, h_kv = call["shape"]
    dtype = call["dtype"]
    tuning = {"persistent": SM_COUNT}
    fixed_kw = F._fixed_max_kw(call["mode"], dtype, 50.0, tuning)
    (has_l, has_r), _ = mask.window_args(call["window"], call["causal"], s, s)
    win_kw = {k: True for k, on in (("window_left", has_l), ("window_right", has_r)) if on}
    items = tuple(sorted(dict(tuning, **win_kw, **fixed_kw).items()))
    _, cfg = F._stage_and_config(call["mode"], call["evaluator"], dtype, call["d"], call["causal"], items,
                                 _program(call))
    stream = F.cute.runtime.make_fake_stream()
    return F.AttnFwdSm90(cfg), F._fake_args(cfg) + (stream,)


def bwd_kernel(call):
    """(kernel object, compile args) of the backward build `attention()` picks for call."""
    from flash_attn_poly.kernels import attn_bwd_sm90 as B, mask
    from flash_attn_poly.kernels.score_stages import program_spec
    from flash_attn_poly.kernels.score_stages_bwd import bwd_side
    b, s, h_q, h_kv = call["shape"]
    d, mode, ev, program = call["d"], call["mode"], call["evaluator"], _program(call)
    if mode == "softcap" and ev == "poly" and program is not None and program_spec(program).is_exp2:
        ev, program = "native", None
    split = B.default_split(mode, ev, d)
    stage = bwd_side(mode, ev, program=program, poly_split=None if ev != "poly" or split is None else split)
    det = call["deterministic"]
    tile = B.BwdTile.for_head_dim(d)
    (has_l, has_r), _ = mask.window_args(call["window"], call["causal"], s, s)
    key = B.BwdKey("bf16" if call["dtype"] == "bf16" else "f16", d, call["causal"], stage, tile, has_l, has_r,
                   det, B.DQ_ASYNC_DEFAULT and not det and d <= 128, B.LPT_DEFAULT and not det)
    ctas = -(-s // tile.tile_n) * h_kv * b * max(1, d // 128)
    loop = h_q == h_kv or ctas >= B.HEAD_LOOP_MIN_CTAS_PER_SM * SM_COUNT
    if loop and not det:
        key = B.dataclasses.replace(key, head_loop=True)
    stream = B.cute.runtime.make_fake_stream()
    return B.kernel_for(key), B.fake_args(key) + (stream,)


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
