"""Old module paths that keep working for one release, with a DeprecationWarning.

The 0.2 layout moved modules (``cc2ops.cuda.device`` is
``cc2ops.cuda.runtime.device`` now, ``cc2ops.graph.lift`` is
``cc2ops.cuda.rewriting.lift``; README's Development section has the map). A
package declares its moved modules with :func:`install`; then every way of
reaching an old path gives the module at its new path, under its own name, and
warns once, naming both:

- ``import cc2ops.cuda.device`` and ``from cc2ops.cuda.device import X`` go
  through a finder put first on ``sys.meta_path``. It only answers for the
  declared old names, and it answers before the regular finders: a declared
  move is authoritative, so a stale copy of the old module that another
  finder could still reach (a leftover file, or an editable install's finder
  that maps ``cc2ops`` to another checkout and serves the submodules missing
  here from there) never shadows the new module;
- ``from cc2ops.cuda import device`` and ``cc2ops.cuda.device`` go through the
  package's module ``__getattr__`` (see :func:`package_getattr`).

The new module is imported by name, and only when an old path is used, so a
package that declares an alias does not depend on the module it points to:
``cc2ops.graph`` can alias a path into ``cc2ops.cuda`` and still never import
CUDA code (the import contracts in ``pyproject.toml`` check that).

A moved *package* keeps its old directory with only an ``__init__`` that
declares its moved submodules and calls :func:`warn_moved_package`: importing
the old package then warns too, and its submodules' old paths resolve as above
(an alias of the package object itself would make the import system look for
the old submodule names in the new package's directory).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["install", "package_getattr", "aliases", "warn_moved_package"]

_ALIASES: dict[str, str] = {}
_lock = threading.Lock()
_finder_installed = False


def aliases() -> dict[str, str]:
    """Every declared ``{old dotted path: new dotted path}`` (a copy)."""
    return dict(_ALIASES)


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path works until the next release",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _AliasLoader(importlib.abc.Loader):
    """Hands out the module at the new path for an import of the old one."""

    def __init__(self, old: str, new: str) -> None:
        self.old = old
        self.new = new
        self._spec: Any = None

    def create_module(self, spec: Any) -> ModuleType:
        # 3: past _warn and this method; the import machinery's own frames are
        # skipped by warnings, so the warning points at the import statement
        _warn(self.old, self.new, stacklevel=3)
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import machinery stamped the alias spec on the real module after
        # create_module; give the module its own spec back (pickling, reload)
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        new = _ALIASES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new))


def install(table: dict[str, str]) -> None:
    """Declare moved modules: ``{old dotted path: new dotted path}`` (idempotent)."""
    global _finder_installed
    with _lock:
        _ALIASES.update(table)
        if not _finder_installed:
            sys.meta_path.insert(0, _AliasFinder())
            _finder_installed = True


def package_getattr(package: str) -> Callable[[str], ModuleType]:
    """A module ``__getattr__`` for ``package`` that resolves its moved submodules.

    Use as ``__getattr__ = package_getattr(__name__)`` in the package's
    ``__init__``; any other missing attribute raises ``AttributeError`` as usual.
    """

    def __getattr__(name: str) -> ModuleType:
        old = f"{package}.{name}"
        new = _ALIASES.get(old)
        if new is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _warn(old, new, stacklevel=3)
        module = importlib.import_module(new)
        # cache it on the package: `from pkg import old` looks the name up
        # twice, and one warning is enough
        setattr(sys.modules[package], name, module)
        return module

    return __getattr__


def warn_moved_package(old: str, new: str) -> None:
    """Warn that the package ``old`` moved to ``new``; ``old``'s ``__init__`` calls it.

    The warning points at the statement importing ``old`` (the import
    machinery's frames are skipped) and is given once, as the package's
    ``__init__`` runs once.
    """
    # 4: past _warn, this function and the old package's __init__
    _warn(old, new, stacklevel=4)
