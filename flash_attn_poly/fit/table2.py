"""Table 2: our constrained programs vs same-form Sollya fpminimax controls, with the floors.

Protocol (the seed's Table 2): coefficients cast to BF16, real arithmetic, 20,001 uniform points
over [-L_c, L_c].  Per row, at the deployed program's L_c:

* ``ours_real``: the deployed program (picked by fused-BF16 error, fit/search.py);
* ``grid_real`` / ``fine_real``: the best of the constrained family under the table's own
  metric: every L_i of the search grid (0.25 steps) and of a 0.01 grid over the same range,
  gate L_c <= L_i + 1, dual-endpoint least squares (fit/solver.py), coefficients cast to BF16;
* ``sollya_real``: Sollya fpminimax, 8-bit coefficients, same monomials, fitted on [0, L_c];
* ``lattice_real``: the exact minimum over all BF16 coefficient vectors of the form
  (fit/lattice.py) -- no fit of that form, degree and clamp can go lower by this metric;
* ``lp_real``: the minimum over real coefficients (no BF16 cast).

``sigmoid_scan`` repeats the D3 sigmoid comparison for every L_c of a 0.125 grid, since the
paper does not say which clamp its D3 row used.  The fused columns are our deployed order
(fit/runtime.py) on the search's score points, for comparison with the table.
"""
from __future__ import annotations

import numpy as np

from . import lattice as Lt
from . import runtime as rt
from . import sollya
from ..asm.programs import load_table
from .search import GRIDS, grid, score_points
from .solver import fit_half
from .targets import TARGETS

# (function, table name, target key): D3 sigmoid forward as in the seed, D4 elsewhere;
# derivative rows use the direct parity fits.
ROWS = [
    ("sigmoid", "sigmoid_d3", "sigmoid"),
    ("sigmoid'", "sigmoid_d4_grad", "sigmoid_grad"),
    ("tanh", "tanh_d4", "tanh"),
    ("tanh'", "tanh_d4_grad_direct", "tanh_grad"),
    ("silu", "silu_d4", "silu"),
    ("silu'", "silu_d4_grad", "silu_grad"),
    ("gelu", "gelu_d4", "gelu"),
    ("gelu'", "gelu_d4_grad", "gelu_grad"),
]
N_REAL = Lt.N_REAL
# The seed's text gives Table 2 numbers for the D3 sigmoid row only ("5.44e-3, compared with
# 5.47e-3 for its Sollya control"); of the other seven it says "Sollya has lower error".
PAPER = {"sigmoid": {"ours": 5.44e-3, "sollya": 5.47e-3}}
FINE_STEP = 0.01
SCAN_LC = grid(4.0, 7.0, 0.125)


def real_error(p, f):
    """Real arithmetic on 20,001 uniform points over [-L_c, L_c] (the seed's control)."""
    x = np.linspace(-p["L_c"], p["L_c"], N_REAL)
    return float(np.abs(rt.replay(p, x, "real") - f(x)).max())


def fused_error(p, f):
    """Our deployed fused-order replay on the search's score points (8,000 per sign over [0, 12])."""
    x = score_points()
    xr = rt.round_to(rt.round_to(x, "f32"), p["dtype"])
    return float(np.abs(rt.replay(p, x, "fused") - f(xr)).max())


def _first(form):
    return 0 if form == "even" else 1


def constrained_best(key, degree, L_c, Li_values, dtype="bf16"):
    """Lowest table-metric error of the constrained family over Li_values (gate L_c <= L_i + 1).

    Returns (err, L_i, coeffs) with coeffs on the dtype lattice (dtype None: unrounded FP64)."""
    t = TARGETS[key]
    tt = Lt.half_points(L_c)
    X, g = Lt.design(tt, _first(t.form), degree), t.g(tt)
    best = (np.inf, None, None)
    for li in Li_values:
        if L_c > li + 1.0:
            continue
        c = fit_half(t.g, float(li), degree)
        c = (c if dtype is None else rt.round_to(c, dtype))[_first(t.form):]
        e = float(Lt.max_err(X, g, c))
        if e < best[0]:
            best = (e, float(li), c)
    return best


def floors(key, degree, L_c, start=(), dtype="bf16"):
    """Exact BF16-lattice minimum and real-coefficient minimum of the table metric."""
    t = TARGETS[key]
    tt = Lt.half_points(L_c)
    X, g = Lt.design(tt, _first(t.form), degree), t.g(tt)
    return Lt.lattice_min(X, g, dtype, start=[np.asarray(s)[_first(t.form):] for s in start])


def _sollya_coeffs(ours, key):
    return sollya.control_program(ours, key)


def table_row(fn, name, key, table):
    ours = table["programs"][name]
    f = TARGETS[key].f
    d, lc = ours["degree"], ours["L_c"]
    lo, hi = GRIDS[key][0][0], GRIDS[key][0][-1]
    ge, gli, _ = constrained_best(key, d, lc, GRIDS[key][0])
    fe, fli, _ = constrained_best(key, d, lc, grid(lo, hi, FINE_STEP))
    row = {"function": fn, "program": name, "degree": d, "L_c": lc, "L_i": ours["L_i"],
           "ours_real": real_error(ours, f), "grid_real": ge, "grid_L_i": gli,
           "fine_real": fe, "fine_L_i": fli, "ours_bf16_fma": fused_error(ours, f)}
    start = [ours["coeffs"]]
    if sollya.available():
        ctl = _sollya_coeffs(ours, key)
        row.update(sollya_real=real_error(ctl, f), sollya_bf16_fma=fused_error(ctl, f),
                   sollya_coeffs_bf16=ctl["coeffs"])
        start.append(ctl["coeffs"])
    fl = floors(key, d, lc, start)
    row.update(lattice_real=fl["err"], lattice_coeffs=fl["coeffs"], lp_real=fl["lp_floor"],
               lattice_nodes=fl["nodes"])
    return row


def sigmoid_scan(L_cs=SCAN_LC, degree=3):
    """The D3 sigmoid row at every clamp of L_cs: ours (0.25 and 0.01 L_i grids), Sollya, floors."""
    key = "sigmoid"
    lo, hi = GRIDS[key][0][0], GRIDS[key][0][-1]
    fine = grid(lo, hi, FINE_STEP)
    out = []
    for lc in L_cs:
        lc = float(lc)
        ge, gli, gc = constrained_best(key, degree, lc, GRIDS[key][0])
        fe, fli, fc = constrained_best(key, degree, lc, fine)
        e64, li64, _ = constrained_best(key, degree, lc, fine, dtype=None)
        r = {"L_c": lc, "grid_real": ge, "grid_L_i": gli, "fine_real": fe, "fine_L_i": fli,
             "fine_fp64_real": e64, "fine_fp64_L_i": li64}
        start = [np.r_[0.0, fc]]
        if sollya.available():
            c = rt.round_to(sollya.fpminimax(key, degree, lc, zero_c0=True), "bf16")
            tt = Lt.half_points(lc)
            r["sollya_real"] = float(Lt.max_err(Lt.design(tt, 1, degree), TARGETS[key].g(tt), c[1:]))
            start.append(c)
        fl = floors(key, degree, lc, start)
        r.update(lattice_real=fl["err"], lp_real=fl["lp_floor"])
        out.append(r)
    return out


def table_rows(table=None, progress=False):
    table = table or load_table()
    it = ROWS
    if progress:
        from tqdm import tqdm
        it = tqdm(ROWS, desc="table2", leave=False)
    return [table_row(fn, name, key, table) for fn, name, key in it]


def build(table=None, progress=False, command=""):
    return {"command": command, "sollya": sollya.available(), "points": N_REAL,
            "rows": table_rows(table, progress), "sigmoid_scan": sigmoid_scan()}


def _e(v):
    return "n/a" if v is None else f"{v:.4e}"


def markdown(res) -> str:
    rows, scan = res["rows"], res["sigmoid_scan"]
    has_s = res["sollya"]
    L = ["# Table 2: constrained fits vs same-form Sollya fpminimax, with exact floors", "",
         f"Generated by `{res['command']}` (CPU). Protocol (the seed's): coefficients cast to BF16, "
         "real arithmetic, 20,001 uniform points over [-L_c, L_c], max abs error. "
         "Columns (fit/table2.py): *deployed* = our program as picked by fused-BF16 error; "
         "*grid* / *fine* = best of the constrained family (dual-endpoint least squares, gate "
         "L_c <= L_i + 1) over L_i at 0.25 / 0.01 steps, scored by this metric; *Sollya* = "
         "fpminimax, 8-bit coefficients on [0, L_c], cast to BF16; *lattice floor* = exact "
         "minimum over every BF16 coefficient vector of the form (fit/lattice.py, branch and "
         "bound); *real floor* = minimax with unrounded coefficients. The seed's text gives "
         "numbers for the sigmoid row only (5.44e-3 ours, 5.47e-3 Sollya) and says Sollya is "
         "lower in the other seven.", ""]
    if not has_s:
        L += ["**Sollya was not installed: its columns are n/a** (" + sollya.INSTALL_HINT + ").", ""]
    L += ["| function | program | D | L_c | paper ours / Sollya | deployed (L_i) | grid best (L_i) "
          "| fine best (L_i) | Sollya | lattice floor | real floor | deployed fused BF16 "
          "| Sollya fused BF16 |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = PAPER.get(r["function"])
        paper = f"{p['ours']:.2e} / {p['sollya']:.2e}" if p else "Sollya lower"
        L.append(f"| {r['function']} | `{r['program']}` | {r['degree']} | {r['L_c']} | {paper} | "
                 f"{r['ours_real']:.4e} ({r['L_i']}) | {r['grid_real']:.4e} ({r['grid_L_i']}) | "
                 f"{r['fine_real']:.4e} ({r['fine_L_i']}) | {_e(r.get('sollya_real'))} | "
                 f"{r['lattice_real']:.4e} | {r['lp_real']:.4e} | {r['ours_bf16_fma']:.4e} | "
                 f"{_e(r.get('sollya_bf16_fma'))} |")
    L += ["", "## D3 sigmoid at every clamp", "",
          "Same metric, L_c on a 0.125 grid (the seed does not state its row's clamp).", "",
          "*fine, FP64 coeffs* = the 0.01 L_i grid without the BF16 cast (not the protocol; shown "
          "because it is the only variant we found that goes below 5.44e-3 at these clamps).", "",
          "| L_c | grid best (L_i) | fine best (L_i) | fine, FP64 coeffs (L_i) | Sollya | lattice floor "
          "| real floor |",
          "|---|---|---|---|---|---|---|"]
    for r in scan:
        L.append(f"| {r['L_c']} | {r['grid_real']:.4e} ({r['grid_L_i']}) | {r['fine_real']:.4e} "
                 f"({r['fine_L_i']}) | {r['fine_fp64_real']:.4e} ({r['fine_fp64_L_i']}) | "
                 f"{_e(r.get('sollya_real'))} | {r['lattice_real']:.4e} | {r['lp_real']:.4e} |")
    L += ["", "## Reading", ""] + reading(res)
    return "\n".join(L) + "\n"


def reading(res):
    """Findings computed from the numbers (so the prose cannot drift from them)."""
    rows, scan = res["rows"], res["sigmoid_scan"]
    sig = rows[0]
    paper = PAPER["sigmoid"]["ours"]
    below = [r["L_c"] for r in scan if r["lattice_real"] <= paper]
    out = [f"- D3 sigmoid at L_c = {sig['L_c']}: deployed {sig['ours_real']:.4e} (L_i {sig['L_i']}, "
           f"picked for fused error), best on the 0.25 L_i grid {sig['grid_real']:.4e}, on the 0.01 "
           f"grid {sig['fine_real']:.4e} (L_i {sig['fine_L_i']}); the exact BF16 floor of the form is "
           f"{sig['lattice_real']:.4e} (real-coefficient floor {sig['lp_real']:.4e}). "
           f"No odd D3 program with BF16 coefficients reaches the paper's {paper:.2e} at this "
           "clamp, by any construction."]
    lo_s = [r.get("sollya_real") for r in scan if r["L_c"] in below and "sollya_real" in r]
    out.append(f"- Over the scan, the BF16 floor is <= {paper:.2e} "
               + (f"only for L_c <= {max(below)}" if below else "at no clamp")
               + (f", where Sollya's error is at most {max(lo_s):.4e} (not 5.47e-3)" if lo_s else "")
               + "; so no clamp of the scan reproduces the paper's pair under this protocol.")
    f64 = [r for r in scan if r["L_c"] == sig["L_c"]]
    if f64:
        r = f64[0]
        out.append(f"- Without the BF16 cast the constrained fit does go lower: {r['fine_fp64_real']:.4e} "
                   f"at L_c {r['L_c']} (L_i {r['fine_fp64_L_i']}), below the paper's {paper:.2e} and "
                   "the BF16 floor. The paper's 5.44e-3 is consistent with unrounded coefficients (or "
                   "a metric other than the stated one), not with BF16-cast coefficients of this form.")
    if res["sollya"]:
        eq = [r["L_c"] for r in scan if abs(r["sollya_real"] - PAPER["sigmoid"]["sollya"]) < 5e-6]
        opt = [r["L_c"] for r in scan if r["sollya_real"] <= r["lattice_real"] * (1 + 1e-9)]
        out.append(f"- Sollya's D3 error rounds to the paper's 5.47e-3 at L_c in {eq}; it equals the "
                   f"exact BF16 floor at L_c in {opt}.")
        wins = [r["L_c"] for r in scan if r["fine_real"] < r["sollya_real"]]
        out.append(f"- The constrained family (0.01 L_i grid) beats Sollya at L_c in {wins} "
                   "(where fpminimax's 8-bit rounding misses the lattice optimum), never by reaching "
                   f"{paper:.2e}.")
        nwin = sum(r["fine_real"] < r["sollya_real"] for r in rows)
        out.append(f"- All rows at the deployed clamps: the constrained family beats Sollya in {nwin} "
                   f"of 8; Sollya equals the BF16 floor in "
                   f"{sum(r['sollya_real'] <= r['lattice_real'] * (1 + 1e-9) for r in rows)} of 8.")
    return out
