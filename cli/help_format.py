"""How ``keo --help`` presents options: a flag shows no value type, since it takes none.

typer's help prints a type for every option, ``<bool>`` for ``--json`` too, though
``--json true`` is refused. Commands and groups of ``keo`` use these classes, which blank the
type of every flag (on/off switches, ``--help``, the ``-v`` counter) before help is drawn.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup


def _without_flag_types(params: list[Any]) -> list[Any]:
    for param in params:
        takes_no_value = getattr(param, "is_flag", False) or getattr(param, "count", False)
        if takes_no_value and param.metavar is None:
            param.metavar = ""
    return params


class KeoCommand(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))


class KeoGroup(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))
