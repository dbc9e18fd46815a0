"""memlib.io.deferred_package on package trees written to tmp_path: the body is deferred only when
it is nothing but imports of the package's own submodules, its submodules import alone (also one
that asks the package for a sibling, as lance_namespace's REST client does), its names resolve
when asked, from any number of threads at once, and any other layout is imported as usual."""
from __future__ import annotations

import sys
import threading
import uuid
from pathlib import Path

import pytest

from memlib.io.deferred_package import DeferredPackage, defer_body, only_own_imports


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A function writing a package (a fresh name each test: the {pkg} of its files) under
    tmp_path on sys.path; returns the name. Its modules leave sys.modules after the test."""
    pkg = "fakepkg_" + uuid.uuid4().hex[:10]
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(files: dict[str, str]) -> str:
        _write(tmp_path / pkg, {rel: text.replace("{pkg}", pkg) for rel, text in files.items()})
        return pkg

    yield write
    for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
        del sys.modules[name]


# like lance_namespace_urllib3_client: a body of imports, a models subpackage the users want,
# API modules they do not, and a module that asks the package for a sibling module
CLIENT = {
    "__init__.py": '"""doc"""\n__version__ = "1.2"\n'
                   "from {pkg}.api.table_api import TableApi\n"
                   "from {pkg}.api_client import ApiClient\n"
                   "from {pkg}.models.thing import Thing\n",
    "models/__init__.py": "from {pkg}.models.thing import Thing\n",
    "models/thing.py": "class Thing:\n    pass\n",
    "api/__init__.py": "from {pkg}.api.table_api import TableApi\n",
    "api/table_api.py": "from {pkg}.api_client import ApiClient\n\nclass TableApi:\n    client = ApiClient\n",
    "api_client.py": "from {pkg} import rest\n\nclass ApiClient:\n    transport = rest.Transport\n",
    "rest.py": "class Transport:\n    pass\n",
}


def test_io_deferred_body_models_alone_and_names_when_asked(tree):
    pkg = tree(CLIENT)
    assert defer_body(pkg)
    module = sys.modules[pkg]
    assert type(module) is DeferredPackage
    models = __import__(f"{pkg}.models", fromlist=["Thing"])
    assert models.Thing.__name__ == "Thing"
    assert f"{pkg}.api" not in sys.modules and f"{pkg}.api_client" not in sys.modules
    assert module.ApiClient.__name__ == "ApiClient"  # a name of the body: the body runs
    assert type(module) is not DeferredPackage and f"{pkg}.api" in sys.modules
    assert module.__version__ == "1.2" and module.TableApi.client is module.ApiClient
    with pytest.raises(AttributeError):
        module.NotThere  # noqa: B018
    assert not defer_body(pkg)  # imported already


def test_io_deferred_body_a_submodule_first_that_asks_the_package_for_a_sibling(tree):
    pkg = tree(CLIENT)
    assert defer_body(pkg)
    table_api = __import__(f"{pkg}.api.table_api", fromlist=["TableApi"])  # the body has not run
    module = sys.modules[pkg]
    assert table_api.TableApi.client.transport is module.rest.Transport
    assert module.TableApi is table_api.TableApi and module.api.TableApi is table_api.TableApi


def test_io_deferred_body_runs_once_for_threads_that_ask_at_once(tree):
    pkg = tree({
        "__init__.py": "from {pkg}.slow import Late\n",
        "slow.py": "import time\ntime.sleep(0.3)\nLate = 42\n",
    })
    assert defer_body(pkg)
    module = sys.modules[pkg]
    start = threading.Barrier(6)
    got: list = []

    def ask() -> None:
        start.wait()
        try:
            got.append(module.Late)
        except AttributeError as exc:
            got.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [42] * 6


@pytest.mark.parametrize("body", [
    "from {pkg}.sub import x\nprint('side effect')\n",       # a call
    "from {pkg}.sub import x\ndef helper():\n    return x\n",  # a definition
    "import json\nfrom {pkg}.sub import x\n",                   # an import from elsewhere
    "from {pkg}.sub import *\n",                                # names not known until run
    "from {pkg}.sub import x\nY = x + 1\n",                     # a computed value
    "from {pkg}.sub import x\nfrom {pkg}.sub import sub\n",     # a name that hides a submodule
])
def test_io_deferred_body_any_other_layout_is_a_plain_import(tree, body):
    pkg = tree({"__init__.py": body, "sub.py": "x = 1\n\ndef sub():\n    return 2\n"})
    assert not defer_body(pkg)
    assert pkg not in sys.modules
    module = __import__(pkg)
    assert type(module) is not DeferredPackage and module.x == 1


def test_io_deferred_body_not_a_package_or_not_installed(tmp_path, monkeypatch):
    name = "fakemod_" + uuid.uuid4().hex[:10]
    (tmp_path / f"{name}.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert not defer_body(name)
        assert not defer_body(name + "_missing")
        assert not defer_body("json.decoder")  # only top-level packages
    finally:
        sys.modules.pop(name, None)


def test_io_only_own_imports_reads_relative_and_absolute_imports():
    assert only_own_imports('"""d"""\nfrom .a import b\nfrom p.c import d as e\n__all__ = None\n', "p")
    assert not only_own_imports("from . import a\n", "p")  # a submodule or a name: not told apart unrun
    assert not only_own_imports("from pp.c import d\n", "p")
    assert not only_own_imports("from .a import (\n", "p")
    assert not only_own_imports("from p.a import a\n", "p", frozenset({"a"}))
    assert only_own_imports("from p.a import A\n", "p", frozenset({"a"}))
