"""Leases and take-overs where several groups of one send meet (issue 22's defects), with the
repository's fakes: ``InMemoryLedger``, ``FakeKinesisClient`` and a ``ManualClock`` that only
the producer's own sleeps move.

- Two groups of ours short of lease at once, one renewal refused, the other applied: the
  renewed group's messages are still put (they used to be dropped: no outcome, KeyError).
- A take-over into a fresh group that loses a key to the reconciler: that key is waited on,
  not put as if it were ours (it used to be: KeyError), and is delivered once.
- A take-over never proceeds while the holder may be alive: the holder's group renewed, or the
  fence's write failed, sends the message back to waiting, its key untouched.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from fakes.kinesis import FakeKinesisClient
from fakes.ledger import InMemoryLedger, LedgerFault

from dedupe_store.clock import ManualClock
from dedupe_store.records import ClaimRequest, ClaimStatus, Group, KeyClaim
from kinesis_store.reader import KinesisReader
from kinesis_store.writer import KinesisWriter
from producer.hooks import NO_HOOKS, Step
from producer.key.claims import ChunkState, ClaimedMessage
from producer.key.context import ProducerPolicy, SendContext
from producer.key.delivery import ChunkDelivery
from producer.key.producer import ExactlyOnceProducer
from producer.key.readback import ReadBackResolver
from producer.key.takeover import TakeOvers
from producer.outcomes import OutcomeStatus
from producer.protocol import LeasePolicy, Message, PreparedMessage, prepare

STREAM = "orders"
LEASE = LeasePolicy(lease_ms=20_000, put_timeout_ms=7_000, skew_ms=5_000)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def kinesis(clock: ManualClock) -> FakeKinesisClient:
    return FakeKinesisClient(stream=STREAM, clock=clock, put_timeout_ms=LEASE.put_timeout_ms)


@pytest.fixture
def ledger() -> InMemoryLedger:
    return InMemoryLedger(inflight_buckets=4)


def resolver(kinesis: FakeKinesisClient, clock: ManualClock) -> ReadBackResolver:
    reader = KinesisReader(kinesis, STREAM, sleep=kinesis.sleep)
    return ReadBackResolver(reader, clock, LEASE, retention_hours=24)


def context_over(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock, pool: ThreadPoolExecutor
) -> SendContext:
    return SendContext(
        stream=STREAM,
        owner="producer-a",
        ledger=ledger,
        writer=KinesisWriter(kinesis, STREAM),
        clock=clock,
        policy=ProducerPolicy(lease=LEASE),
        resolver=resolver(kinesis, clock),
        executor=pool,
        hooks=NO_HOOKS,
        sleep=kinesis.sleep,
        rng=random.Random(0),
        shards=None,
        max_record_bytes=1024 * 1024,
    )


def prepared(*keys: str) -> list[PreparedMessage]:
    items, rejected = prepare([Message(key, f"data of {key}".encode()) for key in keys], 1 << 20)
    assert not rejected
    return items


def claim_for(ledger: InMemoryLedger, item: PreparedMessage, group: Group, now_ms: int) -> KeyClaim:
    request = ClaimRequest(STREAM, item.key, item.payload_digest, item.explicit_hash_key)
    result = ledger.claim(request, group, now_ms=now_ms)
    assert result.status is ClaimStatus.WON
    assert result.claim is not None
    return result.claim


def test_two_groups_short_of_lease_one_renewal_refused_every_message_is_still_put(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN two groups of one send: G1 opened at t0 and G2 ten seconds later, a message in each
    a, b = prepared("a", "b")
    with ThreadPoolExecutor(4) as pool:
        context = context_over(ledger, kinesis, clock, pool)
        delivery = ChunkDelivery(context, [a, b])
        state: ChunkState = delivery._state
        t0 = clock.now_ms()
        g1 = state.add_group(
            ledger.open_group(STREAM, ["a"], owner="producer-a", now_ms=t0, lease_ms=LEASE.lease_ms)
        )
        clock.advance(10_000)
        g2 = state.add_group(
            ledger.open_group(
                STREAM, ["b"], owner="producer-a", now_ms=clock.now_ms(), lease_ms=LEASE.lease_ms
            )
        )
        messages = [
            ClaimedMessage(a, claim_for(ledger, a, g1.group, t0), own=g1),
            ClaimedMessage(b, claim_for(ledger, b, g2.group, clock.now_ms()), own=g2),
        ]
        g1.unresolved.add("a")
        g2.unresolved.add("b")
        # AND time passes: G1's lease has run out (its renewal is refused), G2's is short but
        # still valid (its renewal applies)
        clock.advance(10_500)
        # WHEN the put checks their leases
        ready, diverted = delivery.ready_to_put(messages)
    # THEN both messages are ready to put: "b" under G2 renewed, "a" moved to a fresh group
    assert sorted(m.key for m in ready) == ["a", "b"]
    assert diverted == []
    assert g2.group.lease_expires_at_ms == clock.now_ms() + LEASE.lease_ms
    moved = next(m for m in ready if m.key == "a")
    assert moved.own is not None
    assert moved.own.group_id not in (g1.group_id, g2.group_id)
    assert moved.claim.attempt == 2


class ReconcilerAfterClaim:
    """At after_claim: the lease runs out (the claims were slow) and the reconciler takes key
    ``k0`` over into a group of its own (it does so once that lease has expired)."""

    def __init__(self, ledger: InMemoryLedger, clock: ManualClock) -> None:
        self._ledger = ledger
        self._clock = clock
        self._done = threading.Event()

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002 - the Hooks protocol
        if step is not Step.AFTER_CLAIM or self._done.is_set():
            return
        self._done.set()
        self._clock.advance(LEASE.lease_ms + LEASE.skew_ms + 1)
        seen = self._ledger.batch_get_claims(STREAM, ["k0"])["k0"]
        group = self._ledger.open_group(
            STREAM, ["k0"], owner="reconciler", now_ms=self._clock.now_ms(), lease_ms=LEASE.lease_ms
        )
        taken = self._ledger.take_over_key(seen, group, now_ms=self._clock.now_ms())
        assert taken.status is ClaimStatus.WON


def test_a_take_over_lost_to_the_reconciler_is_waited_on_and_the_key_delivered_once(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN a send whose group's lease runs out between its claims and its put, while the
    # reconciler takes one of its keys over
    producer = ExactlyOnceProducer(
        stream=STREAM,
        ledger=ledger,
        writer=KinesisWriter(kinesis, STREAM),
        clock=clock,
        policy=ProducerPolicy(lease=LEASE, wait_max_ms=1_000),
        resolver=resolver(kinesis, clock),
        sleep=kinesis.sleep,
        hooks=ReconcilerAfterClaim(ledger, clock),
    )
    batch = [Message(f"k{i}", f"data {i}".encode()) for i in range(3)]
    # WHEN it sends: its renewal is refused (expired), its keys move to a fresh group, and the
    # take-over of k0 loses to the reconciler's
    with producer:
        outcomes = producer.send(batch)
    kinesis.land_all()
    # THEN every message has an outcome: k0 was waited on (the reconciler's lease ran out with
    # nothing put), taken over and sent; the others were sent under the fresh group
    assert Counter(o.status for o in outcomes) == {OutcomeStatus.SENT: 3}
    assert Counter(r.partition_key for r in kinesis.visible()) == {"k0": 1, "k1": 1, "k2": 1}


def holder_and_message(ledger: InMemoryLedger, clock: ManualClock) -> tuple[Group, ClaimedMessage]:
    """Another producer's group holding key "x", its lease run out as we last read it."""
    (item,) = prepared("x")
    holder = ledger.open_group(
        STREAM, ["x"], owner="producer-b", now_ms=clock.now_ms(), lease_ms=LEASE.lease_ms
    )
    claim = claim_for(ledger, item, holder, clock.now_ms())
    return holder, ClaimedMessage(item, claim, holder=holder)


def test_a_holder_that_renewed_its_lease_is_not_taken_over(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN a message held by producer B, whose group we read before B renewed it (B is alive)
    holder, message = holder_and_message(ledger, clock)
    clock.advance(LEASE.lease_ms - LEASE.skew_ms - 1_000)
    renewed = ledger.renew_lease(
        holder, now_ms=clock.now_ms(), lease_ms=LEASE.lease_ms, skew_ms=LEASE.skew_ms
    )
    assert renewed.applied
    with ThreadPoolExecutor(2) as pool:
        takeovers = TakeOvers(context_over(ledger, kinesis, clock, pool), ChunkState())
        # WHEN we try to fence B's group before taking its key
        to_take, waiting = takeovers.fence_holders([message])
    # THEN the fence is lost: the message goes back to waiting, on B's group as it is now
    assert to_take == []
    assert waiting == [message]
    assert message.holder == renewed.current
    # AND B's claim of the key is untouched
    assert ledger.batch_get_claims(STREAM, ["x"])["x"] == message.claim


def test_a_fence_that_fails_sends_the_message_back_to_waiting(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN a message held by producer B, B's lease expired, and DynamoDB failing our fence
    holder, message = holder_and_message(ledger, clock)
    clock.advance(LEASE.lease_ms + LEASE.skew_ms + 1)
    ledger.inject("take_over_group", LedgerFault.UNAVAILABLE)
    with ThreadPoolExecutor(2) as pool:
        takeovers = TakeOvers(context_over(ledger, kinesis, clock, pool), ChunkState())
        # WHEN we try to fence B's group
        to_take, waiting = takeovers.fence_holders([message])
    # THEN nothing is taken: whether B is alive is unknown, so the message is waited on again
    assert to_take == []
    assert waiting == [message]
    assert ledger.batch_get_claims(STREAM, ["x"])["x"] == message.claim
    assert ledger.get_group(STREAM, holder.group_id) == holder
