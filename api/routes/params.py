"""Path and query parameters shared by the ``/v1/streams/{stream}`` routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from api.schemas import MAX_STREAM_CHARS, STREAM_PATTERN

StreamName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_STREAM_CHARS,
        pattern=STREAM_PATTERN,
        description="the Kinesis stream name",
        examples=["orders"],
    ),
]
