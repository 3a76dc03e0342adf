"""What the parts of :class:`fakes.ledger.InMemoryLedger` share about their items: the
conditional write the ledger makes for them (its faults, its token) and the item a held
condition found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from dedupe_store.errors import InvalidTransitionError
from dedupe_store.records import Group, KeyClaim

Item = TypeVar("Item", KeyClaim, Group)


class ConditionalWrite(Protocol):
    """:meth:`fakes.ledger.InMemoryLedger.write`: ``change`` applied to the item at ``at``
    of ``items`` if ``condition`` holds, with a token of its own and the faults injected on
    ``operation``; (applied, the item as it is after)."""

    def __call__(
        self,
        operation: str,
        items: dict[tuple[str, str], Item],
        at: tuple[str, str],
        condition: Callable[[Item | None], bool],
        change: Callable[[Item | None, str], Item],
    ) -> tuple[bool, Item | None]: ...


def require(item: Item | None) -> Item:
    if item is None:  # a held condition never passes on an absent item
        raise InvalidTransitionError(None, "update of an absent item")
    return item
