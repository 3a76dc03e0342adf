"""Taking claims over, once a read-back proved their put can no longer land.

:func:`move_into_fresh_group` is the one way keys change groups, for the producer and the
reconciler alike: open a new group of ours first (so every claim that can reach Kinesis is
findable), then take each key over into it, conditional on the attempt seen (attempt + 1).

:class:`TakeOvers` is the producer's side: before it takes keys from another party's expired
group it fences that group (:func:`producer.key.decisions.after_fence`): never while the holder
may be alive.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dedupe_store.errors import LedgerError
from dedupe_store.records import ClaimResult, ClaimStatus, Group, GroupUpdate, KeyClaim
from dedupe_store.states import GroupState
from producer import outcomes
from producer.key.claims import ChunkState, ClaimedMessage
from producer.key.context import SendContext
from producer.key.decisions import FenceVerdict, after_fence

__all__ = ["Moved", "TakeOvers", "move_into_fresh_group"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Moved:
    """Keys taken over into ``group``, by their index in the claims given."""

    group: Group
    won: dict[int, KeyClaim] = field(default_factory=dict)  # the new attempt, ours
    lost: dict[int, KeyClaim | None] = field(default_factory=dict)  # moved first by another
    unknown: dict[int, LedgerError] = field(default_factory=dict)  # may have applied


def move_into_fresh_group(
    claims: Sequence[KeyClaim],
    *,
    open_group: Callable[[list[str]], Group | LedgerError],
    take_over: Callable[[KeyClaim, Group], ClaimResult | LedgerError],
    map_each: Callable[
        [Callable[[KeyClaim], ClaimResult | LedgerError], list[KeyClaim]],
        list[ClaimResult | LedgerError],
    ],
) -> Moved:
    """Open a group (raises the :class:`LedgerError` when it cannot be opened), then take
    each claim over into it. A take-over that failed may have applied: the group keeps such a
    key open, so the reconciler settles it."""
    group = open_group([claim.key for claim in claims])
    if isinstance(group, LedgerError):
        raise group
    moved = Moved(group)
    for index, result in enumerate(map_each(lambda claim: take_over(claim, group), list(claims))):
        if isinstance(result, LedgerError):
            moved.unknown[index] = result
        elif result.status is ClaimStatus.WON and result.claim is not None:
            moved.won[index] = result.claim
        else:
            moved.lost[index] = result.claim
    return moved


class TakeOvers:
    """The producer's take-overs within one chunk's delivery."""

    def __init__(self, context: SendContext, state: ChunkState) -> None:
        self._context = context
        self._state = state

    def take(self, messages: list[ClaimedMessage]) -> list[ClaimedMessage]:
        """Claim a new attempt of each message whose put can no longer land: its holder fenced
        first when it is another party's. Returns the messages to send (ours) and to wait on
        (held by someone else now, or fenced too late); the others have their outcome."""
        to_take, waiting = self.fence_holders(messages)
        return self.move(to_take) + waiting if to_take else waiting

    def fence_holders(
        self, messages: list[ClaimedMessage]
    ) -> tuple[list[ClaimedMessage], list[ClaimedMessage]]:
        """Before taking keys of another party's expired group, take that group over (its
        epoch + 1, a lease already over): its owner, if it wakes up, can no longer settle it,
        and learns it was TAKEN_OVER. Returns the messages to take over and those to wait on
        again (the fence failed or was lost: the holder may be alive); a key the holder's
        group recorded first is a DUPLICATE."""
        holders = {
            m.holder.group_id: m.holder
            for m in messages
            if m.holder is not None
            and m.holder.group_id not in self._state.groups
            and m.holder.state is GroupState.OPEN
        }
        if not holders:
            return messages, []
        fenced = {group_id: self._fence(group) for group_id, group in holders.items()}
        to_take: list[ClaimedMessage] = []
        waiting: list[ClaimedMessage] = []
        for message in messages:
            holder = message.holder
            if holder is None or holder.group_id not in fenced:
                to_take.append(message)
                continue
            update = fenced[holder.group_id]
            verdict, position = after_fence(message.key, update)
            if verdict is FenceVerdict.TAKE_OVER:
                to_take.append(message)
            elif verdict is FenceVerdict.DELIVERED and position is not None:
                self._state.report(
                    outcomes.duplicate(message.item, position, message.claim.attempt)
                )
            else:
                if update is not None and update.current is not None:
                    message.holder = update.current  # wait on it as it is now
                waiting.append(message)
        return to_take, waiting

    def _fence(self, group: Group) -> GroupUpdate | None:
        try:
            return self._context.ledger.take_over_group(
                group,
                owner=self._context.owner,
                now_ms=self._context.clock.now_ms(),
                lease_ms=0,
                skew_ms=self._context.lease.skew_ms,
            )
        except LedgerError as exc:
            log.warning("fencing a group failed stream=%s error=%s", self._context.stream, exc)
            return None

    def move(self, messages: list[ClaimedMessage]) -> list[ClaimedMessage]:
        """Take ``messages`` over into a new group of ours. Returns those now ours to send and
        those to wait on (another party moved them first and holds them); the others have
        their outcome."""
        context, state = self._context, self._state
        try:
            moved = move_into_fresh_group(
                [m.claim for m in messages],
                open_group=context.open_group,
                take_over=context.take_over_key,
                map_each=context.map,
            )
        except LedgerError as exc:
            for message in messages:
                state.in_flight(message, f"ledger unavailable: {exc}")
            return []
        own = state.add_group(moved.group)
        result: list[ClaimedMessage] = []
        for index, message in enumerate(messages):
            if index in moved.won:
                state.claimed(own, message, moved.won[index])
                result.append(message)
            elif index in moved.unknown:
                own.unresolved.add(message.key)  # it may have applied
                state.in_flight(message, f"take over failed: {moved.unknown[index]}")
            else:
                state.left(message)
                current = moved.lost[index]
                judged = state.judge_lost(message.item, current, context.group_of(current))
                if judged is not None:
                    result.append(judged)
        return result
