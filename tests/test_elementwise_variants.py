"""ElementwiseTune variants (bench/tools/elementwise_variants.py): index model on the CPU, SASS
of every benched variant compiled for sm_90a."""
import dataclasses
import os
import random
import sys

import numpy as np
import pytest

from flash_attn_poly.kernels import elementwise as ew
from flash_attn_poly.kernels import sass

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "bench", "tools"))
import elementwise_variants as ev  # noqa: E402

THREADS, CHUNK = ew.THREADS, ew.CHUNK


def schedule(n: int, grid: int, unroll: int, remainder: str):
    """Model of ElementwiseKernel.kernel's index math over every thread of the grid (numpy,
    one row per thread): (stored chunks, loaded chunks, tail elements), with repeats."""
    n_chunks = n // CHUNK
    n_threads = grid * THREADS
    group = n_threads * unroll
    n_groups = n_chunks // group                   # host side (__call__)
    tid = np.arange(n_threads)[:, None]
    k = np.arange(unroll)[None, :]
    full = np.concatenate([(g * group + tid + k * n_threads).ravel() for g in range(n_groups)]
                          + [np.zeros(0, int)])
    stores, loads = [full], [full]
    if remainder == "pred":
        first = n_groups * group + tid
        c = first + k * n_threads
        active = np.broadcast_to(first < n_chunks, c.shape)
        loads.append(np.minimum(c, n_chunks - 1)[active])
        stores.append(c[active & (c < n_chunks)])
    else:                                          # for c in range(first, n_chunks, n_threads)
        steps = np.arange(-(-group // n_threads) + 1)[None, :]
        c = n_groups * group + tid + steps * n_threads
        stores.append(c[c < n_chunks])
        loads.append(c[c < n_chunks])
    t = tid.ravel()
    tail = n_chunks * CHUNK + t[t < n - n_chunks * CHUNK]
    return np.concatenate(stores), np.concatenate(loads), tail


def _sizes():
    rng = random.Random(0)
    fixed = [1, 7, 8, 9, 1023, 2048 * 8 - 1, THREADS * CHUNK * 4 * 3 + 5, 2**20 + 3]
    return fixed + [rng.randrange(1, 3 * 2**20) for _ in range(12)]


@pytest.mark.parametrize("remainder", ["u1", "pred"])
@pytest.mark.parametrize("unroll", [1, 2, 4, 8])
def test_every_chunk_exactly_once(unroll, remainder):
    """For many n and every grid policy (plus odd grids), each chunk is stored exactly once,
    every load is in bounds, and the scalar tail covers n % 8."""
    for n in _sizes():
        n_chunks = n // CHUNK
        grids = {ew.grid_size(n_chunks, unroll, sms, pol, res)
                 for sms in (1, 3, 132) for pol in ("default", "balanced", "resident")
                 for res in (4, 5, 6, 8)} | {1, 2, 7}
        for grid in grids:
            stores, loads, tail = schedule(n, grid, unroll, remainder)
            assert np.array_equal(np.sort(stores), np.arange(n_chunks)), (n, grid, unroll)
            assert loads.size == 0 or (loads.min() >= 0 and loads.max() < n_chunks), (n, grid)
            assert np.array_equal(tail, np.arange(n_chunks * CHUNK, n)), (n, grid)


def test_grid_policies():
    """balanced/resident: <= cap blocks, the fewest rounds the cap allows, and at most a
    partial last round of one group per block; B1 fwd on 132 SMs runs 1024 x 7 exactly."""
    for groups in list(range(1, 3000, 7)) + [7168, 14336, 3584]:
        for sms, res in ((132, 6), (132, 8), (3, 5)):
            for pol, cap in (("balanced", sms * 8), ("resident", sms * res)):
                grid = ew.grid_size(groups * THREADS * 4, 4, sms, pol, res)
                rounds = -(-groups // grid)
                assert grid <= cap and rounds == -(-groups // cap), (groups, pol)
                assert grid * rounds - groups < rounds, (groups, pol)   # < one group per block
    assert ew.grid_size(ev.B1_N // CHUNK, 4, 132, "balanced") == 1024
    assert ew.grid_size(ev.B1_N // CHUNK, 4, 132) == 1056                # default unchanged


def test_api_grid_follows_the_measured_policy(monkeypatch):
    """activations._grid launches SiLU forward with the balanced grid (GRID_POLICY) and every
    other kind with the default one."""
    from flash_attn_poly import activations as A
    monkeypatch.setattr(A, "_sm_count", lambda dev: 132)
    A._grid.cache_clear()
    try:
        assert ew.GRID_POLICY == {"silu_fwd": "balanced"}
        assert A._grid(ev.B1_N, "silu_fwd", 0) == 1024
        assert A._grid(ev.B1_N, "silu_bwd", 0) == ew.grid_size(ev.B1_N // CHUNK, 2, 132)
        assert A._grid(ev.B1_N, "swiglu_fwd", 0) == ew.grid_size(ev.B1_N // CHUNK, 2, 132)
    finally:
        A._grid.cache_clear()


def test_resident_blocks_and_tune_validation():
    assert [ew.resident_blocks(r) for r in (16, 32, 40, 48, 56, 64, 255)] == [8, 8, 6, 5, 4, 4, 1]
    for bad in (dict(unroll=3), dict(remainder="x"), dict(cache="nc"), dict(grid="x"),
                dict(min_blocks=9)):
        with pytest.raises(ValueError):
            ew.ElementwiseTune(**bad)
    assert ew.ElementwiseKey("silu_fwd", "bf16") == ew.ElementwiseKey(
        "silu_fwd", "bf16", tune=ew.ElementwiseTune())


def _bench_keys():
    keys = []
    for kind in ("silu_fwd", "silu_bwd"):
        seen = set()
        for name, tune in ev.VARIANTS.items():
            if kind != "silu_fwd":
                tune = dataclasses.replace(tune, unroll=0)
            if tune not in seen:
                seen.add(tune)
                keys.append(pytest.param(ew.ElementwiseKey(kind, "bf16", "poly", tune=tune),
                                         id=f"{kind}-{name.replace(' ', '_')}"))
    # other kinds/layouts with the non-default device paths
    for tune in (ew.ElementwiseTune(remainder="pred", cache="stream"),
                 ew.ElementwiseTune(remainder="pred", cache="stream_na")):
        keys.append(pytest.param(ew.ElementwiseKey("swiglu_bwd", "bf16", "poly", "concat",
                                                   tune=tune), id=f"swiglu_bwd-concat-{tune.cache}"))
        keys.append(pytest.param(ew.ElementwiseKey("gelu_fwd", "f16", tune=tune),
                                 id=f"gelu_fwd-f16-{tune.cache}"))
    return keys


@pytest.mark.compile
@pytest.mark.parametrize("key", _bench_keys())
def test_variant_sass(key):
    import cutlass.cute as cute

    k = ew.ElementwiseKernel(key)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=False)
    cubin = sass.compile_sm90(k, *k.fake_args(), stream).artifacts.CUBIN
    text = sass.disassemble(cubin)
    c = sass.count_opcodes(text)
    assert c["LDG.128"] > 0 and c["STG.128"] > 0, c
    # every global access is a 16-byte vector, except the 2-byte scalar tail
    glob = {op for op in sass.opcodes(text) if op.startswith(("LDG", "STG"))}
    assert all(".128" in op or op.endswith(".U16") for op in glob), glob
    assert c["STL"] == 0 and c["LDL"] == 0, f"register spills: {c}"
    assert c["MUFU"] == 0, c
    assert c["HFMA2.BF16" if key.dtype == "bf16" else "HFMA2"] > 0, c
    if key.tune.cache == "stream":
        assert any(op.startswith("LDG.E.128.CONSTANT") for op in glob), glob
    if key.tune.cache == "stream_na":
        assert any(op.startswith("LDG.E.NA.128") for op in glob), glob
    if key.tune.cache != "default":
        assert any(op.startswith("STG.E.EF.128") for op in glob), glob
    assert max(sass.registers(cubin).values()) <= 128
