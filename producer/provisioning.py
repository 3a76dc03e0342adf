"""``keo init``'s stream: on demand or N shards, a retention, KMS encryption.

A stream this call creates gets everything asked for, each change waited on until the stream
is ACTIVE again. A stream that exists is left as it is, as ``keo init`` promises: what it has
that differs from what was asked is returned (:attr:`Provisioned.differences`), for the caller
to report, never changed behind the operator's back (a lower retention would drop records).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producer.kinesis import create_stream, wait_active

DEFAULT_RETENTION_HOURS = 24
ON_DEMAND = "ON_DEMAND"
PROVISIONED = "PROVISIONED"


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """What ``keo init`` was asked for. ``shards`` None: on demand."""

    shards: int | None
    retention_hours: int | None = None
    kms_key: str | None = None

    @property
    def mode(self) -> str:
        return ON_DEMAND if self.shards is None else PROVISIONED


@dataclass(frozen=True, slots=True)
class StreamState:
    """What a stream has, from DescribeStreamSummary."""

    mode: str
    open_shards: int
    retention_hours: int
    kms_key: str | None  # None: not encrypted

    @classmethod
    def of(cls, summary: dict[str, Any]) -> StreamState:
        encrypted = summary.get("EncryptionType") == "KMS"
        return cls(
            mode=str(summary.get("StreamModeDetails", {}).get("StreamMode", PROVISIONED)),
            open_shards=int(summary.get("OpenShardCount", 0)),
            retention_hours=int(summary.get("RetentionPeriodHours", DEFAULT_RETENTION_HOURS)),
            kms_key=str(summary["KeyId"]) if encrypted and summary.get("KeyId") else None,
        )

    def describe(self) -> str:
        capacity = "on demand" if self.mode == ON_DEMAND else f"{self.open_shards} shards"
        encryption = f"KMS {self.kms_key}" if self.kms_key else "not encrypted"
        return f"{capacity}, retention {self.retention_hours} h, {encryption}"


@dataclass(frozen=True, slots=True)
class Provisioned:
    created: bool
    state: StreamState
    differences: list[str] = field(default_factory=list)


def differences(spec: StreamSpec, state: StreamState, *, shards_given: bool) -> list[str]:
    """What an existing stream has that ``spec`` asked otherwise (the shard count only when
    it was asked for: it is a default otherwise)."""
    found = []
    if spec.mode != state.mode and (spec.mode == ON_DEMAND or shards_given):
        found.append(f"it is {_words(state.mode)}, not {_words(spec.mode)}")
    elif shards_given and spec.shards is not None and spec.shards != state.open_shards:
        found.append(f"it has {state.open_shards} open shards, not {spec.shards}")
    wanted_hours = spec.retention_hours
    if wanted_hours is not None and wanted_hours != state.retention_hours:
        found.append(f"its retention is {state.retention_hours} h, not {wanted_hours} h")
    if spec.kms_key is not None and spec.kms_key != state.kms_key:
        found.append(
            f"it is encrypted with {state.kms_key}, not {spec.kms_key}"
            if state.kms_key
            else f"it is not encrypted (asked: KMS {spec.kms_key})"
        )
    return found


def _words(mode: str) -> str:
    return "on demand" if mode == ON_DEMAND else "provisioned"


def provision_stream(
    client: Any,
    stream: str,
    spec: StreamSpec,
    *,
    shards_given: bool = True,
    timeout_s: float = 120.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Provisioned:
    """Create ``stream`` as ``spec`` says unless it exists, and wait until it is ACTIVE."""
    created = create_stream(client, stream, spec.shards, timeout_s=timeout_s, sleep=sleep)
    hours = spec.retention_hours
    if created and hours is not None and hours > DEFAULT_RETENTION_HOURS:
        client.increase_stream_retention_period(StreamName=stream, RetentionPeriodHours=hours)
        wait_active(client, stream, timeout_s=timeout_s, sleep=sleep)
    if created and spec.kms_key is not None:
        client.start_stream_encryption(StreamName=stream, EncryptionType="KMS", KeyId=spec.kms_key)
        wait_active(client, stream, timeout_s=timeout_s, sleep=sleep)
    state = StreamState.of(
        client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    )
    if created:
        return Provisioned(created=True, state=state)
    return Provisioned(False, state, differences(spec, state, shards_given=shards_given))
