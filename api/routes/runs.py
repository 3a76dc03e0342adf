"""``/v1/streams/{stream}/runs``: replay-mode runs (``dedupe=replay``), one by name or the OPEN ones.

Replay mode writes no per-key ledger item: the per-key routes know nothing of its rows. What
the ledger holds is a run item per run (a Spark micro-batch ``<query>/<batch id>``, a batch
write, or a CLI ``--run-id``): its state, its executions (a first run and its replays: their
leases, how many task attempts each), and the counts its commit recorded. Run names hold
``/``, so the route captures the rest of the path
(``{run:path}``); clients percent-encode the name, as for keys.

Only OPEN runs are in the sparse in-flight index, so only they can be listed without a scan:
``GET /runs?state=open`` (``stale=true``: those left open past every execution's lease). They are
few: one per batch being written, and those whose driver died before its commit. A COMPLETE
run is looked up by name.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from api.deps import ClockDep, LedgerDep
from api.errors import UnknownRunError
from api.problems import problem_responses
from api.routes.params import StreamName
from api.schemas import OpenRunsPage, ReplayRunState, from_epoch_ms

MAX_RUN_CHARS = 1024
MAX_LIST_LIMIT = 500
DEFAULT_LIST_LIMIT = 100

router = APIRouter(prefix="/v1/streams/{stream}", tags=["runs"])

RunPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_RUN_CHARS,
        description=(
            "the run's name, percent-encoded: '<query>/<batch id>' of a Spark micro-batch, or "
            "the --run-id of a CLI run; it may contain '/'"
        ),
        examples=["orders-to-kinesis/42"],
    ),
]


class OpenRunsQuery(BaseModel):
    """The listing's query parameters; unknown ones are refused (a typo would list them all)."""

    model_config = ConfigDict(extra="forbid")

    state: Literal["open"] = Field(
        default="open",
        description=(
            "open: the runs not committed yet (the only state the index holds: look a "
            "COMPLETE run up by name)"
        ),
    )
    stale: bool = Field(
        default=False,
        description=(
            "true: only runs left open past every execution's lease (their driver did not "
            "commit them)"
        ),
    )
    limit: int = Field(
        default=DEFAULT_LIST_LIMIT,
        ge=1,
        le=MAX_LIST_LIMIT,
        description="list at most this many runs; complete=false says there were more",
    )


@router.get(
    "/runs",
    operation_id="listOpenRuns",
    summary="OPEN replay-mode runs",
    response_description="the OPEN runs, each read consistently",
    responses=problem_responses(422, 503),
)
def list_open_runs(
    *,
    stream: StreamName,
    query: Annotated[OpenRunsQuery, Query()],
    ledger: LedgerDep,
    clock: ClockDep,
) -> OpenRunsPage:
    """OPEN runs from the in-flight index (no table scan), bucket after bucket."""
    now_ms = clock.now_ms()
    found = ledger.open_runs(
        stream, now_ms=now_ms if query.stale else None, page_size=query.limit + 1
    )
    runs = list(itertools.islice(found, query.limit + 1))
    return OpenRunsPage(
        stream=stream,
        stale_only=query.stale,
        as_of=from_epoch_ms(now_ms),
        items=[ReplayRunState.from_run(run, now_ms=now_ms) for run in runs[: query.limit]],
        complete=len(runs) <= query.limit,
    )


@router.get(
    "/runs/{run:path}",
    operation_id="getRun",
    summary="A replay-mode run: its state, executions and counts",
    response_description="whether the run committed, its executions, and what its commit counted",
    responses=problem_responses(404, 422, 503, unknown="run"),
)
def get_run(
    *, stream: StreamName, run: RunPath, ledger: LedgerDep, clock: ClockDep
) -> ReplayRunState:
    """A consistent read of the run's item. Its rows are not in the ledger: replay mode
    writes none (`keo audit` compares the stream with the rows expected)."""
    found = ledger.get_run(stream, run)
    if found is None:
        raise UnknownRunError(stream, run)
    return ReplayRunState.from_run(found, now_ms=clock.now_ms())
