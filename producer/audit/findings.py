"""What both audits' findings are made of. Pure: no I/O.

- :class:`AnomalyLists`: exact counts of each anomaly and its first entries, in order. The key
  audit (:class:`producer.audit.stream.Findings`) keeps an entry per key, the replay audit
  (:class:`producer.audit.rows.RowFindings`) one per row. Any split of the entries, each part
  added up and the parts merged, keeps the same counts and first entries: its memory is
  bounded by ``listed``, never by the number of entries.
- Positions in stream order, and as JSON (a report's, or findings that travel between
  processes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from dedupe_store.records import Position

A = TypeVar("A", bound=StrEnum)
Entry = tuple[str, Any]  # a name (a key, a row's digest) and its detail, JSON-ready


def by_name(entry: Entry) -> Any:
    return entry[0]


@dataclass
class AnomalyLists(Generic[A]):
    """Exact counts of each anomaly and its first ``listed`` entries in ``order``."""

    listed: int
    order: Callable[[Entry], Any] = by_name
    counts: dict[A, int] = field(default_factory=dict)
    entries: dict[A, list[Entry]] = field(default_factory=dict)

    def add(self, anomaly: A, name: str, detail: Any) -> None:
        self.counts[anomaly] = self.counts.get(anomaly, 0) + 1
        kept = self.entries.setdefault(anomaly, [])
        kept.append((name, detail))
        if len(kept) >= 2 * self.listed + 1:  # sort now and then: amortised O(log listed)
            self._trim(anomaly)

    def merge(self, other: AnomalyLists[A]) -> None:
        for anomaly, count in other.counts.items():
            self.counts[anomaly] = self.counts.get(anomaly, 0) + count
        for anomaly, kept in other.entries.items():
            self.entries.setdefault(anomaly, []).extend(kept)
            self._trim(anomaly)

    def count(self, anomaly: A) -> int:
        return self.counts.get(anomaly, 0)

    def first(self, anomaly: A) -> list[Entry]:
        """The first ``listed`` entries of ``anomaly``, in order."""
        if anomaly in self.entries:
            self._trim(anomaly)
        return self.entries.get(anomaly, [])

    def _trim(self, anomaly: A) -> None:
        kept = self.entries[anomaly]
        kept.sort(key=self.order)
        del kept[self.listed :]

    def counts_json(self) -> dict[str, int]:
        return {anomaly.value: count for anomaly, count in self.counts.items()}

    def entries_json(self) -> dict[str, list[list[Any]]]:
        return {
            anomaly.value: [list(entry) for entry in self.first(anomaly)]
            for anomaly in self.entries
        }

    def load_json(
        self, kind: type[A], counts: dict[str, Any], entries: dict[str, list[list[Any]]]
    ) -> None:
        """Adds what :meth:`counts_json` and :meth:`entries_json` wrote (another process's)."""
        other: AnomalyLists[A] = AnomalyLists(self.listed, self.order)
        other.counts = {kind(name): int(count) for name, count in counts.items()}
        other.entries = {
            kind(name): [(str(name_), detail) for name_, detail in kept]
            for name, kept in entries.items()
        }
        self.merge(other)


def in_stream_order(positions: Iterable[Position]) -> list[Position]:
    """Shard by shard (shard ids sort as their numbers), then by sequence number (compared as
    integers: unique per shard only), then by sub-sequence number."""
    return sorted(
        positions, key=lambda p: (p.shard_id, int(p.sequence_number), p.sub_sequence_number or 0)
    )


def position_json(position: Position) -> dict[str, Any]:
    body: dict[str, Any] = {
        "shard_id": position.shard_id,
        "sequence_number": position.sequence_number,
    }
    if position.sub_sequence_number is not None:
        body["sub_sequence_number"] = position.sub_sequence_number
    return body


def position_of_json(body: dict[str, Any]) -> Position:
    return Position(body["shard_id"], body["sequence_number"], body.get("sub_sequence_number"))
