"""Creating a stream and waiting for it, as ``keo init``, the demos, the bench and the tests do."""

from __future__ import annotations

from collections import deque
from typing import Any

import botocore.exceptions
import pytest

from kinesis_store.provisioning import create_stream, wait_active
from producer.errors import StreamUnavailableError


def summary(status: str) -> dict[str, Any]:
    return {"StreamDescriptionSummary": {"StreamStatus": status}}


class Admin:
    """A Kinesis client that creates (or says the stream exists) and reports statuses in turn."""

    def __init__(self, statuses: list[str], create_error: str | None = None) -> None:
        self.statuses = deque(statuses)
        self.create_error = create_error
        self.created: list[tuple[str, int]] = []

    def create_stream(self, *, StreamName: str, ShardCount: int) -> None:  # noqa: N803
        if self.create_error is not None:
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": self.create_error, "Message": "test"}}, "CreateStream"
            )
        self.created.append((StreamName, ShardCount))

    def describe_stream_summary(self, *, StreamName: str) -> dict[str, Any]:  # noqa: N803, ARG002
        return summary(self.statuses.popleft() if len(self.statuses) > 1 else self.statuses[0])


def test_a_new_stream_is_created_and_waited_for_until_active() -> None:
    # GIVEN Kinesis that reports CREATING twice, then ACTIVE
    admin = Admin(["CREATING", "CREATING", "ACTIVE"])
    waits: list[float] = []
    # WHEN the stream is created
    created = create_stream(admin, "orders", 4, sleep=waits.append)
    # THEN it was created with its shards, and the call returned once it was ACTIVE
    assert created
    assert admin.created == [("orders", 4)]
    assert waits == [0.1, 0.1]


def test_an_existing_stream_is_left_as_it_is() -> None:
    # GIVEN a stream that exists already
    admin = Admin(["ACTIVE"], create_error="ResourceInUseException")
    # WHEN it is created again
    # THEN nothing is created, and the call says so
    assert not create_stream(admin, "orders", 4, sleep=lambda _s: None)


def test_another_refusal_reaches_the_caller_as_it_is() -> None:
    # GIVEN Kinesis refusing the creation
    admin = Admin(["ACTIVE"], create_error="LimitExceededException")
    # WHEN the stream is created
    # THEN the AWS error is raised (keo init reports it as an AWS error)
    with pytest.raises(botocore.exceptions.ClientError, match="LimitExceededException"):
        create_stream(admin, "orders", 4, sleep=lambda _s: None)


def test_a_stream_not_active_in_time_is_unavailable() -> None:
    # GIVEN a stream stuck UPDATING
    admin = Admin(["UPDATING"])
    # WHEN it is waited for, with no time to wait
    # THEN it is a retriable "not ACTIVE" error naming the stream and the time waited
    with pytest.raises(StreamUnavailableError, match="stream orders is not ACTIVE after 0 s"):
        wait_active(admin, "orders", timeout_s=0, sleep=lambda _s: None)
