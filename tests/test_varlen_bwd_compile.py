"""Compile-only tests of the varlen backward (BwdConfig.varlen; kernels/attn_bwd_sm90.py
AttnBwdSm90Varlen, kernels/attn_bwd_prepost_sm90.py PreVarlenKernel): the builds a packed batch
uses compile for sm_90a on the CPU with HGMMA and spill no more than the dense build of the same
call (none where it has none), the main kernel is a build of its own with the dense main loop,
and the pre kernel keeps the dense one's loads.  The dense builds' SASS is pinned by
tests/test_sass_defaults_compile.py (the varlen code is behind const_expr)."""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("cutlass")

import builds as B  # noqa: E402

VARIANTS = [   # (mode, evaluator, head_dim, causal, window, softcap, dtype): tests/test_varlen_gpu.py's and D = 64
    ("softmax", "native", 128, True, (-1, -1), None, "bf16"),
    ("softcap", "poly", 256, True, (-1, -1), 30.0, "bf16"),
    ("softmax", "native", 128, False, (48, 16), None, "bf16"),
    ("sigmoid", "poly", 128, True, (-1, -1), None, "fp16"),
    ("softmax", "native", 64, True, (-1, -1), None, "bf16"),
]


def varlen_plan(*variant, kernel=True):
    """builds.varlen_plan with the varlen backward chosen (bwd.varlen), a CTA per query head
    (head_loop off by override; the plan takes the per-KV-head loop where its grid fills, and
    lpt is off in varlen builds); at D = 256 the chunked build (the packed builds of user scores)."""
    return B.varlen_plan(*variant, overrides=_chunked(variant, {"bwd.varlen": True, "bwd.head_loop": False})
                         if kernel else None)


def _chunked(variant, overrides: dict) -> dict:
    """D = 256 packed calls of built-in scores take the swapped build (tests/test_bwd_swap_compile.py);
    these tests name the chunked one, which packed user-score calls take."""
    return dict(B.CHUNKED_D256, **overrides) if variant[2] == 256 else overrides


def _spilled(n: dict) -> int:
    return n["STL"] + n["LDL"]


def _assert_no_extra_spills(varlen_build, cfg, head_dim: int) -> dict:
    """HGMMA present; no more main-loop spill instructions than the dense build of cfg (varlen
    off), at most three more spill instructions in all (outside the loop); none at D = 64 and 128.
    Returns the counts."""
    n = varlen_build.counts()
    assert n["HGMMA"] > 0
    db = B.bwd(dataclasses.replace(cfg, varlen=False))
    dense = db.counts()
    assert _loop_spills(varlen_build.sass) <= _loop_spills(db.sass), \
        f"varlen spills {n['STL']}/{n['LDL']}, dense {dense['STL']}/{dense['LDL']}"
    assert _spilled(n) <= _spilled(dense) + 3, f"varlen spills {n['STL']}/{n['LDL']}, dense {dense['STL']}/{dense['LDL']}"
    if head_dim in (64, 128):
        assert _spilled(n) == 0, n
    return n


def _loop_spills(sass: str) -> int:
    """Local-memory instructions between the first and the last HGMMA (the main loop)."""
    lines = sass.splitlines()
    hg = [i for i, line in enumerate(lines) if "HGMMA" in line]
    return sum(("STL" in line or "LDL" in line) for line in lines[hg[0]:hg[-1] + 1])


@pytest.mark.compile
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-d{v[2]}-c{int(v[3])}-w{v[4][0]}_{v[4][1]}-{v[6]}")
def test_varlen_backward_builds_without_extra_spills(variant):
    """HGMMA present; in the main loop (first to last HGMMA) no more spill instructions than the
    dense build of the same knobs (varlen off; the plan's dense default may differ: head_loop,
    lpt); none at all at D = 64 (the 64 x 128 tile) and D = 128.  Measured on the CPU: D = 256
    2 + 2 spill instructions in the dense build, 3 + 4 in the varlen one (softcap poly): a load in
    the epilogue (the CTA table's sequence, spilled at the start), and since the dQ accumulator's
    rows start at the sequence's padded offset (not at cu_q like Q's) one word stored and
    reloaded once in the prologue; the main loop's are the dense build's."""
    p = varlen_plan(*variant)
    assert p.bwd.varlen and not p.bwd.head_loop and not p.bwd.lpt
    _assert_no_extra_spills(B.bwd(p.bwd), p.bwd, variant[2])


@pytest.mark.compile
@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[1], VARIANTS[3], VARIANTS[4]],
                         ids=["d128", "d256-softcap", "d128-sigmoid", "d64"])
def test_varlen_head_loop_backward_builds_without_extra_spills(variant):
    """The per-KV-head varlen build (override bwd.head_loop: AttnBwdSm90VarlenHeadLoop) compiles with
    HGMMA, dK and dV stored in dtype (no RED of them), and no more main-loop spills than the dense
    head_loop build of the same knobs; none at all at D = 64 and 128.  Sigmoid: the score without
    LSE zeroes the staged dO rows past a sequence's end, on the head loop's path too.  Softmax at
    D = 64 and 128 builds the plan's packed stagger (p_turns + dq_defer over the dQ halves)."""
    from flash_attn_poly.kernels import attn_bwd_sm90
    p = B.varlen_plan(*variant, overrides=_chunked(variant, {"bwd.varlen": True, "bwd.head_loop": True}))
    assert p.bwd.varlen and p.bwd.head_loop and not p.bwd.lpt
    stagger = variant[0] == "softmax" and variant[2] in (64, 128)
    assert (p.bwd.p_turns, p.bwd.dq_defer, p.bwd.dq_halves or not stagger) == (stagger, stagger, True), p.bwd
    assert isinstance(attn_bwd_sm90.kernel_for(p.bwd), attn_bwd_sm90.AttnBwdSm90VarlenHeadLoop)
    vb = B.bwd(p.bwd)
    _assert_no_extra_spills(vb, p.bwd, variant[2])
    from flash_attn_poly.kernels import sass
    reds = lambda text: sum(op.startswith("RED") for op in sass.opcodes(text))
    per_head = reds(B.bwd(varlen_plan(*variant).bwd).sass)
    assert reds(vb.sass) < per_head, (reds(vb.sass), per_head)   # dK, dV stored, not added


@pytest.mark.compile
def test_varlen_dq_halves_backward_builds_without_spills():
    """dq_halves on the per-KV-head varlen build at D = 128 (the plan's default there, as for dense
    calls): the column halves' bulk adds per 16-row band (8 UBLKRED, the dense build's), no spills."""
    from flash_attn_poly.kernels import sass
    p = B.varlen_plan(*VARIANTS[0], overrides={"bwd.varlen": True, "bwd.head_loop": True, "bwd.dq_halves": True})
    assert p.bwd.varlen and p.bwd.head_loop and p.bwd.dq_halves and p.bwd.tile_m == 64
    vb = B.bwd(p.bwd)
    n = _assert_no_extra_spills(vb, p.bwd, 128)
    fams = sass.families("UBLKRED")
    assert sass.count_opcodes(vb.sass, fams)["UBLKRED"] == 8, n


@pytest.mark.compile
def test_varlen_backward_is_its_own_build():
    var = varlen_plan(*VARIANTS[0]).bwd
    dense = dataclasses.replace(var, varlen=False)
    a, b = B.bwd(dense), B.bwd(var)
    assert a.sass != b.sass
    # the same main loop: the GEMMs and the exponentials are the dense build's
    for fam in ("HGMMA", "MUFU.EX2"):
        assert a.counts()[fam] == b.counts()[fam], fam


@pytest.mark.compile
@pytest.mark.parametrize("d", [64, 128])
def test_pre_varlen_sass(d):
    """PreVarlenKernel: the dense pre kernel's 8 x 16-byte row loads, no spills, and the
    launch's tvm-ffi signature (packed tensors, the offsets, max_seqlen_q)."""
    import cutlass.cute as cute
    from flash_attn_poly.kernels import attn_bwd_prepost_sm90 as P, prepost_launch as L, sass
    key = L.PreKey("bf16", d, True, True, varlen=True)
    k = P.kernel_for(key)
    assert isinstance(k, P.PreVarlenKernel)
    c = sass.compile_sm90(k, *k.fake_args(), cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=False))
    n = sass.count_opcodes(sass.disassemble(c.artifacts.CUBIN))
    assert n["LDG.E.128"] == 2 * P.PRE_CHUNKS, n
    assert n["STL"] == 0 and n["LDL"] == 0, n


def test_pre_key_refuses_zero_dq_with_varlen():
    from flash_attn_poly.kernels import prepost_launch as L
    with pytest.raises(ValueError, match="zero_dq serves the head_loop backward"):
        L.PreKey("bf16", 128, True, True, zero_dq=True, varlen=True)


@pytest.mark.compile
@pytest.mark.parametrize("kind", ["bwd", "compact"])
def test_table_kernel_sass(kind):
    """The one-launch tile tables (kernels/varlen_table_sm90.py: the backward's CTA table, the
    forward's compact order) build for sm_90a: no local memory, two CTA barriers (between the
    backward's steps; per level of the compact order), no tensor or transcendental work beyond
    the reciprocals of integer divisions, registers that fit 1024 threads."""
    import re
    import cutlass.cute as cute
    from flash_attn_poly.kernels import sass, varlen_table_sm90 as V
    from flash_attn_poly.kernels.tile_scheduler import TableKey
    k, args = V.build(TableKey(kind))
    assert isinstance(k, V.CompactTableKernel if kind == "compact" else V.BwdTableKernel)
    c = sass.compile_sm90(k, *args, cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=False))
    text = sass.disassemble(c.artifacts.CUBIN)
    n = sass.count_opcodes(text)
    assert n["STL"] == 0 and n["LDL"] == 0 and n["HGMMA"] == 0, n
    assert n["MUFU"] == n["MUFU.RCP"], n
    assert len(re.findall(r"\bBAR\.SYNC", text)) == 2, text.count("BAR")
    (regs,) = sass.registers(c.artifacts.CUBIN).values()
    assert regs <= 64, regs       # 1024 threads: 64 registers each fill the file; measured 24 / 44
