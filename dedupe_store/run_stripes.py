"""``RunStripes``: a replay-mode execution's task attempts counted on stripe items, so that no
item of a run takes more writes a second than DynamoDB gives one partition key.

Every task attempt of a run registers on its execution's counts and finishes on them (the
sum of its open attempts' tags, its attempts, its late rows): two writes. 2,000 tasks of a
batch starting in the same second would write one item 4,000 times in that second, four times
the 1,000 DynamoDB takes on a partition key. So a task counts on stripe
:func:`~dedupe_store.run_items.stripe_of` of its execution (its partition index over 256):
stripe 0 is the run item itself (a run of up to 256 tasks a batch is what it was: no item,
read or write more), stripe k > 0 an item of its own::

    run item     pk "__keo__/run/<stream>/<run>"    state, executions, each execution's
                                                     announced stripes (exec:<e>:stripes)
    stripe item  pk "__keo__/runpart/<stream>/<execution>/<k>/<run>"
                                                     stripe k's open tags, attempts, late
                                                     rows, sealed; not in the in-flight index

Registering an attempt in stripe k > 0 (:meth:`RunStripes.register`)::

    1 stripe item: present and not sealed ─── ADD tag, attempt ───────────────────┐
        absent (or refused, then read back not sealed: a sibling wrote it since)    │
               ─ 2 run item: announce k, with a registration's condition (the run   │
                   OPEN or new, the execution not superseded), opening the          │
                   execution, counting nothing; refused: not registered             │
               ─ 3 stripe item: not sealed ─── ADD tag, attempt ────────────────────┤
        sealed: not registered                                                      │
    4 run item, read consistently after the stripe write: the run OPEN and the   ◄──┘
      execution not superseded, else the tag is taken off again: not registered

Fencing (:meth:`RunStripes.seal`): a supersede writes the run item first (its executions
superseded), then seals every stripe of theirs the item it returned lists; a COMPLETE writes
the run item, then seals every stripe of every execution. Why this keeps the guarantees of one
run item (a replay finds every earlier attempt that can put; no attempt registers after its
run is COMPLETE or its execution superseded); F is the run item's fencing write:

- An attempt goes on to put only if its read (4), made after its stripe write, showed the run
  OPEN and its execution not superseded: the read came before F, so the write did too. Anyone
  who reads the run item after F and then the stripe (the replay that wrote F, from the items
  the seals return; the replay's later tasks; every consistent reader) sees the tag.
- A stripe announced after F is refused on the run item (2). One announced before F is on the
  item F returns, so it is sealed: a stripe write after the seal is refused (1, 3); one before
  it is in the sealed item the seal returns.
- The seal alone would not do: between F and the seal a late attempt can still write its
  stripe, after a reader read it. The read (4) refuses that attempt. The seal refuses later
  ones at (1), without a read of the run item, and makes the counts a supersede returns final
  (finishing attempts still take their tags off).

Readers (:meth:`RunStripes.run_of`, :meth:`RunStripes.runs_of`) add the announced stripes to
their executions' counts, with one consistent ``BatchGetItem``: every caller sees the run one
item would hold. A registration skips its own execution's stripes: it uses the others' counts,
and its own execution's lease, on the run item (extensions stay there: they are rare).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dedupe_store import expressions as x
from dedupe_store.errors import LedgerUnavailableError
from dedupe_store.expressions import SEALED_ATTRIBUTE, TTL_ATTRIBUTE
from dedupe_store.records import ReplayRun, RunAttempt, late_rows_of
from dedupe_store.run_items import (
    announced_stripes,
    execution_names,
    replay_run_pk,
    replay_stripe_pk,
    run_of,
    stripe_of,
    stripe_set,
    with_stripes,
)
from dedupe_store.states import RunState
from dedupe_store.table import DynamoDBTable

__all__ = ["RunStripes", "late_update"]

_StripeItems = dict[str, list[Mapping[str, Any]]]  # by execution


class RunStripes:
    """The stripe items of replay-mode runs on the ledger's table: an attempt registered in its
    stripe, finished, its stripe living on with its lease; stripes sealed; runs read with their
    stripes added. Thread-safe (no state but the table)."""

    def __init__(self, table: DynamoDBTable) -> None:
        self._table = table

    def run_of(
        self, stream: str, run: str, item: Mapping[str, Any], *, skip: Collection[str] = ()
    ) -> ReplayRun:
        """The run ``item`` holds, its executions' announced stripes added (those of the
        executions in ``skip`` left out)."""
        return self.runs_of(stream, [(run, item)], skip=skip)[0]

    def runs_of(
        self,
        stream: str,
        items: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        skip: Collection[str] = (),
    ) -> list[ReplayRun]:
        """The runs of ``items`` (``(run, run item)``), each execution's announced stripes
        added: one consistent read of every stripe of them all, none where none is announced."""
        wanted: dict[str, tuple[int, str]] = {}  # stripe pk -> (which run, which execution)
        for index, (run, item) in enumerate(items):
            for execution_id, stripes in announced_stripes(item).items():
                if execution_id in skip:
                    continue
                for stripe in stripes:
                    pk = replay_stripe_pk(stream, run, execution_id, stripe)
                    wanted[pk] = (index, execution_id)
        runs = [run_of(stream, run, item) for run, item in items]
        if not wanted:
            return runs
        found: list[_StripeItems] = [{} for _ in items]
        for stripe_item in self._table.batch_get_items(list(wanted), "read a run's stripes"):
            index, execution_id = wanted[str(stripe_item["pk"]["S"])]
            found[index].setdefault(execution_id, []).append(stripe_item)
        return [with_stripes(r, stripes) for r, stripes in zip(runs, found, strict=True)]

    def register(
        self, stream: str, run: str, attempt: RunAttempt, opening: Mapping[str, Any]
    ) -> tuple[bool, ReplayRun]:
        """Register ``attempt`` (its task in stripe k > 0) on its stripe, announcing the
        stripe on the run item first when it is new (``opening``: the values that open an
        execution there, as a registration on the run item does). Whether it registered, and
        the run as its read after the stripe write found it (its own execution's stripes
        left out). Refused: the stripe sealed, or the run item refusing the announcement or
        showing, once the attempt was counted, the run not OPEN or the execution superseded
        (then its tag is taken off again)."""
        pk = replay_stripe_pk(stream, run, attempt.execution_id, stripe_of(attempt.task))
        counted = {
            ":stream": opening[":stream"],
            ":expires": opening[":expires"],
            ":one": x.n(1),
            ":tag": x.n(attempt.tag),
        }
        applied, item = self._table.update(
            pk, None, x.REGISTER_IN_STRIPE, x.STRIPE_REGISTRABLE, dict(counted)
        )
        # refused and not sealed: the item was absent when written (a sibling may have made
        # it since: a backend that returns no item on a lost condition has it read after)
        if not applied and (item is None or SEALED_ATTRIBUTE not in item):
            announced, run_item = self._announce(stream, run, attempt, opening)
            if not announced:
                return False, self.run_of(stream, run, run_item, skip={attempt.execution_id})
            applied, _ = self._table.update(
                pk, None, x.REGISTER_IN_STRIPE, x.STRIPE_UNSEALED, dict(counted)
            )
        current = self._read_run(stream, run, skip={attempt.execution_id})
        execution = current.execution(attempt.execution_id)
        fenced = current.state is not RunState.OPEN or execution is None or execution.superseded
        if applied and fenced:
            # counted after the run item's fence: no reader after it may miss a put of it
            self.finish(stream, run, attempt)
            return False, current
        return applied, current

    def _announce(
        self, stream: str, run: str, attempt: RunAttempt, opening: Mapping[str, Any]
    ) -> tuple[bool, Mapping[str, Any]]:
        """Stripe k of the attempt's execution on the run item, under a registration's
        condition: applied, and the run item."""
        values = {**opening, ":zero": x.n(0), ":stripe": stripe_set(stripe_of(attempt.task))}
        announced, item = self._table.update(
            replay_run_pk(stream, run),
            None,
            x.ANNOUNCE_STRIPE,
            x.EXECUTION_REGISTRABLE,
            values,
            names=execution_names(attempt.execution_id),
        )
        if item is None:  # pragma: no cover - a lost condition always has an item
            raise LedgerUnavailableError(
                f"run {run!r} vanished while registering", table=self._table.table_name
            )
        return announced, item

    def _read_run(self, stream: str, run: str, *, skip: Collection[str]) -> ReplayRun:
        item = self._table.get_item(replay_run_pk(stream, run), None, "read a run", consistent=True)
        if item is None:  # pragma: no cover - its stripe was announced on it
            raise LedgerUnavailableError(
                f"run {run!r} vanished while registering", table=self._table.table_name
            )
        return self.run_of(stream, run, item, skip=skip)

    def finish(
        self,
        stream: str,
        run: str,
        attempt: RunAttempt,
        *,
        late_rows: frozenset[str] = frozenset(),
    ) -> None:
        """Take the attempt's tag off its stripe's sum, and add ``late_rows`` (one write; a
        sealed stripe takes it too)."""
        update, values = late_update(
            x.FINISH_IN_STRIPE, x.FINISH_IN_STRIPE_LATE, attempt, late_rows
        )
        self._table.update(
            replay_stripe_pk(stream, run, attempt.execution_id, stripe_of(attempt.task)),
            None,
            update,
            x.STRIPE_COUNTED,
            values,
        )

    def live_on(self, stream: str, run: str, attempt: RunAttempt, *, expires_at_s: int) -> None:
        """The attempt's stripe item kept until ``expires_at_s`` (its lease renewed: what it
        puts until then must be found by a replay while the stream holds it)."""
        self._table.update(
            replay_stripe_pk(stream, run, attempt.execution_id, stripe_of(attempt.task)),
            None,
            x.RENEW_IN_STRIPE,
            x.STRIPE_EXISTS,
            {":expires": x.n(expires_at_s)},
        )

    def seal(
        self,
        stream: str,
        run: str,
        item: Mapping[str, Any],
        execution_ids: Collection[str] | None,
        *,
        complete: bool = False,
    ) -> ReplayRun:
        """After the run item's fencing write (``item``, as it returned it): seal every
        announced stripe of ``execution_ids`` the item shows superseded (every execution:
        None, a COMPLETE run), and the run with their counts as the seals returned them, the
        other stripes read. ``complete``: the stripes take the run's expiry (the retention
        from the commit); else a stripe keeps its own."""
        current = run_of(stream, run, item)
        sealing = {
            execution_id: stripes
            for execution_id, stripes in announced_stripes(item).items()
            if execution_ids is None
            or (
                execution_id in execution_ids
                and (execution := current.execution(execution_id)) is not None
                and execution.superseded
            )
        }
        expires = item.get(TTL_ATTRIBUTE, {"N": "0"})
        sealed: _StripeItems = {}
        for execution_id, stripes in sealing.items():
            for stripe in stripes:
                _, stripe_item = self._table.update(
                    replay_stripe_pk(stream, run, execution_id, stripe),
                    None,
                    x.SEAL_COMPLETE_STRIPE if complete else x.SEAL_STRIPE,
                    x.ANY_ITEM,
                    {":true": {"BOOL": True}, ":stream": x.s(stream), ":expires": expires},
                )
                sealed.setdefault(execution_id, []).append(stripe_item or {})
        return with_stripes(self.run_of(stream, run, item, skip=sealing), sealed)


def late_update(
    update: str, update_late: str, attempt: RunAttempt, late_rows: frozenset[str]
) -> tuple[str, dict[str, Any]]:
    """A finish's update and values: the attempt's tag taken off (``update``), and with late
    rows, those added (``update_late``)."""
    values: dict[str, Any] = {":minus_tag": x.n(-attempt.tag)}
    if not late_rows:
        return update, values
    values[":late"] = {"SS": sorted(late_rows_of(late_rows))}
    return update_late, values
