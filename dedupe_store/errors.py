"""The root of every keo error, the errors of the ledger, and the AWS error code of a vendor's.

The lowest layer holds the root, so every package's errors derive from one class whichever
layer raises them, and an entry point (the CLI, a Spark job) maps the whole tree with one
``except KeoError``. ``retriable`` is class data: whether trying again may succeed.

The tree::

    KeoError                          anything keo cannot do for its caller
    ├── ConfigurationError            settings that cannot work (names the setting, where one is)
    │   └── InvalidStreamNameError    a stream name outside the rule of dedupe_store.names (name)
    └── LedgerError                   anything the ledger cannot do for its caller (table, key)
        ├── InvalidTransitionError    a state change the state machine forbids (a bug, never retried)
        ├── LedgerUnavailableError    DynamoDB could not be reached or answered 5xx (retriable)
        │   └── LedgerThrottledError  DynamoDB throttled the request (retriable)
        ├── LedgerSchemaError         the table is missing or has the wrong shape (not retriable)
        └── PackingError              a group item's blob is corrupt, or an input cannot be packed
                                      (dedupe_store.packing; a ValueError too)

The other packages grow their branches from these roots, each drawn in its own module:
:mod:`kinesis_store.errors` (Kinesis: the stream, the fence's refusal, KPL aggregates),
:mod:`producer.errors` (the batch, the audit; it re-exports the stream's), :mod:`api.errors`,
``OptionsError`` in :mod:`spark_jobs.options`, ``LogSettingError`` in :mod:`cli.logs`.

Expected outcomes, such as a claim lost to another producer or a mark lost to a takeover,
are return values of the ledger, not errors.

Every package reads a vendor error's code with :func:`aws_error_code`; DynamoDB's throttling
codes, :data:`DYNAMODB_THROTTLING_CODES`, are :class:`LedgerThrottledError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final


class KeoError(Exception):
    """Base of every keo error. ``retriable`` says whether trying again may succeed."""

    retriable: ClassVar[bool] = False


class ConfigurationError(KeoError):
    """Settings that cannot work; ``setting`` names the one at fault, where one is."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class InvalidStreamNameError(ConfigurationError):
    """``name`` breaks the stream-name rule (:mod:`dedupe_store.names`)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"stream name {name!r} {reason}")
        self.name = name
        self.reason = reason


class LedgerError(KeoError):
    """Base of every ledger error."""

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
            code = aws_error_code(cause)
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


# what DynamoDB answers a request it throttled (PartiQL batch statements use other spellings:
# dedupe_store.batch_claims)
DYNAMODB_THROTTLING_CODES: Final = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)


def aws_error_code(response_or_exception: object) -> str | None:
    """The AWS error code (``Error.Code``) of a botocore response, or of an exception that
    carries one (``ClientError.response``); None where there is none."""
    response = (
        response_or_exception
        if isinstance(response_or_exception, Mapping)
        else getattr(response_or_exception, "response", None)
    )
    error = response.get("Error") if isinstance(response, Mapping) else None
    code = error.get("Code") if isinstance(error, Mapping) else None
    return code if isinstance(code, str) else None
