"""Sweeps like the seed's figures 4 and 5: D3-D6 at target precision, fused runtime order."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import runtime as rt
from . import search as S
from .targets import TARGETS

FUNCS = ("sigmoid", "tanh", "silu", "gelu")


def sweep(out_dir, dtype="f16", degrees=S.DEGREES, grids=None):
    """One PNG per direction (forward, backward): per function, values (top) and log-scale
    abs error (bottom) of the best gated program of each degree, replayed in fused order."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    x = np.linspace(-8, 8, 4001)
    xr = rt.round_to(rt.round_to(x, "f32"), dtype)
    paths = []
    for direction, suffix in (("forward", ""), ("backward", "_grad")):
        fig, axes = plt.subplots(2, len(FUNCS), figsize=(4 * len(FUNCS), 6), sharex=True)
        for j, fn in enumerate(FUNCS):
            key = fn + suffix
            li, lc = (grids or {}).get(key, (None, None))
            cands = S.search(key, dtype, degrees=degrees, Li_grid=li, Lc_grid=lc)
            f = TARGETS[key].f
            axes[0, j].plot(x, f(x), "k", lw=1, label="exact")
            for d in degrees:
                try:
                    p = S.best(cands, d, dtype).program
                except RuntimeError:
                    continue
                y = rt.replay(p, x, "fused")
                err = np.maximum(np.abs(y - f(xr)), 1e-7)
                lab = f"D{d} L_c={p['L_c']}"
                axes[0, j].plot(x, y, lw=0.8, label=lab)
                axes[1, j].semilogy(x, err, lw=0.6, label=f"{lab} max {err.max():.2e}")
            axes[0, j].set_title(f"{fn}{chr(39) if suffix else ''} ({dtype}, fused)")
            axes[1, j].legend(fontsize=6)
            axes[0, j].legend(fontsize=6)
            axes[1, j].set_xlabel("x")
        axes[1, 0].set_ylabel("abs error")
        fig.tight_layout()
        path = out / f"sweep_{direction}_{dtype}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths
