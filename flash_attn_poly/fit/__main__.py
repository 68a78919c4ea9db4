"""CLI: python -m flash_attn_poly.fit search|write|derive|table|sweep|attn-metric|identities|softcap-tail|softcap-odd|exp2

--table PATH: the table read and written (default: the committed flash_attn_poly/data/programs.json;
a path that does not exist starts an empty table).  Every write stores each entry's derived
constants (programs.derive), which the kernels read instead of importing fit."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m flash_attn_poly.fit")
    ap.add_argument("--table", default=None, help="the table to read and write (default: the committed "
                    "flash_attn_poly/data/programs.json)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search", help="search one target and print (or store) the best program")
    s.add_argument("--target", required=True, help="sigmoid|tanh|silu|gelu[_grad]|softcap|sigmoid_attn")
    s.add_argument("--degree", type=int, default=4)
    s.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    s.add_argument("--n", type=int, default=4096, help="keys, for sigmoid_attn")
    s.add_argument("--squarings", type=int, default=2, help="sigmoid_attn: p = q^(2^s)")
    s.add_argument("--shift", default="thr", choices=["thr", "mid"],
                   help="sigmoid_attn: u = xc - thr (one sub) or per-region midpoints (select + sub)")
    s.add_argument("--write", action="store_true", help="add/replace the entry in programs.json")
    w = sub.add_parser("write", help="regenerate flash_attn_poly/data/programs.json")
    w.add_argument("--out", default=None)
    sub.add_parser("derive", help="rewrite the table with every entry's derived constants (no refit)")
    t = sub.add_parser("table", help="Table 2: ours vs Sollya fpminimax, with exact floors (writes "
                       "JSON and PATH.md)")
    t.add_argument("--json", required=True)
    sw = sub.add_parser("sweep", help="D3-D6 sweeps like the seed's figures 4/5: PNGs, and the per-sweep "
                        "check of its higher-degree-is-worse claim (JSON + PATH.md)")
    sw.add_argument("--out", required=True, help="folder for the two PNGs")
    sw.add_argument("--json", default=None, help="write the numbers here (and PATH.md)")
    sw.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    am = sub.add_parser("attn-metric", help="attention-output error of the poly programs vs native (CPU, FP64 ref)")
    am.add_argument("--modes", nargs="+", default=["sigmoid", "softcap"], choices=["sigmoid", "softcap"])
    am.add_argument("--seeds", type=int, default=3)
    am.add_argument("--S", type=int, default=1024)
    am.add_argument("--H", type=int, default=2)
    am.add_argument("--D", type=int, default=128)
    am.add_argument("--tanh-eps", type=float, default=0.0, help="native softcap: tanh.approx relative error model (e.g. 4.9e-4)")
    am.add_argument("--sigmoid-program", default=None, help="table entry for sigmoid (default sigmoid_attn_n4096)")
    am.add_argument("--softcap-program", default=None, help="table entry for softcap (default softcap_c50)")
    am.add_argument("--json", default=None, help="write the results here (and PATH.md)")
    am.add_argument("--update-table", action="store_true", help="store the summary in the programs' errors")
    st = sub.add_parser("softcap-tail", help="the two-region FP16 softcap pair (fit/softcap_tail.py) from the "
                        "table's FP16 residual pair")
    st.add_argument("--u0", type=float, default=1.0)
    st.add_argument("--L", type=float, default=3.0)
    st.add_argument("--write", action="store_true", help="add/replace the two entries in programs.json")
    so = sub.add_parser("softcap-odd", help="FP16 softcap residual as a true odd polynomial (form odd_u2, "
                        "fit/softcap_odd.py): softcap_c50_f16_odd")
    so.add_argument("--n-coeffs", type=int, default=None, help="fix the number of Q coefficients "
                    "(default: search the grid of fit/softcap_odd.GRID)")
    so.add_argument("--L", type=float, default=None)
    so.add_argument("--floor", type=float, default=None)
    so.add_argument("--write", action="store_true", help="add/replace the entry in programs.json")
    e2 = sub.add_parser("exp2", help="FP32 2^a for the softcap stage's exp2 offload (fit/exp2.py): exp2_f32_d3")
    e2.add_argument("--write", action="store_true", help="add/replace the entry in programs.json")
    idn = sub.add_parser("identities", help="identity backward rules vs direct/differentiated programs")
    idn.add_argument("--json", default=None, help="write rows here (and PATH.md)")
    a = ap.parse_args(argv)
    cmd = "python -m flash_attn_poly.fit " + " ".join(argv if argv is not None else sys.argv[1:])

    from . import programs as P
    path = a.table or P.TABLE_PATH
    if a.cmd == "write":
        table = P.build(command=cmd, progress=True)
        # entries made by other commands (search --write, softcap-tail: their fit.command
        # says which) are kept, not dropped: the kernels' FP16 defaults are among them
        kept = {k: v for k, v in P.read(path)["programs"].items() if k not in table["programs"]}
        table["programs"] = dict(sorted({**table["programs"], **kept}.items()))
        P.write(table, a.out or path)
        print(f"wrote {len(table['programs'])} programs to {a.out or path} "
              f"(kept from the previous table: {sorted(kept)})")
    elif a.cmd == "derive":
        table = P.read(path)
        P.write(table, path)
        print(f"wrote {len(table['programs'])} programs with their derived constants to {path}")
    elif a.cmd == "softcap-tail":
        from . import softcap_tail
        table = P.read(path)
        _emit(softcap_tail.entries(table, a.u0, a.L, command=cmd), a.write, P, path)
    elif a.cmd == "softcap-odd":
        from . import softcap_odd
        fixed = {k: (v,) for k, v in (("L_c", a.L), ("n_coeffs", a.n_coeffs), ("floor", a.floor)) if v is not None}
        p = softcap_odd.search(fixed, progress=True)
        p["fit"]["command"] = cmd
        _emit({"softcap_c50_f16_odd": p}, a.write, P, path)
    elif a.cmd == "exp2":
        from . import exp2
        p = exp2.make()
        p["fit"]["command"] = cmd
        _emit({exp2.NAME: p}, a.write, P, path)
    elif a.cmd == "search":
        _emit(_search(a, cmd, P), a.write, P, path)
    elif a.cmd == "table":
        from . import table2
        res = table2.build(P.read(path), progress=True, command=cmd)
        md = table2.markdown(res)
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
        with open(a.json.rsplit(".", 1)[0] + ".md", "w") as fh:
            fh.write(md)
        print(md, end="")
    elif a.cmd == "attn-metric":
        from . import attn_metric
        a.program = {m: n for m, n in (("sigmoid", a.sigmoid_program), ("softcap", a.softcap_program)) if n}
        out, md = attn_metric.main(a, P.read(path))
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"command": cmd, **out}, fh, indent=1)
            with open(a.json.rsplit(".", 1)[0] + ".md", "w") as fh:
                fh.write(f"# Attention-output error, poly vs native\n\nCommand: `{cmd}`\n\n" + "\n".join(md))
        if a.update_table:
            table = P.read(path)
            for mode, r in out.items():
                table["programs"][r["program"]]["errors"].update(r["summary"])
            P.write(table, path)
    elif a.cmd == "identities":
        from . import identities as I
        rows = I.comparison(P.read(path))
        md = I.markdown(rows, cmd)
        print(md, end="")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"command": cmd, "rows": rows}, fh, indent=1)
            with open(a.json.rsplit(".", 1)[0] + ".md", "w") as fh:
                fh.write(md)
    elif a.cmd == "sweep":
        from . import sweep as SW
        data = SW.run(a.dtype, progress=True)
        pngs = SW.figures(data, a.out)
        md = SW.markdown(data, cmd, pngs)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"command": cmd, **data}, fh, indent=1)
            with open(a.json.rsplit(".", 1)[0] + ".md", "w") as fh:
                fh.write(md)
        print(md, end="")


def _emit(entries, write: bool, P, path):
    """Print new table entries (with their derived constants); with write, add/replace them in
    the table at path (sorted)."""
    entries = {k: P.derive(v) for k, v in P._clean(entries).items()}
    print(json.dumps(entries, indent=1))
    if write:
        table = P.read(path)
        table["programs"] = dict(sorted({**table["programs"], **entries}.items()))
        P.write(table, path)
        print(f"wrote {sorted(entries)} to {path}", file=sys.stderr)


def _search(a, cmd, P):
    if a.target == "sigmoid_attn":
        if a.dtype == "bf16" and a.degree == 4 and a.squarings == 2 and a.shift == "thr":
            a.degree = 3   # --degree defaults to 4 for the lane-wise targets; the B3 entry is D3
        return P.sigmoid_attn_entries(a.n, cmd, progress=True, dtype=a.dtype, degree=a.degree,
                                      squarings=a.squarings, shift=a.shift)
    if a.target == "softcap":
        from . import softcap
        if a.dtype == "bf16":   # the B2 entry: D4 (the --degree default) in BF16
            p = softcap.search(progress=True, degree=a.degree)
            return {"softcap_c50": p, "softcap_c50_grad": softcap.make_grad(p)}
        p = softcap.search(progress=True, degree=a.degree, dtype=a.dtype, select="attn")
        p["fit"] = {"command": cmd, "select": "min attention-output rel L2 / native's, worst of raw "
                                              "score std 10 and 20 logits (softcap.AttnScore), "
                                              "fused replay in " + a.dtype}
        g = softcap.make_grad(p)
        g["fit"] = {"command": cmd}
        return {f"softcap_c50_{a.dtype}": p, f"softcap_c50_{a.dtype}_grad": g}
    p = P.searched(a.target, a.degree, a.dtype, cmd, progress=True)
    fn, grad = a.target.replace("_grad", ""), a.target.endswith("_grad")
    name = f"{fn}_d{a.degree}" + ("_grad" if grad else "") + ("_f16" if a.dtype == "f16" else "")
    return {name: p}


if __name__ == "__main__":
    main()
