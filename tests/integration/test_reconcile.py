"""The reconciler against kinesalite and dynalite: stale claim groups are settled once, never twice.

Crashes are real: ``keo send`` runs in a subprocess with a failpoint that SIGKILLs it after
its claims and before its put (or after its put and before its group's settle). Then ``keo
reconcile --once`` takes the stale groups over, settles them, and ``keo audit`` proves the
stream holds each key once.

In-process tests plant stale groups the way a crashed producer leaves them (a group opened,
its keys claimed, their records put or not, the group never settled) and run a ``Reconciler``
whose injected clock stands 30 s later, so the leases have expired for everyone without the
test waiting for them.

Leases are short (put timeouts 1 s + 1 s, skew 0.5 s, lease 3 s, the minimum), so a group is
stale about 3.5 s after it was opened. A reconciler holds each group it takes over under its
own lease: a reconciler killed mid-run leaves its groups to the next one only once that lease
has expired too.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import planting
import pytest
import stacks
import streamcheck

from dedupe_store.clock import Clock, ManualClock, SkewedClock, SystemClock
from dedupe_store.ledger import DynamoDBLedger, inflight_bucket
from dedupe_store.records import ClaimStatus, Group, GroupUpdate, LedgerRecord
from dedupe_store.states import GroupState, LedgerState
from devstack import emulators as local_stack
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.results import PutResultKind
from producer.audit.stream import audit_stream
from producer.key.readback import ReadBackResolver, ReadBackResult
from producer.outcomes import OutcomeStatus
from producer.protocol import Message, batches, prepare
from producer.reconcile.reconciler import Reconciler, ReconcileReport
from producer.settings import ProducerSettings
from producer.wiring import Stack, build_stack

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))
SHARDS = 2
# The signature fence off (stacks.FAST): these reconcilers run on clocks LATER_MS ahead of the
# wall clock that signs their requests, and the tests plant puts outside any lease; with the
# fence the check would compare the two clocks, not prove anything. The fence and the
# reconciler's resends under it: integration/test_signature_fence.py.
FAST = stacks.FAST
FAST_ENV = {
    "KEO_PUT_CONNECT_TIMEOUT_S": "1",
    "KEO_PUT_READ_TIMEOUT_S": "1",
    "KEO_CLOCK_SKEW_S": "0.5",
    "KEO_LEASE_S": "3",
    "KEO_PUT_FENCE": "off",
    "KEO_WAIT_INITIAL_S": "0.05",
    "KEO_WAIT_MAX_S": "0.5",
}
LATER_MS = 30_000  # how far ahead the in-process reconcilers' clock stands
# the lease of groups planted for in-process reconcilers: their puts land inside it however
# slow the machine is, and it has expired for everyone by a clock LATER_MS ahead
PLANTED_LEASE_MS = 15_000
CRASHED = "crashed-producer"

StackFactory = Callable[..., Stack]


# --- fixtures and helpers -----------------------------------------------------------------------


def settings_for(
    emulators: local_stack.Endpoints, names: Names, **overrides: Any
) -> ProducerSettings:
    return stacks.settings_for(emulators, names, FAST, **overrides)


@pytest.fixture
def make_stack(emulators: local_stack.Endpoints, names: Names) -> StackFactory:
    """Stacks on this test's stream and table (created on first use with ``shards``)."""
    created = False

    def make(*, clock: Clock | None = None, shards: int = SHARDS, **overrides: Any) -> Stack:
        nonlocal created
        settings = settings_for(emulators, names, **overrides)
        if not created:
            stacks.create_stream_and_table(settings, shards)
            created = True
        return build_stack(settings, clock=clock)

    return make


@pytest.fixture
def stack(make_stack: StackFactory) -> Stack:
    return make_stack()


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


@pytest.fixture
def cli_env(env: dict[str, str], names: Names) -> dict[str, str]:
    return {**env, **FAST_ENV, "KEO_STREAM": names.stream, "KEO_TABLE": names.table}


def messages(count: int, prefix: str = "order", routing_key: str | None = None) -> list[Message]:
    return [
        Message(f"{prefix}-{i:05d}", json.dumps({"order": i, "total": i * 7}).encode(), routing_key)
        for i in range(count)
    ]


def write_jsonl(path: Path, batch: Sequence[Message]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for m in batch:
            out.write(json.dumps({"key": m.key, "data": m.data.decode()}) + "\n")
    return path


def keys_of(batch: Sequence[Message]) -> list[str]:
    return [m.key for m in batch]


def plant_stale_claims(
    stack: Stack,
    batch: Sequence[Message],
    *,
    put: bool,
    store_payload: bool = False,
    claimed_at_ms: int | None = None,
    lease_ms: int | None = None,
    group_size: int = 50,
) -> list[Group]:
    """What a producer that crashed leaves: per chunk of ``group_size`` messages, a claim group
    opened and every key claimed for it, the records put or not, the group never settled.

    Each group's records are put right after its claims, well inside its lease (the policy's,
    unless ``lease_ms`` says otherwise). Returns the groups, as opened.
    """
    prepared, rejected = prepare(batch, DEFAULT_MAX_RECORD_BYTES)
    assert not rejected
    stream = stack.settings.stream
    lease_ms = lease_ms if lease_ms is not None else stack.settings.lease_policy().lease_ms
    groups: list[Group] = []

    def now_ms() -> int:
        # real time, whatever the stack's clock: the put below must land inside this lease
        return claimed_at_ms if claimed_at_ms is not None else SystemClock().now_ms()

    with ThreadPoolExecutor(16) as pool:
        for start in range(0, len(prepared), group_size):
            chunk = prepared[start : start + group_size]
            group = stack.ledger.open_group(
                stream,
                [item.key for item in chunk],
                owner=CRASHED,
                now_ms=now_ms(),
                lease_ms=lease_ms,
            )

            def claim(item: Any, group: Group = group) -> None:
                request = planting.request_of(stream, item.message, store_payload=store_payload)
                result = stack.ledger.claim(request, group, now_ms=now_ms())
                assert result.status is ClaimStatus.WON, result

            list(pool.map(claim, chunk))
            if put:
                for request in batches(chunk):
                    # the crashed producer's put, sent while its lease allowed it
                    results = stack.writer.put_entries(
                        [item.entry() for item in request],
                        lease_expires_at_ms=SystemClock().now_ms() + 60_000,
                    )
                    assert all(r.kind is PutResultKind.WRITTEN for r in results), results
            groups.append(group)
    return groups


def reconciler_for(
    stack: Stack,
    *,
    owner: str = "reconciler-test",
    ledger: DynamoDBLedger | None = None,
    resolver: ReadBackResolver | None = None,
    buckets: Sequence[int] | None = None,
) -> Reconciler:
    return Reconciler(
        stream=stack.settings.stream,
        ledger=ledger or stack.ledger,
        resolver=resolver or stack.resolver(),
        writer=stack.writer,
        clock=stack.clock,
        lease=stack.settings.lease_policy(),
        owner=owner,
        buckets=buckets,
    )


def later_clock() -> Clock:
    return SkewedClock(SystemClock(), LATER_MS)


def states(stack: Stack, keys: Sequence[str]) -> dict[str, LedgerState]:
    found = stack.ledger.batch_get(stack.settings.stream, keys)
    return {key: record.state for key, record in found.items()}


def wait_until_stale(stack: Stack, keys: Sequence[str]) -> None:
    """Sleep until the lease + skew of every key's group (whoever holds it now) has passed by
    the system clock, plus a margin."""
    records = stack.ledger.batch_get(stack.settings.stream, keys).values()
    latest_ms = max(r.lease_expires_at_ms or 0 for r in records)
    skew_ms = stack.settings.lease_policy().skew_ms
    delay_s = (latest_ms + skew_ms + 300 - SystemClock().now_ms()) / 1000
    if delay_s > 0:
        time.sleep(delay_s)


def run_keo(
    *args: str, env: dict[str, str], timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run ``keo``; if it hangs, abort it so that faulthandler prints where it was stuck."""
    process = subprocess.Popen(
        [KEO, *args],
        env={**env, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        stdout, stderr = process.communicate(timeout=30)
        pytest.fail(f"keo {' '.join(args)} hung for {timeout_s:g} s:\n{stderr[-6000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def json_line(stdout: str) -> dict[str, Any]:
    (line,) = [line for line in stdout.splitlines() if line.strip()]
    body: dict[str, Any] = json.loads(line)
    return body


def keo_audit(env: dict[str, str], expected: Path) -> tuple[int, dict[str, Any]]:
    result = run_keo("audit", "--expected", str(expected), "--json", env=env)
    return result.returncode, json_line(result.stdout)


# --- crashes of `keo send`, settled by `keo reconcile` ------------------------------------------


@pytest.mark.parametrize(
    ("failpoint", "store_payload", "settled_as"),
    [
        pytest.param("before_put", False, "released", id="crash-before-put"),
        pytest.param("before_put", True, "resent", id="crash-before-put-payload-stored"),
        pytest.param("before_mark", False, "delivered", id="crash-before-mark"),
    ],
)
def test_a_crashed_send_is_settled_by_reconcile_with_no_loss_and_no_duplicate(
    stack: Stack,
    kinesis: Any,
    cli_env: dict[str, str],
    tmp_path: Path,
    failpoint: str,
    store_payload: bool,
    settled_as: str,
) -> None:
    # GIVEN `keo send` of 60 messages was SIGKILLed at a failpoint after claiming them
    batch = messages(60)
    keys = keys_of(batch)
    source = write_jsonl(tmp_path / "orders.jsonl", batch)
    send_env = {**cli_env, "KEO_STORE_PAYLOAD": str(store_payload).lower()}
    crashed = run_keo(
        "send",
        "--input",
        str(source),
        "--no-progress",
        env={**send_env, "KEO_FAILPOINTS": f"{failpoint}=kill"},
    )
    assert crashed.returncode == -9, crashed.stderr
    assert set(states(stack, keys).values()) == {LedgerState.IN_FLIGHT}
    in_stream = streamcheck.read_stream(kinesis, stack.settings.stream)
    assert len(in_stream.records) == (len(keys) if failpoint == "before_mark" else 0)

    # WHEN the leases have expired and `keo reconcile --once` runs
    wait_until_stale(stack, keys)
    reconciled = run_keo("reconcile", "--once", "--json", "--no-progress", env=cli_env)

    # THEN every claim is settled the way its crash calls for, and none is left unresolved
    assert reconciled.returncode == 0, reconciled.stderr
    report = json_line(reconciled.stdout)
    assert report["scanned"] == len(keys), report
    assert report["groups"] >= 1, report
    assert report[settled_as] == len(keys), report
    assert report["unresolved"] == 0, report
    assert report["lost_races"] == 0, report
    if settled_as == "released":
        # nothing was put and nothing can be resent: the keys are free for the next producer
        assert set(states(stack, keys).values()) == {LedgerState.RELEASED}
        assert not streamcheck.read_stream(kinesis, stack.settings.stream).records
        resent = run_keo("send", "--input", str(source), "--no-progress", env=send_env)
        assert resent.returncode == 0, resent.stderr
        statuses = {json.loads(line)["status"] for line in resent.stdout.splitlines()}
        assert statuses == {OutcomeStatus.SENT.value}

    # and `keo audit` finds each key exactly once, no loss, no duplicate, no claim in flight
    code, audit = keo_audit(cli_env, source)
    assert code == 0, audit
    assert audit["clean"] is True
    assert audit["in_flight"] == []
    assert audit["duplicate_count"] == 0
    assert audit["missing_count"] == 0
    assert audit["user_records"] == len(keys)
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(
        contents, keys, stack.ledger, payloads={m.key: m.data for m in batch}
    )
    streamcheck.assert_only(contents, keys)


# --- retention ----------------------------------------------------------------------------------


def test_a_claim_older_than_retention_is_unverifiable_and_never_resent(
    stack: Stack, kinesis: Any
) -> None:
    # GIVEN a claim made 48 h ago on a stream that keeps 24 h, with its payload stored
    # (so the reconciler could resend it, and must not)
    assert stack.info.retention_hours == 24
    (message,) = messages(1, prefix="ancient")
    two_days_ago_ms = SystemClock().now_ms() - 48 * 3600 * 1000
    (group,) = plant_stale_claims(
        stack, [message], put=False, store_payload=True, claimed_at_ms=two_days_ago_ms
    )

    # WHEN the reconciler runs
    report = reconciler_for(stack).run_once()

    # THEN the claim is UNVERIFIABLE, surfaced, and nothing was written to the stream
    assert report.unverifiable == 1, report
    assert (report.groups, report.scanned) == (1, 1), report
    assert (report.resent, report.released, report.delivered) == (0, 0, 0)
    assert states(stack, [message.key]) == {message.key: LedgerState.UNVERIFIABLE}
    assert not streamcheck.read_stream(kinesis, stack.settings.stream).records
    # and its group is settled: no later run takes it over again
    settled = stack.ledger.get_group(stack.settings.stream, group.group_id)
    assert settled is not None, group
    assert settled.state is GroupState.SETTLED, settled
    assert open_groups(stack) == []
    audit = audit_stream(stack.reader, stack.ledger)
    assert audit.unverifiable == [message.key]
    assert not audit.clean
    # and a producer sending the key again is told so, and sends nothing
    with stack.producer() as producer:
        (outcome,) = producer.send([message])
    assert outcome.status is OutcomeStatus.UNVERIFIABLE
    assert not streamcheck.read_stream(kinesis, stack.settings.stream).records


# --- reconcilers racing -------------------------------------------------------------------------

SETTLED_AS = [
    pytest.param(True, False, "delivered", id="found-in-stream"),
    pytest.param(False, True, "resent", id="resent-from-stored-payload"),
    pytest.param(False, False, "released", id="released-without-payload"),
]


def meeting_point(parties: int) -> Callable[[str], None]:
    """Each caller waits, per group id, until ``parties`` callers have reached it."""
    barriers: dict[str, threading.Barrier] = {}
    lock = threading.Lock()

    def meet(group_id: str) -> None:
        with lock:
            barrier = barriers.setdefault(group_id, threading.Barrier(parties))
        barrier.wait(timeout=60)

    return meet


class MeetingLedger(DynamoDBLedger):
    """Takes a group over only when the other reconciler is about to take it over too: both
    have read the same stale groups, and race for each one at its conditional take-over."""

    def __init__(self, stack: Stack, meet: Callable[[str], None]) -> None:
        super().__init__(
            stack.settings.ledger_connection(),
            dedupe_ttl_s=stack.settings.dedupe_ttl_s,
            inflight_buckets=stack.settings.inflight_buckets,
        )
        self._meet = meet

    def take_over_group(
        self, seen: Group, *, owner: str, now_ms: int, lease_ms: int, skew_ms: int
    ) -> GroupUpdate:
        self._meet(seen.group_id)
        return super().take_over_group(
            seen, owner=owner, now_ms=now_ms, lease_ms=lease_ms, skew_ms=skew_ms
        )


class StallingResolver(ReadBackResolver):
    """Resolves, says so, then stalls until told to go on: its reconciler acts on what it read
    only after another reconciler has taken its groups over and settled them."""

    def __init__(self, stack: Stack, resolved: threading.Event, go: threading.Event) -> None:
        super().__init__(
            stack.reader,
            stack.clock,
            stack.settings.lease_policy(),
            retention_hours=stack.info.retention_hours,
        )
        self._resolved = resolved
        self._go = go

    def resolve(self, claims: Sequence[LedgerRecord]) -> dict[str, ReadBackResult]:
        results = super().resolve(claims)
        self._resolved.set()
        assert self._go.wait(timeout=120), "never told to go on"
        return results


def open_groups(stack: Stack) -> list[str]:
    """The stream's groups still OPEN (in the in-flight index, and so by a consistent read)."""
    far_future_ms = SystemClock().now_ms() + 365 * 24 * 3600 * 1000
    listed = list(stack.ledger.stale_groups(stack.settings.stream, now_ms=far_future_ms))
    found = stack.ledger.batch_get_groups(stack.settings.stream, listed)
    return sorted(g for g, group in found.items() if group.state is GroupState.OPEN)


def assert_settled_once(
    stack: Stack, kinesis: Any, batch: Sequence[Message], settled_as: str
) -> None:
    """Every key settled the way it should be, and in the stream exactly once (or, released,
    not at all), and the audit clean."""
    keys = keys_of(batch)
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    if settled_as == "released":
        assert states(stack, keys) == dict.fromkeys(keys, LedgerState.RELEASED)
        assert not contents.records
        assert audit_stream(stack.reader, stack.ledger).clean
    else:
        assert states(stack, keys) == dict.fromkeys(keys, LedgerState.DELIVERED)
        payloads = {m.key: m.data for m in batch}
        streamcheck.assert_exactly_once(contents, keys, stack.ledger, payloads=payloads)
        streamcheck.assert_only(contents, keys)
        assert audit_stream(stack.reader, stack.ledger, expected=keys).clean


@pytest.mark.parametrize(("put", "store_payload", "settled_as"), SETTLED_AS)
def test_two_reconcilers_over_the_same_stale_claims_settle_each_once(
    make_stack: StackFactory, kinesis: Any, put: bool, store_payload: bool, settled_as: str
) -> None:
    # GIVEN 80 stale claims in 4 groups: records put but unsettled, or never put (payload
    # stored or not)
    first = make_stack(clock=later_clock())
    batch = messages(80)
    keys = keys_of(batch)
    groups = plant_stale_claims(
        first,
        batch,
        put=put,
        store_payload=store_payload,
        lease_ms=PLANTED_LEASE_MS,
        group_size=20,
    )
    assert len(groups) == 4
    second = make_stack(clock=later_clock())

    # WHEN two reconcilers read the same stale groups, and only then both take each one over
    meet = meeting_point(2)
    reconcilers = [
        reconciler_for(s, owner=f"reconciler-{i}", ledger=MeetingLedger(s, meet))
        for i, s in enumerate((first, second))
    ]
    with ThreadPoolExecutor(2) as pool:
        reports: list[ReconcileReport] = list(pool.map(lambda r: r.run_once(), reconcilers))

    # THEN each group was taken over by exactly one of them: the other lost the race for it
    assert all(r.errors == 0 and r.unresolved == 0 for r in reports), reports
    assert sum(r.groups for r in reports) == len(groups), reports
    assert sum(r.lost_races for r in reports) == len(groups), reports
    # and each claim was resolved and settled once, by the reconciler that holds its group
    assert sum(r.scanned for r in reports) == len(keys), reports
    assert sum(getattr(r, settled_as) for r in reports) == len(keys), reports
    # and the stream holds each key at most once, as the ledger says, and no group is left open
    assert_settled_once(first, kinesis, batch, settled_as)
    assert open_groups(first) == []


@pytest.mark.parametrize(("put", "store_payload", "settled_as"), SETTLED_AS)
def test_a_reconciler_stalled_past_its_lease_settles_nothing_the_next_one_took_over(
    make_stack: StackFactory, kinesis: Any, put: bool, store_payload: bool, settled_as: str
) -> None:
    # GIVEN 80 stale claims in 4 groups: records put but unsettled, or never put (payload
    # stored or not)
    stack = make_stack(clock=later_clock())
    batch = messages(80)
    keys = keys_of(batch)
    groups = plant_stale_claims(
        stack,
        batch,
        put=put,
        store_payload=store_payload,
        lease_ms=PLANTED_LEASE_MS,
        group_size=20,
    )
    group_ids = [g.group_id for g in groups]
    # and a reconciler that took every group over and resolved its claims, then stalled
    resolved, go = threading.Event(), threading.Event()
    stalled = reconciler_for(
        stack, owner="reconciler-stalled", resolver=StallingResolver(stack, resolved, go)
    )
    with ThreadPoolExecutor(1) as pool:
        stalled_run = pool.submit(stalled.run_once)
        try:
            assert resolved.wait(timeout=120), stalled_run
            held = stack.ledger.batch_get_groups(stack.settings.stream, group_ids)
            assert {g.owner for g in held.values()} == {"reconciler-stalled"}, held

            # WHEN its lease expires and another reconciler, whose clock is well past that
            # lease, takes the groups over and settles them
            later = make_stack(clock=SkewedClock(SystemClock(), 2 * LATER_MS))
            report = reconciler_for(later, owner="reconciler-next").run_once()
        finally:
            # and only then the stalled one goes on with what it read
            go.set()
        stalled_report = stalled_run.result(timeout=120)

    # THEN the next reconciler settled every claim
    assert (report.groups, report.scanned) == (len(groups), len(keys)), report
    assert getattr(report, settled_as) == len(keys), report
    assert report.lost_races == 0, report
    assert (report.errors, report.unresolved) == (0, 0), report
    # and the stalled one, going on, settled none: each of its writes lost to the next one's
    assert (stalled_report.groups, stalled_report.scanned) == (len(groups), len(keys))
    counted = (stalled_report.delivered, stalled_report.resent, stalled_report.released)
    assert counted == (0, 0, 0), stalled_report
    assert stalled_report.lost_races == len(keys), stalled_report
    assert (stalled_report.errors, stalled_report.unresolved) == (0, 0), stalled_report
    assert_settled_once(stack, kinesis, batch, settled_as)
    # and a reconciler running after both finds nothing left to resolve, and changes nothing
    last = make_stack(clock=SkewedClock(SystemClock(), 3 * LATER_MS))
    after = reconciler_for(last, owner="reconciler-last").run_once()
    assert after.scanned == 0, after
    assert (after.delivered, after.resent, after.released, after.unverifiable) == (0, 0, 0, 0)
    assert (after.errors, after.unresolved) == (0, 0), after
    assert_settled_once(stack, kinesis, batch, settled_as)
    assert open_groups(stack) == []


def bucket_of(stack: Stack, group: Group) -> int:
    """The in-flight index bucket the ledger files an OPEN group under."""
    value = inflight_bucket(group.stream, group.group_id, stack.ledger.inflight_buckets)
    return int(value.rsplit("#", 1)[1])


def test_two_reconcilers_sharing_the_buckets_settle_all_claims(
    stack: Stack, kinesis: Any, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN stale groups of 10 claims whose records are in the stream: at least 6 groups, in
    # both halves of the index buckets (a group's bucket follows from its random id)
    batch: list[Message] = []
    groups: list[Group] = []
    while len(groups) < 6 or len({bucket_of(stack, g) % 2 for g in groups}) < 2:
        assert len(groups) < 40, "the groups' buckets never spread over both halves"
        more = messages(10, prefix=f"group{len(groups):02d}")
        groups.extend(plant_stale_claims(stack, more, put=True, group_size=10))
        batch.extend(more)
    keys = keys_of(batch)
    halves = [[g for g in groups if bucket_of(stack, g) % 2 == share] for share in (0, 1)]
    wait_until_stale(stack, keys)

    # WHEN `keo reconcile --bucket 0/2` and `--bucket 1/2` run at once
    command = [KEO, "reconcile", "--once", "--json", "--no-progress", "--bucket"]
    processes = [
        subprocess.Popen(
            [*command, share],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for share in ("0/2", "1/2")
    ]
    outputs = [p.communicate(timeout=120) for p in processes]

    # THEN each settled exactly the groups of its buckets and their claims, together all of them
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
    reports = [json_line(stdout) for stdout, _ in outputs]
    expected = [(len(half), 10 * len(half), 10 * len(half)) for half in halves]
    assert [(r["groups"], r["scanned"], r["delivered"]) for r in reports] == expected, reports
    assert all(r["lost_races"] == 0 and r["unresolved"] == 0 for r in reports), reports
    source = tmp_path / "keys.txt"
    source.write_text("\n".join(keys) + "\n", encoding="utf-8")
    code, audit = keo_audit(cli_env, source)
    assert code == 0, audit
    assert audit["clean"] is True
    streamcheck.assert_exactly_once(
        streamcheck.read_stream(kinesis, stack.settings.stream), keys, stack.ledger
    )
    assert open_groups(stack) == []


# --- cost of read-back --------------------------------------------------------------------------


def test_get_records_calls_do_not_grow_with_the_number_of_claims_on_a_shard(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # GIVEN a 4-shard stream and stale claims whose records all route to one shard
    stack = make_stack(clock=later_clock(), shards=4)
    calls: dict[int, int] = {}
    for count in (10, 300):
        batch = messages(count, prefix=f"n{count}", routing_key="tenant-7")
        groups = plant_stale_claims(stack, batch, put=True, lease_ms=PLANTED_LEASE_MS)

        # WHEN the reconciler settles them
        report = reconciler_for(stack).run_once()

        # THEN all are found in the stream, each shard window read once for all their groups
        assert report.groups == len(groups), report
        assert report.delivered == count, report
        calls[count] = report.get_records_calls
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    assert len(contents.per_shard()) == 1
    # a page of records and the empty page at the tip: not one call (or more) per claim
    assert calls[10] <= 3, calls
    assert calls[300] <= 3, calls
    assert calls[300] <= calls[10] + 1, calls


def test_a_reconciler_killed_before_its_marks_leaves_the_claims_to_the_next_one(
    stack: Stack,
    make_stack: StackFactory,
    kinesis: Any,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    # GIVEN 30 stale claims in one group, whose records are in the stream
    batch = messages(30)
    keys = keys_of(batch)
    (group,) = plant_stale_claims(stack, batch, put=True)
    wait_until_stale(stack, keys)

    # WHEN `keo reconcile` is SIGKILLed after taking the group over and finding the records,
    # before settling it
    killed = run_keo(
        "reconcile",
        "--once",
        "--no-progress",
        env={**cli_env, "KEO_FAILPOINTS": "reconcile_before_mark=kill"},
    )
    assert killed.returncode == -9, killed.stderr
    assert states(stack, keys) == dict.fromkeys(keys, LedgerState.IN_FLIGHT)
    # the group is the killed reconciler's now, under a lease of its own
    held = stack.ledger.get_group(stack.settings.stream, group.group_id)
    assert held is not None, group
    assert held.state is GroupState.OPEN, held
    assert held.epoch == group.epoch + 1, held
    assert held.owner.startswith("reconciler:"), held
    assert held.lease_expires_at_ms > group.lease_expires_at_ms, held
    # so a reconciler whose clock has not passed that lease (+ skew) leaves the group alone
    early = make_stack(clock=ManualClock(held.lease_expires_at_ms))
    untouched = reconciler_for(early).run_once()
    assert (untouched.groups, untouched.scanned, untouched.lost_races) == (0, 0, 0), untouched
    assert stack.ledger.get_group(stack.settings.stream, group.group_id) == held
    # and once it has, `keo reconcile` runs again
    wait_until_stale(stack, keys)
    again = run_keo("reconcile", "--once", "--json", "--no-progress", env=cli_env)

    # THEN the second run takes the group over from the killed one, and records every record
    assert again.returncode == 0, again.stderr
    report = json_line(again.stdout)
    assert (report["groups"], report["scanned"]) == (1, len(keys)), report
    assert report["delivered"] == len(keys), report
    assert (report["lost_races"], report["unresolved"]) == (0, 0), report
    source = tmp_path / "keys.txt"
    source.write_text("\n".join(keys) + "\n", encoding="utf-8")
    code, audit = keo_audit(cli_env, source)
    assert code == 0, audit
    streamcheck.assert_exactly_once(
        streamcheck.read_stream(kinesis, stack.settings.stream), keys, stack.ledger
    )
    assert open_groups(stack) == []
