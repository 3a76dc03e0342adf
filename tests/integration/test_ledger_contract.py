"""The contract of ``DynamoDBLedger``, run against three DynamoDBs: dynalite, moto (server mode)
and Amazon's DynamoDB Local.

All return the item a failed condition saw (``ReturnValuesOnConditionCheckFailure``; the
project patches dynalite to, as DynamoDB does); the ``dynalite-read-back`` run strips the flag
from every request so the ledger must read the item after a lost condition. DynamoDB Local and
moto have the TTL API, dynalite does not. Every path keeps:
every transition is conditional on the state and attempt its caller saw, a lost condition
returns the record that won, and a request repeated after its first try applied says "applied".

The cases every backend passes live in ``tests/ledger_contract/``; here are the fixture and
the cases only DynamoDB can stage (a response lost on the wire, items written in bulk).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import stacks
from moto.server import ThreadedMotoServer

from dedupe_store.connection import ConnectionOptions
from dedupe_store.errors import LedgerError, LedgerSchemaError, LedgerThrottledError
from dedupe_store.ledger import LEDGER_SCHEMA_VERSION, SCHEMA_PK, DynamoDBLedger, TtlStatus
from dedupe_store.records import (
    ClaimResult,
    ClaimStatus,
    Group,
    KeyClaim,
    PendingClaim,
    ReplayRun,
    RunAttempt,
)
from dedupe_store.states import LedgerState
from devstack import emulators as local_stack
from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from devstack.faults import FaultInjector, FaultKind

if TYPE_CHECKING:
    from conftest import Names

# the cases every Ledger backend passes, collected by pytest from this module's namespace
from ledger_contract import *  # noqa: F403
from ledger_contract.staging import (
    ALICE,
    BOB,
    LEASE_MS,
    POSITION,
    RUN,
    SKEW_MS,
    STREAM,
    T0_MS,
    TTL_S,
    attempt,
    claimed,
    execution,
    execution_of,
    in_two_halves,
    open_group,
    request_for,
)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(params=["dynalite", "dynalite-read-back", "moto", "dynamodb-local"])
def ledger(request: pytest.FixtureRequest, names: Names) -> DynamoDBLedger:
    if request.param.startswith("dynalite"):
        endpoint: str = request.getfixturevalue("emulators").dynamodb
    elif request.param == "dynamodb-local":
        endpoint = request.getfixturevalue("dynamodb_local_endpoint")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
    ledger = new_table(endpoint, names.table, dedupe_ttl_s=TTL_S, inflight_buckets=4)
    if request.param == "dynalite-read-back":
        ledger.client.meta.events.register("provide-client-params.dynamodb.*", _no_old_item)
    return ledger


def ledger_at(endpoint: str, table: str, **ledger_options: Any) -> DynamoDBLedger:
    """A ledger on ``endpoint``'s ``table``."""
    options = ConnectionOptions(
        table_name=table,
        region=local_stack.REGION,
        host=endpoint,
        aws_access_key_id=local_stack.DUMMY_ACCESS_KEY_ID,
        aws_secret_access_key=local_stack.DUMMY_SECRET_ACCESS_KEY,
    )
    return DynamoDBLedger(options, **ledger_options)


def new_table(endpoint: str, table: str, **ledger_options: Any) -> DynamoDBLedger:
    """A new, empty ledger table on ``endpoint``, ACTIVE (not stamped)."""
    ledger = ledger_at(endpoint, table, **ledger_options)
    assert ledger.create_table(wait=False)
    stacks.wait_table_active(ledger)
    return ledger


def _no_old_item(params: dict[str, Any], **_: Any) -> None:
    # as a DynamoDB that never returns the item a failed condition saw
    params.pop("ReturnValuesOnConditionCheckFailure", None)


@pytest.fixture(params=["moto", "dynamodb-local"])
def ttl_endpoint(request: pytest.FixtureRequest) -> str:
    """A DynamoDB with the TTL API."""
    fixture = "moto_endpoint" if request.param == "moto" else "dynamodb_local_endpoint"
    endpoint: str = request.getfixturevalue(fixture)
    return endpoint


# --- a lost condition -----------------------------------------------------------------------------


def test_a_lost_claim_is_judged_from_the_item_its_failed_condition_returned(
    ledger: DynamoDBLedger, request: pytest.FixtureRequest
) -> None:
    # GIVEN alice holds the key, and every DynamoDB request is counted from now on
    held = claimed(ledger, "k-judged")
    bobs = open_group(ledger, "k-judged", owner=BOB, now_ms=T0_MS + 1_000)
    operations: list[str] = []
    ledger.client.meta.events.register(
        "before-call.dynamodb.*", lambda model, **_: operations.append(model.name)
    )
    # WHEN bob claims it
    result = ledger.claim(request_for("k-judged"), bobs, now_ms=T0_MS + 1_000)
    # THEN he loses to alice's claim, seen in the failed write's answer where the backend
    # returns it (DynamoDB does): no second request; else read after it
    assert result.status is ClaimStatus.LOST
    assert result.claim is not None
    assert result.claim.group_id == held.group_id
    returns_old_item = request.node.callspec.params["ledger"] != "dynalite-read-back"
    assert operations == (["UpdateItem"] if returns_old_item else ["UpdateItem", "GetItem"])


# --- a request retried by the SDK after its first try applied -----------------------------------
#
# The response of an applied write is lost on the wire; the SDK (3 retries here) sends the very
# same request again, whose condition now fails on its own effect. Each write must recognise it.


def test_a_claim_retried_by_the_sdk_after_its_first_try_applied_reports_won(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN an open group, and the response of the next claim lost after it applied
    group = open_group(ledger, "k-retried")
    with FaultInjector(ledger.client, seed=1) as faults:
        faults.response_lost_in_transit(operations=["UpdateItem"], count=1)
        # WHEN a producer claims the key
        result = ledger.claim(request_for("k-retried"), group, now_ms=T0_MS)
    # THEN the SDK's retry is recognised: the claim is won, once, attempt 1
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert result.status is ClaimStatus.WON
    assert result.claim is not None
    assert (result.claim.attempt, result.claim.group_id) == (1, group.group_id)
    assert ledger.get_claim(STREAM, "k-retried") == result.claim


# --- claims in batches (PartiQL, on DynamoDB Local; dynalite has none) --------------------------


def _counted(ledger: DynamoDBLedger) -> list[str]:
    """Every DynamoDB request the ledger makes from now on, by operation."""
    operations: list[str] = []
    ledger.client.meta.events.register(
        "before-call.dynamodb.*", lambda model, **_: operations.append(model.name)
    )
    return operations


def test_new_keys_are_claimed_25_to_a_request_and_a_resend_costs_under_a_tenth_of_one(
    dynamodb_local_endpoint: str, names: Names
) -> None:
    # GIVEN a ledger on DynamoDB Local, which runs PartiQL batches
    ledger = new_table(dynamodb_local_endpoint, names.table, dedupe_ttl_s=TTL_S)
    keys = [f"k-{i:03d}" for i in range(100)]
    group = open_group(ledger, *keys)
    operations = _counted(ledger)
    # WHEN 100 new keys are claimed
    first = in_two_halves(ledger, [request_for(k) for k in keys], group, now_ms=T0_MS)
    # THEN all are won in 4 requests (25 INSERTs each), and the backend is known to batch
    assert all(isinstance(r, ClaimResult) and r.status is ClaimStatus.WON for r in first)
    assert operations == ["BatchExecuteStatement"] * 4
    assert ledger.batch_claims is True
    # WHEN they are all sent again (every key DUPLICATE)
    bobs = open_group(ledger, *keys, owner=BOB, now_ms=T0_MS + 1)
    operations.clear()
    again = in_two_halves(ledger, [request_for(k) for k in keys], bobs, now_ms=T0_MS + 1)
    # THEN each is lost to its claim, judged from items read 100 to a request: 0.05 requests
    # a key (one UpdateItem and one GetItem each, 2.0, before)
    assert [r.claim for r in again if isinstance(r, ClaimResult)] == [
        r.claim for r in first if isinstance(r, ClaimResult)
    ]
    assert all(isinstance(r, ClaimResult) and r.status is ClaimStatus.LOST for r in again)
    assert operations == ["BatchExecuteStatement"] * 4 + ["BatchGetItem"]


def test_a_resend_in_batches_of_25_has_its_pending_claims_judged_100_to_a_read(
    dynamodb_local_endpoint: str, names: Names
) -> None:
    # GIVEN 500 keys delivered, on DynamoDB Local
    ledger = new_table(dynamodb_local_endpoint, names.table, dedupe_ttl_s=TTL_S)
    keys = [f"k-{i:03d}" for i in range(500)]
    requests = [request_for(k) for k in keys]
    first = in_two_halves(ledger, requests, open_group(ledger, *keys), now_ms=T0_MS)
    bobs = open_group(ledger, *keys, owner=BOB, now_ms=T0_MS + 1)
    operations = _counted(ledger)
    # WHEN they are claimed again as the producer claims a group: INSERTs 25 to a call, then
    # every key they left pending judged in one call
    inserted = [
        result
        for start in range(0, len(requests), 25)
        for result in ledger.insert_claims(requests[start : start + 25], bobs, now_ms=T0_MS + 1)
    ]
    pending = [r for r in inserted if isinstance(r, PendingClaim)]
    verdicts = ledger.judge_claims(pending, now_ms=T0_MS + 1)
    # THEN every key was left pending by its INSERT, and each is lost to its first claim:
    # 20 BatchExecuteStatement and 5 BatchGetItem (20 of each when each batch read its own)
    assert len(pending) == 500
    assert verdicts == [ClaimResult.lost(r.claim) for r in first if isinstance(r, ClaimResult)]
    assert Counter(operations) == {"BatchExecuteStatement": 20, "BatchGetItem": 5}


def test_a_judge_read_that_fails_gives_each_of_its_keys_the_error(
    dynamodb_local_endpoint: str, names: Names
) -> None:
    # GIVEN 150 keys left pending (they exist), and the first read of them refused
    ledger = new_table(dynamodb_local_endpoint, names.table, dedupe_ttl_s=TTL_S)
    keys = [f"k-{i:03d}" for i in range(150)]
    claimed(ledger, *keys)
    pending = [PendingClaim(request_for(k), "not-ours") for k in keys]
    with FaultInjector(ledger.client, seed=3) as faults:
        faults.rejected(operations=["BatchGetItem"], count=1)
        # WHEN they are judged
        verdicts = ledger.judge_claims(pending, now_ms=T0_MS)
    # THEN the first read's 100 keys each get its ledger error, the other 50 are judged
    assert faults.injected == {FaultKind.REJECTED.value: 1}
    assert all(isinstance(v, LedgerError) for v in verdicts[:100]), verdicts[:100]
    assert all(isinstance(v, ClaimResult) and v.status is ClaimStatus.LOST for v in verdicts[100:])


@dataclass
class _Judged:
    ledger: DynamoDBLedger
    keys: list[str]
    verdicts: list[ClaimResult | LedgerError]
    reads: int  # BatchGetItem requests
    injected: Counter[str]
    pauses: list[float]  # the ledger's, recorded rather than slept


def _judged_through(
    endpoint: str, table: str, rule: FaultRule, monkeypatch: pytest.MonkeyPatch
) -> _Judged:
    """150 keys left pending (they exist, claimed by another), judged through a fault proxy
    that applies ``rule``."""
    ledger = new_table(endpoint, table, dedupe_ttl_s=TTL_S)
    keys = [f"k-{i:03d}" for i in range(150)]
    claimed(ledger, *keys)
    pending = [PendingClaim(request_for(k), "not-ours") for k in keys]
    pauses: list[float] = []
    schedule = FaultSchedule([rule], seed=5)
    with FaultProxy(endpoint, schedule) as proxy:
        proxied = ledger_at(proxy.endpoint, table, dedupe_ttl_s=TTL_S)
        monkeypatch.setattr(proxied, "_pause", pauses.append)
        verdicts = proxied.judge_claims(pending, now_ms=T0_MS)
    return _Judged(
        ledger, keys, verdicts, proxy.received["BatchGetItem"], schedule.injected, pauses
    )


def test_keys_a_read_leaves_unprocessed_are_asked_again_after_growing_pauses(
    dynamodb_local_endpoint: str, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a DynamoDB that leaves half of the keys of each of its first three reads unprocessed
    rule = FaultRule("BatchGetItem", "partial", limit=3)
    # WHEN 150 keys left pending are judged through it
    judged = _judged_through(dynamodb_local_endpoint, names.table, rule, monkeypatch)
    # THEN every key is judged lost to its item: the first read's keys were asked again three
    # times, each after a pause twice the one before
    assert judged.injected == {"BatchGetItem:partial": 3}
    assert judged.reads == 5
    assert judged.pauses == [0.05, 0.1, 0.2]
    assert judged.verdicts == [
        ClaimResult.lost(judged.ledger.get_claim(STREAM, k)) for k in judged.keys
    ]


def test_a_read_whose_keys_stay_unprocessed_gives_up_with_a_throttled_error(
    dynamodb_local_endpoint: str, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a DynamoDB that leaves every key of its reads unprocessed, however often asked
    rule = FaultRule("BatchGetItem", "partial", fraction=1.0)
    # WHEN 150 keys left pending are judged through it
    judged = _judged_through(dynamodb_local_endpoint, names.table, rule, monkeypatch)
    # THEN each read gives up after 8 rounds that processed nothing, its pauses doubling to a
    # second, and each key gets a throttled error it can be retried on (none is judged lost)
    assert judged.reads == 16
    assert judged.pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0] * 2
    assert all(isinstance(v, LedgerThrottledError) for v in judged.verdicts), judged.verdicts


def test_a_backend_without_partiql_is_learned_once_and_claimed_one_key_a_request(
    emulators: local_stack.Endpoints, names: Names
) -> None:
    # GIVEN a ledger on dynalite, which has no BatchExecuteStatement, not told so
    ledger = new_table(emulators.dynamodb, names.table, dedupe_ttl_s=TTL_S)
    group = open_group(ledger, "k-1", "k-2", "k-3")
    operations = _counted(ledger)
    # WHEN keys are claimed in two calls
    first = in_two_halves(ledger, [request_for("k-1"), request_for("k-2")], group, now_ms=T0_MS)
    second = in_two_halves(ledger, [request_for("k-3")], group, now_ms=T0_MS)
    # THEN the first batch's answer taught it: one UpdateItem a key from then on, all won
    assert all(isinstance(r, ClaimResult) and r.status is ClaimStatus.WON for r in first + second)
    assert operations == ["BatchExecuteStatement"] + ["UpdateItem"] * 3
    assert (ledger.batch_claims, ledger.claims_per_request) == (False, 1)


def test_a_batch_retried_by_the_sdk_after_its_first_try_applied_reports_its_claims_won(
    dynamodb_local_endpoint: str, names: Names
) -> None:
    # GIVEN a batch of claims whose response is lost after DynamoDB applied it
    ledger = new_table(dynamodb_local_endpoint, names.table, dedupe_ttl_s=TTL_S)
    keys = [f"k-{i}" for i in range(5)]
    group = open_group(ledger, *keys)
    with FaultInjector(ledger.client, seed=1) as faults:
        faults.response_lost_in_transit(operations=["BatchExecuteStatement"], count=1)
        # WHEN the keys are claimed (the SDK sends the batch again: every INSERT a duplicate)
        results = in_two_halves(ledger, [request_for(k) for k in keys], group, now_ms=T0_MS)
    # THEN each key's item carries this batch's token: all are won, once, at attempt 1
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert all(isinstance(r, ClaimResult) and r.status is ClaimStatus.WON for r in results)
    for key, result in zip(keys, results, strict=True):
        assert isinstance(result, ClaimResult)
        assert ledger.get_claim(STREAM, key) == result.claim
        assert result.claim is not None
        assert (result.claim.attempt, result.claim.group_id) == (1, group.group_id)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(FaultKind.UNAVAILABLE, id="unreachable"),
        pytest.param(FaultKind.LOST_RESPONSE, id="response-lost"),
        pytest.param(FaultKind.THROTTLE, id="throttled"),
    ],
)
def test_a_batch_that_fails_as_a_whole_is_resolved_key_by_key(
    dynamodb_local_endpoint: str, names: Names, kind: FaultKind
) -> None:
    # GIVEN a batch of claims that fails as a whole, every try of it: unreachable, applied
    # with its answer lost, or throttled
    ledger = new_table(dynamodb_local_endpoint, names.table, dedupe_ttl_s=TTL_S)
    ledger.batch_claims = True
    keys = [f"k-{i}" for i in range(5)]
    group = open_group(ledger, *keys)
    with FaultInjector(ledger.client, seed=2) as faults:
        faults.add(kind, operations=["BatchExecuteStatement"], count=100)
        # WHEN the keys are claimed
        results = in_two_halves(ledger, [request_for(k) for k in keys], group, now_ms=T0_MS)
    # THEN each key is settled as a lost claim is: its item read back says whether the batch
    # applied (the claim is ours: its token) or not (claimed one by one now), or, throttled
    # through every round, each key gets the throttled error to retry; never a key claimed
    # twice, never one held by nobody's knowledge
    assert faults.injected[kind.value] >= 1
    if kind is FaultKind.THROTTLE:
        assert all(isinstance(r, LedgerThrottledError) for r in results), results
        assert [ledger.get_claim(STREAM, k) for k in keys] == [None] * len(keys)
        return
    assert all(isinstance(r, ClaimResult) and r.status is ClaimStatus.WON for r in results)
    for key, result in zip(keys, results, strict=True):
        assert isinstance(result, ClaimResult)
        assert result.claim is not None
        assert ledger.get_claim(STREAM, key) == result.claim
        assert (result.claim.attempt, result.claim.group_id) == (1, group.group_id)


def test_an_open_retried_by_the_sdk_after_its_first_try_applied_returns_the_group(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN the response of the next put lost after it applied
    with FaultInjector(ledger.client, seed=5) as faults:
        faults.response_lost_in_transit(operations=["PutItem"], count=1)
        # WHEN a group is opened
        group = open_group(ledger, "k-open-retried")
    # THEN the retried open is recognised: the group is there, OPEN at epoch 1
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert ledger.get_group(STREAM, group.group_id) == group


def test_a_settle_retried_by_the_sdk_after_its_first_try_applied_reports_applied(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN a claimed group, and the response of the next write lost after it applied
    group = claimed(ledger, "k-settle-retried")
    with FaultInjector(ledger.client, seed=2) as faults:
        faults.response_lost_in_transit(operations=["UpdateItem"], count=1)
        # WHEN it is settled
        result = ledger.record_positions(
            group, {"k-settle-retried": POSITION}, settle=True, now_ms=T0_MS + 1
        )
    # THEN the retried settle is recognised as applied
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert result.applied
    record = ledger.get(STREAM, "k-settle-retried")
    assert record is not None
    assert (record.state, record.position) == (LedgerState.DELIVERED, POSITION)


def test_a_take_over_retried_by_the_sdk_after_its_first_try_applied_reports_won(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN an expired claim, bob's group, and the response of the next write lost after it applied
    claimed(ledger, "k-take-retried")
    seen = ledger.get_claim(STREAM, "k-take-retried")
    assert seen is not None
    bobs = open_group(ledger, "k-take-retried", owner=BOB, now_ms=T0_MS + LEASE_MS + 1)
    with FaultInjector(ledger.client, seed=3) as faults:
        faults.response_lost_in_transit(operations=["UpdateItem"], count=1)
        # WHEN bob takes it over
        result = ledger.take_over_key(seen, bobs, now_ms=T0_MS + LEASE_MS + 1)
    # THEN the retried take-over is recognised as won: attempt 2, in bob's group
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert result.status is ClaimStatus.WON
    assert result.claim is not None
    assert (result.claim.attempt, result.claim.group_id) == (2, bobs.group_id)


def test_a_group_take_over_retried_by_the_sdk_after_its_first_try_applied_reports_applied(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN an expired group, and the response of the next write lost after it applied
    group = claimed(ledger, "k-group-retried")
    with FaultInjector(ledger.client, seed=4) as faults:
        faults.response_lost_in_transit(operations=["UpdateItem"], count=1)
        # WHEN bob takes it over
        result = ledger.take_over_group(
            group, owner=BOB, now_ms=T0_MS + LEASE_MS + SKEW_MS, lease_ms=LEASE_MS, skew_ms=SKEW_MS
        )
    # THEN it applied, once: epoch 2, bob's
    assert faults.injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 1}
    assert result.applied
    assert result.current is not None
    assert (result.current.epoch, result.current.owner) == (2, BOB)


# --- a registration in a stripe racing its execution's supersede ---------------------------------
#
# An execution's tasks past its first 256 register on stripe items (dedupe_store.run_stripes),
# and a supersede writes the run item first, then seals the stripes. The fake has no stripes:
# it registers an attempt in one step, so these orders exist only here.


def _before_each(
    ledger: DynamoDBLedger, operation: str, act: Callable[[dict[str, Any]], None]
) -> None:
    """``act`` called with the parameters of each ``operation`` call ``ledger`` makes, before
    it is sent (not for the calls ``act`` makes itself)."""
    acting = False

    def handler(params: dict[str, Any], **_: Any) -> None:
        nonlocal acting
        if not acting:
            acting = True
            try:
                act(params)
            finally:
                acting = False

    ledger.client.meta.events.register(f"provide-client-params.dynamodb.{operation}", handler)


def _stripes_registered_and_a_replay(ledger: DynamoDBLedger) -> tuple[RunAttempt, RunAttempt]:
    """Tasks 0 and 300 of execution exec-1 registered (stripe 1 announced), and a replay's
    first task (exec-2)."""
    task0, task300 = attempt("a1"), attempt("a2", task="300")
    for one in (task0, task300, attempt("b1", execution="exec-2", started_at_ms=T0_MS + 2_000)):
        assert ledger.register_attempt(STREAM, RUN, one).registered
    return task0, task300


def test_an_attempt_counted_on_its_stripe_as_its_execution_is_superseded_is_refused(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN an execution's tasks in stripes 0 and 1, and a replay of the run
    task0, task300 = _stripes_registered_and_a_replay(ledger)
    superseded: list[ReplayRun | None] = []

    def supersede_before_the_run_is_read(params: dict[str, Any]) -> None:
        if not superseded and params["Key"]["pk"]["S"].startswith("__keo__/run/"):
            superseded.append(ledger.supersede_executions(STREAM, RUN, ["exec-1"]))

    _before_each(ledger, "GetItem", supersede_before_the_run_is_read)
    # WHEN a retry of task 300 is counted on its stripe, the replay supersedes the execution
    # (run item, then seals), and the retry then reads the run item
    retry = attempt("a3", task="300", task_attempt=1, started_at_ms=T0_MS + 3_000)
    refused = ledger.register_attempt(STREAM, RUN, retry)
    # THEN the supersede counted the retry (it was on the stripe when sealed: a replay that
    # read it waits for it), and the retry is refused and its tag taken off: it puts nothing
    assert superseded
    assert execution_of(superseded[0], "exec-1") == execution(
        "exec-1", task0, task300, retry, superseded=True
    )
    assert (refused.registered, refused.superseded) == (False, True)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "300") == (task300,)
    now = execution_of(ledger.get_run(STREAM, RUN), "exec-1")
    assert (now.attempts, now.open_tags) == (3, task0.tag + task300.tag)


def test_a_stripe_announced_as_its_execution_is_superseded_is_sealed_before_it_is_written(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN an execution's tasks in stripes 0 and 1, and a replay of the run
    task0, task300 = _stripes_registered_and_a_replay(ledger)
    announced: list[bool] = []

    def supersede_once_stripe_2_is_announced(params: dict[str, Any]) -> None:
        pk = params["Key"]["pk"]["S"]
        if pk.startswith("__keo__/run/") and "ADD" in params["UpdateExpression"]:
            announced.append(":stripe" in params["ExpressionAttributeValues"])
        elif pk.startswith("__keo__/runpart/") and announced == [True]:
            announced.append(True)  # once
            ledger.supersede_executions(STREAM, RUN, ["exec-1"])

    _before_each(ledger, "UpdateItem", supersede_once_stripe_2_is_announced)
    # WHEN task 600 announces stripe 2 on the run item, the replay supersedes the execution
    # (its stripes sealed: stripe 2 too, not yet written), and task 600 writes its stripe
    late = attempt("a3", task="600", started_at_ms=T0_MS + 3_000)
    refused = ledger.register_attempt(STREAM, RUN, late)
    # THEN that write is refused: task 600 is not registered, and counted nowhere
    assert announced == [True, True]
    assert (refused.registered, refused.superseded) == (False, True)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "600") == ()
    assert execution_of(ledger.get_run(STREAM, RUN), "exec-1") == execution(
        "exec-1", task0, task300, superseded=True
    )


def test_two_first_registrations_in_a_new_stripe_both_register_whichever_writes_it_first(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN an execution's task 0 registered, stripe 1 not written yet
    task0 = attempt("a1")
    assert ledger.register_attempt(STREAM, RUN, task0).registered
    sibling = attempt("a2", task="301")
    raced: list[bool] = []

    def sibling_writes_the_stripe_before_it_is_read(params: dict[str, Any]) -> None:
        if not raced and params["Key"]["pk"]["S"].startswith("__keo__/runpart/"):
            raced.append(ledger.register_attempt(STREAM, RUN, sibling).registered)

    _before_each(ledger, "GetItem", sibling_writes_the_stripe_before_it_is_read)
    # WHEN task 300's write to its stripe is refused (the item absent), and task 301 writes
    # the stripe before the refusal's item is read back
    task300 = attempt("a3", task="300")
    registration = ledger.register_attempt(STREAM, RUN, task300)
    # THEN both registered (the read found an item not sealed: it was absent when written,
    # not refused by a seal): nothing superseded the execution, whose stripe counts both
    assert raced == [True]
    assert (registration.registered, registration.superseded) == (True, False)
    assert ledger.task_attempts(STREAM, RUN, "exec-1", "300") == (task300,)
    assert execution_of(ledger.get_run(STREAM, RUN), "exec-1") == execution(
        "exec-1", task0, sibling, task300
    )


# --- batched reads ------------------------------------------------------------------------------


def test_batch_get_reads_250_keys_and_leaves_absent_ones_out(ledger: DynamoDBLedger) -> None:
    # GIVEN 250 keys claimed in one group (more than one BatchGetItem of 100)
    keys = [f"k-batch-{i:03d}" for i in range(250)]
    claimed(ledger, *keys)
    # WHEN they are read in one call, with absent keys and repeats mixed in
    found = ledger.batch_get(STREAM, [*keys, "k-absent-1", keys[0], "k-absent-2"])
    # THEN every claimed key comes back once, absent ones are left out
    assert sorted(found) == keys
    assert all(r.state is LedgerState.IN_FLIGHT and r.attempt == 1 for r in found.values())
    assert found["k-batch-249"].lease_expires_at_ms == T0_MS + LEASE_MS
    assert found["k-batch-000"].owner == ALICE
    assert ledger.get(STREAM, "k-absent-1") is None


def test_the_segments_of_a_parallel_scan_hold_each_item_of_the_stream_once(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN 30 keys claimed in two groups, and a key of another stream
    keys = [f"k-scan-{i:02d}" for i in range(30)]
    claimed(ledger, *keys[:20])
    claimed(ledger, *keys[20:])
    other = ledger.open_group("payments", ["k-other"], owner=BOB, now_ms=T0_MS, lease_ms=LEASE_MS)
    ledger.claim(request_for("k-other", stream="payments"), other, now_ms=T0_MS)
    # WHEN the table is scanned in 4 segments
    items = [
        item
        for segment in range(4)
        for item in ledger.scan_items(STREAM, segment=segment, total_segments=4)
    ]
    # THEN together they hold every key item and group item of the stream once, no other
    claims = sorted(item.key for item in items if isinstance(item, KeyClaim))
    groups = [item for item in items if isinstance(item, Group)]
    assert claims == keys
    assert sorted(len(group.members) for group in groups) == [10, 20]
    assert {item.stream for item in items} == {STREAM}
    # AND the whole scan joins them as before
    assert sorted(record.key for record in ledger.scan(STREAM)) == keys


# --- the schema version -------------------------------------------------------------------------


def test_a_table_stamped_by_another_ledger_version_is_refused_not_misread(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN a table created and stamped by this version: it is accepted
    ledger.create_table(wait=True)
    assert ledger.schema_version() == LEDGER_SCHEMA_VERSION
    ledger.ensure_ready()
    # WHEN another ledger version's stamp is found in it (the item as such a version writes it)
    ledger.client.put_item(
        TableName=ledger.table_name,
        Item={"pk": {"S": SCHEMA_PK}, "schema_version": {"N": str(LEDGER_SCHEMA_VERSION + 1)}},
    )
    # THEN every process that checks the table refuses it, naming both versions
    newer, ours = LEDGER_SCHEMA_VERSION + 1, LEDGER_SCHEMA_VERSION
    with pytest.raises(
        LedgerSchemaError, match=f"schema version {newer}; this keo reads version {ours}"
    ):
        ledger.ensure_ready()
    with pytest.raises(LedgerSchemaError, match=f"schema version {newer}"):
        ledger.ensure_ready(stamp_new=True)
    with pytest.raises(LedgerSchemaError):
        ledger.create_table(wait=True)


def test_a_table_written_before_stamps_is_read_as_version_1_and_refused(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN a table with items and no stamp, as ledger version 1 left it
    ledger.client.put_item(
        TableName=ledger.table_name,
        Item={"pk": {"S": f"{STREAM}#k-old"}, "stream": {"S": STREAM}, "state": {"S": "DELIVERED"}},
    )
    # WHEN a process checks the table, or keo init runs on it
    # THEN it is refused as version 1, and never stamped as this version's
    assert ledger.schema_version() == 1
    with pytest.raises(LedgerSchemaError, match="schema version 1"):
        ledger.ensure_ready()
    with pytest.raises(LedgerSchemaError, match="schema version 1"):
        ledger.ensure_ready(stamp_new=True)
    with pytest.raises(LedgerSchemaError, match="schema version 1"):
        ledger.create_table(wait=True)
    assert ledger.schema_version() == 1


def test_a_reader_never_stamps_a_table_and_a_writer_stamps_an_empty_one(
    ledger: DynamoDBLedger,
) -> None:
    # GIVEN an empty table without a stamp, as tools other than keo init create it
    assert ledger.schema_version() is None
    # WHEN a reader (the API, the audit) checks it
    # THEN it is refused with what to do, and left as it was (readers only read)
    with pytest.raises(LedgerSchemaError, match=r"no ledger schema stamp.*keo init"):
        ledger.ensure_ready()
    assert ledger.schema_version() is None
    # WHEN a writer (a producer, a reconciler) checks it
    # THEN it becomes this version's, and readers accept it from then on
    ledger.ensure_ready(stamp_new=True)
    assert ledger.schema_version() == LEDGER_SCHEMA_VERSION
    ledger.ensure_ready()


# --- TTL -----------------------------------------------------------------------------------------


def test_ttl_is_turned_on_once_and_found_on_after_that(ttl_endpoint: str, names: Names) -> None:
    # GIVEN a table on a DynamoDB with the TTL API (moto, DynamoDB Local), TTL off
    ledger = new_table(ttl_endpoint, names.table)
    # WHEN keo init turns TTL on, and runs again (DynamoDB refuses to turn on a TTL that is on)
    # THEN it is on, and on again is success, never "not supported"
    assert ledger.enable_ttl() is TtlStatus.ENABLED
    assert ledger.enable_ttl() is TtlStatus.ALREADY_ON
    description = ledger.client.describe_time_to_live(TableName=names.table)
    assert description["TimeToLiveDescription"]["AttributeName"] == "expires_at"


def test_ttl_on_another_attribute_is_reported_not_changed(ttl_endpoint: str, names: Names) -> None:
    ledger = new_table(ttl_endpoint, names.table)
    ledger.client.update_time_to_live(
        TableName=names.table,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"},
    )
    assert ledger.enable_ttl() is TtlStatus.OTHER_ATTRIBUTE


def test_a_backend_without_the_ttl_api_says_so(
    emulators: local_stack.Endpoints, names: Names
) -> None:
    # dynalite has DescribeTimeToLive (always off) and no UpdateTimeToLive
    ledger = new_table(emulators.dynamodb, names.table)
    assert ledger.enable_ttl() is TtlStatus.UNSUPPORTED
