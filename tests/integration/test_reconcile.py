"""The reconciler against kinesalite and dynalite: stale claims are settled once, never twice.

Crashes are real: ``keo send`` runs in a subprocess with a failpoint that SIGKILLs it after
its claims and before its put (or after its put and before its mark). Then ``keo reconcile
--once`` settles the stale claims and ``keo audit`` proves the stream holds each key once.

In-process tests plant stale claims the way a crashed producer leaves them (claim, then put
or not, never mark) and run a ``Reconciler`` whose injected clock stands 30 s later, so the
leases have expired for everyone without the test waiting for them.

Leases are short (put timeouts 1 s + 1 s, skew 0.5 s, lease 3 s, the minimum), so a claim is
stale about 3.5 s after it was made.
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

import pytest
import stacks
import streamcheck

from dedupe_store import inflight
from dedupe_store.clock import Clock, SkewedClock, SystemClock
from dedupe_store.records import ClaimRequest, ClaimStatus, LedgerRecord
from dedupe_store.states import LedgerState
from devstack import emulators as local_stack
from producer.audit import audit_stream
from producer.outcomes import OutcomeStatus
from producer.protocol import DEFAULT_MAX_RECORD_BYTES, Message, PutResultKind, batches, prepare
from producer.readback import ReadBackResolver, ReadBackResult
from producer.reconciler import Reconciler, ReconcileReport
from producer.settings import ProducerSettings
from producer.wiring import Stack, build_stack

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))
SHARDS = 2
FAST: dict[str, Any] = {
    "put_connect_timeout_s": 1.0,
    "put_read_timeout_s": 1.0,
    "clock_skew_s": 0.5,
    "lease_s": 3.0,
    "wait_initial_s": 0.05,
    "wait_max_s": 0.5,
}
FAST_ENV = {
    "KEO_PUT_CONNECT_TIMEOUT_S": "1",
    "KEO_PUT_READ_TIMEOUT_S": "1",
    "KEO_CLOCK_SKEW_S": "0.5",
    "KEO_LEASE_S": "3",
    "KEO_WAIT_INITIAL_S": "0.05",
    "KEO_WAIT_MAX_S": "0.5",
}
LATER_MS = 30_000  # how far ahead the in-process reconcilers' clock stands
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
) -> list[LedgerRecord]:
    """What a producer that crashed leaves: a claim per message, its record put or not, no mark.

    Claims and puts go in chunks of 50 so every put leaves well inside its claim's lease.
    """
    prepared, rejected = prepare(batch, DEFAULT_MAX_RECORD_BYTES)
    assert not rejected
    lease_ms = stack.settings.lease_policy().lease_ms
    claims: list[LedgerRecord] = []

    def claim(item: Any) -> LedgerRecord:
        request = ClaimRequest(
            stack.settings.stream,
            item.key,
            item.payload_digest,
            item.explicit_hash_key,
            item.message.data if store_payload else None,
        )
        # real time, whatever the stack's clock: the put below must land inside this lease
        now_ms = claimed_at_ms if claimed_at_ms is not None else SystemClock().now_ms()
        result = stack.ledger.claim(request, owner=CRASHED, now_ms=now_ms, lease_ms=lease_ms)
        assert result.status is ClaimStatus.WON, result
        assert result.record is not None
        return result.record

    with ThreadPoolExecutor(16) as pool:
        for start in range(0, len(prepared), 50):
            chunk = prepared[start : start + 50]
            claims.extend(pool.map(claim, chunk))
            if put:
                for request in batches(chunk):
                    results = stack.writer.put_entries([item.entry() for item in request])
                    assert all(r.kind is PutResultKind.WRITTEN for r in results), results
    return claims


def reconciler_for(
    stack: Stack,
    *,
    owner: str = "reconciler-test",
    resolver: ReadBackResolver | None = None,
    buckets: Sequence[int] | None = None,
) -> Reconciler:
    return Reconciler(
        stream=stack.settings.stream,
        ledger=stack.ledger,
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
    """Sleep until every claim's lease + skew has passed by the system clock (plus a margin)."""
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
    assert report["scanned"] == len(keys)
    assert report[settled_as] == len(keys), report
    assert report["unresolved"] == 0
    assert report["lost_races"] == 0
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
    plant_stale_claims(
        stack, [message], put=False, store_payload=True, claimed_at_ms=two_days_ago_ms
    )

    # WHEN the reconciler runs
    report = reconciler_for(stack).run_once()

    # THEN the claim is UNVERIFIABLE, surfaced, and nothing was written to the stream
    assert report.unverifiable == 1, report
    assert (report.resent, report.released, report.delivered) == (0, 0, 0)
    assert states(stack, [message.key]) == {message.key: LedgerState.UNVERIFIABLE}
    assert not streamcheck.read_stream(kinesis, stack.settings.stream).records
    audit = audit_stream(stack.reader, stack.ledger)
    assert audit.unverifiable == [message.key]
    assert not audit.clean
    # and a producer sending the key again is told so, and sends nothing
    with stack.producer() as producer:
        (outcome,) = producer.send([message])
    assert outcome.status is OutcomeStatus.UNVERIFIABLE
    assert not streamcheck.read_stream(kinesis, stack.settings.stream).records


# --- reconcilers racing -------------------------------------------------------------------------


class MeetingResolver(ReadBackResolver):
    """Resolves, then waits for the other reconciler: both act on the very same claims."""

    def __init__(self, stack: Stack, barrier: threading.Barrier) -> None:
        super().__init__(
            stack.reader,
            stack.clock,
            stack.settings.lease_policy(),
            retention_hours=stack.info.retention_hours,
        )
        self._barrier = barrier

    def resolve(self, claims: Sequence[LedgerRecord]) -> dict[str, ReadBackResult]:
        results = super().resolve(claims)
        self._barrier.wait(timeout=60)
        return results


@pytest.mark.parametrize(
    ("put", "store_payload", "settled_as"),
    [
        pytest.param(True, False, "delivered", id="found-in-stream"),
        pytest.param(False, True, "resent", id="resent-from-stored-payload"),
        pytest.param(False, False, "released", id="released-without-payload"),
    ],
)
def test_two_reconcilers_over_the_same_stale_claims_settle_each_once(
    make_stack: StackFactory, kinesis: Any, put: bool, store_payload: bool, settled_as: str
) -> None:
    # GIVEN 80 stale claims: records put but unmarked, or never put (payload stored or not)
    first = make_stack(clock=later_clock())
    batch = messages(80)
    keys = keys_of(batch)
    plant_stale_claims(first, batch, put=put, store_payload=store_payload)
    second = make_stack(clock=later_clock())

    # WHEN two reconcilers resolve all of them and only then both act, at once
    barrier = threading.Barrier(2)
    reconcilers = [
        reconciler_for(s, owner=f"reconciler-{i}", resolver=MeetingResolver(s, barrier))
        for i, s in enumerate((first, second))
    ]
    with ThreadPoolExecutor(2) as pool:
        reports: list[ReconcileReport] = list(pool.map(lambda r: r.run_once(), reconcilers))

    # THEN every claim is settled, and the stream holds each key at most once
    assert [r.scanned for r in reports] == [len(keys), len(keys)]
    assert all(r.errors == 0 and r.unresolved == 0 for r in reports), reports
    contents = streamcheck.read_stream(kinesis, first.settings.stream)
    if settled_as == "released":
        assert set(states(first, keys).values()) == {LedgerState.RELEASED}
        assert not contents.records
    else:
        assert set(states(first, keys).values()) == {LedgerState.DELIVERED}
        payloads = {m.key: m.data for m in batch}
        streamcheck.assert_exactly_once(contents, keys, first.ledger, payloads=payloads)
        streamcheck.assert_only(contents, keys)
        assert audit_stream(first.reader, first.ledger, expected=keys).clean
    # and each claim was settled by exactly one of them; the other lost the race
    assert sum(getattr(r, settled_as) for r in reports) == len(keys), reports
    assert sum(r.lost_races for r in reports) == len(keys), reports


def bucket_of(stack: Stack, key: str) -> int:
    return inflight.bucket_of(key, stack.ledger.inflight_buckets)


def test_two_reconcilers_sharing_the_buckets_settle_all_claims(
    stack: Stack, kinesis: Any, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN 60 stale claims whose records are in the stream, spread over the index buckets
    batch = messages(60)
    keys = keys_of(batch)
    plant_stale_claims(stack, batch, put=True)
    even = {k for k in keys if bucket_of(stack, k) % 2 == 0}
    assert 0 < len(even) < len(keys)
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

    # THEN each settled exactly the claims of its buckets, and together all of them
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
    reports = [json_line(stdout) for stdout, _ in outputs]
    assert [r["scanned"] for r in reports] == [len(even), len(keys) - len(even)], reports
    assert [r["delivered"] for r in reports] == [len(even), len(keys) - len(even)], reports
    assert all(r["lost_races"] == 0 and r["unresolved"] == 0 for r in reports), reports
    source = tmp_path / "keys.txt"
    source.write_text("\n".join(keys) + "\n", encoding="utf-8")
    code, audit = keo_audit(cli_env, source)
    assert code == 0, audit
    assert audit["clean"] is True
    streamcheck.assert_exactly_once(
        streamcheck.read_stream(kinesis, stack.settings.stream), keys, stack.ledger
    )


# --- cost of read-back --------------------------------------------------------------------------


def test_get_records_calls_do_not_grow_with_the_number_of_claims_on_a_shard(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # GIVEN a 4-shard stream and stale claims whose records all route to one shard
    stack = make_stack(clock=later_clock(), shards=4)
    calls: dict[int, int] = {}
    for count in (10, 300):
        batch = messages(count, prefix=f"n{count}", routing_key="tenant-7")
        plant_stale_claims(stack, batch, put=True)

        # WHEN the reconciler settles them
        report = reconciler_for(stack).run_once()

        # THEN all are found in the stream, each shard window read once
        assert report.delivered == count, report
        calls[count] = report.get_records_calls
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    assert len(contents.per_shard()) == 1
    # a page of records and the empty page at the tip: not one call (or more) per claim
    assert calls[10] <= 3, calls
    assert calls[300] <= 3, calls
    assert calls[300] <= calls[10] + 1, calls


def test_a_reconciler_killed_before_its_marks_leaves_the_claims_to_the_next_one(
    stack: Stack, kinesis: Any, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN 30 stale claims whose records are in the stream
    batch = messages(30)
    keys = keys_of(batch)
    plant_stale_claims(stack, batch, put=True)
    wait_until_stale(stack, keys)

    # WHEN `keo reconcile` is SIGKILLed after finding them, before marking any
    killed = run_keo(
        "reconcile",
        "--once",
        "--no-progress",
        env={**cli_env, "KEO_FAILPOINTS": "reconcile_before_mark=kill"},
    )
    assert killed.returncode == -9, killed.stderr
    assert set(states(stack, keys).values()) == {LedgerState.IN_FLIGHT}
    # and `keo reconcile` runs again
    again = run_keo("reconcile", "--once", "--json", "--no-progress", env=cli_env)

    # THEN the second run finds and marks every one, and the audit is clean
    assert again.returncode == 0, again.stderr
    report = json_line(again.stdout)
    assert report["delivered"] == len(keys), report
    source = tmp_path / "keys.txt"
    source.write_text("\n".join(keys) + "\n", encoding="utf-8")
    code, audit = keo_audit(cli_env, source)
    assert code == 0, audit
    streamcheck.assert_exactly_once(
        streamcheck.read_stream(kinesis, stack.settings.stream), keys, stack.ledger
    )
