"""GPU clock and power during timed segments: is a row slower because its kernels ran at a
lower SM clock?

Why: at the gqa_4096 shape our backward's wall time (seed protocol: 100 back-to-back calls
per round) exceeded its summed device time from bench/tools/kernel_breakdown.py (20 profiled
calls) by ~160 us per call while FA4's exceeded its own by ~56 us, with no host stall found
(bench/tools/call_timeline.py; docs/MEASURED.md). One explanation is a lower SM clock under
sustained load (power or thermal capping). This module samples `nvidia-smi` in the background and averages the
samples that fall inside each timed segment of bench/protocol.py.

    with clocks.Sampler() as s:            # nvidia-smi -lms <period> in a subprocess
        times = protocol.time_alternating(fns, timing)
    stats = clocks.per_name(s.samples(), protocol.last_segments())

Each sample: host time (s, from nvidia-smi's timestamp), SM clock (MHz), power (W) and the
active clock-event (throttle) reasons bitmask (0 where this nvidia-smi has no such field).
Without nvidia-smi the sampler records nothing and per_name returns {} (the benchmark
still runs).
"""
from __future__ import annotations

import datetime as _dt
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

QUERY = "timestamp,clocks.sm,power.draw,{reasons}"
# the event-reasons field was renamed (older drivers: clocks_throttle_reasons.active)
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def _reasons_field(exe: str, gpu: int) -> str | None:
    """The event-reasons field this nvidia-smi knows (None: neither; the query then has none)."""
    for name in REASON_FIELDS:
        r = subprocess.run([exe, f"--id={gpu}", f"--query-gpu={name}", "--format=csv,noheader"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return name
    return None


@dataclass(frozen=True)
class Sample:
    t: float          # host time, seconds since the epoch
    sm_mhz: float
    power_w: float
    reasons: int      # nvidia-smi clocks_event_reasons.active bitmask


def parse_line(line: str) -> Sample | None:
    """One line of `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`, e.g.
    '2026/11/30 05:33:11.123, 1980, 512.34, 0x0000000000000000'; None if unparsable."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) not in (3, 4):
        return None
    try:
        ts = _dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        return Sample(ts, float(parts[1]), float(parts[2]), int(parts[3], 16) if len(parts) == 4 else 0)
    except ValueError:
        return None


class Sampler:
    """Context manager: `nvidia-smi -lms period_ms` writing to a temporary file."""

    def __init__(self, period_ms: int = 20, gpu: int = 0):
        self.period_ms, self.gpu = period_ms, gpu
        self._proc, self._file, self._samples = None, None, []

    def __enter__(self):
        exe = shutil.which("nvidia-smi")
        if exe:
            reasons = _reasons_field(exe, self.gpu)
            query = QUERY.format(reasons=reasons) if reasons else QUERY.replace(",{reasons}", "")
            self._file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
            self._proc = subprocess.Popen(
                [exe, f"--id={self.gpu}", f"--query-gpu={query}", "--format=csv,noheader,nounits",
                 f"--loop-ms={self.period_ms}"], stdout=self._file, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._file.seek(0)
            self._samples = [s for s in map(parse_line, self._file.read().splitlines()) if s]
            self._file.close()
        return False

    def samples(self) -> list[Sample]:
        return list(self._samples)


def per_name(samples: list[Sample], segments: list[tuple[str, float, float]]) -> dict[str, dict]:
    """Mean SM clock / power and the OR of the event reasons over the samples inside each
    name's segments (name, t_start, t_end); names without a sample are left out."""
    acc: dict[str, list[Sample]] = {}
    for name, t0, t1 in segments:
        acc.setdefault(name, []).extend(s for s in samples if t0 <= s.t <= t1)
    out = {}
    for name, ss in acc.items():
        if ss:
            reasons = 0
            for s in ss:
                reasons |= s.reasons
            out[name] = {"sm_mhz": sum(s.sm_mhz for s in ss) / len(ss),
                         "power_w": sum(s.power_w for s in ss) / len(ss),
                         "reasons": f"0x{reasons:x}", "samples": len(ss)}
    return out
