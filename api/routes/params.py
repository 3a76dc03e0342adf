"""Path and query parameters shared by the ``/v1/streams/{stream}`` routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from dedupe_store.names import MAX_STREAM_NAME_CHARS, STREAM_NAME_PATTERN

StreamName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_STREAM_NAME_CHARS,
        pattern=STREAM_NAME_PATTERN,  # the rule of dedupe_store.names
        description="the Kinesis stream name",
        examples=["orders"],
    ),
]
