"""A package's names, imported when first used (PEP 562 ``__getattr__``).

Every package's ``__init__`` exports its public names this way, so that importing one module
of a package does not import all of it: importing the Kinesis reader no longer imports the
ledger (pynamodb) and the producers, and a Spark process that reads a stream starts faster.
The lowest layer, so every package can use it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    names: Mapping[str, Sequence[str]],
    *,
    own: Sequence[str] = (),
    submodules: Sequence[str] = (),
) -> tuple[Callable[[str], object], list[str]]:
    """The ``__getattr__`` of ``package``, which exports ``names`` (by the module that holds
    them) and its ``submodules``: a name is imported on first use, then kept on the package;
    and its ``__all__``: those names and the package's ``own`` (defined in its ``__init__``).
    A package lists each name here and in its ``TYPE_CHECKING`` imports (``X as X``: what type
    checkers read), which a test holds equal."""
    module_of = {name: module for module, exported in names.items() for name in exported}
    module_of.update({name: f"{package}.{name}" for name in submodules})

    def attribute(name: str) -> object:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        imported = importlib.import_module(module)
        value = imported if module == f"{package}.{name}" else getattr(imported, name)
        setattr(sys.modules[package], name, value)
        return value

    return attribute, sorted([*module_of, *own])
