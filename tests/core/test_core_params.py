"""No function of the build path takes more than six parameters: a longer list is a context or an
options object that wants to exist (pipelines.context.BuildContext, jobs.api.BuildOptions).

Counted from the source with ``ast``, nested functions and methods included: every positional,
keyword-only and positional-only parameter, ``*args`` and ``**kwargs`` one each, ``self``/``cls``
not counted.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOST = 6

# the build's modules: its driver, the Ray pipeline and the library stages it runs
BUILD_PATH = ("jobs/builder", "jobs/api.py", "jobs/build.py", "jobs/nightly.py", "jobs/local_ray.py", "pipelines",
              "memlib/compose", "memlib/io", "memlib/extract", "memlib/text", "memlib/embed", "memlib/graph",
              "memlib/schema.py", "memlib/ids.py")

# functions allowed over six (none): an entry leaves the list when its function is brought to six
ALLOWED: set[str] = set()


def count(args: ast.arguments) -> int:
    names = [a.arg for a in args.posonlyargs + args.args]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int, int]]:
    """(qualified name, line, parameters) of every function and method under ``tree``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node.lineno, count(node.args)
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def too_long() -> dict[str, str]:
    """``path:qualname`` -> ``path:line qualname (n parameters)`` of every build-path function over six."""
    out = {}
    for part in BUILD_PATH:
        base = ROOT / part
        for path in sorted(base.rglob("*.py")) if base.is_dir() else [base]:
            rel = path.relative_to(ROOT).as_posix()
            for name, line, n in functions(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
                if n > MOST:
                    out[f"{rel}:{name}"] = f"{rel}:{line} {name} ({n} parameters)"
    return out


def test_the_counting_rule():
    src = ("class A:\n"
           "    def m(self, a, b, c, d, e, f): pass\n"
           "    @classmethod\n"
           "    def c(cls, a, b, c, d, e, *args, **kw): pass\n"
           "def f(a, /, b, *, c, d, e, f, g): pass\n"
           "def outer():\n"
           "    def inner(a, b, c, d, e, f, *rest): pass\n")
    got = {name: n for name, _, n in functions(ast.parse(src))}
    assert got == {"A.m": 6, "A.c": 7, "f": 7, "outer": 0, "outer.inner": 7}


def test_no_build_path_function_takes_more_than_six_parameters():
    found = too_long()
    assert all((ROOT / part).exists() for part in BUILD_PATH)
    extra = [found[k] for k in sorted(set(found) - ALLOWED)]
    assert not extra, "more than 6 parameters (group them in a context or options object):\n" + "\n".join(extra)
    done = sorted(ALLOWED - set(found))
    assert not done, f"at six parameters or fewer now (or gone): take them off ALLOWED: {done}"
