"""``DynamoDBGroupLedger``: claim groups, on the ledger's table.

Its kind of item::

    group item  pk "__keo__/group/<stream>/<id>"     state, epoch, owner, lease, members,
                                                      positions; in the in-flight index while OPEN

A group item is written when the group opens (a put conditional on a new id), when its lease
is renewed or taken over, and when its positions are recorded (each an update conditional on
the state and epoch the caller holds, through :class:`dedupe_store.table.DynamoDBTable`, whose
token recognises an SDK retry of an applied write). The conditions are in
:mod:`dedupe_store.expressions`, the transitions in :mod:`dedupe_store.states`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dedupe_store import expressions as x
from dedupe_store.expressions import TTL_ATTRIBUTE
from dedupe_store.inflight import Cursor, bucket_of, bucket_partition, walk_items
from dedupe_store.names import check_stream_name
from dedupe_store.packing import pack_members, pack_positions, unpack_members, unpack_positions
from dedupe_store.records import Group, GroupUpdate, Position
from dedupe_store.states import GroupState, GroupTransition, next_group_state
from dedupe_store.table import (
    CONDITION_FAILED,
    VENDOR_ERRORS,
    DynamoDBTable,
    binary_of,
    code_of,
    number_of,
    text_of,
)

if TYPE_CHECKING:
    from dedupe_store.contract import GroupLedger

__all__ = [
    "DynamoDBGroupLedger",
    "GroupsHandedOn",
    "group_of",
    "group_pk",
    "inflight_bucket",
    "new_group_id",
]


def group_pk(stream: str, group_id: str) -> str:
    # built from a stream name that passed the rule (no "/", no "#"): never another kind's key
    return f"__keo__/group/{check_stream_name(stream)}/{group_id}"


def inflight_bucket(stream: str, group_id: str, buckets: int) -> str:
    """The in-flight index partition of an open group."""
    return bucket_partition(stream, bucket_of(group_id, buckets))


def new_group_id() -> str:
    """16 URL-safe characters, 96 random bits: unique without coordination."""
    return secrets.token_urlsafe(12)


class DynamoDBGroupLedger:
    """The claim groups of :class:`dedupe_store.contract.GroupLedger` on the ledger's table.
    Thread-safe: :class:`dedupe_store.ledger.DynamoDBLedger` holds one and hands its calls on."""

    def __init__(self, table: DynamoDBTable, *, dedupe_ttl_s: int, inflight_buckets: int) -> None:
        self._table = table
        self.dedupe_ttl_s = dedupe_ttl_s
        self.inflight_buckets = inflight_buckets

    # --- reads ------------------------------------------------------------------------------

    def get_group(self, stream: str, group_id: str) -> Group | None:
        item = self._table.get_item(
            group_pk(stream, group_id), None, "get a group", consistent=True
        )
        return None if item is None else group_of(item)

    def batch_get_groups(self, stream: str, group_ids: Iterable[str]) -> dict[str, Group]:
        items = self._table.batch_get_items([group_pk(stream, g) for g in group_ids], "get groups")
        groups = (group_of(item) for item in items)
        return {group.group_id: group for group in groups}

    def stale_groups(
        self,
        stream: str,
        *,
        now_ms: int,
        buckets: Sequence[int] | None = None,
        page_size: int = 500,
    ) -> Iterator[str]:
        """Ids of OPEN groups whose lease expired before ``now_ms``, from the sparse index.

        The index is eventually consistent: re-read each group consistently before acting.
        """

        def read_page(
            bucket: int, limit: int, after: Cursor | None
        ) -> tuple[list[str], Cursor | None]:
            page, cursor = self._query_bucket(
                stream, bucket, before_ms=now_ms, limit=limit, after=after
            )
            return [group_id for _, group_id in page], cursor

        yield from walk_items(
            read_page,
            buckets=buckets,
            inflight_buckets=self.inflight_buckets,
            page_size=page_size,
        )

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
        """Up to ``limit`` OPEN groups of a bucket, by lease expiry, expanded into their
        members (re-read consistently), with the cursor of the page's last group."""
        after = (after_lease_ms, after_pk) if after_lease_ms is not None and after_pk else None
        page, cursor = self._query_bucket(
            stream,
            bucket,
            before_ms=before_ms,
            limit=limit,
            after=after,
        )
        groups = self.batch_get_groups(stream, [group_id for _, group_id in page])
        keys = [
            key
            for _, group_id in page
            if (group := groups.get(group_id)) is not None and group.state is GroupState.OPEN
            for key in group.members
        ]
        return keys, cursor

    def _query_bucket(
        self,
        stream: str,
        bucket: int,
        *,
        before_ms: int | None,
        limit: int,
        after: tuple[int, str] | None,
    ) -> tuple[list[tuple[int, str]], tuple[int, str] | None]:
        """One page of a bucket of open groups: ``[(lease, group id)]`` and the cursor after
        it, if any. Only group items: runs are indexed in partitions of their own, and an
        item of any other kind found here is left out all the same."""
        page, cursor = self._table.query_index(
            bucket_partition(stream, bucket), before_ms=before_ms, limit=limit, after=after
        )
        prefix = group_pk(stream, "")
        found = [(lease, pk[len(prefix) :]) for lease, pk in page if pk.startswith(prefix)]
        return found, cursor

    # --- writes -----------------------------------------------------------------------------

    def open_group(
        self, stream: str, members: Sequence[str], *, owner: str, now_ms: int, lease_ms: int
    ) -> Group:
        """A new OPEN group (epoch 1) in the in-flight index; a put conditional on a new id."""
        state = next_group_state(None, GroupTransition.OPEN)
        group_id = new_group_id()
        token = secrets.token_hex(8)
        lease_expires_at_ms = now_ms + lease_ms
        item = {
            "pk": x.s(group_pk(stream, group_id)),
            "stream": x.s(stream),
            "state": x.s(state.value),
            "epoch": x.n(1),
            "owner": x.s(owner),
            "claimed_at_ms": x.n(now_ms),
            "lease_expires_at_ms": x.n(lease_expires_at_ms),
            "inflight_bucket": x.s(inflight_bucket(stream, group_id, self.inflight_buckets)),
            "members": x.b(pack_members(members)),
            TTL_ATTRIBUTE: x.n(now_ms // 1000 + self.dedupe_ttl_s),
            "write_token": x.s(token),
        }
        kwargs = {
            "TableName": self._table.table_name,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": "pk"},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        with self._table.translated("open a group"):
            try:
                self._table.client.put_item(**kwargs)
            except VENDOR_ERRORS as exc:
                # a retry of our own applied put fails its condition on our own token
                current = (
                    self.get_group(stream, group_id) if code_of(exc) == CONDITION_FAILED else None
                )
                if current is None or current.write_token != token:
                    raise  # translated on its way out
        return Group(
            stream=stream,
            group_id=group_id,
            state=state,
            epoch=1,
            owner=owner,
            claimed_at_ms=now_ms,
            lease_expires_at_ms=lease_expires_at_ms,
            members=tuple(members),
            expires_at_s=now_ms // 1000 + self.dedupe_ttl_s,
            write_token=token,
        )

    def renew_lease(self, group: Group, *, now_ms: int, lease_ms: int, skew_ms: int) -> GroupUpdate:
        next_group_state(group.state, GroupTransition.RENEW)
        values = {
            **_group_held(group.epoch),
            ":now_plus_skew": x.n(now_ms + skew_ms),
            ":next_epoch": x.n(group.epoch + 1),
            ":lease": x.n(now_ms + lease_ms),
        }
        return self._update_group(group, x.RENEW, x.RENEWABLE, values)

    def take_over_group(
        self, seen: Group, *, owner: str, now_ms: int, lease_ms: int, skew_ms: int
    ) -> GroupUpdate:
        next_group_state(seen.state, GroupTransition.TAKE_OVER)
        values = {
            **_group_held(seen.epoch),
            ":now_minus_skew": x.n(now_ms - skew_ms),
            ":next_epoch": x.n(seen.epoch + 1),
            ":owner": x.s(owner),
            ":lease": x.n(now_ms + lease_ms),
        }
        return self._update_group(seen, x.TAKE_OVER_GROUP, x.TAKEABLE, values)

    def record_positions(
        self, group: Group, positions: Mapping[str, Position], *, settle: bool, now_ms: int
    ) -> GroupUpdate:
        next_group_state(group.state, GroupTransition.SETTLE if settle else GroupTransition.RECORD)
        merged = group.with_positions(positions)
        values = {
            **_group_held(group.epoch),
            ":positions": x.b(pack_positions(len(group.members), merged)),
            ":now": x.n(now_ms),
        }
        if settle:
            values[":settled"] = x.s(GroupState.SETTLED.value)
        return self._update_group(group, x.SETTLE if settle else x.RECORD, x.GROUP_HELD, values)

    def _update_group(
        self, group: Group, update: str, condition: str, values: dict[str, Any]
    ) -> GroupUpdate:
        applied, item = self._table.update(
            group_pk(group.stream, group.group_id), None, update, condition, values
        )
        return GroupUpdate(applied, None if item is None else group_of(item))


def _group_held(epoch: int) -> dict[str, dict[str, str]]:
    return {":open": x.s(GroupState.OPEN.value), ":epoch": x.n(epoch)}


def group_of(item: Mapping[str, Any]) -> Group:
    """The group a group item holds, from DynamoDB's wire format."""
    stream = str(item["stream"]["S"])
    positions = item.get("positions")
    return Group(
        stream=stream,
        group_id=str(item["pk"]["S"])[len(group_pk(stream, "")) :],
        state=GroupState(item["state"]["S"]),
        epoch=int(item["epoch"]["N"]),
        owner=str(item["owner"]["S"]),
        claimed_at_ms=int(item["claimed_at_ms"]["N"]),
        lease_expires_at_ms=int(item["lease_expires_at_ms"]["N"]),
        members=tuple(unpack_members(binary_of(item["members"]["B"]))),
        positions=unpack_positions(binary_of(positions["B"])) if positions is not None else {},
        recorded_at_ms=number_of(item, "recorded_at_ms"),
        expires_at_s=number_of(item, TTL_ATTRIBUTE),
        write_token=text_of(item, "write_token"),
    )


class GroupsHandedOn:
    """The :class:`dedupe_store.contract.GroupLedger` methods of a whole ledger, each handed
    on to its groups part (``_group_ledger``): :class:`dedupe_store.ledger.DynamoDBLedger` and
    the tests' in-memory ledger both hold one."""

    _group_ledger: GroupLedger

    def get_group(self, stream: str, group_id: str) -> Group | None:
        return self._group_ledger.get_group(stream, group_id)

    def batch_get_groups(self, stream: str, group_ids: Iterable[str]) -> dict[str, Group]:
        return self._group_ledger.batch_get_groups(stream, group_ids)

    def stale_groups(
        self,
        stream: str,
        *,
        now_ms: int,
        buckets: Sequence[int] | None = None,
        page_size: int = 500,
    ) -> Iterator[str]:
        return self._group_ledger.stale_groups(
            stream, now_ms=now_ms, buckets=buckets, page_size=page_size
        )

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
        return self._group_ledger.in_flight_page(
            stream,
            bucket,
            before_ms=before_ms,
            limit=limit,
            after_lease_ms=after_lease_ms,
            after_pk=after_pk,
        )

    def open_group(
        self, stream: str, members: Sequence[str], *, owner: str, now_ms: int, lease_ms: int
    ) -> Group:
        return self._group_ledger.open_group(
            stream, members, owner=owner, now_ms=now_ms, lease_ms=lease_ms
        )

    def renew_lease(self, group: Group, *, now_ms: int, lease_ms: int, skew_ms: int) -> GroupUpdate:
        return self._group_ledger.renew_lease(
            group, now_ms=now_ms, lease_ms=lease_ms, skew_ms=skew_ms
        )

    def take_over_group(
        self, seen: Group, *, owner: str, now_ms: int, lease_ms: int, skew_ms: int
    ) -> GroupUpdate:
        return self._group_ledger.take_over_group(
            seen, owner=owner, now_ms=now_ms, lease_ms=lease_ms, skew_ms=skew_ms
        )

    def record_positions(
        self, group: Group, positions: Mapping[str, Position], *, settle: bool, now_ms: int
    ) -> GroupUpdate:
        return self._group_ledger.record_positions(group, positions, settle=settle, now_ms=now_ms)
