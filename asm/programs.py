"""The coefficient table (flash_attn_poly/data/programs.json) and the programs derived from it.

    load_table(path=None) -> dict        the one loader of the table (cached per file version)
    entry(name, table=None) -> dict      one entry, as the table stores it
    names(target=None, derivative=None, mode=None, table=None) -> list[str]
    spec(name, table=None) -> ProgramSpec

A `ProgramSpec` is what a kernel needs to know about one program, derived from its entry's
form: its hash is its content (name, target, form, dtype, degree, clamp, the numeric params,
the coefficients and their bits, and the derivative sibling `<name>_grad` where the table has
one), so it keys compile caches as it is.  Which PTX blocks exist for a program (`roles`),
whether its packed result is f16x2 or bf16x2, its clamp, n, the two-region FP32 threshold:
all come from the spec, never from a map keyed by the program's name, so a refit (another n,
another degree of an existing form) runs by its name alone.  `asm.blocks.block_for(spec,
role)` builds the blocks.

No environment variable picks the table: code that needs another one (a test's fixture, a
freshly fitted temporary table) passes it, `spec(name, table=...)`.  Pure Python: no torch,
no cutlass, nothing from flash_attn_poly.fit (fit writes the table; derived constants the
kernels need, such as the FP32 region threshold `params.thr_f32`, are written by fit).
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

# attention score functions (the public modes) and the table targets their kernels run: a
# softcap kernel runs a softcap program in place of the tanh, or an exp2 program in place of
# part of the exp2s (the exp2 offload)
MODE_TARGETS = {"softcap": ("softcap", "exp2"), "sigmoid": ("sigmoid_attn",)}

# lane-wise forms (asm/ptxgen.FORMS): y = f(x) per 16-bit lane
LANE_FORMS = ("odd", "odd_u2", "residual_odd", "even", "residual_even", "odd_piecewise2",
              "even_piecewise2")
TWO_REGION_FORMS = ("odd_piecewise2", "even_piecewise2")   # region picked by |x| >= params.thr

# block roles (asm/blocks.block_for):
#   "fwd"     the value block on two FP32 inputs (packed by cvt.rn inside the block)
#   "packed"  a lane-wise program on one packed 16-bit pair (elementwise kernels)
#   "bwd"     the derivative program `<name>_grad` on two FP32 inputs
#   "head", "tail"  a squaring program's value block less its last squaring, and that squaring
#   "fwd_bwd" the coupled value + derivative-surrogate block (piecewise2 + piecewise2_factored)
#   "exp2"    FP32 2^a on one FP32 input
ROLES = ("fwd", "packed", "bwd", "head", "tail", "fwd_bwd", "exp2")

_PACKED = {"bf16": "bf16x2", "f16": "f16x2"}


# ----------------------------------------------------------------------------- the table
@lru_cache(maxsize=1)
def default_table_path() -> str:
    """data/programs.json of the flash_attn_poly package, found without importing the package
    (so this module stays free of torch)."""
    pkg = importlib.util.find_spec("flash_attn_poly")
    return os.path.join(list(pkg.submodule_search_locations)[0], "data", "programs.json")


def _version(path: str) -> tuple:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"coefficient table {path} missing: run "
                                "`python -m flash_attn_poly.fit write` or pass another table") from None
    return (st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _read(path: str, version: tuple) -> dict:
    with open(path) as f:
        return json.load(f)


def load_table(path: Optional[str] = None) -> dict:
    """The table at path (default: the package's programs.json).  Cached per file version (a
    table rewritten on disk is read again); the dict is shared: copy it before changing it."""
    path = os.fspath(path) if path is not None else default_table_path()
    return _read(path, _version(path))


def entry(name: str, table: Optional[dict] = None) -> dict:
    """Table entry ``name`` (KeyError naming it when the table has none)."""
    progs = (load_table() if table is None else table)["programs"]
    if name not in progs:
        raise KeyError(f"program {name!r} missing from the coefficient table")
    return progs[name]


def names(target=None, derivative: Optional[bool] = None, mode: Optional[str] = None,
          table: Optional[dict] = None) -> list:
    """Sorted entry names, filtered by target (a name or a tuple of names), by whether the
    entry is a derivative program, and by the attention mode whose kernels run it."""
    targets = (target,) if isinstance(target, str) else target
    if mode is not None:
        if mode not in MODE_TARGETS:
            raise ValueError(f"mode {mode!r} runs no table program; modes with programs: "
                             f"{sorted(MODE_TARGETS)}")
        targets = tuple(t for t in MODE_TARGETS[mode] if targets is None or t in targets)
    progs = (load_table() if table is None else table)["programs"]
    return sorted(n for n, e in progs.items()
                  if (targets is None or e["target"] in targets)
                  and (derivative is None or bool(e.get("derivative")) == derivative))


# ----------------------------------------------------------------------------- the spec
def _frozen(v):
    return tuple(_frozen(x) for x in v) if isinstance(v, (list, tuple)) else v


def _thawed(v):
    return [_thawed(x) for x in v] if isinstance(v, tuple) else v


def _kernel_params(params: dict) -> tuple:
    """The params that shape code or numerics: every number, bool and list of numbers, sorted.
    Left out: descriptions (strings) and fit provenance (the FP64 solutions, *_fp64)."""
    def numeric(v):
        if isinstance(v, (list, tuple)):
            return all(numeric(x) for x in v)
        return v is None or isinstance(v, (bool, int, float))
    return tuple(sorted((k, _frozen(v)) for k, v in params.items()
                        if not k.endswith("_fp64") and numeric(v)))


@dataclass(frozen=True)
class ProgramSpec:
    """One program of the table as the kernels and blocks see it (hash = content)."""

    name: str
    target: str
    form: str
    dtype: str                      # "bf16", "f16" (packed pairs) or "f32"
    degree: int
    derivative: bool
    clamp: Optional[float]          # L_c: |x| is clamped there (None: the form has no clamp)
    offset: float
    coeffs: tuple                   # floats, or one tuple per region (piecewise2 forms)
    coeff_bits: tuple               # the table's bit patterns of coeffs
    params: tuple                   # ((key, value), ...): the entry's numeric params
    grad: Optional["ProgramSpec"] = None   # the derivative program `<name>_grad`, if any
    # the spec as JSON (to_json), made once: a string crosses torch custom-op boundaries, and
    # torch.compile traces an attribute read, not json.dumps
    json_text: str = field(default="", compare=False, repr=False)

    def __post_init__(self):
        if not self.json_text:
            d = {"name": self.name, **self.entry()}
            if self.grad is not None:
                d["grad"] = {"name": self.grad.name, **self.grad.entry()}
            object.__setattr__(self, "json_text", json.dumps(d, sort_keys=True))

    # -- the entry --------------------------------------------------------------------
    def param(self, key: str, default=KeyError):
        for k, v in self.params:
            if k == key:
                return v
        if default is KeyError:
            raise KeyError(f"program {self.name!r} has no params.{key}")
        return default

    def entry(self) -> dict:
        """The program as a table entry (the dict shape asm/ptxgen and fit.runtime read)."""
        return {"target": self.target, "derivative": self.derivative, "form": self.form,
                "dtype": self.dtype, "degree": self.degree, "L_c": self.clamp,
                "offset": self.offset, "coeffs": _thawed(self.coeffs),
                "coeffs_bits": _thawed(self.coeff_bits),
                "params": {k: _thawed(v) for k, v in self.params}}

    # -- what kernels ask ---------------------------------------------------------------
    @property
    def mode(self) -> Optional[str]:
        """The attention mode whose kernels run this program (None: none does)."""
        if self.derivative:
            return None
        return next((m for m, ts in MODE_TARGETS.items() if self.target in ts), None)

    @property
    def packed_type(self) -> Optional[str]:
        """"bf16x2" or "f16x2": the packed type of the blocks' results (None: FP32 program)."""
        return _PACKED.get(self.dtype)

    @property
    def f16(self) -> bool:
        """The blocks return f16x2 pairs (else bf16x2, or FP32 for an FP32 program)."""
        return self.dtype == "f16"

    @property
    def n(self) -> int:
        """Keys n of a sigmoid-attention program: it evaluates sigma(x - ln n)."""
        return int(self.param("n"))

    @property
    def squarings(self) -> int:
        return int(self.param("squarings", 0) or 0)

    @property
    def two_region(self) -> bool:
        return self.form in TWO_REGION_FORMS

    @property
    def region_threshold_f32(self) -> float:
        """A two-region program's FP32 region threshold t on |x| (params.thr_f32, written by
        fit): |x| >= t exactly where the block's 16-bit |x| >= params.thr.  0.0: one region."""
        if not self.two_region:
            return 0.0
        t = self.param("thr_f32", None)
        if t is None:
            raise ValueError(f"two-region program {self.name!r} has no params.thr_f32 (the FP32 region "
                             "threshold that fit writes): rewrite its table with "
                             "`python -m flash_attn_poly.fit [--table PATH] derive`")
        return float(t)

    @property
    def clamp_on_fma(self) -> bool:
        """Form odd_u2: the block has no clamp; the caller clamps x to [-L_c, L_c] first (on
        the FMA pipe: fma.rn.sat.f32)."""
        return self.form == "odd_u2"

    @property
    def is_exp2(self) -> bool:
        """Form exp2_f32: FP32 2^a (the softcap kernels' exp2 offload)."""
        return self.form == "exp2_f32"

    @property
    def roles(self) -> tuple:
        """The blocks asm.blocks.block_for builds for this program (see ROLES)."""
        g = self.grad
        if self.form in LANE_FORMS:
            return ("fwd", "packed") + (("bwd",) if g is not None and g.form in LANE_FORMS else ())
        if self.form == "piecewise2":
            return (("fwd",) + (("head", "tail") if self.squarings >= 1 else ())
                    + (("fwd_bwd",) if g is not None and g.form == "piecewise2_factored" else ()))
        if self.form == "exp2_f32":
            return ("exp2",)
        return ()

    def to_json(self) -> str:
        return self.json_text


def _from_entry(name: str, e: dict, grad: Optional[ProgramSpec]) -> ProgramSpec:
    return ProgramSpec(
        name=name, target=e["target"], form=e["form"], dtype=e["dtype"], degree=int(e["degree"]),
        derivative=bool(e.get("derivative")),
        clamp=None if e.get("L_c") is None else float(e["L_c"]),
        offset=float(e.get("offset") or 0.0), coeffs=_frozen(e["coeffs"]),
        coeff_bits=_frozen(e.get("coeffs_bits", ())), params=_kernel_params(e.get("params") or {}),
        grad=grad)


def _build(name: str, table: dict) -> ProgramSpec:
    e = entry(name, table)
    g = table["programs"].get(name + "_grad")
    grad = None
    if g is not None and g.get("derivative") and not e.get("derivative"):
        grad = _from_entry(name + "_grad", g, None)
    return _from_entry(name, e, grad)


@lru_cache(maxsize=None)
def _default_spec(name: str, path: str, version: tuple) -> ProgramSpec:
    return _build(name, _read(path, version))


def spec(name: str, table: Optional[dict] = None) -> ProgramSpec:
    """The ProgramSpec of entry ``name`` of ``table`` (default: the committed table; cached)."""
    if not isinstance(name, str):
        raise TypeError(f"a program name is a str, got {type(name).__name__}")
    if table is None:
        path = default_table_path()
        return _default_spec(name, path, _version(path))
    return _build(name, table)


def from_json(text: str) -> ProgramSpec:
    """The ProgramSpec that ProgramSpec.to_json wrote."""
    d = json.loads(text)
    g = d.pop("grad", None)
    grad = None if g is None else _from_entry(g.pop("name"), g, None)
    return _from_entry(d.pop("name"), d, grad)
