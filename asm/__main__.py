"""``python -m flash_attn_poly.asm count`` | ``show NAME`` | ``list``.

count: JSON {block: {"instructions": n, "fma": m}} for every main block of the table.
show:  the block's PTX text (as inlined), its constraint string and its programs.
--table PATH uses another coefficient table (default: flash_attn_poly/data/programs.json).
"""
import argparse
import json
import sys

from . import blocks, programs


def count(table) -> dict:
    out = {}
    for name in blocks.MAIN_BLOCKS:
        try:
            blk = blocks.get_block(name, table)
        except KeyError as err:       # a program the table does not have (yet)
            out[name] = {"error": str(err)}
            continue
        out[name] = {"instructions": blk.n_instructions, "fma": blk.n_fma}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flash_attn_poly.asm")
    ap.add_argument("command", choices=["count", "show", "list"])
    ap.add_argument("name", nargs="?")
    ap.add_argument("--table", default=None)
    args = ap.parse_args(argv)
    table = programs.load_table(args.table)
    if args.command == "count":
        print(json.dumps(count(table), indent=1))
    elif args.command == "list":
        print("\n".join(blocks.BUILDERS))
    else:
        if not args.name:
            ap.error("show needs a block name")
        blk = blocks.get_block(args.name, table)
        print(f"// {blk.name}: {blk.n_instructions} instructions, {blk.n_fma} fma; "
              f"constraints \"{blk.constraints()}\"; programs {', '.join(blk.programs)}")
        print(blk.asm_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
