"""Errors of the delivery-state API.

They grow from the roots in :mod:`dedupe_store.errors`. The tree::

    KeoError                   anything keo cannot do for its caller (dedupe_store.errors)
    ├── ConfigurationError     settings that cannot work (dedupe_store.errors)
    │   └── ApiConfigError     the app cannot start with these settings (no token, no --no-auth);
    │                          an ApiError too
    └── ApiError               anything the API itself refuses (ledger errors are dedupe_store's)
        ├── ApiConfigError     (above)
        ├── UnauthorizedError  a /v1 request without the right bearer token       -> 401
        ├── UnknownKeyError    the ledger has no item for the key in the stream    -> 404 (stream, key)
        ├── UnknownRunError    the ledger has no replay-mode run of that name       -> 404 (stream, run)
        └── InvalidCursorError a cursor this API did not issue for this listing   -> 422
                               (api.cursor; a ValueError too)

Ledger errors keep their own branch (:mod:`dedupe_store.errors`) and are mapped to problems in
:mod:`api.problems`: ``LedgerUnavailableError`` and ``LedgerSchemaError`` -> 503.
"""

from __future__ import annotations

from dedupe_store.errors import ConfigurationError, KeoError


class ApiError(KeoError):
    """Base of the API's own errors."""


class ApiConfigError(ApiError, ConfigurationError):
    """Settings the API cannot serve with."""


class UnauthorizedError(ApiError):
    """The request has no bearer token, or not the configured one."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownKeyError(ApiError):
    """No ledger item for ``key`` in ``stream``: never claimed, or its dedupe TTL deleted it."""

    def __init__(self, stream: str, key: str) -> None:
        super().__init__(f"no delivery state for key {key!r} in stream {stream!r}")
        self.stream = stream
        self.key = key


class UnknownRunError(ApiError):
    """No replay-mode run ``run`` in ``stream``: never registered, or its dedupe TTL deleted
    it."""

    def __init__(self, stream: str, run: str) -> None:
        super().__init__(f"no replay-mode run {run!r} in stream {stream!r}")
        self.stream = stream
        self.run = run
