"""flash_attn_poly.asm: PTX inline-asm blocks for the polynomial programs.

programs.py   load_table (the one table loader), ProgramSpec / spec(name, table=None): what a
              kernel needs to know about a program, derived from its table entry's form
blocks.py     PtxBlock / block_for(spec, role): block text built from a program's spec;
              get_block(name, table=None): the named blocks (CLI, elementwise kernels, tests)
ptxgen.py     per-form op sequences (the fused order of fit/runtime.py)
emulator.py   bit-exact numpy emulator of the PTX subset (runs the block text itself)
fpbits.py     exact 16-bit float numerics behind the emulator
cute_ops.py   CuTe DSL llvm.inline_asm wrappers (imports cutlass; kernels only)
CLI: python -m flash_attn_poly.asm count | show NAME | list
asm imports nothing from kernels, plan or fit (the expected block outputs from fit.runtime
and the GPU self-test kernel live in tests/asm_reference.py and tests/asm_selftest.py).
"""
