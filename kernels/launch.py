"""Launch-path selection shared by every torch entry (attention fwd/bwd, elementwise).

Two ways to call a compiled CuTe DSL kernel:
  * "tvm": compiled with --enable-tvm-ffi and an env stream; torch tensors and Python
    floats go straight in, apache-tvm-ffi decodes them in C++ (torch's DLPack exchange
    API) and launches on torch's current stream.  No per-call from_dlpack.
  * "dlpack": the original path: from_dlpack(t).mark_layout_dynamic per tensor, Float32
    wrappers and an explicit CUstream.  On the CPU machine that marshalling alone costs
    ~62 us for the 5 tensors of the attention forward (docs/NOTES.md, 2026-05 entry).

FLASH_ATTN_POLY_LAUNCH selects the path, read on every call so one process can time both:
  unset / "auto": tvm, and on a call-time error log a warning once per kernel and use the
                  dlpack path for that kernel from then on (a GPU run never dies on it);
  "tvm":          tvm only, errors propagate (for timing: no silent fallback);
  "dlpack":       the original path only.
"""
from __future__ import annotations

import logging
import os

ENV = "FLASH_ATTN_POLY_LAUNCH"
_MODES = ("auto", "tvm", "dlpack")
_log = logging.getLogger("flash_attn_poly.launch")
_broken: set = set()      # keys whose tvm path raised once under "auto"


def mode() -> str:
    m = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if m not in _MODES:
        raise ValueError(f"{ENV}={m!r}; expected one of {_MODES}")
    return m


def compile_kwargs(tvm_ffi: bool, options: str = "") -> tuple:
    """(fake stream, options) for cute.compile on one path."""
    import cutlass.cute as cute

    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=tvm_ffi)
    opts = (options + (" --enable-tvm-ffi" if tvm_ffi else "")).strip()
    return stream, opts


def run(key, tvm_call, dlpack_call):
    """Call tvm_call() or dlpack_call() (zero-argument callables) as mode() says.

    The tvm call raises before the kernel is launched (argument checks, module load),
    so re-running the launch through dlpack after such an error does the work once."""
    m = mode()
    if m == "dlpack" or (m == "auto" and key in _broken):
        return dlpack_call()
    if m == "tvm":
        return tvm_call()
    try:
        return tvm_call()
    except Exception as e:  # noqa: BLE001 - any tvm-side failure falls back, logged
        _broken.add(key)
        _log.warning("tvm-ffi launch failed for %r (%s: %s); using the from_dlpack path for "
                     "this kernel from now on (set %s=tvm to see the error)",
                     key, type(e).__name__, e, ENV)
        return dlpack_call()
