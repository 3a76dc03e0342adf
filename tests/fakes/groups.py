"""``InMemoryGroupLedger``: the claim groups of :class:`dedupe_store.contract.GroupLedger` in
a dict, the part of :class:`fakes.ledger.InMemoryLedger` that keeps them.

Same conditional semantics as :class:`dedupe_store.groups.DynamoDBGroupLedger`::

    open group:      group absent                                  ──> OPEN epoch 1
    renew:           OPEN and epoch = held and lease > now + skew  ──> OPEN epoch + 1
    take over group: OPEN and epoch = seen and lease + skew <= now ──> OPEN epoch + 1
    record / settle: OPEN and epoch = held                         ──> OPEN / SETTLED

The sparse in-flight index holds exactly the OPEN groups, ordered like the GSI: by bucket, then
lease expiry, then the group's key. It shares the ledger's lock (reentrant), its fault knobs
and its conditional write.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from dedupe_store.inflight import Cursor, bucket_of, walk_items
from dedupe_store.names import check_stream_name
from dedupe_store.records import Group, GroupUpdate, Position
from dedupe_store.states import GroupState, GroupTransition, next_group_state
from fakes.items import ConditionalWrite, require


class InMemoryGroupLedger:
    """Claim groups and their in-flight index. Thread-safe: the ledger's lock around every
    call."""

    def __init__(
        self,
        lock: threading.RLock,
        read_fault: Callable[[str], None],
        write: ConditionalWrite,
        *,
        dedupe_ttl_s: int,
        inflight_buckets: int,
    ) -> None:
        """``read_fault``: raises the fault injected on the ledger for a call, if any;
        ``write``: the ledger's conditional write (its faults, its token)."""
        self._lock = lock
        self._read_fault = read_fault
        self._write = write
        self.dedupe_ttl_s = dedupe_ttl_s
        self.inflight_buckets = inflight_buckets
        # (stream, group id) -> the group: read by the ledger's joins, under its lock
        self.groups: dict[tuple[str, str], Group] = {}

    # --- reads ------------------------------------------------------------------------------

    def get_group(self, stream: str, group_id: str) -> Group | None:
        with self._lock:
            self._read_fault("get_group")
            return self.groups.get((check_stream_name(stream), group_id))

    def batch_get_groups(self, stream: str, group_ids: Iterable[str]) -> dict[str, Group]:
        with self._lock:
            self._read_fault("batch_get_groups")
            return {
                group_id: group
                for group_id in group_ids
                if (group := self.groups.get((stream, group_id))) is not None
            }

    def stale_groups(
        self,
        stream: str,
        *,
        now_ms: int,
        buckets: Sequence[int] | None = None,
        page_size: int = 500,
    ) -> Iterator[str]:
        """Groups whose lease ended before ``now_ms`` (strictly), bucket by bucket."""
        with self._lock:
            self._read_fault("stale_groups")

        def read_page(
            bucket: int, limit: int, after: Cursor | None
        ) -> tuple[list[str], Cursor | None]:
            page, cursor = self._index_page(stream, bucket, now_ms, limit, after)
            return [pk.rsplit("/", 1)[1] for _, pk in page], cursor

        found = walk_items(
            read_page, buckets=buckets, inflight_buckets=self.inflight_buckets, page_size=page_size
        )
        return iter(list(found))  # read now, as the call is made

    def in_flight_page(
        self,
        stream: str,
        bucket: int,
        *,
        before_ms: int | None,
        limit: int,
        after_lease_ms: int | None = None,
        after_pk: str | None = None,
    ) -> tuple[list[str], tuple[int, str] | None]:
        """One page of a bucket's OPEN groups in index order, expanded into their members."""
        after = (after_lease_ms, after_pk) if after_lease_ms is not None and after_pk else None
        with self._lock:
            page, cursor = self._index_page(stream, bucket, before_ms, limit, after)
            keys = [
                key for _, pk in page for key in self.groups[(stream, pk.rsplit("/", 1)[1])].members
            ]
        return keys, cursor

    def _index_page(
        self, stream: str, bucket: int, before_ms: int | None, limit: int, after: Cursor | None
    ) -> tuple[list[Cursor], Cursor | None]:
        """``(lease, group pk)`` of one page of a bucket, and DynamoDB's cursor: a full page
        has a last key, even when nothing follows."""
        with self._lock:
            index = [
                (lease_ms, group_pk(stream, group_id))
                for b, lease_ms, group_id in self._index(stream)
                if b == bucket and (before_ms is None or lease_ms < before_ms)
            ]
        if after is not None:
            index = [entry for entry in index if entry > after]
        page = index[:limit]
        return page, (page[-1] if len(page) == limit and page else None)

    def _index(self, stream: str) -> list[tuple[int, int, str]]:
        """The sparse GSI: (bucket, lease expiry, group id) of the OPEN groups, sorted."""
        return sorted(
            (
                bucket_of(group_id, self.inflight_buckets),
                group.lease_expires_at_ms,
                group_id,
            )
            for (s, group_id), group in self.groups.items()
            if s == stream and group.state is GroupState.OPEN
        )

    # --- writes -----------------------------------------------------------------------------

    def open_group(
        self, stream: str, members: Sequence[str], *, owner: str, now_ms: int, lease_ms: int
    ) -> Group:
        state = next_group_state(None, GroupTransition.OPEN)
        group_id = uuid.uuid4().hex[:16]

        def change(_current: Group | None, token: str) -> Group:
            return Group(
                stream=stream,
                group_id=group_id,
                state=state,
                epoch=1,
                owner=owner,
                claimed_at_ms=now_ms,
                lease_expires_at_ms=now_ms + lease_ms,
                members=tuple(members),
                expires_at_s=now_ms // 1000 + self.dedupe_ttl_s,
                write_token=token,
            )

        applied, current = self._write_group(
            "open_group", stream, group_id, lambda current: current is None, change
        )
        return require(current if applied else None)

    def renew_lease(self, group: Group, *, now_ms: int, lease_ms: int, skew_ms: int) -> GroupUpdate:
        next_group_state(group.state, GroupTransition.RENEW)

        def condition(current: Group | None) -> bool:
            return _holds(current, group.epoch) and require(current).lease_expires_at_ms > (
                now_ms + skew_ms
            )

        def change(current: Group | None, token: str) -> Group:
            return dataclasses.replace(
                require(current),
                epoch=group.epoch + 1,
                lease_expires_at_ms=now_ms + lease_ms,
                write_token=token,
            )

        return GroupUpdate(
            *self._write_group("renew_lease", group.stream, group.group_id, condition, change)
        )

    def take_over_group(
        self, seen: Group, *, owner: str, now_ms: int, lease_ms: int, skew_ms: int
    ) -> GroupUpdate:
        next_group_state(seen.state, GroupTransition.TAKE_OVER)

        def condition(current: Group | None) -> bool:
            return _holds(current, seen.epoch) and require(current).lease_expired(now_ms, skew_ms)

        def change(current: Group | None, token: str) -> Group:
            return dataclasses.replace(
                require(current),
                epoch=seen.epoch + 1,
                owner=owner,
                lease_expires_at_ms=now_ms + lease_ms,
                write_token=token,
            )

        return GroupUpdate(
            *self._write_group("take_over_group", seen.stream, seen.group_id, condition, change)
        )

    def record_positions(
        self, group: Group, positions: Mapping[str, Position], *, settle: bool, now_ms: int
    ) -> GroupUpdate:
        target = next_group_state(
            group.state, GroupTransition.SETTLE if settle else GroupTransition.RECORD
        )
        merged = group.with_positions(positions)

        def change(current: Group | None, token: str) -> Group:
            return dataclasses.replace(
                require(current),
                state=target,
                positions=merged,
                recorded_at_ms=now_ms,
                write_token=token,
            )

        return GroupUpdate(
            *self._write_group(
                "record_positions",
                group.stream,
                group.group_id,
                lambda current: _holds(current, group.epoch),
                change,
            )
        )

    def _write_group(
        self,
        operation: str,
        stream: str,
        group_id: str,
        condition: Callable[[Group | None], bool],
        change: Callable[[Group | None, str], Group],
    ) -> tuple[bool, Group | None]:
        # a key is built here, as DynamoDBGroupLedger builds its item keys: the name is checked
        return self._write(
            operation, self.groups, (check_stream_name(stream), group_id), condition, change
        )


def group_pk(stream: str, group_id: str) -> str:
    """The group's key, as :func:`dedupe_store.groups.group_pk` spells it."""
    return f"__keo__/group/{check_stream_name(stream)}/{group_id}"


def _holds(current: Group | None, epoch: int) -> bool:
    return current is not None and current.state is GroupState.OPEN and current.epoch == epoch
