"""The NumPy backend's shape: no import circles between its modules, none over 500 lines, one path table."""

import ast
from pathlib import Path

import pytest

import xconv_numpy
from xconv_numpy import paths

PACKAGE = Path(xconv_numpy.__file__).resolve().parent


def _modules():
    return {".".join(f.relative_to(PACKAGE).with_suffix("").parts): f for f in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path) -> set:
    """The package's modules ``name`` imports (relative imports and absolute xconv_numpy ones)."""
    mods = _modules()
    pkg = name.split(".")[:-1] if not name.endswith("__init__") else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1] if node.level > 1 else pkg
            elif node.module and node.module.startswith("xconv_numpy"):
                base, node = [], ast.ImportFrom(module=node.module[len("xconv_numpy."):] or None, names=node.names)
            else:
                continue
            stem = base + (node.module.split(".") if node.module else [])
            for alias in node.names:
                cand = ".".join(stem + [alias.name])
                target = cand if cand in mods else ".".join(stem)
                if target in mods:
                    out.add(target)
                elif ".".join(stem + ["__init__"]) in mods:
                    out.add(".".join(stem + ["__init__"]))
    out.discard(name)
    return out


def test_no_import_circles():
    graph = {name: _imports(name, path) for name, path in _modules().items()}
    state = {}

    def visit(n, stack):
        state[n] = "open"
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open":
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m, stack + [m])
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert graph["fast"] >= {"paths", "grid.strategy_a", "grid.strategy_b"}      # the walk sees real imports


def test_no_module_over_500_lines():
    """Every module of the core (xconv/) and of every backend folder (backends/), not only this one."""
    root = Path(__file__).resolve().parent.parent
    files = [f for top in ("xconv", "backends") for f in (root / top).rglob("*.py") if "build" not in f.parts]
    assert len(files) > 50 and PACKAGE / "paths.py" in [f.resolve() for f in files]
    sizes = {str(f.relative_to(root)): len(f.read_text().splitlines()) for f in files}
    assert max(sizes.values()) <= 500, {n: s for n, s in sizes.items() if s > 500}


def test_every_rule_names_a_path_and_each_op_ends_with_a_catch_all():
    assert all(r.path in paths.PATHS for r in paths.RULES)
    for op in ("fprop", "backward"):
        last = [r for r in paths.RULES if r.op == op][-1]
        assert last.when(None, None) is True and paths.PATHS[last.path].leases_scratch    # runs under any limit


def _doc_rows(header: str) -> list:
    """The rows of the table in docs/numpy-backend.md whose header row starts with ``header``, as cell lists."""
    lines = (Path(__file__).resolve().parent.parent / "docs" / "numpy-backend.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_docs_show_the_table_the_code_has():
    """docs/numpy-backend.md: one row per path (its trace note) and the rules in the code's order."""
    doc_paths = {row[0]: row[-1] for row in _doc_rows("| path | runs |")}
    assert doc_paths == {name: p.note for name, p in paths.PATHS.items()}
    order = []
    for r in paths.RULES:                      # the cost-model rules are one row per op and output set
        path = r.path if not r.name.startswith("cost model") else "(cost model)"
        if not order or order[-1] != (r.op, path):
            order.append((r.op, path))
    doc_order = [(row[0], "(cost model)" if row[3].startswith("cost model") else row[2])
                 for row in _doc_rows("| op | outputs | path | rule |") if row[1] != "grad_bias"]
    assert doc_order == order


def test_tuning_knobs_only_through_tune():
    from xconv_numpy import tuning

    with pytest.raises(ValueError, match="unknown tuning knob"):
        with paths.tune(chunk_byte=(1, 2)):
            pass
    with paths.tune(chunk_bytes=(1, 200)):
        assert tuning.get("chunk_bytes") == (1, 200) and tuning.get("compact_inner") is None
    assert tuning.get("chunk_bytes") == tuning.KNOBS["chunk_bytes"][0]
