"""Settings of the producer, reconciler and audit, validated at start.

Every invalid combination fails with a message that names the setting by its environment
variable, e.g. a lease too short to outlive a put (or, with the signature fence, the window
a put's signature is accepted in).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final, Self

from pydantic import model_validator

from dedupe_store.names import MAX_STREAM_NAME_CHARS, STREAM_NAME_PATTERN
from dedupe_store.settings import (
    ENDPOINT_URL_RULE,
    EndpointUrl,
    LedgerSettings,
    emulator_credentials_for,
    setting,
)
from producer.protocol import LeasePolicy
from producer.retries import (
    CLAIM_WAIT_INITIAL_MS,
    CLAIM_WAIT_MAX_MS,
    PUT_MAX_ATTEMPTS,
    PUT_RETRY_INITIAL_MS,
    PUT_RETRY_MAX_MS,
)

# Kinesis refuses a SigV4 request that arrives more than 5 minutes after its signing time.
AWS_SIGNATURE_WINDOW_S: Final = 300.0
_FENCED_LEASE_S: Final = 360.0  # the window, the put timeouts, twice the skew, and room
_UNFENCED_LEASE_S: Final = 60.0


class PutFence(StrEnum):
    """What keeps a put from landing after its lease."""

    SIGNATURE = "signature"  # the request's own signature window, checked before it is sent
    OFF = "off"  # the lease deadline as each request leaves: a stall after it may duplicate


class Dedupe(StrEnum):
    """The guarantee a write asks for (DESIGN.md "Two guarantees, two prices")."""

    KEY = "key"  # each key at most once, ever: one conditional ledger write per message
    REPLAY = "replay"  # what a run without failures writes, however often it is replayed


class PastRetention(StrEnum):
    """What a replay does when the windows it must read back reach past the stream's trim
    horizon (what the earlier attempts put is partly gone)."""

    FAIL = "fail"  # nothing sent: ReplayWindowTrimmedError names the run
    SEND = "send"  # the rows not found are sent: duplicates possible


class ProducerSettings(LedgerSettings):
    """The producer, the reconciler and the audit: the ledger's settings, plus the stream, the
    put's timeouts and the lease. Read by ``keo send|reconcile|audit|init`` and the Spark sink."""

    stream: str = setting(
        "keo-stream",
        min_length=1,
        max_length=MAX_STREAM_NAME_CHARS,
        pattern=STREAM_NAME_PATTERN,  # the rule of dedupe_store.names
        description="Kinesis data stream (`keo init` creates it)",
        why=(
            "a name that says what it holds; the bounds are Kinesis's stream-name rules, "
            "and not dots only (the API could not name it in a URL)"
        ),
    )
    kinesis_endpoint_url: EndpointUrl = setting(
        None,
        rule=ENDPOINT_URL_RULE,
        description="Kinesis endpoint override (`keo emulators up` writes it to .keo/endpoints.env)",
        why="unset reaches real AWS: an emulator is opted into, never the default",
    )
    put_connect_timeout_s: float = setting(
        2.0,
        gt=0,
        le=60,
        description="connect timeout of a PutRecords request (SDK retries are always off for puts)",
        why="a dead request is given up quickly, and never replayed by the SDK",
    )
    put_read_timeout_s: float = setting(
        5.0,
        gt=0,
        le=120,
        description="read timeout of a PutRecords request; past it the put is ambiguous and read back",
        why="a dead request is given up quickly, and never replayed by the SDK",
    )
    clock_skew_s: float = setting(
        5.0,
        ge=0,
        le=300,
        description="margin for clock skew between hosts and Kinesis arrival times",
        why=(
            "covers client clocks against Kinesis's ApproximateArrivalTimestamp, which is not "
            "even monotonic; 0 only when every clock involved is one host's"
        ),
    )
    put_fence: PutFence = setting(
        PutFence.SIGNATURE,
        rule="`signature` or `off`",
        description=(
            "the signature fence: a put leaves only if its signature expires (Kinesis refuses "
            "it) before its lease does, checked on the signed request right before it is sent"
        ),
        why=(
            "no put lands after its lease, even from a process stalled (GC, SIGSTOP, a starved "
            "VM) between its lease check and its put: no stalled producer can write a "
            "duplicate. The price: the lease outlives the signature window, so a crashed "
            "producer's keys wait one lease (6 min by default) for the reconciler. `off` "
            "allows a 60 s lease and checks the clock instead as each put leaves (the lease "
            "deadline: the put's timeouts + skew of lease left, else not sent), so slow or "
            "throttled ledger calls and a stall before that check send nothing late; a process "
            "stalled after it, or a put the network holds, longer than the lease can still "
            "write a duplicate, which `keo audit` reports (docs/guarantees.md)"
        ),
    )
    signature_window_s: float = setting(
        300.0,
        ge=1,
        le=3000,
        rule=(
            "below 300 only with a Kinesis endpoint override that enforces it "
            "(the fault proxy's emulated window)"
        ),
        description=(
            "how long after its signing time Kinesis still accepts a request (SigV4's window); "
            "the fence relies on it"
        ),
        why=(
            "300 s is AWS's: Kinesis refuses a request signed more than 5 minutes before it "
            "arrives (InvalidSignatureException: Signature expired). A shorter value is a "
            "promise only an endpoint that enforces it keeps (tests use a few seconds behind "
            "the fault proxy)"
        ),
    )
    lease_s: float = setting(
        _FENCED_LEASE_S,
        default_text="`360` with the fence, `60` with KEO_PUT_FENCE=off",
        gt=0,
        le=3600,
        rule=(
            "lease >= put connect timeout + put read timeout + 2 x clock skew (17 s by "
            "default), + the signature window with the fence (317 s by default)"
        ),
        description="how long a claim is its producer's alone before anyone may take it over",
        why=(
            "no put can land after its claim's lease expired: a put lands at most connect + "
            "read timeout after it leaves (with the fence: at most the signature window after "
            "it was signed, however long its process stalls), and clocks differ by up to the "
            "skew either way. 360 s covers the 300 s window with the margins; a crashed "
            "producer's keys then wait 6 minutes for the reconciler. Without the fence, 60 s "
            "leaves room for a stall while those keys wait only a minute, but a process stalled "
            "longer than its lease after the send-time check, or a put the network holds that "
            "long, can still duplicate (the audit reports it)"
        ),
    )
    put_max_attempts: int = setting(
        PUT_MAX_ATTEMPTS,
        ge=1,
        le=50,
        description=(
            "sends of a record that was definitely not written (a per-record error such as "
            f"throttling), with backoff and full jitter from {PUT_RETRY_INITIAL_MS} ms doubling "
            f"to {PUT_RETRY_MAX_MS / 1000:g} s"
        ),
        why=(
            f"{PUT_MAX_ATTEMPTS} sends wait up to 11 s in all (about half that with jitter), "
            "many times a shard's 1 s throughput window; then the key is FAILED (not written, "
            "safe to resend)"
        ),
    )
    put_rate_limit_percent: float = setting(
        100.0,
        ge=0,
        le=1000,
        description=(
            "how much of each shard's write quota (1,000 records and 1 MiB a second) this "
            "process's puts may take at most: each request waits until every shard it puts on "
            "has room (the KPL's RateLimit); the share shrinks by twice the part of a request "
            "a shard refused (other writers take part of it; at most by half) and grows by "
            "half of itself a second while the shard takes every record; 0 turns the pacing off"
        ),
        why=(
            "a writer alone on its shards reaches their quota without being throttled, where "
            "one that sends as fast as it can is refused about as many records as it writes "
            "and resends them; writers sharing a shard (a Spark job's tasks) settle on their "
            "parts of it; lower it to leave other writers room from the start"
        ),
    )
    wait_initial_s: float = setting(
        CLAIM_WAIT_INITIAL_MS / 1000,
        gt=0,
        description="first wait, doubling, while another producer's claim on a key is in flight",
        why=(
            f"{CLAIM_WAIT_INITIAL_MS} ms, doubling: looks again soon after a fast put settles, "
            "without polling hard"
        ),
    )
    wait_max_s: float = setting(
        CLAIM_WAIT_MAX_MS / 1000,
        gt=0,
        rule="wait max >= wait initial",
        description="longest wait between looks at another producer's claim",
        why=(
            f"{CLAIM_WAIT_MAX_MS / 1000:g} s bounds the delay once the other claim settles; the "
            "waiting stops at its lease + skew, and the key is then resolved by read-back"
        ),
    )
    max_record_bytes: int | None = setting(
        None,
        gt=0,
        description="largest record (data + partition key) accepted; larger messages are REJECTED",
        why="unset reads the stream's own limit (1 MiB where the stream does not say)",
    )
    store_payload: bool = setting(
        False,
        description="keep small payloads in their claims so the reconciler can resend them",
        why=(
            "off: the ledger holds no user data unless asked; a crashed producer's unsent "
            "keys are then released, and sent again by the caller's retry"
        ),
    )
    groups_in_flight: int = setting(
        3,
        ge=1,
        le=8,
        description=(
            "claim groups of one send in flight at once: a group claims its keys while the "
            "groups before it put and settle"
        ),
        why=(
            "claims 25 to a request, beside the group before, are often all answered before "
            "that group has put and settled: with 2 the ledger then waits for the next group "
            "to open; 3 keeps it busy (7.6% more messages a second on DynamoDB Local), 4 adds "
            "nothing"
        ),
    )
    store_payload_max_bytes: int = setting(
        4096,
        ge=0,
        le=350_000,
        description="largest payload kept in a claim when KEO_STORE_PAYLOAD is on",
        why=(
            "4 KiB keeps a claim a few write units (writes bill per 1 KB); the bound keeps "
            "the item under DynamoDB's 400 KB"
        ),
    )
    owner: str | None = setting(
        None,
        description="the producer's identity, recorded in its claims; unique per process",
        why="unset: host:pid:random, unique per process, so two processes never share a claim",
    )
    dedupe: Dedupe = setting(
        Dedupe.KEY,
        rule="`key` or `replay`",
        description=(
            "the guarantee: `key` delivers each key at most once, ever; `replay` delivers what "
            "a run without failures would have written, however often the run is replayed"
        ),
        why=(
            "`key` is the stronger promise (any process, any run: a key once) at one ledger "
            "write per message; `replay` needs a run name (a Spark batch, `--run-id`) and costs "
            "a few ledger writes per task, but keys are not compared across runs "
            "(docs/guarantees.md)"
        ),
    )
    replay_max_wait_s: float | None = setting(
        None,
        ge=0,
        le=3600,
        description=(
            "replay mode: the longest a replay waits for an earlier attempt's lease before it "
            "gives its rows not found back as IN_FLIGHT (unset: as long as the lease runs)"
        ),
        why=(
            "a replay waits only for rows it did not find while an earlier attempt may still "
            "put them; the wait is at most one lease, and failing the task instead only moves "
            "the wait to Spark's retry"
        ),
    )
    replay_past_retention: PastRetention = setting(
        PastRetention.FAIL,
        rule="`fail` or `send`",
        description=(
            "replay mode: a recovery whose earlier attempts' windows begin before the stream's "
            "trim horizon fails (nothing sent, the run named), or with `send` sends the rows "
            "it did not find"
        ),
        why=(
            "rows put before the trim horizon cannot be read back, so a row not found there may "
            "be in a consumer's hands already: resending it blindly could deliver it twice"
        ),
    )
    aggregate: bool = setting(
        False,
        description="pack user records per shard into KPL aggregates (KCL deaggregates them)",
        why=(
            "off: one Kinesis record per message is what every consumer reads; aggregates "
            "need KCL or a deaggregator on the consuming side"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _default_lease_follows_the_fence(cls, values: Any) -> Any:
        """Without the fence, a lease that was not set is the shorter one (the declared
        default is the fence's: the lease must outlive the signature window)."""
        unset = isinstance(values, dict) and values.get("lease_s") is None
        if unset and str(values.get("put_fence", PutFence.SIGNATURE)) == PutFence.OFF:
            return {**values, "lease_s": _UNFENCED_LEASE_S}
        return values

    @model_validator(mode="after")
    def _lease_outlives_a_put(self) -> Self:
        minimum_s = self.put_connect_timeout_s + self.put_read_timeout_s + 2 * self.clock_skew_s
        if self.fenced:
            minimum_s += self.signature_window_s
            if self.signature_window_s < AWS_SIGNATURE_WINDOW_S and not self.kinesis_endpoint_url:
                raise ValueError(
                    f"KEO_SIGNATURE_WINDOW_S={self.signature_window_s:g} is shorter than the "
                    f"{AWS_SIGNATURE_WINDOW_S:g} s Kinesis accepts a signature for: the fence "
                    "would let a stalled put land after its lease; a shorter window is only for "
                    "an endpoint that enforces it (KEO_KINESIS_ENDPOINT_URL, the fault proxy)"
                )
        if self.lease_s < minimum_s and self.fenced:
            raise ValueError(
                f"KEO_LEASE_S={self.lease_s:g} is too short for the signature fence: a signed "
                f"put is accepted for KEO_SIGNATURE_WINDOW_S, so the lease must be at least "
                f"KEO_SIGNATURE_WINDOW_S + KEO_PUT_CONNECT_TIMEOUT_S + KEO_PUT_READ_TIMEOUT_S "
                f"+ 2 x KEO_CLOCK_SKEW_S = {minimum_s:g} s; raise the lease, lower the window "
                "or the timeouts, or set KEO_PUT_FENCE=off"
            )
        if self.lease_s < minimum_s:
            raise ValueError(
                f"KEO_LEASE_S={self.lease_s:g} is too short: a put may still land up to "
                f"KEO_PUT_CONNECT_TIMEOUT_S + KEO_PUT_READ_TIMEOUT_S + 2 x KEO_CLOCK_SKEW_S "
                f"= {minimum_s:g} s after it was sent; raise the lease or lower the timeouts"
            )
        if self.wait_max_s < self.wait_initial_s:
            raise ValueError("KEO_WAIT_MAX_S must be >= KEO_WAIT_INITIAL_S")
        return self

    @property
    def fenced(self) -> bool:
        return self.put_fence == PutFence.SIGNATURE  # a model_copy may hold the plain string

    def lease_policy(self) -> LeasePolicy:
        return LeasePolicy(
            lease_ms=round(self.lease_s * 1000),
            put_timeout_ms=round((self.put_connect_timeout_s + self.put_read_timeout_s) * 1000),
            skew_ms=round(self.clock_skew_s * 1000),
            signature_window_ms=round(self.signature_window_s * 1000) if self.fenced else None,
        )

    def ledger_callers(self) -> int:
        # the claim workers, and beside them each group in flight opening, renewing, settling
        return self.ledger_concurrency + self.groups_in_flight

    def kinesis_region(self) -> str:
        return self.resolved_region()

    def emulator_credentials(self) -> tuple[str, str] | None:
        """Dummy credentials for a Kinesis emulator when the environment has none."""
        return emulator_credentials_for(self.kinesis_endpoint_url)
