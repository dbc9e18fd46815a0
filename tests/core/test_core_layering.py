"""The three packages depend one way: jobs -> pipelines -> memlib (jobs may also use memlib).

Checked by parsing every module's imports (including imports inside functions), so a lazy
``from jobs.build import run_build`` inside the library is caught as well as a top-level one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package -> top-level packages of this repository it must never import
FORBIDDEN = {
    "memlib": {"jobs", "pipelines", "ray", "tests"},
    "pipelines": {"jobs", "tests"},
    "jobs": {"tests"},
}


def imported_roots(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def violations(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, root in imported_roots(path):
            if root in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {root}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_downwards(package):
    assert violations(package) == []


def test_the_checker_sees_lazy_imports(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from jobs.build import run_build\n    import pipelines.shard\n")
    assert imported_roots(mod) == [(2, "jobs"), (3, "pipelines")]


def test_no_directory_is_named_like_a_build_artefact():
    """pytest's default norecursedirs and ruff's default exclude skip any directory called
    ``build`` or ``dist``: a source or test folder of that name would be silently ignored."""
    names = {"build", "dist", "_build"}
    found = [str(p.relative_to(ROOT)) for top in ("memlib", "pipelines", "jobs", "tests")
             for p in (ROOT / top).rglob("*") if p.is_dir() and p.name in names]
    assert found == []


def test_no_module_imports_a_private_name_of_another():
    bad = []
    for top in ("memlib", "pipelines", "jobs"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                    if private:
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module} {private}")
    assert bad == []


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules of this repository it imports (lazy imports included; a package's
    ``__init__`` is the package)."""
    mods: dict[str, Path] = {}
    for top in FORBIDDEN:
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target)
                if found and found != mod and not mod.startswith(found + "."):
                    graph[mod].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (its strongly connected components of two or more modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(module_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """memlib's packages (``memlib.embed``, ``memlib.retrieve``, ... and its top-level modules) ->
    the others they import."""
    def package(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        if mod.startswith("memlib."):
            out.setdefault(package(mod), set()).update(
                package(t) for t in targets if t.startswith("memlib.") and package(t) != package(mod))
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def test_memlib_packages_import_one_way():
    """No two of memlib's packages import each other, directly or round a longer loop: the token
    encoder lives in memlib.embed (the build and retrieval both use it), and the build's
    packages never import retrieval's."""
    assert cycles(package_graph(module_graph())) == []
    assert cycles(package_graph({"memlib.a.x": {"memlib.b.y"}, "memlib.b.y": {"memlib.a.z"}, "memlib.a.z": set()})) \
        == [["memlib.a", "memlib.b"]]
