"""``/v1/streams/{stream}/summary``: in-flight and stale counts, the exactly-once window."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ClockDep, LedgerDep, RetentionDep, SettingsDep
from api.problems import problem_responses
from api.routes.params import StreamName
from api.schemas import ReconcileRun, StreamSummary, exactly_once_window, from_epoch_ms
from dedupe_store.contract import LedgerReader
from dedupe_store.inflight import walk_in_flight

router = APIRouter(prefix="/v1/streams/{stream}", tags=["summary"])

# groups per index query (ledger schema v2): up to 500 keys each, so a page past the cap
# overshoots it by at most this many groups
_COUNT_PAGE = 100


@router.get(
    "/summary",
    operation_id="getSummary",
    summary="In-flight and stale counts, exactly-once window, last reconcile run",
    responses=problem_responses(422, 503),
)
def get_summary(
    *,
    stream: StreamName,
    ledger: LedgerDep,
    settings: SettingsDep,
    clock: ClockDep,
    retention: RetentionDep,
) -> StreamSummary:
    """Counts come from the in-flight index (eventually consistent: they may lag by a moment):
    the keys listed by its open claim groups, an upper bound of the claims in flight (a group
    lists every key its producer sent, until it settles; the in-flight listing re-reads each).

    The exactly-once window is min(dedupe TTL, stream retention): a key delivered longer ago
    than that can be delivered again. The retention is the stream's own, read from Kinesis
    (or the one the server was configured with); null when it cannot be known.
    """
    now_ms = clock.now_ms()
    cap = settings.summary_count_cap
    in_flight, in_flight_complete = count_in_flight(ledger, stream, before_ms=None, cap=cap)
    stale, stale_complete = count_in_flight(ledger, stream, before_ms=now_ms, cap=cap)
    return StreamSummary(
        stream=stream,
        as_of=from_epoch_ms(now_ms),
        in_flight=in_flight,
        stale=stale,
        counts_complete=in_flight_complete and stale_complete,
        exactly_once_window=exactly_once_window(ledger.dedupe_ttl_s, retention(stream)),
        last_reconcile=_last_run(ledger, stream),
    )


def _last_run(ledger: LedgerReader, stream: str) -> ReconcileRun | None:
    run = ledger.last_run(stream)
    if run is None:
        return None
    return ReconcileRun(
        started_at=from_epoch_ms(run.started_ms),
        finished_at=from_epoch_ms(run.finished_ms),
        outcomes=run.outcomes,
    )


def count_in_flight(
    ledger: LedgerReader, stream: str, *, before_ms: int | None, cap: int
) -> tuple[int, bool]:
    """Keys listed by the open groups of the in-flight index (leases expired before
    ``before_ms``), up to ``cap``."""
    count = 0
    for keys, _ in walk_in_flight(
        ledger, stream, before_ms=before_ms, page_limit=lambda: _COUNT_PAGE
    ):
        count += len(keys)
        if count > cap:
            return cap, False
    return count, True
