"""Administering a stream: create it and wait until it is ACTIVE (``keo init``, the demos, the
bench, the tests), and ``keo init``'s stream: on demand or N shards, a retention, KMS.

A stream this call creates gets everything asked for, each change waited on until the stream
is ACTIVE again. A stream that exists is left as it is, as ``keo init`` promises: what it has
that differs from what was asked is returned (:attr:`Provisioned.differences`), for the caller
to report, never changed behind the operator's back (a lower retention would drop records).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import botocore.exceptions
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from dedupe_store.errors import aws_error_code
from kinesis_store.errors import StreamUnavailableError

DEFAULT_RETENTION_HOURS = 24
ON_DEMAND = "ON_DEMAND"
PROVISIONED = "PROVISIONED"
_ACTIVE_POLL_S = 0.1


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


def create_stream(
    client: Any,
    stream: str,
    shards: int | None,
    *,
    timeout_s: float = 120.0,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Create ``stream`` with ``shards`` shards (None: on demand) unless it exists (an existing
    stream keeps its shard count), then wait until it is ACTIVE. True when this call created it.

    Other botocore errors reach the caller as they are (``keo init`` reports them as AWS
    errors); not ACTIVE in time is :class:`StreamUnavailableError`.
    """
    created = True
    try:
        if shards is None:
            client.create_stream(StreamName=stream, StreamModeDetails={"StreamMode": "ON_DEMAND"})
        else:
            client.create_stream(StreamName=stream, ShardCount=shards)
    except botocore.exceptions.ClientError as exc:
        if aws_error_code(exc) != "ResourceInUseException":
            raise
        created = False
    wait_active(client, stream, timeout_s=timeout_s, sleep=sleep)
    return created


def wait_active(
    client: Any,
    stream: str,
    *,
    timeout_s: float = 120.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until ``stream`` is ACTIVE (after a create, a split or a merge), polling every
    0.1 s; :class:`StreamUnavailableError` when it is not within ``timeout_s``."""

    def active() -> bool:
        summary = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
        return bool(summary["StreamStatus"] == "ACTIVE")

    polling = Retrying(
        retry=retry_if_result(operator.not_),
        wait=wait_fixed(_ACTIVE_POLL_S),
        stop=stop_after_delay(timeout_s),
        sleep=sleep,
        retry_error_callback=lambda _state: False,  # not ACTIVE in time
    )
    if not polling(active):
        raise StreamUnavailableError(
            f"stream {stream} is not ACTIVE after {timeout_s:g} s", stream=stream
        )
