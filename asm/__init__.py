"""flash_attn_poly.asm: PTX inline-asm blocks for the polynomial programs.

blocks.py     PtxBlock / get_block(name, table=None): block text built from programs.json
ptxgen.py     per-form op sequences (the fused order of fit/runtime.py)
emulator.py   bit-exact numpy emulator of the PTX subset (runs the block text itself)
fpbits.py     exact 16-bit float numerics behind the emulator
reference.py  expected block outputs from fit.runtime, all-pattern test inputs
cute_ops.py   CuTe DSL llvm.inline_asm wrappers (imports cutlass; kernels only)
selftest_kernel.py  one-thread-per-element CuTe kernel mapping arrays through a block
CLI: python -m flash_attn_poly.asm count | show NAME | list
"""
