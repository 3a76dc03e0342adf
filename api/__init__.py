"""The delivery-state API: answers "was key X delivered, where, and when?" (and "did replay-mode
run R commit?") from the ledger.

It reads the ledger and never writes it; it imports ``dedupe_store`` only.
"""

from __future__ import annotations

from api.errors import (
    ApiConfigError,
    ApiError,
    UnauthorizedError,
    UnknownKeyError,
    UnknownRunError,
)
from api.main import create_app
from api.settings import ApiSettings

__all__ = [
    "ApiConfigError",
    "ApiError",
    "ApiSettings",
    "UnauthorizedError",
    "UnknownKeyError",
    "UnknownRunError",
    "create_app",
]
