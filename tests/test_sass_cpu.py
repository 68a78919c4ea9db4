"""CPU tier of kernels/sass.py's text side: opcode families counted on synthetic SASS lines."""
from flash_attn_poly.kernels import sass

TEXT = """
        /*0010*/                   MUFU.EX2 R1, R2 ;
        /*0020*/              @!P0 MUFU.EX2.FTZ R3, R4 ;
        /*0030*/                   MUFU.TANH R5, R6 ;
        /*0040*/                   FFMA2 R8, R8, R9, R10 ;
        /*0050*/                   FFMA R11, R12, R13, R14 ;
        /*0060*/                   UTCHMMA tmem[UR4], gdesc[UR6], tmem[UR8] ;
"""


def test_families_count_an_opcode_with_its_modifiers_only():
    fam = sass.families("MUFU.EX2", "MUFU", "FFMA", "FFMA2")
    assert fam["MUFU.EX2"] == r"MUFU\.EX2(\..*)?" and fam["FFMA2"] == r"FFMA2(\..*)?"
    assert sass.count_opcodes(TEXT, fam) == {"MUFU.EX2": 2, "MUFU": 3, "FFMA": 1, "FFMA2": 1}
    # the named families of FAMILIES are these regexes
    assert {k: sass.FAMILIES[k] for k in ("MUFU.EX2", "MUFU", "FFMA", "STL")} == \
        sass.families("MUFU.EX2", "MUFU", "FFMA", "STL")


def test_sm100_table_families():
    """tests/fa4_builds.py's families (the SM100 tables): tcgen05 MMA first, then its opcodes and
    the extra ones bench/tools/sm100_sass.py asks for, each counted with its modifiers."""
    import fa4_builds as fb
    fam = fb.families("FMUL")
    assert list(fam) == ["UTCMMA (tcgen05.mma)", *fb.OPCODES, "FMUL"]
    c = sass.count_opcodes(TEXT, fam)
    assert c["UTCMMA (tcgen05.mma)"] == 1 and c["MUFU.EX2"] == 2 and c["MUFU.TANH"] == 1 and c["FFMA2"] == 1
