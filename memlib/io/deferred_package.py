"""A package registered without running its ``__init__``: its submodules import alone, and its body
runs the first time a name the module lacks is asked for.

lancedb imports ``lance_namespace``, which imports ``lance_namespace_urllib3_client.models``; the
import system runs the client package's body first, and that body imports every REST API module
(each method wrapped by pydantic at import: about 0.5 CPU-s, half of lancedb's import), which a
store on a file system never calls. :func:`defer_body` registers such a package with its path and
no body; :func:`import_lancedb` (:mod:`memlib.io.lance_tables`) uses it.

Deferring is only done when it cannot change what the package does: the body (read, not run) holds
nothing but a docstring, imports from the package's own submodules and constants bound to names
(none of them named as a submodule).
Any other body (a function, a call, an import from elsewhere), a module that is not a source
package, or a package already imported: nothing is registered and the caller imports as usual.
``importlib.util.LazyLoader`` does not fit: any attribute, ``__path__`` too (asked by every
submodule import), runs the body."""
from __future__ import annotations

import ast
import importlib.util
import pkgutil
import sys
import threading
import types
from importlib.abc import Loader
from importlib.machinery import ModuleSpec, SourceFileLoader
from typing import Any


def only_own_imports(source: str, package: str, submodules: frozenset[str] = frozenset()) -> bool:
    """Whether a package body ``source`` is only a docstring, imports from ``package``'s own
    submodules and constant assignments, none of them binding the name of one of its
    ``submodules`` (the package's attribute would then be that name, not the submodule): running
    it later (or never) changes nothing but when those submodules load."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    own = package + "."
    bound: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if isinstance(stmt, ast.ImportFrom) and "*" not in (a.name for a in stmt.names) and (
                (stmt.level == 0 and (stmt.module or "").startswith(own)) or (stmt.level == 1 and stmt.module)):
            bound.update(a.asname or a.name for a in stmt.names)
            continue
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and all(
                isinstance(t, ast.Name) for t in stmt.targets):
            bound.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
            continue
        return False
    return not bound & submodules


def deferrable_spec(name: str) -> ModuleSpec | None:
    """The spec of top-level package ``name`` when its body may be deferred (see the module's
    docstring); None otherwise (not installed, not a source package, a body that does more)."""
    if "." in name or name in sys.modules:
        return None
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None or not isinstance(spec.loader, SourceFileLoader):
        return None
    try:
        source = spec.loader.get_source(name)
    except (ImportError, OSError):
        return None
    submodules = frozenset(m.name for m in pkgutil.iter_modules(spec.submodule_search_locations))
    return spec if source is not None and only_own_imports(source, name, submodules) else None


class _Body:
    """A deferred package's body: its loader, and a lock the threads asking for it share."""

    def __init__(self, loader: Loader):
        self.loader, self.lock, self.running = loader, threading.RLock(), False


_BODIES: dict[str, _Body] = {}  # package name -> its body not run yet
_REGISTER = threading.Lock()


class DeferredPackage(types.ModuleType):
    """A registered package whose body has not run. A name it lacks that is one of its submodules
    is that submodule, imported (as ``from package import submodule`` does; its own modules do so
    while the body has not run, and running it then would be a circular import); any other name
    runs the body (once, other threads wait for it), and the module is a plain module from then on.
    Asked again by the body itself (a circular import), a missing name raises AttributeError as a
    module being imported does."""

    def __getattr__(self, attr: str) -> Any:
        body = _BODIES.get(self.__name__)
        if body is not None and not (attr.startswith("__") and attr.endswith("__")):
            sub = f"{self.__name__}.{attr}"
            if sub in sys.modules or importlib.util.find_spec(sub) is not None:
                return importlib.import_module(sub)
        if body is not None:
            with body.lock:
                if type(self) is DeferredPackage and not body.running:
                    body.running = True
                    try:
                        body.loader.exec_module(self)
                        self.__class__ = types.ModuleType
                        _BODIES.pop(self.__name__, None)
                    finally:
                        body.running = False
        try:
            return self.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}") from None


def defer_body(name: str) -> bool:
    """Register top-level package ``name`` in ``sys.modules`` without running its body, when that
    cannot change what it does; returns whether it was registered (else import it as usual)."""
    with _REGISTER:
        spec = deferrable_spec(name)
        if spec is None:
            return False
        module = importlib.util.module_from_spec(spec)
        _BODIES[name] = _Body(spec.loader)
        module.__class__ = DeferredPackage
        sys.modules[name] = module
        return True
