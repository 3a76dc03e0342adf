"""The streams' retention the API reports the exactly-once window from: configured, or read
from each stream and kept a while (pure: a scripted describe and a manual clock)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import botocore.exceptions

from api.retention import KEEP_FAILED_MS, KEEP_MS, StreamRetention, retention_from
from api.settings import ApiSettings
from dedupe_store.clock import ManualClock


class Kinesis:
    """DescribeStreamSummary of streams with a retention; others are not found."""

    def __init__(self, retention_hours: dict[str, int]) -> None:
        self.retention_hours = retention_hours
        self.calls: list[str] = []

    def describe(self, stream: str) -> Mapping[str, Any]:
        self.calls.append(stream)
        if stream not in self.retention_hours:
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "ResourceNotFoundException", "Message": "no"}},
                "DescribeStreamSummary",
            )
        return {"StreamName": stream, "RetentionPeriodHours": self.retention_hours[stream]}


def test_a_streams_retention_is_read_once_and_kept_a_while() -> None:
    # GIVEN a stream kept 48 hours
    kinesis, clock = Kinesis({"orders": 48}), ManualClock()
    retention = StreamRetention(kinesis.describe, clock)
    # WHEN its retention is asked for twice, then again once the kept value is old
    first, second = retention("orders"), retention("orders")
    clock.advance(KEEP_MS)
    kinesis.retention_hours["orders"] = 168
    later = retention("orders")
    # THEN Kinesis was asked twice, and the change is seen
    assert (first, second, later) == (48, 48, 168)
    assert kinesis.calls == ["orders", "orders"]


def test_a_stream_kinesis_cannot_describe_has_an_unknown_retention_asked_again_soon() -> None:
    kinesis, clock = Kinesis({}), ManualClock()
    retention = StreamRetention(kinesis.describe, clock)
    assert retention("gone") is None
    assert retention("gone") is None
    clock.advance(KEEP_FAILED_MS)
    assert retention("gone") is None
    assert kinesis.calls == ["gone", "gone"]


def test_a_configured_retention_is_every_streams_without_asking_kinesis() -> None:
    settings = ApiSettings(stream_retention_hours=72, region="us-east-1")
    lookup = retention_from(settings)
    assert (lookup("a"), lookup("b")) == (72, 72)
    assert not isinstance(lookup, StreamRetention)
