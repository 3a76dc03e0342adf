"""The reconciler's resends: claims whose put can no longer land and whose claim stored the
payload, sent again under a new group of the reconciler's (:func:`move_into_fresh_group`),
with one PutRecords and one settle. Ambiguous again: the next run settles it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from dedupe_store.errors import LedgerError
from dedupe_store.records import ClaimResult, Group, KeyClaim, Position
from kinesis_store.entries import put_entry
from kinesis_store.results import PutResultKind
from kinesis_store.writer import KinesisWriter
from producer.key.context import LedgerCalls
from producer.key.takeover import move_into_fresh_group

__all__ = ["PayloadResender", "ResendCounts"]

log = logging.getLogger(__name__)


class ResendCounts(Protocol):
    """The counters a resend adds to (the reconciler's report)."""

    errors: int
    lost_races: int
    pending: int
    resent: int


class PayloadResender:
    """Sends stored payloads again for the reconciler; every write conditional, as its own."""

    def __init__(
        self,
        calls: LedgerCalls,
        *,
        writer: KinesisWriter,
        map_each: Callable[..., list[ClaimResult | LedgerError]],
        where: Callable[[], Mapping[str, str]],
    ) -> None:
        self._calls = calls  # the reconciler's stream, owner, ledger, clock and lease
        self._writer = writer
        self._map = map_each
        self._where = where

    def resend(self, claims: list[KeyClaim], report: ResendCounts) -> set[str]:
        """Send stored payloads again under a new group of ours: open it, take each key over
        (conditional on the attempt seen), one PutRecords, settle. Ambiguous again: next run.
        Returns the keys that left their old group (taken over by us, or by someone first)."""
        try:
            moved = move_into_fresh_group(
                claims,
                open_group=self._calls.open_group,
                take_over=self._calls.take_over_key,
                map_each=self._map,
            )
        except LedgerError as exc:
            log.warning(
                "resend group failed stream=%s error=%s",
                self._calls.stream,
                exc,
                extra=dict(self._where()),
            )
            report.errors += len(claims)
            return set()
        report.errors += len(moved.unknown)
        report.lost_races += len(moved.lost)
        held = list(moved.won.values())
        # a take-over whose answer was lost may have applied: keep the group open
        unknown = bool(moved.unknown)
        if held:
            self._put_resend(moved.group, held, unknown=unknown, report=report)
        elif not unknown:
            # someone else moved every key on first: the new group has nothing to send
            with contextlib.suppress(LedgerError):
                self._calls.ledger.record_positions(
                    moved.group, {}, settle=True, now_ms=self._calls.clock.now_ms()
                )
        return {claims[i].key for i in (*moved.won, *moved.lost)}

    def _put_resend(
        self, group: Group, held: list[KeyClaim], *, unknown: bool, report: ResendCounts
    ) -> None:
        """One PutRecords of ``held``'s stored payloads under ``group``, then its settle; what
        was not written stays claimed by the group: the next run settles it."""
        sendable = self._lease_to_send(group)
        if sendable is None:
            report.pending += len(held)
            return
        results = self._writer.put_entries(
            [put_entry(claim.key, claim.payload or b"", claim.routing_hash_key) for claim in held],
            lease_expires_at_ms=sendable.lease_expires_at_ms,
        )
        positions = {
            claim.key: Position(str(result.shard_id), str(result.sequence_number))
            for claim, result in zip(held, results, strict=True)
            if result.kind is PutResultKind.WRITTEN
        }
        report.pending += len(held) - len(positions)
        try:
            settled = self._calls.ledger.record_positions(
                sendable,
                positions,
                settle=len(positions) == len(held) and not unknown,
                now_ms=self._calls.clock.now_ms(),
            )
        except LedgerError as exc:
            log.warning(
                "resend settle failed stream=%s group=%s error=%s",
                self._calls.stream,
                group.group_id,
                exc,
                extra={**self._where(), "group": group.group_id},
            )
            report.errors += len(positions)
            return
        report.resent += len(positions) if settled.applied else 0

    def _lease_to_send(self, group: Group) -> Group | None:
        """Our resend group, with a lease that outlives a put sent now (renewed if short)."""
        if self._calls.lease.safe_to_send(group.lease_expires_at_ms, self._calls.clock.now_ms()):
            return group
        return self._calls.renew(group)
