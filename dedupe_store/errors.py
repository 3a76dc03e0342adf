"""Errors of the ledger.

The tree::

    LedgerError                      anything the ledger cannot do for its caller
    ├── InvalidTransitionError       a state change the state machine forbids (a bug, never retried)
    ├── LedgerUnavailableError       DynamoDB could not be reached or answered 5xx (retriable)
    │   └── LedgerThrottledError     DynamoDB throttled the request (retriable)
    └── LedgerSchemaError            the table is missing or has the wrong shape (not retriable)

Expected outcomes, such as a claim lost to another producer or a mark lost to a takeover,
are return values of the ledger, not errors.
"""

from __future__ import annotations

from typing import ClassVar


class LedgerError(Exception):
    """Base of every ledger error. ``retriable`` says whether trying again may succeed."""

    retriable: ClassVar[bool] = False

    def __init__(self, message: str, *, table: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.table = table
        self.key = key

    @property
    def cause_response_code(self) -> str | None:
        """The AWS error code of the vendor error this one was raised from, if any."""
        cause = self.__cause__
        code = getattr(cause, "cause_response_code", None)
        if code is None:
            response = getattr(cause, "response", None)
            if isinstance(response, dict):
                code = response.get("Error", {}).get("Code")
        return code if isinstance(code, str) else None


class InvalidTransitionError(LedgerError):
    """The state machine forbids this transition."""

    def __init__(self, current: str | None, transition: str) -> None:
        super().__init__(f"transition {transition} is not allowed from state {current or 'ABSENT'}")
        self.current = current
        self.transition = transition


class LedgerUnavailableError(LedgerError):
    """DynamoDB could not be reached, timed out, or failed on its side."""

    retriable = True


class LedgerThrottledError(LedgerUnavailableError):
    """DynamoDB throttled the request."""


class LedgerSchemaError(LedgerError):
    """The ledger table does not exist or does not have the expected keys and index."""
