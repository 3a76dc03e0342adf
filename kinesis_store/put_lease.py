"""The lease the PutRecords being sent is put under: the earliest end of its groups' leases.

:class:`kinesis_store.writer.KinesisWriter` enters :func:`sending_under` around each call; the
before-send checks on the put client (the protocol's, :mod:`producer.fence`) read it with
:func:`put_lease_expires_at_ms`. A context variable: one value per thread, the thread that makes
the call, so writers in several threads never see each other's lease.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["put_lease_expires_at_ms", "sending_under"]

_LEASE_EXPIRES_AT_MS: ContextVar[int | None] = ContextVar("keo_put_lease", default=None)


@contextlib.contextmanager
def sending_under(lease_expires_at_ms: int | None) -> Iterator[None]:
    """The requests made inside are put under a lease that ends at ``lease_expires_at_ms``."""
    token = _LEASE_EXPIRES_AT_MS.set(lease_expires_at_ms)
    try:
        yield
    finally:
        _LEASE_EXPIRES_AT_MS.reset(token)


def put_lease_expires_at_ms() -> int | None:
    """The end of the lease the request being sent is put under (None: none was given)."""
    return _LEASE_EXPIRES_AT_MS.get()
