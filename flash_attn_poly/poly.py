"""Polynomial programs inside a user score function (device code; see flash_attn_poly.score_mod).

    t = poly.tanh(x, program="tanh_d4")        # x: a TensorSSA of 2 Float32 (a score_mod's pair)
    p = poly.sigmoid(x, program="sigmoid_d3")
    e = poly.exp2(x, program="exp2_f32_d3")

Each runs a program of the coefficient table (flash_attn_poly/data/programs.json, or a
ProgramSpec of any table) as the PTX block its form generates, on the FMA pipe instead of MUFU:
tanh and sigmoid pack the pair into one 16-bit register pair (BF16 or FP16, the program's dtype)
and return the two results in FP32; exp2 runs the FP32 program once per value.  The program's
target must match the function (a tanh program for tanh, ...); its error is the program's (the
table's `errors` field), not MUFU's.
"""
from __future__ import annotations

from .asm import programs as _programs

_TARGETS = {"tanh": ("tanh",), "sigmoid": ("sigmoid",), "exp2": ("exp2",)}


def _spec(fn: str, program, role: str):
    spec = program if isinstance(program, _programs.ProgramSpec) else _programs.spec(program)
    if spec.target not in _TARGETS[fn] or spec.derivative or role not in spec.roles:
        raise ValueError(f"poly.{fn}: program {spec.name!r} (target {spec.target!r}, form {spec.form!r}) is not a "
                         f"{fn} program with a {role!r} block; {fn} programs of the committed table: "
                         f"{_programs.names(target=_TARGETS[fn], derivative=False)}")
    return spec


def _pair(x, spec):
    import cutlass.cute as cute
    from cutlass import Float32, Int32
    from .kernels.scores.common import run_program, unpack_bf16x2, unpack_f16x2
    if not isinstance(x, cute.TensorSSA) or tuple(x.shape) != (2,):
        raise TypeError(f"flash_attn_poly.poly takes a TensorSSA of 2 Float32 values (a score_mod's scores), "
                        f"got {type(x).__name__}")
    word = Int32(run_program(spec, "fwd", Float32(x[0]), Float32(x[1]))[0])
    lo, hi = unpack_f16x2(word) if spec.f16 else unpack_bf16x2(word)
    out = cute.make_rmem_tensor((2,), Float32)
    out[0], out[1] = lo, hi
    return out.load()


def tanh(x, program="tanh_d4"):
    """tanh of both values of x by a tanh program of the table (default the D4 BF16 "tanh_d4")."""
    return _pair(x, _spec("tanh", program, "fwd"))


def sigmoid(x, program="sigmoid_d3"):
    """sigmoid of both values of x by a sigmoid program (default the seed's B1 D3 "sigmoid_d3")."""
    return _pair(x, _spec("sigmoid", program, "fwd"))


def exp2(x, program="exp2_f32_d3"):
    """2^x of both values by an FP32 exp2 program (finite x in [-125, 127]; -inf is not mapped
    to 0: mask after it)."""
    import cutlass.cute as cute
    from cutlass import Float32
    from .kernels.scores.common import exp2_fma
    spec = _spec("exp2", program, "exp2")
    out = cute.make_rmem_tensor((2,), Float32)
    out[0], out[1] = exp2_fma(Float32(x[0]), spec), exp2_fma(Float32(x[1]), spec)
    return out.load()
