"""``keo``: the command line of kinesis-exactly-once.

Exit codes (scripts can rely on them):
    0  everything asked for was done (every message SENT or DUPLICATE; audit clean; ...)
    1  the command ran, and found or left something wrong (rejects, conflicts, anomalies)
    2  usage error: an unknown flag or a bad value
    3  configuration error: settings that cannot work together, or a missing dependency
    4  a backend could not be reached (Kinesis, DynamoDB, an emulator)
"""

from __future__ import annotations

from cli.app import app, main

__all__ = ["app", "main"]
