"""A randomized soak: a seeded mix of every fault, then the audit.

Both emulators sit behind the quota mode's proxies, with AWS's quotas scaled down so that they
bind at this size (a shard's records a second, a key's write units, the table's units: the
producers are throttled as AWS throttles them, and resend), and seeded fault schedules in front
of the quotas: PutRecords responses lost after
the write, 5xx before and after the write, whole-request and per-record throttling; DynamoDB
claims and marks throttled, failing before the write, or losing their response after it (one
claim a key on dynalite, 25 to a ``BatchExecuteStatement`` on DynamoDB Local, where the
duplicates' ``BatchGetItem`` fails too); GetRecords throttled. Two producers race over
overlapping keys and chunks are sent again. Then the faults stop, the reconciler settles what
is left, undelivered keys are sent again, and the audit must find every key exactly once, as a
KCL consumer reads the stream. The same soak runs once more (on DynamoDB Local) with the
producers aggregating (KPL aggregates) while the stream is split under them (before the first
puts leave, and every second): aggregates packed on a stale shard map land across a split,
the KCL drops them whole, and every key must still reach a KCL consumer exactly once.

The seed is in the test id and in every failure message: ``make soak SEEDS=7`` replays it.
Small by default (CI); ``make soak SEEDS=1,2,3,4,5 MESSAGES=3000`` runs a long one, and
``CHUNK=1200`` sends more than a group's 500 keys at once, so groups are in flight together.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import streamcheck
from splits import Splitter

from dedupe_store.states import GroupState
from devstack import emulators as local_stack
from devstack.dynamodb_quota_proxy import DynamoDbQuotaProxy
from devstack.dynamodb_quotas import DynamoDbQuotas
from devstack.fault_proxy import FaultRule, FaultSchedule
from devstack.quota_proxy import KinesisQuotaProxy
from devstack.quotas import KinesisQuotas
from kinesis_store.provisioning import create_stream
from producer.clients import kinesis_client
from producer.outcomes import OutcomeStatus
from producer.protocol import Message
from producer.settings import ProducerSettings
from producer.wiring import Stack, build_stack, ledger_from

if TYPE_CHECKING:
    from conftest import Names

SEEDS = [int(s) for s in os.environ.get("SOAK_SEEDS", "1").split(",") if s.strip()]
MESSAGES = int(os.environ.get("SOAK_MESSAGES", "240"))
CHUNK = int(os.environ.get("SOAK_CHUNK", "40"))  # keys a send
# aggregating: the stream split right before the first put leaves, then every second, twice
SPLITS_FORCED, SPLITS_LIVE = 1, 2
# Generous lease: the proxies share this process and its 2 cores with the producers. The
# signature fence is on, with a 6 s window the Kinesis proxy enforces as AWS enforces its 5
# minutes (a put slowed past it is refused, not written): the lease is its minimum,
# 6 + 1 + 1 + 2 x 1.
SIGNATURE_WINDOW_S = 6.0
TIMING: dict[str, Any] = {
    "put_connect_timeout_s": 1.0,
    "put_read_timeout_s": 1.0,
    "clock_skew_s": 1.0,
    "lease_s": 10.0,
    "signature_window_s": SIGNATURE_WINDOW_S,
    "wait_initial_s": 0.1,
    "wait_max_s": 1.0,
    "ledger_max_retry_attempts": 3,
}


# AWS's quotas scaled down to what this soak offers, so that they bind: a shard takes 40
# records a second, and the producers' pacer (one for the process) keeps to 60, one and a half
# times it (a pacer set above the account's quota: the shard throttles, records are resent); a
# key's item 2 write units a second (a claim and its mark; a retry waits); the table 150 write
# and 150 read units a second
SHARD_QUOTAS = KinesisQuotas(shard_write_records_per_s=40)
PACED_ABOVE_SHARD_QUOTAS = {"put_rate_limit_percent": 6.0}
TABLE_QUOTAS = DynamoDbQuotas(
    key_write_units_per_s=2, table_write_units_per_s=150, table_read_units_per_s=150
)


def _kinesis_faults(seed: int) -> FaultSchedule:
    return FaultSchedule(
        [
            FaultRule("PutRecords", "drop_response", probability=0.12),
            FaultRule("PutRecords", "error_after", probability=0.05),
            FaultRule("PutRecords", "error_before", probability=0.05),
            FaultRule("PutRecords", "throttle", probability=0.05),
            FaultRule("PutRecords", "partial", probability=0.15, fraction=0.3),
            FaultRule("GetRecords", "throttle", probability=0.1),
        ],
        seed=seed,
    )


def _dynamodb_faults(seed: int) -> FaultSchedule:
    return FaultSchedule(
        [
            FaultRule("UpdateItem", "throttle", probability=0.04),
            FaultRule("UpdateItem", "error_before", probability=0.03),
            FaultRule("UpdateItem", "drop_response", probability=0.03),
            FaultRule("BatchExecuteStatement", "throttle", probability=0.04),
            FaultRule("BatchExecuteStatement", "error_before", probability=0.03),
            FaultRule("BatchExecuteStatement", "drop_response", probability=0.03),
            FaultRule("BatchGetItem", "error_before", probability=0.03),
        ],
        seed=seed + 1000,
    )


@pytest.fixture(params=["dynalite", "dynamodb-local"])
def dynamodb(emulators: local_stack.Endpoints, request: pytest.FixtureRequest) -> str:
    """The DynamoDB under the soak: dynalite (one claim a key) or DynamoDB Local (PartiQL)."""
    if request.param == "dynamodb-local":
        endpoint: str = request.getfixturevalue("dynamodb_local_endpoint")
        return endpoint
    return emulators.dynamodb


@pytest.fixture
def proxies(
    emulators: local_stack.Endpoints, dynamodb: str, request: pytest.FixtureRequest
) -> Iterator[tuple[KinesisQuotaProxy, DynamoDbQuotaProxy]]:
    """The quota mode's proxies, with the seed's faults in front of the quotas."""
    seed: int = request.node.callspec.params["seed"]
    with (
        KinesisQuotaProxy(
            emulators.kinesis,
            SHARD_QUOTAS,
            schedule=_kinesis_faults(seed),
            signature_window_s=SIGNATURE_WINDOW_S,
        ) as kinesis,
        DynamoDbQuotaProxy(
            dynamodb, TABLE_QUOTAS, schedule=_dynamodb_faults(seed)
        ) as dynamodb_proxy,
    ):
        yield kinesis, dynamodb_proxy


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed={s}" for s in SEEDS])
@pytest.mark.parametrize(
    ("dynamodb", "shape"),
    [
        ("dynalite", "records"),
        ("dynamodb-local", "records"),
        # on the DynamoDB AWS runs only: the aggregation is Kinesis' side, and dynalite's one
        # claim a key doubles its time (CI's)
        ("dynamodb-local", "aggregates-across-splits"),
    ],
    indirect=["dynamodb"],
)
def test_soak_every_fault_then_every_key_exactly_once(
    seed: int,
    shape: str,
    emulators: local_stack.Endpoints,
    dynamodb: str,
    proxies: tuple[KinesisQuotaProxy, DynamoDbQuotaProxy],
    names: Names,
) -> None:
    kinesis_proxy, dynamodb_proxy = proxies
    aggregate = shape == "aggregates-across-splits"
    direct = ProducerSettings(
        stream=names.stream,
        table=names.table,
        kinesis_endpoint_url=emulators.kinesis,
        dynamodb_endpoint_url=dynamodb,
        aggregate=aggregate,
        **TIMING,
    )
    create_stream(kinesis_client(direct, for_put=False), direct.stream, 2, timeout_s=30)
    ledger_from(direct).create_table()
    faulty = direct.model_copy(
        update={
            "kinesis_endpoint_url": kinesis_proxy.endpoint,
            "dynamodb_endpoint_url": dynamodb_proxy.endpoint,
            **PACED_ABOVE_SHARD_QUOTAS,
        }
    )
    rng = random.Random(seed)
    keys = [f"soak-{seed}-{i:05d}" for i in range(MESSAGES)]
    payload = {key: f"payload of {key}".encode() for key in keys}

    # GIVEN two producers behind the faulty proxies, racing over overlapping chunks (and the
    # stream split under them, when they aggregate)
    splitter = Splitter(
        streamcheck.kinesis_client(emulators.kinesis),
        direct.stream,
        live=SPLITS_LIVE if aggregate else 0,
        forced=SPLITS_FORCED if aggregate else 0,
        every_s=1.0,
    )
    stack = build_stack(faulty, hooks=splitter)
    chunks = [keys[i : i + CHUNK] for i in range(0, MESSAGES, CHUNK)]

    def produce(owner: str, order: list[list[str]]) -> None:
        with stack.producer(owner=owner) as producer:
            for chunk in order:
                producer.send([Message(k, payload[k]) for k in chunk])

    first = chunks + rng.sample(chunks, k=max(1, len(chunks) // 3))  # some chunks again
    second = rng.sample(chunks, k=max(1, len(chunks) // 2))
    # WHEN they send under every fault
    with splitter:
        racer = threading.Thread(target=produce, args=(f"soak-b-{seed}", second))
        racer.start()
        produce(f"soak-a-{seed}", first)
        racer.join()
    assert splitter.stale_puts == (SPLITS_FORCED if aggregate else 0), f"seed={seed}"
    injected = dict(kinesis_proxy.schedule.injected) | dict(dynamodb_proxy.schedule.injected)
    throttled = {
        "kinesis": dict(kinesis_proxy.state.throttles),
        "dynamodb": dict(dynamodb_proxy.state.throttles),
    }
    # how often the quotas bound depends on the machine's speed: said, not asserted
    print(f"seed={seed} shape={shape}: faults {injected}, quota throttles {throttled}")

    # AND THEN, faults over: the reconciler settles stale claims, undelivered keys are resent
    settle = build_stack(direct)
    delivered: set[str] = set()
    deadline = time.monotonic() + 180
    while len(delivered) < len(keys):
        assert time.monotonic() < deadline, f"seed={seed}: not settled; faults {injected}"
        _wait_until_stale(settle)
        settle.reconciler(owner=f"soak-reconciler-{seed}").run_once()
        with settle.producer(owner=f"soak-final-{seed}") as producer:
            pending = [k for k in keys if k not in delivered]
            for outcome in producer.send([Message(k, payload[k]) for k in pending]):
                assert outcome.status is not OutcomeStatus.CONFLICT, f"seed={seed}: {outcome}"
                if outcome.delivered and outcome.key is not None:
                    delivered.add(outcome.key)

    # THEN every key is in the stream exactly once, where the ledger says
    contents = streamcheck.read_stream(streamcheck.kinesis_client(emulators.kinesis), direct.stream)
    assert not contents.duplicates(), f"seed={seed}: duplicates; faults {injected}, {throttled}"
    streamcheck.assert_exactly_once(contents, keys, settle.ledger)
    streamcheck.assert_only(contents, keys)
    assert sum(injected.values()) > 0, f"seed={seed}: no fault was injected"


def _wait_until_stale(stack: Stack) -> None:
    """Waits until every group left OPEN is stale for everyone (its lease's end + skew has
    passed: the reconciler's own test), by the leases the ledger holds. No producer runs
    now, so none of them is renewed."""
    lease_ms = int(stack.settings.lease_s * 1000)
    skew_ms = int(stack.settings.clock_skew_s * 1000)
    stream = stack.settings.stream
    # no lease ends later than a lease from now: this lists every OPEN group
    horizon_ms = stack.clock.now_ms() + 2 * lease_ms
    groups = (
        stack.ledger.get_group(stream, group_id)
        for group_id in stack.ledger.stale_groups(stream, now_ms=horizon_ms)
    )
    ends = [g.lease_expires_at_ms for g in groups if g is not None and g.state is GroupState.OPEN]
    stale_at_ms = max(ends, default=0) + skew_ms
    while (now_ms := stack.clock.now_ms()) <= stale_at_ms:
        time.sleep((stale_at_ms - now_ms + 1) / 1000)
