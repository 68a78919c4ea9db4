"""Every default of the plan is a row with a reason and, where a measurement chose it, the tag of
its line in docs/MEASURED.md (the row and the fact cannot drift apart silently)."""
import os
import re

from flash_attn_poly import plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = ("PROGRAM_ROWS", "SPLIT_ROWS", "GRAD_ROWS", "FWD_ROWS", "BWD_ROWS")


def test_every_row_has_a_reason_and_a_known_tag():
    text = open(os.path.join(ROOT, "docs", "MEASURED.md")).read()
    tags = set(re.findall(r"^- \*\*([a-z0-9-]+)\*\*:", text, flags=re.M))
    assert tags, "docs/MEASURED.md has no tagged lines"
    for table in TABLES:
        for row in getattr(plan, table):
            assert isinstance(row, plan.Row) and row.why.strip(), (table, row)
            assert row.sets, (table, row)
            if row.measured:
                assert row.measured in tags, f"{table}: row tag {row.measured!r} is not a line of docs/MEASURED.md"


def test_measured_rows_cover_the_tunable_defaults():
    """Rows that set a timing choice (not a structural necessity) cite a measurement."""
    # swap: the D = 256 kernel class (attn_bwd_swap_sm90), like varlen; a row turning it on also sets
    # head_loop, a timing choice, so it still needs its measurement
    structural = {"tile_m", "tile_n", "num_stages", "stages", "deterministic", "varlen", "swap"}
    for table in ("FWD_ROWS", "BWD_ROWS"):
        for row in getattr(plan, table):
            if set(row.sets) - structural - {"dq_async"} and not row.measured:
                raise AssertionError(f"{table}: {row.sets} has no docs/MEASURED.md tag")
