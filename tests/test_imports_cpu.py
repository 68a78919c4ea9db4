"""Imports flow one way: interface -> plan -> kernels (scores, config, dispatch) -> asm; the
fitting toolkit only writes the coefficient table.  Checked on the source (every import
statement, at any depth), so a lazy import inside a function counts too."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# layer of a module path (relative to the repository), and the layers each may import
LAYERS = {
    "asm": {"asm"},
    "kernels": {"kernels", "asm"},
    "plan": {"plan", "kernels", "asm"},
    "api": {"api", "plan", "kernels", "asm"},
    "fit": {"fit", "asm"},
}


def _layer(rel: str) -> str:
    if rel.startswith("asm/"):
        return "asm"
    if rel.startswith("kernels/"):
        return "kernels"
    if rel.startswith("flash_attn_poly/fit/"):
        return "fit"
    if rel == "flash_attn_poly/plan.py":
        return "plan"
    return "api"


def _target(mod: str, rel: str, level: int) -> str:
    """The layer an import of `mod` (relative level `level`) from file `rel` reaches."""
    if level:
        base = os.path.dirname(rel).split("/")[: max(0, len(os.path.dirname(rel).split("/")) - (level - 1))]
        mod = ".".join(base + ([mod] if mod else []))
        mod = mod.replace("/", ".")
    parts = mod.split(".")
    if parts[0] in ("asm", "kernels"):
        return parts[0]
    if parts[0] != "flash_attn_poly":
        return ""
    if len(parts) == 1:
        return "api"
    sub = parts[1]
    return {"asm": "asm", "kernels": "kernels", "fit": "fit", "plan": "plan"}.get(sub, "api")


def _files():
    for top in ("flash_attn_poly", "kernels", "asm"):
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            for n in names:
                if n.endswith(".py"):
                    path = os.path.join(d, n)
                    yield os.path.relpath(path, ROOT).replace(os.sep, "/"), path


def test_imports_flow_one_way():
    bad = []
    for rel, path in _files():
        src = _layer(rel)
        tree = ast.parse(open(path).read(), filename=rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.module or not node.level else [a.name for a in node.names]
                targets = [_target(n, rel, node.level) for n in names]
                if node.level and not node.module:   # from . import x, y
                    targets = [_target(a.name, rel, node.level) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [_target(a.name, rel, 0) for a in node.names]
            else:
                continue
            for t in targets:
                if t and t not in LAYERS[src] and not (src == "fit" and t == "fit"):
                    bad.append(f"{rel}:{node.lineno} ({src}) imports {t}")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_nothing_in_the_product_imports_fit():
    offenders = []
    for rel, path in _files():
        if _layer(rel) == "fit" or rel.endswith("__main__.py"):
            continue
        text = open(path).read()
        if "flash_attn_poly.fit" in text.replace("flash_attn_poly.fit`", "") and "import" in text:
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    if any(m.startswith("flash_attn_poly.fit") for m in mods):
                        offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders
