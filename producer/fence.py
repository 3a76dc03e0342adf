"""The before-send checks on the put client: no request leaves that could land after its lease.

Kinesis refuses a SigV4 request that reaches it more than 5 minutes after the ``X-Amz-Date``
it was signed with. botocore signs each attempt just before sending it, so a ``before-send``
handler sees the request's signing time; it lets the request go only if
:func:`producer.protocol.signature_fence_admits` (signed_at + window + skew <= the lease's
end). A request that passes lands before its lease ends however long its process stalls
afterwards: a server-side fence, checked on our side of the wire.

The handler learns the lease of the request being sent from
:func:`kinesis_store.put_lease.sending_under`, which :class:`kinesis_store.writer.KinesisWriter`
enters around each call (a context variable: one value per thread, the thread that makes the
call). A refused request is not sent: the handler raises
:class:`kinesis_store.errors.PutFencedError`, which the writer turns into a NOT_WRITTEN result
(``SignatureFence``, retriable). It fails closed: a request with no lease given, or no
signing time, is refused too.

With the signature fence off (``KEO_PUT_FENCE=off``), :class:`LeaseDeadline` takes its place
on the put client: the same handler, checking the clock instead of the signature: a request
leaves only while its lease has the put's timeouts and the skew left
(:meth:`producer.protocol.LeasePolicy.outlasts_put`), else ``LeaseFence`` (not written,
retriable). Checked at the last moment, after any slow ledger call (a renewal retried under
throttling, a take-over), it keeps a put sent late from landing after its lease: what it cannot
bound is a process that stalls after the check, or a network that holds the request longer
than its timeouts; only the signature's window bounds those.

::

    writer.put_entries(entries, lease_expires_at_ms=L)
      └─ sending_under(L) ─ client.put_records ─ sign (X-Amz-Date) ─ before-send: fence ─ send
                                                                            └─ refused: not sent
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from dedupe_store.clock import Clock
from kinesis_store.errors import PutFencedError
from kinesis_store.put_lease import put_lease_expires_at_ms
from kinesis_store.results import LEASE_FENCE, SIGNATURE_FENCE
from producer.protocol import LeasePolicy

__all__ = [
    "SIGNED_AT_HEADER",
    "LeaseDeadline",
    "SignatureFence",
    "fence_for",
    "signed_at_ms",
]

SIGNED_AT_HEADER: Final = "X-Amz-Date"
_SIGNED_AT_FORMAT: Final = "%Y%m%dT%H%M%SZ"  # SigV4's basic ISO 8601, always UTC
_EVENT: Final = "before-send.kinesis.PutRecords"


def signed_at_ms(headers: Mapping[str, Any]) -> int | None:
    """When a SigV4 request was signed (its ``X-Amz-Date``, to the second), in epoch ms;
    None when it has no such header or an unreadable one."""
    value = headers.get(SIGNED_AT_HEADER)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    try:
        signed = datetime.strptime(value, _SIGNED_AT_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(signed.timestamp()) * 1000


class _BeforeSendCheck:
    """A check run on every PutRecords of a client, last, right before it is sent."""

    def install(self, client: Any) -> None:
        """Check every PutRecords of ``client`` last, right before it is sent: after any other
        ``before-send`` handler (the closest to the wire we can get)."""
        client.meta.events.register_last(_EVENT, self.check, unique_id=f"keo-fence-{id(self)}")

    def check(self, request: Any, **_: Any) -> None:
        raise NotImplementedError


class SignatureFence(_BeforeSendCheck):
    """The ``before-send`` check of one put client, with a fenced :class:`LeasePolicy`."""

    def __init__(self, policy: LeasePolicy) -> None:
        if not policy.fenced:
            raise ValueError("the signature fence needs a lease policy with a signature window")
        self._policy = policy

    def check(self, request: Any, **_: Any) -> None:
        """Raise :class:`PutFencedError` unless ``request`` may leave under its lease."""
        lease_expires_at_ms = put_lease_expires_at_ms()
        signed_at = signed_at_ms(request.headers)
        if lease_expires_at_ms is None or signed_at is None:
            missing = "no lease was given" if lease_expires_at_ms is None else "it is not signed"
            raise PutFencedError(
                f"signature fence: request not sent: {missing}",
                code=SIGNATURE_FENCE,
                signed_at_ms=signed_at,
                lease_expires_at_ms=lease_expires_at_ms,
            )
        if self._policy.fence_admits(signed_at, lease_expires_at_ms):
            return
        reach_ms = (self._policy.signature_window_ms or 0) + self._policy.skew_ms
        past_ms = signed_at + reach_ms - lease_expires_at_ms
        raise PutFencedError(
            f"signature fence: request not sent: it could land up to {reach_ms / 1000:g} s "
            f"(window + skew) after it was signed, {past_ms / 1000:g} s past its lease",
            code=SIGNATURE_FENCE,
            signed_at_ms=signed_at,
            lease_expires_at_ms=lease_expires_at_ms,
        )


class LeaseDeadline(_BeforeSendCheck):
    """The ``before-send`` check of a put client with the signature fence off: a request
    leaves only while its lease has the put's timeouts and the skew left, by ``clock``."""

    def __init__(self, policy: LeasePolicy, clock: Clock) -> None:
        self._policy = policy
        self._clock = clock

    def check(self, request: Any, **_: Any) -> None:  # noqa: ARG002 - botocore's signature
        """Raise :class:`PutFencedError` unless a put sent now lands before its lease ends."""
        lease_expires_at_ms = put_lease_expires_at_ms()
        now_ms = self._clock.now_ms()
        if lease_expires_at_ms is None:
            raise PutFencedError(
                "lease deadline: request not sent: no lease was given",
                code=LEASE_FENCE,
                signed_at_ms=now_ms,
                lease_expires_at_ms=None,
            )
        if self._policy.outlasts_put(lease_expires_at_ms, now_ms):
            return
        needed_ms = self._policy.put_timeout_ms + self._policy.skew_ms
        raise PutFencedError(
            f"lease deadline: request not sent: its lease has {(lease_expires_at_ms - now_ms) / 1000:g} s "
            f"left, less than the put's timeouts + skew ({needed_ms / 1000:g} s)",
            code=LEASE_FENCE,
            signed_at_ms=now_ms,
            lease_expires_at_ms=lease_expires_at_ms,
        )


def fence_for(policy: LeasePolicy, clock: Clock) -> SignatureFence | LeaseDeadline:
    """The before-send check a put client gets: the signature fence when ``policy`` has a
    window, else the lease deadline."""
    return SignatureFence(policy) if policy.fenced else LeaseDeadline(policy, clock)
