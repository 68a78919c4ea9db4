"""kernels/compile_cache.py: keys, the cache directory, the fingerprint (CPU unit tier) and the
on-disk round trip with a real tvm-ffi build of a small elementwise kernel (compile tier: a
new process loads the entry without tracing, a damaged entry is rebuilt with a warning,
processes racing on one entry build it once)."""
from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from flash_attn_poly.kernels import compile_cache as cc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Inner:
    n: int
    x: float = 0.5


@dataclasses.dataclass(frozen=True)
class Key:
    name: str
    inner: Inner
    bits: tuple = ()


class Color(enum.Enum):
    RED = 1


class Refuses:
    def cache_key(self):
        return None


class Named:
    def __init__(self, name):
        self.name = name

    def cache_key(self):
        return ("named", self.name)


# ------------------------------------------------------------------------------ keys
def test_stable_repr_spells_plain_values_and_frozen_dataclasses():
    k = Key("a", Inner(3), (("0x3e91", 6.0), None, True))
    s = cc.stable_repr(k)
    assert s == cc.stable_repr(Key("a", Inner(3), (("0x3e91", 6.0), None, True)))
    assert "Key(" in s and "Inner(n=3,x=0.5)" in s and " at 0x" not in s
    # every field counts: a different value anywhere is a different key
    assert len({s, cc.stable_repr(Key("b", Inner(3))), cc.stable_repr(Key("a", Inner(4))),
                cc.stable_repr(Key("a", Inner(3, 0.25))), cc.stable_repr(Key("a", Inner(3), (1,))),
                cc.stable_repr(Key("a", Inner(3), [1]))}) == 6
    assert cc.stable_repr(0.1) == repr(0.1) and cc.stable_repr(-0.0) != cc.stable_repr(0.0)
    assert cc.stable_repr(Color.RED).endswith("Color.RED")
    assert cc.stable_repr(int) == "<type builtins.int>"
    assert cc.stable_repr({"b": 1, "a": 2}) == cc.stable_repr({"a": 2, "b": 1})
    assert cc.stable_repr(frozenset({3, 1})) == cc.stable_repr(frozenset({1, 3}))


def test_stable_repr_refuses_what_it_cannot_spell():
    assert cc.stable_repr(lambda x: x) is None                  # a user function
    assert cc.stable_repr(object()) is None                     # an arbitrary instance
    assert cc.stable_repr(Key("a", Inner(1), (Refuses(),))) is None   # the hook says no, deep inside
    assert cc.stable_repr(Key("a", Inner(1), (lambda: 0,))) is None
    spelled = cc.stable_repr(Key("a", Inner(1), (Named("alibi"),)))
    assert spelled is not None and "('named','alibi')" in spelled
    assert spelled != cc.stable_repr(Key("a", Inner(1), (Named("softcap"),)))


def test_real_keys_have_stable_reprs():
    """The keys of every family spell out (cutlass types by qualified name, kernel configs and
    their score specs and programs field by field)."""
    import sass_catalogue as cat
    from flash_attn_poly.kernels import attn_bwd_prepost_sm90 as P, elementwise as ew

    softcap, sigmoid = (cat.plan_of(cat.builds()[n]) for n in ("softcap_poly_d128_bf16", "sigmoid_poly_d128_bf16"))
    keys = [softcap.fwd, softcap.bwd, sigmoid.fwd, sigmoid.bwd,
            P.PreKey("bf16", 128, True, True), P.PostKey("bf16"),
            ew.ElementwiseKey("silu_fwd", "bf16", "poly", "flat", ew.program_bits("silu_fwd", "bf16", "poly"))]
    spelled = [cc.stable_repr(k) for k in keys]
    assert all(s is not None and " at 0x" not in s for s in spelled), spelled
    assert len(set(spelled)) == len(keys)
    # the program is in the key by content: its coefficient bits, not only its name
    assert str(softcap.fwd.score.program.coeff_bits[0]) in spelled[0] and "exp2_f32_d3" in spelled[0]


def test_family_must_be_a_plain_name():
    with pytest.raises(ValueError, match="family"):
        cc.compiled("../escape", Key("a", Inner(1)), lambda: None)


# ------------------------------------------------------------------------------ directory
def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.delenv(cc.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_dir() == tmp_path / "xdg" / "flash_attn_poly"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cc.cache_dir() == cc.Path.home() / ".cache" / "flash_attn_poly"
    monkeypatch.setenv(cc.ENV, str(tmp_path / "moved"))
    assert cc.cache_dir() == tmp_path / "moved"
    for off in ("0", "off", "OFF", "false"):
        monkeypatch.setenv(cc.ENV, off)
        assert cc.cache_dir() is None
    path = cc.entry_path("attn_fwd", "spelled", tmp_path)
    assert path.parent == tmp_path / cc.fingerprint() / "attn_fwd" and path.suffix == ".o"
    assert path != cc.entry_path("attn_bwd", "spelled", tmp_path) != cc.entry_path("attn_fwd", "other", tmp_path)


def test_fingerprint_covers_sources_versions_and_arch():
    parts = dict(cc.fingerprint_parts())
    assert parts["arch"] == os.environ.get("CUTE_DSL_ARCH", parts["arch"])
    for name in ("python", "nvidia-cutlass-dsl", "apache-tvm-ffi", "torch"):
        assert parts[name] not in ("", "absent"), name
    # where they are installed: a venv with equal versions must not load this install's
    # runtime libraries (their absolute paths are in the entry's RUNTIME_LIBS file)
    for name in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        assert os.path.isdir(parts[f"{name}@"]), parts[f"{name}@"]
    # the CUDA flavours: a cache filled with one flavour's code is not another's
    flavours = [parts[f"nvidia-cutlass-dsl-libs-cu{v}"] for v in (12, 13)]
    assert any(f != "absent" for f in flavours), flavours
    for source in ("kernels/compile_cache.py", "kernels/attn_fwd_sm90.py", "asm/blocks.py",
                   "data/programs.json"):
        assert len(parts[source]) == 64, source
    assert len(cc.fingerprint()) == 16 and int(cc.fingerprint(), 16) >= 0


# ------------------------------------------------------------------------------ round trip
_KEY_SRC = 'ew.ElementwiseKey("silu_fwd", "bf16", "native", "flat", ())'

_CHILD = textwrap.dedent(f"""
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    from flash_attn_poly.kernels import compile_cache as cc, elementwise as ew
    t1 = time.perf_counter()
    key = {_KEY_SRC}
    build = (lambda: ew._build(key)) if sys.argv[1] == "may_build" else None
    fn = cc.compiled("elementwise", key, build)
    t2 = time.perf_counter()
    x = torch.zeros(16, dtype=torch.bfloat16)
    try:
        fn(x, x, x, x, x, 16, 2, 1)
        err = ""
    except Exception as e:  # no CUDA here: the device check of argument 0 rejects the call
        err = str(e)
    print(json.dumps(dict(counters=dict(cc.counters), import_s=t1 - t0, get_s=t2 - t1,
                          seconds=dict(cc.seconds), error=err)))
""")


def _child(cache_dir, mode="may_build"):
    env = dict(os.environ, **{cc.ENV: str(cache_dir), "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    return subprocess.Popen([sys.executable, "-c", _CHILD, mode], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc, stderr=None):
    """The child's JSON line; stderr: a list that receives its stderr (the cache's log)."""
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    if stderr is not None:
        stderr.append(err)
    return json.loads(out.strip().splitlines()[-1])


def _elementwise():
    from flash_attn_poly.kernels import elementwise as ew

    key = ew.ElementwiseKey("silu_fwd", "bf16", "native", "flat", ())
    return key, (lambda: ew._build(key))


def _so(path) -> dict:
    """{"load_so": 1} where the export linked the entry's shared library (a C compiler exists):
    a load then goes through tvm-ffi alone; {} where only the object file was written."""
    return {"load_so": 1} if path.with_suffix(".so").is_file() else {}


def _call_error(fn):
    import torch

    x = torch.zeros(16, dtype=torch.bfloat16)
    with pytest.raises(Exception, match="device_type=cuda") as info:
        fn(x, x, x, x, x, 16, 2, 1)
    return str(info.value)


@pytest.mark.compile
def test_round_trip_new_process_loads_without_tracing(fresh_cache):
    key, build = _elementwise()
    before = cc.counters.copy()
    fn = cc.compiled("elementwise", key, build)
    delta = cc.counters - before
    path = cc.entry_path("elementwise", cc.stable_repr(key))
    so = _so(path)
    assert delta == {"build": 1, "export": 1, "load": 1, **so}, delta    # built, written, read back
    assert cc.compiled("elementwise", key, build) is fn               # memory hit: nothing else
    assert cc.counters - before == delta
    entries = list(fresh_cache.glob(f"{cc.fingerprint()}/elementwise/*.o"))
    assert entries == [path]
    # a new process with no way to build (build=None would raise if called) loads the entry
    got = _result(_child(fresh_cache, "load_only"))
    assert got["counters"] == {"load": 1, **so}, got
    assert got["error"] == _call_error(fn)        # the same tvm-ffi signature, argument checks
    print(f"\nnew process: import {got['import_s']:.2f} s, cached kernel {got['get_s'] * 1e3:.1f} ms "
          f"(load {got['seconds']['load'] * 1e3:.1f} ms, fingerprint "
          f"{got['seconds']['fingerprint'] * 1e3:.1f} ms); this process built it in "
          f"{cc.seconds['build']:.2f} s")


@pytest.mark.compile
def test_disabled_cache_builds_in_memory(fresh_cache, monkeypatch):
    monkeypatch.setenv(cc.ENV, "off")
    key, build = _elementwise()
    before = cc.counters.copy()
    fn = cc.compiled("elementwise", key, build)
    assert cc.counters - before == {"build": 1}
    assert not any(fresh_cache.iterdir())
    _call_error(fn)


@pytest.mark.compile
def test_memory_only_key_writes_nothing(fresh_cache):
    from flash_attn_poly.kernels import elementwise as ew

    @dataclasses.dataclass(frozen=True)
    class UserKey:            # e.g. a user's score function: no stable spelling
        base: object
        hook: object

    key = UserKey(ew.ElementwiseKey("silu_fwd", "bf16", "native", "flat", ()), Refuses())
    before = cc.counters.copy()
    cc.compiled("elementwise", key, lambda: ew._build(key.base))
    assert cc.counters - before == {"build": 1, "memory_only": 1}
    assert not any(fresh_cache.iterdir())


def _damage(path, damage):
    """Replace the file at path by a damaged copy: a new file renamed over it, as a damaged entry
    appears to a later process (rewriting it in place would pull the pages from under this
    process's own dlopen of the entry's X.so: SIGBUS)."""
    good = path.read_bytes()
    bad = path.with_name(path.name + ".damaged")
    bad.write_bytes({"empty": b"", "truncated": good[: len(good) // 2], "garbage": os.urandom(4096)}[damage])
    os.replace(bad, path)


@pytest.mark.compile
@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_damaged_entry_is_rebuilt_with_a_warning(fresh_cache, damage):
    """A damaged entry (its object file and, where linked, its shared library) is logged,
    deleted and rebuilt by the next process that asks for it; the rewritten entry loads.  (In
    new processes: one that has dlopened an entry's X.so keeps that mapping whatever replaces
    the file.)"""
    key, build = _elementwise()
    cc.compiled("elementwise", key, build)
    path = cc.entry_path("elementwise", cc.stable_repr(key))
    so = _so(path)
    for p in (path, path.with_suffix(".so")) if so else (path,):
        _damage(p, damage)
    log = []
    got = _result(_child(fresh_cache), log)
    assert got["counters"] == {"corrupt": 1, "build": 1, "export": 1, "load": 1, **so}, got
    assert "does not load" in log[0] and str(path) in log[0], log[0][-2000:]
    assert path.stat().st_size > 0 and got["error"]
    got = _result(_child(fresh_cache, "load_only"))     # the rewritten entry loads
    assert got["counters"] == {"load": 1, **so}, got


@pytest.mark.compile
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_shared_library_falls_back_to_the_object_file(fresh_cache, damage):
    """An entry's X.so that does not load (a truncated one is not even dlopened: that faulted
    the process with SIGBUS) is deleted and its object file loads instead (no rebuild); the
    call signature is the same."""
    key, build = _elementwise()
    fn = cc.compiled("elementwise", key, build)
    path = cc.entry_path("elementwise", cc.stable_repr(key))
    if not _so(path):
        pytest.skip("no C compiler: the cache writes object files only")
    _damage(path.with_suffix(".so"), damage)
    got = _result(_child(fresh_cache, "load_only"))
    assert got["counters"] == {"load": 1}, got
    assert not path.with_suffix(".so").exists() and path.is_file()
    assert got["error"] == _call_error(fn)


@pytest.mark.compile
def test_unwritable_cache_dir_falls_back_to_memory(fresh_cache, monkeypatch, caplog):
    monkeypatch.setattr(cc, "_warned", set())
    blocker = fresh_cache / "not_a_dir"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv(cc.ENV, str(blocker))
    key, build = _elementwise()
    before = cc.counters.copy()
    with caplog.at_level(logging.WARNING, logger="flash_attn_poly.compile_cache"):
        fn = cc.compiled("elementwise", key, build)
    assert cc.counters - before == {"build": 1}
    assert any("cannot create" in r.getMessage() for r in caplog.records)
    _call_error(fn)


@pytest.mark.compile
def test_processes_racing_on_one_entry_build_it_once(fresh_cache):
    procs = [_child(fresh_cache) for _ in range(2)]
    results = [_result(p) for p in procs]
    builds = sum(r["counters"].get("build", 0) for r in results)
    assert builds == 1, results       # the second waited on the entry's lock, then loaded it
    assert all(r["counters"].get("load", 0) == 1 for r in results), results     # (through X.so or X.o)
    assert results[0]["error"] == results[1]["error"] != ""
    assert len(list(fresh_cache.glob(f"*/elementwise/*.o"))) == 1
    assert not list(fresh_cache.glob("*/elementwise/.*.tmp.o"))     # no temporary file left behind
