"""The one compile cache and launch path of every kernel family (attention forward and
backward, backward pre/post, elementwise).

``compiled(family, key, build) -> fn``: the compiled kernel for ``key``, built at most once per
process and, where the key allows it, once per machine:

1. memory: a dict keyed ``(family, key)``; ``key`` is a hashable frozen value (a frozen
   dataclass) that names everything the build depends on.
2. disk: ``<cache dir>/<fingerprint>/<family>/<sha256 of the key's stable repr>.o``, the
   compiled host launcher plus the embedded cubin as one object file
   (``JitCompiledFunction.export_to_c``), linked back in by ``cute.runtime.load_module``
   (LLVM JITLink, a few ms, no tracing, no MLIR pipeline, no ptxas, no GPU needed until
   the call).  Where a C compiler exists the export also links ``X.so`` (``cc -shared``),
   which ``tvm_ffi.load_module`` opens in under a millisecond without importing cutlass
   (once the DSL's runtime libraries, listed per fingerprint in ``runtime_libs.txt``, are
   loaded with RTLD_GLOBAL): a process whose kernels are all cached never imports cutlass.  The fingerprint covers what changes code generation besides the key: the
   kernel and asm sources, the coefficient table, the CUDA arch, and the versions of
   cutlass-dsl, apache-tvm-ffi, torch and Python; another fingerprint is another directory.
3. build: ``kernel, args = build()``, then ``cute.compile(kernel, *args, <env stream>,
   options="--enable-tvm-ffi")``; the result is written to disk (temporary file, then an
   atomic rename) and read back, so a process that compiled gets the same object as one
   that loaded.

Launch path: every compiled function takes torch tensors and Python numbers positionally,
in the order of the kernel's ``__call__`` without the stream; apache-tvm-ffi checks them
against the fake signature (dtype, rank, divisibility, device) and converts them in C++,
and the kernel runs on torch's current stream (``make_fake_stream(use_tvm_ffi_env_stream=True)``).

Cache directory: ``FLASH_ATTN_POLY_CACHE_DIR`` moves it (``0`` / ``off`` disables the disk
side); default ``$XDG_CACHE_HOME/flash_attn_poly`` or ``~/.cache/flash_attn_poly``.  Old
fingerprints are not pruned: delete the directory to reclaim them.

Keys on disk: ``stable_repr(key)`` spells a key out of plain values (str, int, float, bool,
None, bytes, tuples, lists, dicts, sets, enums, types and frozen dataclasses, field by field,
with their qualified class names).  An object can decide for itself with a ``cache_key()``
method: it returns the plain value that names it, or None to keep every key containing it in
memory only (a user's score function, whose code is not in the fingerprint).  Any other
object (a function, an arbitrary instance) also makes the key memory-only.

Concurrency: processes that miss the same entry compile it one at a time (an ``flock`` on
``<entry>.lock``; the later ones then load what the first wrote); where locking does not
work, concurrent writers are harmless because each writes its own temporary file.  An entry
that does not load (truncated, foreign, damaged) is logged, deleted and rebuilt; an entry that
cannot be written (read-only or full disk) is logged and the compiled function is used from
memory.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

ENV = "FLASH_ATTN_POLY_CACHE_DIR"
_DISABLED = ("0", "off", "false", "no", "none")
COMPILE_OPTIONS = "--enable-tvm-ffi"
EXPORT_NAME = "func"            # symbol prefix of the exported function in every entry
RUNTIME_LIBS = "runtime_libs.txt"   # per fingerprint: the CuTe DSL runtime libraries an X.so needs
LOCK_TIMEOUT_S = 600.0          # longer than the slowest build on a loaded 2-core machine
_FAMILY = re.compile(r"[A-Za-z0-9_.-]+")

_log = logging.getLogger("flash_attn_poly.compile_cache")
_memory: dict = {}
_mutex = threading.RLock()
_warned: set = set()
# what the process did, per event: "build" (cute.compile), "load" (an entry read from disk),
# "export" (an entry written), "corrupt" (an entry that did not load and was rebuilt),
# "memory_only" (a key without a stable repr)
counters: collections.Counter = collections.Counter()
seconds: collections.Counter = collections.Counter()   # wall time per event, same names


# ------------------------------------------------------------------------------ build
def compile_tvm_ffi(kernel, args, options: str = ""):
    """``cute.compile`` of ``kernel(*args, stream)`` for the launch path: tvm-ffi entry, stream
    from the caller's environment (torch's current stream).  ``options`` adds compiler flags
    (e.g. ``--keep-cubin --dump-dir=D`` for SASS inspection); the device code is the same with
    and without ``--enable-tvm-ffi``, which only changes the host launcher."""
    import cutlass.cute as cute

    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    opts = f"{options} {COMPILE_OPTIONS}".strip()
    return cute.compile(kernel, *args, stream, options=opts)


def compiled(family: str, key, build: Callable[[], tuple]):
    """The compiled tvm-ffi function of ``family`` for ``key`` (see the module docstring).

    family: a short name, also the entry's directory ("attn_fwd", "attn_bwd", ...).
    key: hashable, equal keys build equal kernels.
    build: () -> (kernel object, compile args without the stream); called on a miss only."""
    fn = _memory.get((family, key))
    if fn is not None:
        return fn
    if not isinstance(family, str) or not _FAMILY.fullmatch(family):
        raise ValueError(f"family must be a non-empty name of letters, digits, '_', '.', '-'; "
                         f"got {family!r}")
    with _mutex:
        fn = _memory.get((family, key))
        if fn is None:
            fn = _memory[(family, key)] = _load_or_build(family, key, build)
    return fn


def clear_memory() -> None:
    """Forget the in-memory entries (the disk cache stays): the next call loads or builds."""
    with _mutex:
        _memory.clear()


def _build(build):
    counters["build"] += 1
    t0 = time.perf_counter()
    kernel, args = build()
    fn = compile_tvm_ffi(kernel, tuple(args))
    seconds["build"] += time.perf_counter() - t0
    return fn


def _load_or_build(family: str, key, build):
    root = cache_dir()
    if root is None:
        return _build(build)
    spelled = stable_repr(key)
    if spelled is None:
        counters["memory_only"] += 1
        return _build(build)
    path = entry_path(family, spelled, root)
    fn = _try_load(path)
    if fn is not None:
        return fn
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if str(root) not in _warned:     # once per directory, not once per kernel
            _warned.add(str(root))
            _log.warning("compile cache: cannot create %s (%s); compiling without the disk cache",
                         path.parent, e)
        return _build(build)
    with _EntryLock(path.with_suffix(".lock")) as locked:
        if locked:   # another process may have written it while this one waited
            fn = _try_load(path)
            if fn is not None:
                return fn
        fn = _build(build)
        if _export(fn, path):
            loaded = _try_load(path)
            if loaded is not None:
                return loaded
        return fn


# ------------------------------------------------------------------------------ disk
def cache_dir() -> Optional[Path]:
    """The cache root (FLASH_ATTN_POLY_CACHE_DIR, else the user's cache directory), or None
    when the variable disables the disk cache.  Read on every miss, so tests can move it."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in _DISABLED:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(Path.home(), ".cache")
    return Path(base) / "flash_attn_poly"


def entry_path(family: str, spelled_key: str, root: Optional[Path] = None) -> Path:
    """Where the entry of (family, key) lives; spelled_key is stable_repr(key)."""
    root = cache_dir() if root is None else root
    digest = hashlib.sha256(f"{family}\n{spelled_key}".encode()).hexdigest()[:40]
    return Path(root) / fingerprint() / family / f"{digest}.o"


def _try_load(path: Path):
    """The function in the entry at path, None if there is none; a damaged entry is logged,
    deleted and reported as missing (the caller rebuilds it).  The entry's shared library
    (X.so, linked at export where a C compiler exists) loads through tvm-ffi alone, without
    importing cutlass; the object file (X.o) through cute.runtime.load_module."""
    so = path.with_suffix(".so")
    if so.is_file():
        fn = _try_load_so(so, path.parent.parent / RUNTIME_LIBS)
        if fn is not None:
            return fn
    if not path.is_file():
        return None
    t0 = time.perf_counter()
    try:
        import cutlass.cute as cute

        fn = cute.runtime.load_module(str(path), enable_tvm_ffi=True)[EXPORT_NAME]
    except Exception as e:  # noqa: BLE001 - any failure to link the entry means: rebuild it
        counters["corrupt"] += 1
        _log.warning("compile cache: entry %s does not load (%s: %s); deleting it and compiling "
                     "again", path, type(e).__name__, _one_line(e))
        _remove(path, so)
        return None
    counters["load"] += 1
    seconds["load"] += time.perf_counter() - t0
    return fn


_preloaded: set = set()


def _try_load_so(so: Path, libs_file: Path):
    """dlopen an entry's shared library through tvm-ffi, after the CuTe DSL runtime libraries
    it links against (their paths, written at export, in RUNTIME_LIBS) are loaded with
    RTLD_GLOBAL; None (the caller falls back to the object file) on any failure."""
    t0 = time.perf_counter()
    try:
        if not _elf_intact(so):
            raise OSError("not a whole ELF file (truncated or damaged)")
        if str(libs_file) not in _preloaded:
            import ctypes

            for lib in libs_file.read_text().split():
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            _preloaded.add(str(libs_file))
        import tvm_ffi

        fn = tvm_ffi.load_module(str(so))[EXPORT_NAME]
    except Exception as e:  # noqa: BLE001 - the object file is the fallback
        _log.info("compile cache: %s does not load (%s: %s); using the object file", so,
                  type(e).__name__, _one_line(e))
        _remove(so)
        return None
    counters["load"] += 1
    counters["load_so"] += 1
    seconds["load"] += time.perf_counter() - t0
    return fn


def _elf_intact(path: Path) -> bool:
    """Does the file hold every byte its ELF headers point to?  dlopen maps the segments and a
    truncated file faults (SIGBUS) when the loader touches a page past its end, killing the
    process: check the section header table and every segment against the file size first."""
    import struct

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return False   # a 64-bit little-endian ELF, as cc -shared writes on x86-64 / aarch64
            phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
            if shoff + shnum * shentsize > size or phoff + phnum * phentsize > size:
                return False
            f.seek(phoff)
            table = f.read(phnum * phentsize)
            for i in range(phnum):
                p_offset, = struct.unpack_from("<Q", table, i * phentsize + 8)
                p_filesz, = struct.unpack_from("<Q", table, i * phentsize + 32)
                if p_offset + p_filesz > size:
                    return False
    except (OSError, struct.error):
        return False
    return True


def _link_so(obj: Path) -> bool:
    """Link the entry's object file into X.so (cc -shared), so that a later process loads it
    without importing cutlass; also record the runtime libraries it needs.  No C compiler or a
    failed link only loses that fast path."""
    import shutil
    import subprocess

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return False
    so = obj.with_suffix(".so")
    tmp = so.with_name(f".{so.stem}.{os.getpid()}.{threading.get_ident()}.tmp.so")
    try:
        libs = obj.parent.parent / RUNTIME_LIBS
        if not libs.is_file():
            import cutlass.cute as cute

            paths = cute.runtime.find_runtime_libraries(enable_tvm_ffi=True)
            tmp_libs = libs.with_name(f".{libs.name}.{os.getpid()}.tmp")
            tmp_libs.write_text("\n".join(str(p) for p in paths) + "\n")
            os.replace(tmp_libs, libs)
        r = subprocess.run([cc, "-shared", "-o", str(tmp), str(obj)], capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            raise OSError(r.stderr.strip()[:300] or f"{cc} exited with {r.returncode}")
        os.replace(tmp, so)
    except Exception as e:  # noqa: BLE001 - the object file entry is complete without it
        _log.info("compile cache: no shared library for %s (%s: %s)", obj, type(e).__name__, _one_line(e))
        _remove(tmp)
        return False
    return True


def _export(fn, path: Path) -> bool:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.o")
    t0 = time.perf_counter()
    try:
        fn.export_to_c(object_file_path=str(tmp), function_name=EXPORT_NAME)
        if tmp.stat().st_size == 0:
            raise OSError("the export wrote an empty file")
        os.replace(tmp, path)     # atomic: readers see no entry or a whole one
        _link_so(path)
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written is not an error
        _log.warning("compile cache: cannot write %s (%s: %s); this build stays in memory only",
                     path, type(e).__name__, _one_line(e))
        _remove(tmp)
        return False
    counters["export"] += 1
    seconds["export"] += time.perf_counter() - t0
    return True


def _remove(*paths: Path) -> None:
    """Delete what a failed load or write leaves (a damaged entry, a temporary file), where it
    exists and can be deleted: the caller goes on either way."""
    for p in paths:
        try:
            p.unlink()
        except OSError:
            pass


def _one_line(e: Exception) -> str:
    """The DSL's errors are multi-line and coloured: one plain line for the log."""
    return re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(e).split()))[:300]


class _EntryLock:
    """Exclusive flock on a lock file next to the entry, so that processes missing the same
    entry compile it once.  Enters as True when held; False (and no lock) where flock is not
    available or the holder does not finish within LOCK_TIMEOUT_S: the caller then compiles
    anyway, which is correct, only slower."""

    def __init__(self, path: Path, timeout: float = LOCK_TIMEOUT_S):
        self.path, self.timeout, self.fd = path, timeout, None

    def __enter__(self) -> bool:
        try:
            import fcntl

            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except (ImportError, OSError):
            return False
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    _log.warning("compile cache: %s still locked after %.0f s; compiling without "
                                 "waiting", self.path, self.timeout)
                    break
                time.sleep(0.05)
            except OSError:    # no flock on this file system: tolerate concurrent writers
                break
        os.close(self.fd)
        self.fd = None
        return False

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)     # closing the descriptor releases the flock
            self.fd = None


# ------------------------------------------------------------------------------ keys
def stable_repr(obj) -> Optional[str]:
    """A spelling of obj that is the same in every process (no ids, no addresses), or None
    when obj (or anything in it) cannot be spelled so: such keys are cached in memory only."""
    return _spell(obj, 0)


def _spell(obj, depth: int) -> Optional[str]:
    if depth > 32:
        return None
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return repr(obj)            # float repr round-trips exactly
    if isinstance(obj, type):
        return f"<type {obj.__module__}.{obj.__qualname__}>"
    hook = getattr(obj, "cache_key", None)
    if callable(hook):
        value = hook()
        if value is None or value is obj:
            return None
        inner = _spell(value, depth + 1)
        return None if inner is None else f"{_qualname(obj)}:{inner}"
    if isinstance(obj, enum.Enum):
        return f"{_qualname(obj)}.{obj.name}"
    if isinstance(obj, (tuple, list)):
        parts = [_spell(x, depth + 1) for x in obj]
        if any(p is None for p in parts):
            return None
        open_, close = ("(", ")") if isinstance(obj, tuple) else ("[", "]")
        return open_ + ",".join(parts) + close
    if isinstance(obj, (set, frozenset)):
        parts = [_spell(x, depth + 1) for x in obj]
        if any(p is None for p in parts):
            return None
        return "{" + ",".join(sorted(parts)) + "}"
    if isinstance(obj, dict):
        items = [(_spell(k, depth + 1), _spell(v, depth + 1)) for k, v in obj.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ",".join(f"{k}:{v}" for k, v in sorted(items)) + "}"
    if dataclasses.is_dataclass(obj):
        parts = []
        for f in dataclasses.fields(obj):
            value = _spell(getattr(obj, f.name), depth + 1)
            if value is None:
                return None
            parts.append(f"{f.name}={value}")
        return f"{_qualname(obj)}(" + ",".join(parts) + ")"
    return None


def _qualname(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


# ------------------------------------------------------------------------------ fingerprint
_fingerprint: Optional[str] = None


def fingerprint() -> str:
    """16 hex digits naming everything besides the key that a cached build depends on:
    the package sources that generate code (kernels/, asm/, the coefficient table), the
    target arch (CUTE_DSL_ARCH or the GPU's), and the cutlass-dsl (with its installed CUDA
    flavours: their embedded ptxas generates different code), apache-tvm-ffi, torch and Python
    versions.  Computed once per process (it hashes the source files)."""
    global _fingerprint
    if _fingerprint is None:
        t0 = time.perf_counter()
        h = hashlib.sha256()
        for name, value in fingerprint_parts():
            h.update(f"{name}={value}\n".encode())
        _fingerprint = h.hexdigest()[:16]
        seconds["fingerprint"] += time.perf_counter() - t0
    return _fingerprint


def fingerprint_parts() -> list:
    """(name, value) pairs that fingerprint() hashes; a source file contributes its digest."""
    parts = [("python", f"{sys.version_info.major}.{sys.version_info.minor}"),
             ("arch", _arch())]
    for dist in ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13",
                 "apache-tvm-ffi", "torch"):
        parts.append((dist, _version(dist)))
        parts.append((f"{dist}@", _location(dist)))
    for rel, path in _codegen_sources():
        parts.append((rel, hashlib.sha256(path.read_bytes()).hexdigest()))
    return parts


def _arch() -> str:
    """CUTE_DSL_ARCH (what the DSL compiles for) if set, else the GPU's compute capability as
    torch reports it: a name that differs where builds differ, without importing cutlass."""
    env = os.environ.get("CUTE_DSL_ARCH", "").strip()
    if env:
        return env
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no torch or no driver: the CPU build's default
        pass
    return "cpu"


def _version(dist: str) -> str:
    module = {"nvidia-cutlass-dsl": "cutlass", "apache-tvm-ffi": "tvm_ffi", "torch": "torch"}.get(dist)
    loaded = sys.modules.get(module) if module else None
    version = getattr(loaded, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "absent"
    return str(version)


def _location(dist: str) -> str:
    """The directory a distribution is installed in (its site-packages), "absent" if none."""
    from importlib import metadata

    try:
        return str(Path(metadata.distribution(dist).locate_file("")).resolve())
    except Exception:  # noqa: BLE001 - not installed, or metadata without a location
        return "absent"


def _codegen_sources() -> list:
    """(relative name, path) of every file whose content can change a kernel: the kernel and
    asm packages' Python sources and the package data (the coefficient table)."""
    import importlib.util

    kernels = Path(__file__).resolve().parent
    roots = [("kernels", kernels)]
    try:   # located, not imported: the package's __init__ sits above kernels/
        pkg = importlib.util.find_spec("flash_attn_poly")
        asm = importlib.util.find_spec("flash_attn_poly.asm")
        roots += [("asm", Path(asm.origin).resolve().parent),
                  ("data", Path(pkg.origin).resolve().parent / "data")]
    except (ImportError, AttributeError, TypeError):   # kernels imported as a top-level package
        roots += [("asm", kernels.parent / "asm"), ("data", kernels.parent / "flash_attn_poly" / "data")]
    out = []
    for name, root in roots:
        files = sorted(root.rglob("*.py")) if name != "data" else sorted(root.glob("*.json"))
        out += [(f"{name}/{p.relative_to(root).as_posix()}", p) for p in files if p.is_file()]
    return out
