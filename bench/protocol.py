"""The benchmark protocol shared by every bench script (the seed's component protocol).

Warm up every implementation, then run `rounds` rounds; in each round every
implementation is timed over `iters` back-to-back calls between two CUDA events, and the
order of implementations alternates between rounds (listed order, then reversed), so
that neither side of a native/poly pair always runs on a cooler or warmer GPU. A row's
time is the median over rounds of the per-round mean; a speedup is the ratio of two such
medians measured in the same run.

`Timing(order="shuffle")` draws a fresh (seeded) permutation each round instead. Why: the
H200 runs under its power cap during these loops and its SM clock follows the power of the
last tens of milliseconds, so with listed/reversed order a row keeps the same neighbours
every round, and rows listed beside low-power baselines (torch.compile'd sigmoid, flex) ran
at higher clocks (docs/MEASURED.md, "Benchmark protocol"). Shuffling spreads the neighbours.
`Timing(settle_ms=...)` idles the GPU before every segment instead, so that each starts from
the same power state (burst rather than sustained clocks; docs/MEASURED.md).

Job outputs: every bench script writes its JSON (and the Markdown beside it) to
bench/out/<name>.json, a git-ignored scratch folder, unless `--json PATH` names another file;
committing a result under bench/results/ is always that explicit path (`output_path`). The
commit a result was measured at is `commit_id()` (FAP_COMMIT, else git, else the package
version + "unknown").
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

PROTOCOL = ("{warmup} warm-up calls per implementation, then {rounds} rounds of {iters} "
            "CUDA-event-timed back-to-back calls; {order}; a row is the median over rounds of the "
            "per-round mean time")
ORDERS = {"alternate": "implementation order alternates between rounds (listed, reversed)",
          "shuffle": "implementation order changes between rounds (a seeded random permutation per round)"}


@dataclass
class Timing:
    warmup: int = 25
    rounds: int = 5
    iters: int = 100
    order: str = "alternate"   # "alternate" (the seed's: listed, reversed) | "shuffle"
    settle_ms: float = 0.0     # > 0: the GPU idles this long before every timed segment

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {sorted(ORDERS)}, got {self.order!r}")
        if self.settle_ms < 0:
            raise ValueError(f"settle_ms must be >= 0, got {self.settle_ms!r}")

    def describe(self) -> str:
        text = PROTOCOL.format(warmup=self.warmup, rounds=self.rounds, iters=self.iters,
                               order=ORDERS[self.order])
        if self.settle_ms:
            text += f"; the GPU idles {self.settle_ms:g} ms before every timed segment"
        return text

    def round_orders(self, names: list[str], seed: int = 0) -> list[list[str]]:
        """The implementation order of every round."""
        if self.order == "alternate":
            return [names if r % 2 == 0 else names[::-1] for r in range(self.rounds)]
        rng = random.Random(seed)
        return [rng.sample(names, len(names)) for _ in range(self.rounds)]


def _time_once(fn: Callable[[], object], iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


_SEGMENTS: list[tuple[str, float, float]] = []


def last_segments() -> list[tuple[str, float, float]]:
    """(name, host start, host end) in seconds of every timed segment of the last
    time_alternating call (for bench/tools/clocks.py; the GPU is idle before each start, and each
    end follows the end event's synchronize)."""
    return list(_SEGMENTS)


def time_alternating(fns: dict[str, Callable[[], object]], timing: Timing) -> dict[str, float]:
    """Median per-round mean time in ms for each named callable, timed side by side."""
    names = list(fns)
    for name in names:
        for _ in range(timing.warmup):
            fns[name]()
    torch.cuda.synchronize()
    _SEGMENTS.clear()
    per_round: dict[str, list[float]] = {n: [] for n in names}
    for order in timing.round_orders(names):
        for name in order:
            if timing.settle_ms:
                time.sleep(timing.settle_ms / 1000)   # the previous segment has synchronised
            t0 = time.time()
            per_round[name].append(_time_once(fns[name], timing.iters))
            _SEGMENTS.append((name, t0, time.time()))
    return {n: statistics.median(v) for n, v in per_round.items()}


GRAPH_PROTOCOL = ("{warmup} eager warm-up calls per implementation, then {iters} back-to-back calls "
                  "captured into one CUDA graph per implementation; {rounds} rounds of one "
                  "CUDA-event-timed replay each, implementation order alternating between rounds "
                  "(listed, reversed); a row is the median over rounds of the per-call time. Host "
                  "launch cost is excluded: rows are device time")


def _capture(fn: Callable[[], object], iters: int) -> "torch.cuda.CUDAGraph":
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):           # side-stream warm-up, as torch's graph docs require
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    return graph


def time_with_clocks(fns: dict[str, Callable[[], object]], timing: Timing, with_clocks: bool):
    """(time_alternating's times, per-name SM clock / power from bench/tools/clocks.py or {})."""
    if not with_clocks:
        return time_alternating(fns, timing), {}
    tools = os.path.join(BENCH_DIR, "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import clocks
    with clocks.Sampler() as sampler:
        times = time_alternating(fns, timing)
    return times, clocks.per_name(sampler.samples(), last_segments())


def time_alternating_graph(fns: dict[str, Callable[[], object]], timing: Timing) -> dict[str, float]:
    """time_alternating with each implementation's `iters` calls captured in one CUDA graph:
    per-call device time (ms), host dispatch excluded (GRAPH_PROTOCOL)."""
    names = list(fns)
    for name in names:
        for _ in range(timing.warmup):
            fns[name]()
    torch.cuda.synchronize()
    graphs = {n: _capture(fns[n], timing.iters) for n in names}
    torch.cuda.synchronize()
    per_round: dict[str, list[float]] = {n: [] for n in names}
    for order in timing.round_orders(names):
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            per_round[name].append(start.elapsed_time(end) / timing.iters)
    del graphs
    torch.cuda.synchronize()
    return {n: statistics.median(v) for n, v in per_round.items()}


def graph_time(fn: Callable[[], object], timing: Timing) -> float | None:
    """GPU-only time per call (ms): `iters` calls captured into one CUDA graph and replayed, so
    host-side launch cost is excluded. None when the callable cannot be captured."""
    try:
        fn()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(timing.iters):
                fn()
        for _ in range(3):
            graph.replay()
        times = []
        for _ in range(timing.rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / timing.iters)
        return statistics.median(times)
    except Exception as e:  # noqa: BLE001 - capture is best effort per implementation
        print(f"graph capture failed: {type(e).__name__}: {str(e)[:160]}")
        torch.cuda.synchronize()
        return None


BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(BENCH_DIR, "out")   # scratch for job outputs (git-ignored)


def package_version() -> str:
    """flash-attn-poly's installed version, read from the package metadata (no torch import)."""
    try:
        from importlib.metadata import version
        return version("flash-attn-poly")
    except Exception:  # noqa: BLE001 - not installed (a bare copy on PYTHONPATH)
        return "unknown"


def commit_id() -> str:
    """The commit a result was measured at, recorded even outside a git checkout.

    FAP_COMMIT when set (the device machine gets a copy of the tree without .git: the caller
    exports the sha), else HEAD of the checkout this file is in (short sha, "-dirty" when a
    tracked file differs from it), else "<package version>+unknown"."""
    env = os.environ.get("FAP_COMMIT", "").strip()
    if env:
        return env
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR,
                              capture_output=True, text=True, timeout=30)
        sha = head.stdout.strip()
        if head.returncode == 0 and sha:
            status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=BENCH_DIR, capture_output=True, text=True, timeout=30)
            return sha + ("-dirty" if status.returncode == 0 and status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return f"{package_version()}+unknown"


def progress(message: str) -> None:
    """One progress line on stderr (long jobs: a line per build or step)."""
    print(message, file=sys.stderr, flush=True)


def add_json_arg(p, name: str) -> None:
    """--json on an argparse parser; output_path() resolves it (default: bench/out/<name>.json)."""
    p.add_argument("--json", metavar="PATH",
                   help=f"write the results here, and the Markdown table beside it (.md); default "
                        f"bench/out/{name}.json (scratch, git-ignored). A committed results file is "
                        f"always an explicit path, e.g. --json bench/results/{name}.json")


def output_path(json_path: str | None, name: str) -> str:
    """Where a job writes its JSON: the explicit --json path, else bench/out/<name>.json."""
    path = json_path or os.path.join(OUT_DIR, name + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return path


def header(timing: Timing | None = None, protocol_text: str | None = None) -> dict:
    """Where and how a job ran: device, date, commit, torch and the protocol text (the job's own
    `protocol_text` where it does not time through `timing`, else timing.describe())."""
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"device": dev, "date": _dt.date.today().isoformat(), "commit": commit_id(),
            "torch": torch.__version__,
            "protocol": protocol_text if protocol_text is not None else timing.describe()}


def shape_of(args) -> dict:
    """The attention shape of add_shape_args' options, as results record it."""
    return dict(batch=args.batch, seqlen=args.seqlen, hq=args.hq, hkv=args.hkv, headdim=args.headdim)


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")


def add_shape_args(p, batch=1, seqlen=4096, hq=32, hkv=8, headdim=128) -> None:
    """--batch --seqlen --hq --hkv --headdim on an argparse parser (attention benchmarks)."""
    for name, default in (("batch", batch), ("seqlen", seqlen), ("hq", hq), ("hkv", hkv), ("headdim", headdim)):
        p.add_argument(f"--{name}", type=int, default=default)


def parse_cell(text: str, min_seqlen: int = 1) -> tuple:
    """A --cell B,S option (argparse type): batch >= 1 and sequence length >= min_seqlen."""
    try:
        b, s = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a cell is B,S (two integers), got {text!r}") from None
    if b < 1 or s < min_seqlen:
        raise argparse.ArgumentTypeError(f"B >= 1 and S >= {min_seqlen}, got {text!r}")
    return b, s


def add_timing_args(p, warmup: int, rounds: int | None, iters: int) -> None:
    """--warmup --rounds --iters (the Timing fields) on an argparse parser, with this script's
    defaults; rounds=None: a job without rounds (no --rounds)."""
    for name, default in (("warmup", warmup), ("rounds", rounds), ("iters", iters)):
        if default is not None:
            p.add_argument(f"--{name}", type=int, default=default)


def doc_body(doc: str) -> str:
    """A bench script's docstring after its title and usage paragraphs (what its rows mean)."""
    return doc.split("\n\n", 2)[2].strip()


def write_results(path: str, payload: dict, markdown: str) -> None:
    """payload as JSON at path, and the Markdown beside it (same name, .md)."""
    write_json(path, payload)
    md = os.path.splitext(path)[0] + ".md"
    with open(md, "w") as f:
        f.write(markdown)
    progress(f"wrote {path} and {md}")


def report(path: str, res: dict, table: str, title: str, *, shape: str = "", notes: str = "",
           doc: str | None = None) -> None:
    """Print a job's Markdown table, then write_results: res as JSON at path and the Markdown
    beside it, "# <title> (<device>, <date>, commit <commit>)", a paragraph "<shape>Protocol:
    <res["protocol"]>.<notes>", the body of the script's docstring `doc` (doc_body) when given,
    and the table."""
    print(table)
    parts = [f"# {title} ({res['device']}, {res['date']}, commit {res['commit']})",
             f"{shape}Protocol: {res['protocol']}.{notes}"]
    parts += [doc_body(doc)] if doc else []
    write_results(path, res, "\n\n".join(parts + [table]) + "\n")


def markdown_table(rows: list[dict], cols: list[str]) -> str:
    def fmt(x):
        return f"{x:.3f}" if isinstance(x, float) else ("—" if x is None else str(x))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
