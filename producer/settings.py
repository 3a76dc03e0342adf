"""Settings of the producer, reconciler and audit, validated at start.

Every invalid combination fails with a message that names the setting by its environment
variable, e.g. a lease too short to outlive a put.
"""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from dedupe_store.settings import (
    ENDPOINT_URL_RULE,
    EndpointUrl,
    LedgerSettings,
    emulator_credentials_for,
    setting,
)
from producer.protocol import LeasePolicy


class ProducerSettings(LedgerSettings):
    """The producer, the reconciler and the audit: the ledger's settings, plus the stream, the
    put's timeouts and the lease. Read by ``keo send|reconcile|audit|init`` and the Spark sink."""

    stream: str = setting(
        "keo-stream",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Kinesis data stream (`keo init` creates it)",
        why="a name that says what it holds; the bounds are Kinesis's stream-name rules",
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
    lease_s: float = setting(
        60.0,
        gt=0,
        le=3600,
        rule="lease >= put connect timeout + put read timeout + 2 x clock skew (17 s by default)",
        description="how long a claim is its producer's alone before anyone may take it over",
        why=(
            "no put can land after its claim's lease expired: a put lands at most connect + "
            "read timeout after it leaves, and clocks differ by up to the skew either way; "
            "60 s leaves room for a stall (this version has no signature fence: a process "
            "stalled longer than that between its lease check and its put can still "
            "duplicate, and the audit reports it) while a crashed producer's keys wait only "
            "a minute for the reconciler"
        ),
    )
    put_max_attempts: int = setting(
        8,
        ge=1,
        le=50,
        description=(
            "sends of a record that was definitely not written (a per-record error such as "
            "throttling), with backoff and full jitter from 100 ms doubling to 5 s"
        ),
        why=(
            "8 sends wait up to 11 s in all (about half that with jitter), many times a "
            "shard's 1 s throughput window; then the key is FAILED (not written, safe to resend)"
        ),
    )
    wait_initial_s: float = setting(
        0.1,
        gt=0,
        description="first wait, doubling, while another producer's claim on a key is in flight",
        why="100 ms, doubling: looks again soon after a fast put settles, without polling hard",
    )
    wait_max_s: float = setting(
        5.0,
        gt=0,
        rule="wait max >= wait initial",
        description="longest wait between looks at another producer's claim",
        why=(
            "5 s bounds the delay once the other claim settles; the waiting stops at its "
            "lease + skew, and the key is then resolved by read-back"
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
    aggregate: bool = setting(
        False,
        description="pack user records per shard into KPL aggregates (KCL deaggregates them)",
        why=(
            "off: one Kinesis record per message is what every consumer reads; aggregates "
            "need KCL or a deaggregator on the consuming side"
        ),
    )

    @model_validator(mode="after")
    def _lease_outlives_a_put(self) -> Self:
        minimum_s = self.put_connect_timeout_s + self.put_read_timeout_s + 2 * self.clock_skew_s
        if self.lease_s < minimum_s:
            raise ValueError(
                f"KEO_LEASE_S={self.lease_s:g} is too short: a put may still land up to "
                f"KEO_PUT_CONNECT_TIMEOUT_S + KEO_PUT_READ_TIMEOUT_S + 2 x KEO_CLOCK_SKEW_S "
                f"= {minimum_s:g} s after it was sent; raise the lease or lower the timeouts"
            )
        if self.wait_max_s < self.wait_initial_s:
            raise ValueError("KEO_WAIT_MAX_S must be >= KEO_WAIT_INITIAL_S")
        return self

    def lease_policy(self) -> LeasePolicy:
        return LeasePolicy(
            lease_ms=round(self.lease_s * 1000),
            put_timeout_ms=round((self.put_connect_timeout_s + self.put_read_timeout_s) * 1000),
            skew_ms=round(self.clock_skew_s * 1000),
        )

    def kinesis_region(self) -> str:
        return self.resolved_region()

    def emulator_credentials(self) -> tuple[str, str] | None:
        """Dummy credentials for a Kinesis emulator when the environment has none."""
        return emulator_credentials_for(self.kinesis_endpoint_url)
