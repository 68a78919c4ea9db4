"""Sollya fpminimax control (seed table 2), via the real `sollya` binary.

Same degree, same sparse monomials (no constant term where the form pins c0 = 0), fitted on
the half domain [0, L_c] of the same residual, each coefficient constrained to 8-bit
floating point, then cast to BF16 and run through the same reconstruction.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np

from . import runtime as rt

INSTALL_HINT = "sollya not found: install it with `apt-get install -y sollya` (Debian/Ubuntu)"

# Half-domain residuals g(t) in Sollya syntax, matching targets.TARGETS[...].g
SOLLYA_G = {
    "sigmoid": "1/(1+exp(-x)) - 1/2",
    "sigmoid_grad": "exp(-x)/(1+exp(-x))^2",
    "tanh": "tanh(x)",
    "tanh_grad": "1 - tanh(x)^2",
    "silu": "x*(1/(1+exp(-x)) - 1/2)",
    "silu_grad": "1/(1+exp(-x)) + x*exp(-x)/(1+exp(-x))^2 - 1/2",
    "gelu": "x*erf(x/sqrt(2))/2",
    "gelu_grad": "erf(x/sqrt(2))/2 + x*exp(-x^2/2)/sqrt(2*pi)",
}


def available() -> bool:
    return shutil.which("sollya") is not None


def fpminimax(key: str, degree: int, L: float, zero_c0: bool, bits: int = 8) -> np.ndarray:
    """Coefficients c_0..c_D (c_0 = 0 when zero_c0) of Sollya's absolute fpminimax on [0, L]."""
    if not available():
        raise RuntimeError(INSTALL_HINT)
    first = 1 if zero_c0 else 0
    mono = ",".join(str(k) for k in range(first, degree + 1))
    fmts = ",".join([str(bits)] * (degree + 1 - first))
    script = "\n".join([
        "prec = 200!;",
        "display = hexadecimal!;",  # exact: decimal display truncates digits
        f"f = {SOLLYA_G[key]};",
        # Start at 2^-10, not 0: with no constant term every basis function vanishes at 0
        # and Remez reports a non-Haar system and fails.
        f"p = fpminimax(f, [|{mono}|], [|{fmts}|], [1b-10; {L!r}], absolute);",
        f"for i from 0 to {degree} do print(coeff(p, i));",
        "quit;",
    ])
    out = subprocess.run(["sollya"], input=script, capture_output=True, text=True, timeout=300)
    vals = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    try:
        c = np.array([float.fromhex(v) for v in vals[-(degree + 1):]])
    except ValueError as e:
        raise RuntimeError(f"sollya failed: {out.stdout}\n{out.stderr}") from e
    if len(c) != degree + 1:
        raise RuntimeError(f"sollya failed: {out.stdout}\n{out.stderr}")
    return c


def control_program(ours: dict, key: str) -> dict:
    """Sollya counterpart of one of our programs: same form, degree, L_c, dtype."""
    zero_c0 = ours["form"] != "even"
    c = fpminimax(key, ours["degree"], ours["L_c"], zero_c0)
    cr = rt.round_to(c, ours["dtype"])
    p = dict(ours)
    p.update(coeffs=[float(v) for v in cr], coeffs_fp64=[float(v) for v in c],
             fit={"command": "sollya fpminimax, 8-bit coefficients, absolute, [0, L_c]"})
    return p
