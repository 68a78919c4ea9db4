"""Build the coefficient table flash_attn_poly/data/programs.json from the searches, and write
it (the table's only writer: every entry gets its derived constants, `derive`).  Reading goes
through the one loader, flash_attn_poly.asm.programs.load_table."""
from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path

import numpy as np

from ..asm import programs as _programs
from . import runtime as rt
from . import search as S
from . import sigattn, softcap
from .solver import N_NODES, differentiate
from .targets import TARGETS

TABLE_PATH = Path(_programs.default_table_path())
FUNCTIONS = ("sigmoid", "tanh", "silu", "gelu")


def read(path=None) -> dict:
    """A private copy of the table at path (default: the committed one) to change and write;
    a path that does not exist yet reads as an empty table."""
    if path is not None and not Path(path).exists():
        return {"version": 1, "programs": {}}
    return copy.deepcopy(_programs.load_table(None if path is None else str(path)))


def _fit_meta(key, dtype, command):
    li, lc = S.GRIDS[key]
    return {"command": command, "nodes": N_NODES, "score_points": S.SCORE_POINTS,
            "score_range": list(S.SCORE_RANGE), "L_i_grid": [float(li[0]), float(li[-1]), 0.25],
            "L_c_grid": [float(lc[0]), float(lc[-1]), 0.25], "select": f"min {dtype}_fused max abs after gates, then lattice refinement"}


def searched(key, degree, dtype, command, progress=False, grids=None):
    li, lc = grids if grids else (None, None)
    cands = S.search(key, dtype, degrees=(degree,), Li_grid=li, Lc_grid=lc, progress=progress)
    b = S.best_refined(cands, key, degree, dtype)
    p = dict(b.program)
    p["errors"] = b.errors
    p["gates"] = b.gates
    p["fit"] = {**_fit_meta(key, dtype, command), **p.get("fit", {})}
    p["params"] = {"backward": "direct"} if TARGETS[key].derivative else {}
    return p


def differentiated(fwd: dict, command: str) -> dict:
    """Differentiated-polynomial backward: q' of the executed (rounded) forward, as an even
    program of degree D-1 (B2: D4 tanh -> D3)."""
    t = TARGETS[fwd["target"] + "_grad"]
    c64 = differentiate(fwd["coeffs"])
    d = len(c64) - 1
    p = S.make_program(t, fwd["dtype"], d, fwd["L_i"], fwd["L_c"], c64)
    e, g = S.evaluate(t, fwd["dtype"], d, fwd["L_i"], [fwd["L_c"]], c64)
    p["errors"] = {"units": "abs", **{k: float(v[0]) for k, v in e.items()}}
    p["gates"] = {k: bool(v[0]) for k, v in g.items()}
    p["params"] = {"backward": "differentiated", "of": f"{fwd['target']}_d{fwd['degree']}"}
    p["fit"] = {"command": command}
    return p


def sigmoid_attn_entries(n, command, progress=False, dtype="bf16", **kw):
    """The B3 forward program (and, in BF16, its coupled derivative surrogate).  dtype f16:
    `sigmoid_attn_n{n}_f16`, forward only (the kernels take sigma' = P (1 - P))."""
    fwd = sigattn.search(n, progress=progress, dtype=dtype, **kw)
    fwd["fit"] = {"command": command, "nodes": N_NODES, "score_points": 8000,
                  "score_range": list(sigattn.SCORE_RANGE),
                  "select": "min fused (p^2-weighted rel RMS + p-weighted rel mass), worst of "
                            "x~N(d,s^2), s in {1,2}, d in {0,1.4}; then 16-bit coefficient refinement"}
    if dtype == "f16":
        return {f"sigmoid_attn_n{n}_f16": fwd}
    grad = sigattn.make_grad(fwd)
    grad["fit"] = {"command": command, "select": "least squares of P(a+bu) to sigma'(x-ln n), relative weights"}
    return {f"sigmoid_attn_n{n}": fwd, f"sigmoid_attn_n{n}_grad": grad}


def build(command="python -m flash_attn_poly.fit write", progress=False, grids=None) -> dict:
    """All required entries.  grids: optional {key: (Li_grid, Lc_grid)} for quick tests."""
    grids = grids or {}
    progs = {}

    def one(key, degree, dtype):
        return searched(key, degree, dtype, command, progress, grids.get(key))

    progs["sigmoid_d3"] = one("sigmoid", 3, "bf16")
    for fn in FUNCTIONS:
        progs[f"{fn}_d4"] = one(fn, 4, "bf16")
        grad = one(fn + "_grad", 4, "bf16")
        progs[f"{fn}_d4_grad" if fn != "tanh" else "tanh_d4_grad_direct"] = grad
        progs[f"{fn}_d4_f16"] = one(fn, 4, "f16")
        progs[f"{fn}_d4_grad_f16"] = one(fn + "_grad", 4, "f16")
    progs["tanh_d4_grad"] = differentiated(progs["tanh_d4"], command)
    sc = softcap.search(progress=progress)
    sc["fit"] = {"command": command, "nodes": N_NODES,
                 "select": "uniform max <= 2x best plain fit, then min Gemma-weighted RMS (logits)"}
    progs["softcap_c50"] = sc
    scg = softcap.make_grad(sc)
    tg = TARGETS["tanh_grad"]
    e, g = S.evaluate(tg, "bf16", scg["degree"], scg["L_i"], [scg["L_c"]], scg["coeffs_fp64"])
    scg["errors"] = {"units": "abs (dtanh/du)", **{k: float(v[0]) for k, v in e.items()}}
    scg["fit"] = {"command": command}
    progs["softcap_c50_grad"] = scg
    # direct even D4 fit of dtanh/du (the scale c cancels): the tanh_d4_grad_direct program
    scd = dict(progs["tanh_d4_grad_direct"], target="softcap")
    scd["params"] = {"c": softcap.C, "backward": "direct", "of": "tanh_d4_grad_direct"}
    scd["errors"] = {**scd["errors"], **{k.replace("<=", "_le_"): v
                                         for k, v in softcap.grad_errors(scd).items()}}
    progs["softcap_c50_grad_direct"] = scd
    progs.update(sigmoid_attn_entries(4096, command, progress))
    return {"version": 1, "generated_by": command,
            "generated_on": datetime.date.today().isoformat(),
            "programs": dict(sorted(progs.items()))}


def _clean(o):
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, np.bool_):
        return bool(o)
    return o


def derive(entry: dict) -> dict:
    """The entry with the constants the kernels derive from it written into its params, so the
    product reads them instead of importing fit: a two-region program's FP32 region threshold
    params.thr_f32 (runtime.region_threshold_f32: the least FP32 t whose cvt.rn to the
    program's dtype is >= params.thr)."""
    if entry.get("form") in _programs.TWO_REGION_FORMS:
        entry = {**entry, "params": {**entry["params"], "thr_f32": rt.region_threshold_f32(entry)}}
    return entry


def write(table: dict, path=TABLE_PATH):
    """Write table to path, every entry with its derived constants (derive)."""
    table = {**table, "programs": {k: derive(v) for k, v in table["programs"].items()}}
    Path(path).write_text(json.dumps(_clean(table), indent=1) + "\n")
