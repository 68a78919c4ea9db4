"""The timing tools' `--knob` text as plan overrides (flash_attn_poly.plan.resolve).

A knob is NAME=VALUE, several joined by '+' (e.g. `tile_n=64+num_stages=3`, `split=1/8+program=
softcap_c50_f16_odd`, `head_loop=0+lpt=1`):

  fwd.<field>=V, bwd.<field>=V     a FwdConfig / BwdConfig field (kernels/config.py), set after
                                   the plan's rows: "fwd.tile_n=64", "bwd.head_loop=0"
  <field>=V                        the same with the tool's direction implied: fwd_tuning,
                                   cta_overhead, ncu_fwd, poly_split read FwdConfig fields,
                                   bwd_tuning BwdConfig fields
  split=J/K (poly_split=J/K)       the poly score's key column split ("poly_split")
  grad_rule=R (softcap_grad=R)     the poly backward's derivative rule ("grad_rule")
  program=NAME, sigmoid_grad=R,    attention() arguments: the plan resolves from them (deterministic
  deterministic=0/1                turns off dq_async, lpt and head_loop by its row)
                                   (bwd also: zero_dq_in_pre=0/1, who zeroes head_loop's dQ
                                   accumulator, and varlen_order=unit/block, the packed backward's
                                   CTA table order: plan choices with a "bwd." override)

Values: bool fields 0 / 1, int fields and persistent (a CTA count; 0 = a CTA per tile) ints,
float fields floats, the rest strings.  Overrides replace fields after the rows: set every field
you mean (a 128-key split at D = 128 under BF16 softcap's 64-key tile needs the tile too:
`tile_m=128+tile_n=128+num_stages=2+pingpong=1`); kernels/config.check_fwd / check_bwd name a
combination no kernel builds when the plan is resolved.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

# call facts of the configs, not tunable (the plan takes them from the call)
_CALL_FIELDS = ("score", "dtype", "head_dim", "causal", "window_left", "window_right")
CALL_KNOBS = {"program": str, "sigmoid_grad": str, "deterministic": bool}   # plan_for keywords
# backward choices of the plan that are no BwdConfig field but take a "bwd." override
BWD_PLAN_FIELDS = {"zero_dq_in_pre": "bool",   # who zeroes head_loop's dQ accumulator
                   "varlen_order": "str"}      # packed calls: the backward's CTA table order
ALIASES = {"split": "poly_split", "softcap_grad": "grad_rule"}
POLY_ONLY = ("poly_split", "grad_rule", "program", "sigmoid_grad")   # need evaluator="poly"


def _fields(direction: str) -> dict:
    """{field: type name} of the tunable FwdConfig ("fwd") / BwdConfig ("bwd") fields."""
    from flash_attn_poly.kernels.config import BwdConfig, FwdConfig
    cls = FwdConfig if direction == "fwd" else BwdConfig
    out = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.name not in _CALL_FIELDS}
    return out if direction == "fwd" else {**out, **BWD_PLAN_FIELDS}


@dataclass(frozen=True)
class Knob:
    text: str
    overrides: dict = field(default_factory=dict)   # plan.resolve overrides
    call: dict = field(default_factory=dict)        # testing.plan_for keywords

    @property
    def poly_only(self) -> bool:
        """Does the knob name the poly score (split, grad rule, program)?"""
        return any(k in POLY_ONLY for k in (*self.overrides, *self.call))


def _value(name: str, kind: str, value: str):
    if kind in ("bool", bool):
        if value not in ("0", "1"):
            raise ValueError(f"--knob {name}: expected 0 or 1, got {value!r}")
        return value == "1"
    try:
        if kind in ("int", int):
            return int(value)
        if kind in ("float", float):
            return float(value)
    except ValueError:
        raise ValueError(f"--knob {name}: expected {getattr(kind, '__name__', kind)}, got {value!r}") from None
    return value


def _split(name: str, value: str) -> tuple:
    j, sep, k = value.partition("/")
    try:
        return int(j), int(k)
    except ValueError:
        raise ValueError(f"--knob {name}: expected J/K (e.g. 1/8), got {value!r}") from None


def parse(text: str, direction: str = "fwd") -> Knob:
    """The Knob of `text`; bare field names are `direction`'s ("fwd" | "bwd")."""
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    fields = {d: _fields(d) for d in ("fwd", "bwd")}
    overrides, call = {}, {}
    for part in text.split("+"):
        name, sep, value = part.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"--knob {text!r}: expected NAME=VALUE[+NAME=VALUE...], got {part!r}")
        key = ALIASES.get(name, name)
        if key == "poly_split":
            overrides[key] = _split(name, value)
        elif key == "grad_rule":
            overrides[key] = value
        elif key in ("fwd_ctas", "l2_section_mb"):   # the forward's runtime plan values
            overrides[key] = _value(name, int, value)
        elif key in CALL_KNOBS:
            call[key] = _value(name, CALL_KNOBS[key], value)
        else:
            scope, dot, fname = key.partition(".")
            if not dot:
                scope, fname = direction, key
            if scope not in fields or fname not in fields[scope]:
                known = dict.fromkeys([*fields[direction], *ALIASES, "poly_split", "grad_rule", *CALL_KNOBS])
                raise ValueError(f"--knob {name}: unknown; known: {', '.join(known)} "
                                 "(or fwd.<FwdConfig field>, bwd.<BwdConfig field>)")
            overrides[f"{scope}.{fname}"] = _value(name, fields[scope][fname], value)
    return Knob(text, overrides, call)


def tuning_args(parser, argv, direction: str, *, modes: str, knob_help: str, example: str):
    """(args, output path) of a tuning tool (fwd_tuning.py, bwd_tuning.py; `parser` holds its
    shape options): adds --knob (repeatable), --modes, --non-causal, --order, --warmup / --rounds / --iters
    (10 / 5 / 20) and --json (default bench/out/<direction>_tuning.json), parses argv, and checks
    the knobs: at least one (else a parser error suggesting `--knob example`), each one parsing for
    `direction` (else a parser error naming the problem)."""
    import protocol
    parser.add_argument("--knob", action="append", default=[], help=knob_help)
    parser.add_argument("--modes", default=modes)
    parser.add_argument("--non-causal", action="store_true", help="time non-causal calls (default: causal)")
    parser.add_argument("--window", type=_window, default=(-1, -1), metavar="LEFT,RIGHT",
                        help="window_size of the calls, e.g. 48,16 (default -1,-1: none)")
    parser.add_argument("--order", choices=sorted(protocol.ORDERS), default="alternate")
    parser.add_argument("--q-std", type=float, default=1.0,
                        help="standard deviation of q (default 1): the scores' spread scales with it, so a "
                             "data-dependent branch (the sigmoid block's MUFU branch) fires as it would on "
                             "trained activations")
    protocol.add_timing_args(parser, warmup=10, rounds=5, iters=20)
    protocol.add_json_arg(parser, f"{direction}_tuning")
    args = parser.parse_args(argv)
    if not args.knob:
        parser.error(f"give at least one --knob (e.g. --knob {example})")
    for text in args.knob:
        try:
            parse(text, direction)
        except ValueError as e:
            parser.error(str(e))
    return args, protocol.output_path(args.json, f"{direction}_tuning")


def _window(text: str) -> tuple:
    """--window LEFT,RIGHT: two integers, -1 for an unbounded side."""
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"two integers LEFT,RIGHT (-1: unbounded), got {text!r}") from None
    if left < -1 or right < -1:
        raise argparse.ArgumentTypeError(f"sizes are >= -1, got {text!r}")
    return left, right


def applicable(knobs: dict, evaluator: str, label: str) -> dict:
    """The knobs ({text: Knob}) a row of `evaluator` runs, in order: split / program / grad-rule
    knobs need a poly evaluator; each one left out is printed under `label`."""
    mine = {text: kn for text, kn in knobs.items() if evaluator == "poly" or not kn.poly_only}
    for text in sorted(set(knobs) - set(mine)):
        print(f"{label}: row '{text}' skipped (split / program / grad_rule knobs need a poly evaluator)")
    return mine


def inputs(args, n: int, device: str = "cuda"):
    """q, k, v (n = 3), and dO (n = 4): seeded standard-normal BF16 tensors of the tool's shape
    options (protocol.add_shape_args), [batch, seqlen, heads, headdim], on `device` ("meta": shapes
    only, for resolving plans and compiling without a GPU); q scaled by args.q_std (1 where the tool
    has no such option)."""
    import torch
    heads = (args.hq, args.hkv, args.hkv, args.hq)[:n]
    shape = lambda h: (args.batch, args.seqlen, h, args.headdim)
    if device == "meta":
        return [torch.empty(shape(h), device="meta", dtype=torch.bfloat16) for h in heads]
    g = torch.Generator(device=device).manual_seed(0)
    out = [torch.randn(shape(h), device=device, dtype=torch.bfloat16, generator=g) for h in heads]
    q_std = getattr(args, "q_std", 1.0)
    if q_std != 1.0:
        out[0] = (out[0].float() * q_std).to(torch.bfloat16)
    return out


def each_plan(q, k, v, modes: str, knobs: dict, refused: list = None, causal: bool = True, window=(-1, -1)):
    """(mode:evaluator, row name, plan) of a tuning tool's rows, softcap 50: per entry of
    `modes` ("softmax:native,softcap:poly"), the default plan ("default"), then each applicable knob's.
    refused: a list to collect (mode:evaluator, knob, reason) of the knob rows whose plan no kernel
    builds (e.g. tile_n 80 under sigmoid/poly, whose 1/16 split cannot repeat in 80 keys), which
    are then skipped with the reason printed; None: such a knob raises its ValueError."""
    for me in modes.split(","):
        mode, ev = me.split(":")
        kw = dict(causal=causal, softcap=50.0 if mode == "softcap" else None, window_size=tuple(window))
        for name, knob in [("default", None)] + list(applicable(knobs, ev, me).items()):
            try:
                p = plan_for(q, k, v, mode, ev, knob, **kw)
            except ValueError as e:
                if refused is None or knob is None:
                    raise
                refused.append((me, name, str(e)))
                print(f"{me}: row '{name}' skipped: {e}")
                continue
            yield me, name, p


def compile_plans(plans, backward: bool) -> int:
    """A tuning tool's --compile-only: compile each (mode:evaluator, row name, plan)'s forward (and
    backward) kernel into the disk compile cache, without a GPU; prints a line per row."""
    import functools
    import time
    from flash_attn_poly.kernels import compile_cache, dispatch
    for me, name, plan in plans:
        t0 = time.time()
        f, b = plan.fwd, plan.bwd
        compile_cache.compiled("attn_fwd", f, functools.partial(dispatch._fwd_build, f))
        if backward:
            compile_cache.compiled("attn_bwd", b, functools.partial(dispatch._bwd_build, b))
        what = (f"backward tile {b.tile_m} x {b.tile_n}, head_loop {b.head_loop}" if backward else
                f"forward tile {f.tile_m} x {f.tile_n}, {f.num_stages} stages, pingpong {f.pingpong}, "
                f"persistent {f.persistent}")
        print(f"compiled {me} {name}: {what} ({time.time() - t0:.1f} s)", flush=True)
    return len(plans)


def shape_text(args, extra: str = "") -> str:
    """The report's shape line of a tuning tool's run."""
    import protocol
    win = "" if tuple(args.window) == (-1, -1) else f", window {tuple(args.window)}"
    return f"Shape: {protocol.shape_of(args)}, {'non-causal' if args.non_causal else 'causal'}{win}, BF16{extra}. "


def plan_row(default, plan, direction: str = "fwd") -> dict:
    """What a plan row adopting `plan` over `default` would be: {"when": the call facts of the
    cell (mode, evaluator, head_dim; the S and batch a short-sequence row needs are no plan
    fact yet), "sets": the kernel config fields that differ}.  plan.py's rows take such a row
    only where the timing and the GPU tests of that config justify it."""
    a, b = getattr(default, direction), getattr(plan, direction)
    sets = {f.name: getattr(b, f.name) for f in dataclasses.fields(b)
            if f.name not in _CALL_FIELDS and getattr(a, f.name) != getattr(b, f.name)}
    if plan.score != default.score:
        sets["score"] = f"{plan.score.program.name if plan.score.program else plan.score.kind} {plan.score.poly_split}"
    for name in ("fwd_ctas", "l2_section_mb") if direction == "fwd" else ():   # runtime plan values, no config field
        if getattr(plan, name) != getattr(default, name):
            sets[name] = getattr(plan, name)
    c = plan.call
    when = {"mode": c.mode, "evaluator": c.evaluator, "head_dim": c.head_dim,
            "cell": f"B={c.batch} S={c.seqlen_q} H={c.heads_q}/{c.heads_kv}"}
    return {"when": when, "sets": sets}


def ratio_rows(times: dict, prefixes: list, texts: list) -> list:
    """Rows "<prefix> <knob> / default": each knob row's time over its default's, for the rows
    that ran (times keys "<prefix> <knob>" and "<prefix> default")."""
    return [{"row": f"{pre} {t} / default", "ms": times[f"{pre} {t}"] / times[f"{pre} default"]}
            for pre in prefixes for t in texts if f"{pre} {t}" in times]


def plan_for(q, k, v, mode: str, evaluator: str, knob: Knob = None, **kw):
    """The plan attention(q, k, v, mode, evaluator=, **kw) resolves, with the knob applied
    (flash_attn_poly.testing.plan_for; q, k, v may live on torch's meta device)."""
    from flash_attn_poly import testing
    knob = knob or Knob("")
    p = testing.plan_for(q, k, v, mode, evaluator, knob.overrides, **{**kw, **knob.call})
    exp2_offload = p.score.program is not None and p.score.program.is_exp2   # its split sets exp2_fma
    score_knobs = sorted(k for k in set(knob.overrides) & {"poly_split", "grad_rule"}
                         if not (k == "poly_split" and exp2_offload))
    if score_knobs and p.score.evaluator != "poly":
        # a native score has no block columns and a native backward: the knob would be dropped
        # and the row would time the default
        prog = p.score.program.name if p.score.program is not None else None
        raise ValueError(f"--knob {knob.text!r}: {', '.join(score_knobs)} applies to a poly score; "
                         f"{mode}/{evaluator} resolves to a native score (program {prog}): name a poly "
                         "program too, e.g. program=softcap_c50_f16_odd")
    return p

