"""Compile a CuTe DSL ``@cute.jit`` function for sm_90a on a CPU-only machine and read its SASS.

How the cubin is obtained (nvidia-cutlass-dsl 4.8.1):

* ``cute.compile(fn, *args, options="--gpu-arch=sm_90a --keep-cubin --keep-ptx --dump-dir=D")``
  builds host + device code without a GPU (the ``--gpu-arch`` option does what the environment
  variable ``CUTE_DSL_ARCH=sm_90a`` does; either one works).  Tensor arguments are fake tensors
  from ``cutlass.cute.runtime.make_fake_compact_tensor`` / ``make_fake_tensor``.
* ``--keep-cubin`` fills ``compiled.artifacts.CUBIN`` (``bytes``) and ``--keep-ptx`` fills
  ``compiled.artifacts.PTX`` (``str``).  Both also write ``*.sm_90a.cubin`` / ``*.ptx`` files into
  the dump directory, which defaults to the *current working directory*, so we always pass a
  temporary ``--dump-dir``.
* ``nvdisasm -c <cubin>`` prints the SASS.  nvdisasm comes from the pip package
  ``nvidia-cuda-nvdisasm`` (``site-packages/nvidia/cu13/bin/nvdisasm``); ``$NVDISASM`` or PATH
  override the search.  (``--keep-sass`` exists too but needs nvdisasm on PATH.)

Example::

    from flash_attn_poly.kernels import sass
    text = sass.sass_of(my_jit_fn, fake_a, fake_b)
    print(sass.count_opcodes(text))   # {"HGMMA": .., "MUFU.EX2": .., "HFMA2.BF16": .., ...}
"""
from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ARCH = "sm_90a"

# Opcode families the benches and tests look at.  Each key counts SASS instructions whose
# opcode (mnemonic plus dot modifiers) matches the regex.
FAMILIES = {
    "HGMMA": r"HGMMA(\..*)?",
    "MUFU.EX2": r"MUFU\.EX2(\..*)?",
    "MUFU.TANH": r"MUFU\.TANH(\..*)?",
    "MUFU.RCP": r"MUFU\.RCP(\..*)?",
    "MUFU.RSQ": r"MUFU\.RSQ(\..*)?",
    "MUFU": r"MUFU(\..*)?",
    "HFMA2": r"HFMA2(\..*)?",                        # all packed 16-bit FMAs (f16 and bf16)
    "HFMA2.BF16": r"HFMA2(\.MMA)?\.BF16(_V2)?(\..*)?",  # bf16x2: HFMA2.BF16_V2 / HFMA2.MMA.BF16_V2
    "HMUL2": r"HMUL2(\..*)?",
    "HADD2": r"HADD2(\..*)?",
    "HMNMX2": r"HMNMX2(\..*)?",
    "HSET2": r"HSET2(\..*)?",
    "LOP3": r"LOP3(\..*)?",
    "F2FP": r"F2FP(\..*)?",
    "FFMA": r"FFMA(\..*)?",
    "FMNMX": r"FMNMX(\..*)?",                        # FP32 min/max (ALU pipe)
    "LDG.E.128": r"LDG\.E\.128(\..*)?",
    "LDG.E.64": r"LDG\.E\.64(\..*)?",
    "STG.E.128": r"STG\.E\.128(\..*)?",
    "LDG.128": r"LDG(\.[A-Z0-9_]+)*\.128(\..*)?",    # any 128-bit load: .CONSTANT, .NA, ...
    "STG.128": r"STG(\.[A-Z0-9_]+)*\.128(\..*)?",    # any 128-bit store: .EF (st.global.cs), ...
    "STL": r"STL(\..*)?",   # local stores: register spills
    "LDL": r"LDL(\..*)?",   # local loads: spill reloads
}



def families(*opcodes: str) -> dict:
    """{opcode: regex} for count_opcodes: each opcode with or without further dot modifiers
    ("MUFU.EX2" counts MUFU.EX2 and MUFU.EX2.FTZ, not MUFU.EX2X)."""
    return {op: re.escape(op) + r"(\..*)?" for op in opcodes}


# "/*0090*/   @!P0 F2FP.BF16.F32.PACK_AB R0, R7, R0 ;" -> "F2FP.BF16.F32.PACK_AB"
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_.]*)")


def nvdisasm_path() -> str:
    """Path of nvdisasm: $NVDISASM, then PATH, then the pip wheel under site-packages/nvidia."""
    env = os.environ.get("NVDISASM")
    if env:
        return env
    found = shutil.which("nvdisasm")
    if found:
        return found
    for root in sys.path:
        hits = sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", "nvdisasm")))
        hits += sorted(glob.glob(os.path.join(root, "nvidia", "cuda_nvdisasm", "bin", "nvdisasm")))
        if hits:
            return hits[-1]
    raise FileNotFoundError("nvdisasm not found: pip install nvidia-cuda-nvdisasm or set $NVDISASM")


def compile_sm90(fn, *args, options: str = ""):
    """cute.compile ``fn`` for sm_90a keeping cubin and PTX in ``compiled.artifacts``."""
    import cutlass.cute as cute

    dump = tempfile.mkdtemp(prefix="fap_sass_")
    opts = f"--gpu-arch={ARCH} --keep-cubin --keep-ptx --dump-dir={dump} {options}".strip()
    try:
        return cute.compile(fn, *args, options=opts)
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin (``nvdisasm -c``: code sections only)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([nvdisasm_path(), "-c", f.name], check=True,
                             capture_output=True, text=True)
    return out.stdout


def sass_of(fn, *args, options: str = "") -> str:
    """Compile ``fn(*args)`` for sm_90a on the CPU and return its SASS."""
    compiled = compile_sm90(fn, *args, options=options)
    cubin = compiled.artifacts.CUBIN
    if not cubin:
        raise RuntimeError("cute.compile returned no cubin (is --keep-cubin honoured?)")
    return disassemble(cubin)


def opcodes(sass: str) -> list[str]:
    """Every instruction's opcode with its modifiers, in program order."""
    return [m.group(1) for m in _INSTR.finditer(sass)]


def histogram(sass: str) -> collections.Counter:
    return collections.Counter(opcodes(sass))


def count_opcodes(sass: str, families: dict[str, str] | None = None) -> dict[str, int]:
    """Counts per family (see FAMILIES); an instruction may count in several families."""
    fams = {k: re.compile(v + r"$") for k, v in (families or FAMILIES).items()}
    hist = histogram(sass)
    return {k: sum(n for op, n in hist.items() if rx.match(op)) for k, rx in fams.items()}


def registers(cubin: bytes) -> dict[str, int]:
    """Registers per thread of every kernel in a cubin (what ``cuobjdump -res-usage`` shows):
    EIATTR_REGCOUNT (0x2f) records of the ``.nv.info`` section, (symbol index, count)."""
    import struct

    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(base, off):
        return cubin[base + off:cubin.index(b"\0", base + off)].decode()

    secs = {cstr(heads[shstrndx][4], h[0]): h for h in heads}
    strtab, symtab = secs[".strtab"][4], secs[".symtab"]
    sym_names = [cstr(strtab, struct.unpack_from("<I", cubin, symtab[4] + i * 24)[0])
                 for i in range(symtab[5] // 24)]
    out, i = {}, secs[".nv.info"][4]
    end = i + secs[".nv.info"][5]
    while i < end:                  # records: format, attribute, then a u16 size + payload
        fmt, attr = cubin[i], cubin[i + 1]
        size = struct.unpack_from("<H", cubin, i + 2)[0] if fmt == 0x04 else 0
        if attr == 0x2F:
            sym, regs = struct.unpack_from("<II", cubin, i + 4)
            out[sym_names[sym]] = regs
        i += 4 + size
    return out


# ---------------------------------------------------------------- overlap loops: where the PV wait sits
# Score-stage opcode families counted on either side of the PV wait (the rest of an
# overlapped loop body is GEMM issue, pipeline waits/arrives, address math and O's rescale).
STAGE_FAMILIES = {
    "MUFU": r"MUFU\.(EX2|TANH)(\..*)?",
    "FFMA": r"FFMA(\..*)?",
    "FMUL": r"FMUL(\..*)?",
    "FADD": r"FADD(\..*)?",
    "FMNMX": r"FMNMX(\..*)?",
    "SHFL": r"SHFL(\..*)?",
    "HFMA2": r"HFMA2(\..*)?",
    "HMUL2": r"HMUL2(\..*)?",
    "HMNMX2": r"HMNMX2(\..*)?",
    "LOP3": r"LOP3(\..*)?",
    "F2FP": r"F2FP(\..*)?",
}
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRA = re.compile(r"^(@!?U?P[0-9T]+\s+)?BRA\s+`?\(?(\.L_x_\d+)\)?`?")


def _sass_lines(sass: str):
    """[(kind, text)] in program order: ("label", name) or ("instr", instruction text)."""
    out = []
    for line in sass.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            out.append(("label", m.group(1)))
            continue
        m = _LINE.match(line)
        if m:
            out.append(("instr", m.group(2).rstrip(" ;")))
    return out


def _family_counts(instrs, families):
    fams = {k: re.compile(v + r"$") for k, v in families.items()}
    counts = {k: 0 for k in families}
    for ins in instrs:
        m = _INSTR.match("/*0000*/ " + ins)
        op = m.group(1) if m else ""
        for k, rx in fams.items():
            if rx.match(op):
                counts[k] += 1
    counts["total"] = len(instrs)
    return counts


def conditional_loops(lines) -> list[tuple[int, int]]:
    """(label index, branch index) in _sass_lines(sass) of every loop closed by a conditional
    backward branch, in program order of the branch."""
    where = {t: i for i, (k, t) in enumerate(lines) if k == "label"}
    out = []
    for i, (kind, text) in enumerate(lines):
        if kind != "instr":
            continue
        m = _BRA.match(text)
        if m and m.group(1) and m.group(2) in where and where[m.group(2)] < i:
            out.append((where[m.group(2)], i))
    return out


def overlap_loops(sass: str, families: dict[str, str] | None = None) -> list[dict]:
    """Per overlapped main loop of a kernel (a conditional backward branch whose body holds
    HGMMA and a ``WARPGROUP.DEPBAR.LE gsb0, 0x1``): where the score stage sits relative to
    the PV wait.  The body splits at the first ``DEPBAR ... 0x1`` (S_n ready, P_{n-1}V in
    flight) and the next ``DEPBAR ... 0x0`` (PV landed) into ``before`` (loop top to 0x1:
    GEMM issue), ``overlap`` (0x1 to 0x0: runs under PV) and ``after`` (0x0 to the branch);
    each holds opcode-family counts (STAGE_FAMILIES by default) plus ``total``.
    ``masked`` is True for a body with 16 or more ISETP (the causal mask compares key
    columns; a mask-free body has a handful) and ``lines`` the body's index range in
    ``_sass_lines``.  The mask-free (interior) loop is the one
    with ``masked`` False."""
    fam = families or STAGE_FAMILIES
    lines = _sass_lines(sass)
    loops = []
    for start, i in conditional_loops(lines):
        body = [t for k, t in lines[start:i + 1] if k == "instr"]
        label = lines[start][1]
        dep1 = [j for j, t in enumerate(body) if t.startswith("WARPGROUP.DEPBAR") and t.endswith("0x1")]
        if not dep1 or not any(t.startswith("HGMMA") for t in body):
            continue
        a = dep1[0]
        dep0 = [j for j, t in enumerate(body[a:], a) if t.startswith("WARPGROUP.DEPBAR") and t.endswith("0x0")]
        b = dep0[0] if dep0 else len(body)
        loops.append(dict(
            label=label, lines=(start, i), masked=sum(t.startswith("ISETP") for t in body) >= 16,
            before=_family_counts(body[:a], fam), overlap=_family_counts(body[a + 1:b], fam),
            after=_family_counts(body[b + 1:], fam)))
    return loops


def overlap_report(sass: str) -> str:
    """One line per overlapped loop: stage opcodes under PV (between the two waits) / after
    the PV wait, e.g. ``interior: MUFU 21/43 FFMA 60/4 ...``."""
    rows = []
    for lp in overlap_loops(sass):
        ov, af = lp["overlap"], lp["after"]
        parts = " ".join(f"{k} {ov[k]}/{af[k]}" for k in ov if ov[k] or af[k])
        rows.append(f"{'masked' if lp['masked'] else 'interior'} {lp['label']}: {parts}")
    return "\n".join(rows)


def main(argv=None) -> int:
    """``python -m flash_attn_poly.kernels.sass FILE.cubin``: print opcode family counts."""
    import json

    argv = sys.argv[1:] if argv is None else argv
    for path in argv:
        with open(path, "rb") as f:
            text = disassemble(f.read())
        print(json.dumps({path: count_opcodes(text)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
