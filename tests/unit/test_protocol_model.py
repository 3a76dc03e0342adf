"""A model of the whole protocol: real producers, read-back and reconciler over fake stores.

Hypothesis drives two ``ExactlyOnceProducer`` s, a ``Reconciler`` and the clock through sends
(keys repeat, sometimes with other data), put faults (written, response lost, not written,
late, held, throttled), ledger faults (unavailable, responses lost, throttled: slow and applied
late, or failing after the SDK's backoff, lease renewals and take-overs included), crashes at
each failpoint, and time passing. Nothing sleeps: ``sleep`` moves a ``ManualClock`` and lands
late writes. The signature fence is off (``LEASE`` has no window): each party's put client has
the lease deadline ``keo`` installs then (:func:`producer.fence.fence_for`, on its own clock),
which refuses a put with less than its timeouts + skew of lease left. A LATE write lands within
its put's timeout; a HELD one after it (the client gave up; the network still holds it), but
before the lease it was sent under ends. Past that lease, by a process stalled after the check
or a network holding it longer, fence-off mode can duplicate (the documented bound, which only
the signature window closes): the model has neither. After every step:

- each key is in the stream at most once, counting the late writes still to land;
- every DELIVERED ledger item names a record at exactly its position, with its key and digest;
- every SENT or DUPLICATE outcome names a position holding its key (or a write still to land).

At the end of each run every lease is let run out, late writes land, the reconciler runs until
nothing is stale, and every released or never-claimed key is sent again: then every key that
was ever sent is in the stream exactly once, and the ledger says where.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

import pytest
from fakes.kinesis import FakeKinesisClient, FakePutClient, PutFault
from fakes.ledger import InMemoryLedger, LedgerFault
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from dedupe_store.clock import Clock, ManualClock, SkewedClock
from dedupe_store.errors import LedgerError
from dedupe_store.records import Position
from dedupe_store.states import LedgerState
from devstack.failpoints import FailpointError, Failpoints
from kinesis_store.reader import KinesisReader
from kinesis_store.results import LEASE_FENCE, RecordResult
from kinesis_store.writer import KinesisWriter
from producer.fence import fence_for
from producer.hooks import Hooks, Step
from producer.key.producer import ExactlyOnceProducer, ProducerPolicy
from producer.key.readback import ReadBackResolver
from producer.outcomes import OutcomeStatus
from producer.protocol import LeasePolicy, Message, explicit_hash_key, payload_digest
from producer.reconcile.reconciler import Reconciler

_P = ParamSpec("_P")
_T = TypeVar("_T")

STREAM = "model-stream"
KEYS = [f"k{i}" for i in range(6)]
LEASE = LeasePolicy(lease_ms=20_000, put_timeout_ms=7_000, skew_ms=5_000)
# past any lease by any clock: lease + skew, and two clocks up to a skew apart each way
FOREVER_MS = LEASE.lease_ms + 4 * LEASE.skew_ms
STEPS = ["after_claim", "before_put", "after_put", "before_mark"]
LEDGER_OPERATIONS = [
    "open_group",
    "claim",
    "record_positions",
    "renew_lease",
    "take_over_key",
    "take_over_group",
    "release",
    "batch_get_claims",
    "batch_get_groups",
]
READ_OPERATIONS = {"batch_get_claims", "batch_get_groups"}
# how long the SDK's retries of a throttled ledger call take: up to past a put's timeouts +
# skew (the lease deadline then refuses the put that follows), and past a whole lease
THROTTLED_FOR_MS = [200, 5_000, LEASE.put_timeout_ms + LEASE.skew_ms, LEASE.lease_ms]


def data_of(key: str, variant: int) -> bytes:
    return f"{key}:payload:{variant}".encode()


class SynchronousExecutor(Executor):
    """Runs each call at once, in order: a run is a pure function of its steps."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        future: Future[_T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class ProtocolModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.failpoints = Failpoints()
        self.hooks = _Switch(self.failpoints)
        self.clock = ManualClock()
        self.kinesis = FakeKinesisClient(
            stream=STREAM, clock=self.clock, shard_count=2, put_timeout_ms=LEASE.put_timeout_ms
        )
        self.ledger = InMemoryLedger(inflight_buckets=4, sleep_ms=self.kinesis.advance)
        self.producers: list[ExactlyOnceProducer] = []
        self.reconciler: Reconciler | None = None
        self.sent: dict[str, set[int]] = {}  # key -> data variants ever given to send()
        self.delivered_claims: list[tuple[str, Position]] = []  # from SENT/DUPLICATE outcomes
        self.writers: list[_LeaseTellingWriter] = []

    @initialize(
        seed=st.integers(0, 2**16),
        # every party's clock is within the skew margin of Kinesis' arrival clock
        offsets_ms=st.lists(
            st.sampled_from([-LEASE.skew_ms, -1_000, 0, 1_000, LEASE.skew_ms]),
            min_size=3,
            max_size=3,
        ),
    )
    def start(self, seed: int, offsets_ms: list[int]) -> None:
        self.kinesis.seed(seed)
        self.offsets_ms = offsets_ms
        self.producers = [
            self._producer("producer-0", offsets_ms[0], store_payload_max_bytes=None),
            # this one stores payloads in its claims: the reconciler can resend them
            self._producer("producer-1", offsets_ms[1], store_payload_max_bytes=1024),
        ]
        clock = SkewedClock(self.clock, offsets_ms[2])
        self.reconciler = Reconciler(
            stream=STREAM,
            ledger=self.ledger,
            resolver=self._resolver(clock),
            writer=self._writer(clock),
            clock=clock,
            lease=LEASE,
            owner="reconciler",
            sleep=self.kinesis.sleep,
        )

    def _writer(self, clock: Clock) -> KinesisWriter:
        """A party's writer: its own put client, with the lease deadline on its clock."""
        client = FakePutClient(self.kinesis)
        fence_for(LEASE, clock).install(client)
        writer = _LeaseTellingWriter(client, self.kinesis)
        self.writers.append(writer)
        return writer

    def _resolver(self, clock: Clock) -> ReadBackResolver:
        reader = KinesisReader(self.kinesis, STREAM, sleep=self.kinesis.sleep)
        return ReadBackResolver(reader, clock, LEASE, retention_hours=24)

    def _producer(
        self, owner: str, offset_ms: int, *, store_payload_max_bytes: int | None
    ) -> ExactlyOnceProducer:
        policy = ProducerPolicy(
            lease=LEASE,
            put_max_attempts=3,
            store_payload_max_bytes=store_payload_max_bytes,
        )
        clock = SkewedClock(self.clock, offset_ms)
        return ExactlyOnceProducer(
            stream=STREAM,
            ledger=self.ledger,
            writer=self._writer(clock),
            clock=clock,
            policy=policy,
            resolver=self._resolver(clock),
            owner=owner,
            sleep=self.kinesis.sleep,
            executor=SynchronousExecutor(),
            rng=random.Random(0),
            hooks=self.hooks,
        )

    # --- rules ----------------------------------------------------------------------------

    @rule(
        producer=st.integers(0, 1),
        batch=st.lists(
            st.tuples(st.sampled_from(KEYS), st.sampled_from([0, 0, 0, 1])), min_size=1, max_size=5
        ),
    )
    def send(self, producer: int, batch: list[tuple[str, int]]) -> None:
        self._send(producer, batch)

    @rule(
        producer=st.integers(0, 1),
        batch=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True),
        step=st.sampled_from(STEPS),
    )
    def crash(self, producer: int, batch: list[str], step: str) -> None:
        """The producer dies at ``step``: its claims stay IN_FLIGHT, its puts may be out."""
        self.failpoints.arm(f"{step}=raise")
        try:
            self._send(producer, [(key, 0) for key in batch])
        except FailpointError:
            pass
        finally:
            self.failpoints.disarm()

    @rule(
        producer=st.integers(0, 1),
        batch=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True),
        step=st.sampled_from([Step(step) for step in STEPS]),
        reconcile=st.booleans(),
        other_sends=st.booleans(),
    )
    def stall_mid_send(
        self, producer: int, batch: list[str], step: Step, reconcile: bool, other_sends: bool
    ) -> None:
        """The producer stalls at ``step``, past its group's lease, while a reconciler (maybe)
        takes the group over and the other producer (maybe) sends the same keys; then it wakes
        up: it renews or moves its keys (its take-overs racing theirs), puts, and settles."""
        self.hooks.current = _Stall(
            self,
            step=step,
            reconcile=reconcile,
            other=1 - producer if other_sends else None,
            keys=batch,
        )
        try:
            self._send(producer, [(key, 0) for key in batch])
        finally:
            self.hooks.current = self.failpoints

    @rule(faults=st.lists(st.sampled_from(list(PutFault)), min_size=1, max_size=3))
    def put_faults(self, faults: list[PutFault]) -> None:
        self.kinesis.script(*faults)

    @rule(
        operation=st.sampled_from(LEDGER_OPERATIONS),
        fault=st.sampled_from(list(LedgerFault)),
    )
    def ledger_fault(self, operation: str, fault: LedgerFault) -> None:
        if operation in READ_OPERATIONS:
            fault = LedgerFault.UNAVAILABLE
        self.ledger.inject(operation, fault)

    @rule(
        operation=st.sampled_from(LEDGER_OPERATIONS),
        applied=st.booleans(),
        delay_ms=st.sampled_from(THROTTLED_FOR_MS),
    )
    def ledger_throttled(self, operation: str, applied: bool, delay_ms: int) -> None:
        """DynamoDB throttles the next call: the SDK's retries take ``delay_ms``, then the
        write applies late (as built when the call began) or the call fails."""
        fault = LedgerFault.THROTTLED_THEN_APPLIED if applied else LedgerFault.THROTTLED
        if operation in READ_OPERATIONS:
            fault = LedgerFault.THROTTLED
        self.ledger.inject(operation, fault, delay_ms=delay_ms)

    @rule(ms=st.sampled_from([200, 1_000, 5_000, LEASE.lease_ms, LEASE.lease_ms + LEASE.skew_ms]))
    def advance(self, ms: int) -> None:
        self.kinesis.advance(ms)

    @rule()
    def land_late_writes(self) -> None:
        self.kinesis.land_all()

    @rule()
    def reconcile(self) -> None:
        # a ledger read that fails ends the run (retriable): the next run starts over
        assert self.reconciler is not None
        with contextlib.suppress(LedgerError):
            report = self.reconciler.run_once()
            for name in ("delivered", "resent", "released", "pending", "lost_races", "errors"):
                if getattr(report, name):
                    event(f"reconcile: {name}")
        self._note_refusals()

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def each_key_at_most_once_in_the_stream(self) -> None:
        copies = Counter(r.partition_key for r in self.kinesis.visible())
        copies.update(str(p.entry["PartitionKey"]) for p in self.kinesis.pending())
        assert [key for key, n in copies.items() if n > 1] == [], self._story()

    @invariant()
    def delivered_items_name_their_record(self) -> None:
        by_position = {(r.shard_id, r.sequence_number): r for r in self.kinesis.visible()}
        for item in self.ledger.scan(STREAM):
            if item.state is not LedgerState.DELIVERED:
                continue
            assert item.position is not None
            record = by_position.get((item.position.shard_id, item.position.sequence_number))
            assert record is not None, (item, self._story())
            assert record.partition_key == item.key
            assert payload_digest(record.data, item.routing_hash_key) == item.payload_digest

    @invariant()
    def delivered_outcomes_name_their_record(self) -> None:
        by_position = {(r.shard_id, r.sequence_number): r for r in self.kinesis.visible()}
        pending = {str(p.entry["PartitionKey"]) for p in self.kinesis.pending()}
        for key, position in self.delivered_claims:
            record = by_position.get((position.shard_id, position.sequence_number))
            assert (record is not None and record.partition_key == key) or key in pending, (
                key,
                position,
                self._story(),
            )

    # --- the end of a run -------------------------------------------------------------------

    def teardown(self) -> None:
        self.failpoints.disarm()
        try:
            self._settle_everything()
        finally:
            for producer in self.producers:
                producer.close()

    def _settle_everything(self) -> None:
        self.kinesis.clear_script()
        self.kinesis.set_fault_weights({})
        self.ledger.clear_faults()
        # every lease runs out for everyone, by every clock; every late write has landed
        self.kinesis.advance(FOREVER_MS)
        self.kinesis.land_all()
        assert self.reconciler is not None
        for _ in range(5):
            self.reconciler.run_once()
            if all(i.state is not LedgerState.IN_FLIGHT for i in self.ledger.scan(STREAM)):
                break
            self.kinesis.advance(FOREVER_MS)
        items = {item.key: item for item in self.ledger.scan(STREAM)}
        assert not [k for k, i in items.items() if i.state is LedgerState.IN_FLIGHT], self._story()
        again = []
        for key, variants in sorted(self.sent.items()):
            item = items.get(key)
            if item is None or item.state is LedgerState.RELEASED:
                variant = next(
                    (
                        v
                        for v in sorted(variants)
                        if item is None or _digest(key, v) == item.payload_digest
                    ),
                    min(variants),
                )
                again.append((key, variant))
        if again:
            outcomes = self.producers[0].send([Message(k, data_of(k, v)) for k, v in again])
            assert all(o.status is OutcomeStatus.SENT for o in outcomes), (outcomes, self._story())
        copies = Counter(r.partition_key for r in self.kinesis.visible())
        assert copies == Counter(set(self.sent)), self._story()
        items = {item.key: item for item in self.ledger.scan(STREAM)}
        assert all(items[k].state is LedgerState.DELIVERED for k in self.sent), self._story()
        self.delivered_items_name_their_record()

    # --- helpers ----------------------------------------------------------------------------

    def send_now(self, producer: int, batch: list[tuple[str, int]]) -> None:
        """A send by ``producer`` in the middle of another's (from a stall's hook, on the
        stalled producer's thread: Hypothesis' events are recorded on the test's only)."""
        self._send(producer, batch, events=False)

    def _send(self, producer: int, batch: list[tuple[str, int]], *, events: bool = True) -> None:
        for key, variant in batch:
            self.sent.setdefault(key, set()).add(variant)
        messages = [Message(key, data_of(key, variant)) for key, variant in batch]
        for outcome in self.producers[producer].send(messages):
            if events:
                event(f"outcome: {outcome.status}")
            if outcome.status in {OutcomeStatus.SENT, OutcomeStatus.DUPLICATE}:
                assert outcome.key is not None
                assert outcome.position is not None, outcome
                self.delivered_claims.append((outcome.key, outcome.position))
        if events:
            self._note_refusals()

    def _note_refusals(self) -> None:
        if any(writer.refused for writer in self.writers):
            event("a put refused by the lease deadline")

    def _story(self) -> Iterator[Any]:
        return iter(
            [
                (
                    "stream",
                    [
                        (r.shard_id, r.sequence_number, r.partition_key, r.arrival_ms)
                        for r in self.kinesis.visible()
                    ],
                ),
                ("pending", self.kinesis.pending()),
                ("ledger", list(self.ledger.scan(STREAM))),
                ("now", self.clock.now_ms()),
            ]
        )


class _LeaseTellingWriter(KinesisWriter):
    """Tells the fake Kinesis the lease each put is sent under, so that a write the network
    holds past its put's timeout (HELD) still lands before that lease ends."""

    def __init__(self, client: FakePutClient, kinesis: FakeKinesisClient) -> None:
        super().__init__(client, STREAM)
        self._kinesis = kinesis
        self.refused = 0  # puts the lease deadline kept from leaving

    def put_entries(
        self,
        entries: list[dict[str, Any]],
        *,
        lease_expires_at_ms: int | None = None,
        turn: int | None = None,
    ) -> list[RecordResult]:
        with self._kinesis.under_lease(lease_expires_at_ms):
            results = super().put_entries(
                entries, lease_expires_at_ms=lease_expires_at_ms, turn=turn
            )
        if any(result.error_code == LEASE_FENCE for result in results):
            self.refused += 1
        return results


class _Switch:
    """The hooks every producer of the model holds; a rule swaps what is behind them."""

    def __init__(self, current: Hooks) -> None:
        self.current = current

    def at(self, step: Step, *, batch_id: int | None = None) -> None:
        self.current.at(step, batch_id=batch_id)


class _Stall:
    """At ``step`` of a send (once): every lease runs out by every clock, every late write
    lands, the reconciler may take the group over, and the other producer may send the same
    keys (its take-overs racing the stalled one's once it wakes)."""

    def __init__(
        self,
        model: ProtocolModel,
        *,
        step: Step,
        reconcile: bool,
        other: int | None = None,
        keys: list[str] | None = None,
    ) -> None:
        self._model = model
        self._step = step
        self._reconcile = reconcile
        self._other = other
        self._keys = keys or []
        self._stalled = False

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        if step is not self._step or self._stalled:
            return
        self._stalled = True
        self._model.kinesis.advance(FOREVER_MS)
        self._model.kinesis.land_all()
        if self._reconcile and self._model.reconciler is not None:
            with contextlib.suppress(LedgerError):
                self._model.reconciler.run_once()
        if self._other is not None:
            self._model.send_now(self._other, [(key, 0) for key in self._keys])


def _digest(key: str, variant: int) -> str:
    return payload_digest(data_of(key, variant), explicit_hash_key(Message(key, b"")))


ProtocolModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_protocol_model = ProtocolModel.TestCase

pytestmark = pytest.mark.timeout(120)
