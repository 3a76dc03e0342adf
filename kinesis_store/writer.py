"""``KinesisWriter``: PutRecords for one stream, every record's result classified.

It translates each botocore error once: into a put result classified with
:mod:`kinesis_store.results` (which carries whether to resend), or, for a missing stream, into
:class:`kinesis_store.errors.StreamNotFoundError`, keeping the cause; nothing past this module
looks at botocore's exception classes on the put path. The put client must be built with SDK
retries off: a retried PutRecords is exactly the duplicate this project exists to prevent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import botocore.exceptions

from dedupe_store.errors import aws_error_code
from kinesis_store.errors import PutFencedError, StreamError, StreamNotFoundError
from kinesis_store.put_lease import sending_under
from kinesis_store.results import (
    RecordResult,
    TransportFailure,
    classify_request_error,
    classify_response,
    classify_transport_failure,
    not_written,
)
from kinesis_store.shards import OpenShards, Shard
from kinesis_store.write_pacing import WritePacer, shard_loads, split_to_fit

__all__ = ["KinesisWriter", "transport_failure_of"]

log = logging.getLogger(__name__)

# botocore's transport failures as our codes, the most specific first: a ConnectTimeoutError
# is also a ConnectionError. Whether each was sent, and so whether it may be resent, is the
# data of ours (TransportFailure, kinesis_store.results), not something read off a class name.
_TRANSPORT_FAILURES: tuple[tuple[type[Exception], TransportFailure], ...] = (
    (botocore.exceptions.ConnectTimeoutError, TransportFailure.CONNECT_TIMEOUT),
    (botocore.exceptions.EndpointConnectionError, TransportFailure.CONNECTION_NOT_MADE),
    (botocore.exceptions.ReadTimeoutError, TransportFailure.READ_TIMEOUT),
    # any other: a reset, a closed connection, TLS, a proxy in the way, a cut response stream
    (botocore.exceptions.HTTPClientError, TransportFailure.CONNECTION_LOST),
    (botocore.exceptions.ConnectionError, TransportFailure.CONNECTION_LOST),
)
_TRANSPORT_ERRORS = tuple(error for error, _ in _TRANSPORT_FAILURES)


class KinesisWriter:
    """PutRecords for one stream, classifying every record's result."""

    def __init__(
        self,
        client: Any,
        stream: str,
        *,
        pacer: WritePacer | None = None,
        shards: OpenShards | None = None,
        on_paced: Callable[[float], None] | None = None,
    ) -> None:
        """With a ``pacer`` (and the stream's ``shards``, to know where each record goes: read
        again as :class:`OpenShards` says), each request waits until the shards it puts
        on have room (:mod:`kinesis_store.write_pacing`); ``on_paced`` is told the seconds
        each request that waited waited (a metric)."""
        if (pacer is None) != (shards is None):
            raise ValueError("a write pacer needs the stream's shards, and only it does")
        self._client = client
        self.stream = stream
        self._pacer = pacer
        self._shards = shards
        self._on_paced = on_paced

    @property
    def client(self) -> Any:
        """The botocore client, for event hooks (metrics, injected faults)."""
        return self._client

    @property
    def shards(self) -> OpenShards | None:
        """The shard map the puts are paced by (None: not paced)."""
        return self._shards if self._pacer is not None else None

    def _paced_requests(
        self, entries: list[dict[str, Any]]
    ) -> tuple[list[list[dict[str, Any]]], Sequence[Shard]]:
        """The requests ``entries`` go in: one, or with a pacer as many as keep each shard's
        part of each within what it takes at once (:func:`split_to_fit`); and the shard map
        they were split by (none: not paced). Pacing is a
        courtesy, never a condition of the put: a shard map that cannot be read (a role
        without ListShards, the stream unavailable) turns it off for this writer, said once;
        the put goes on."""
        if self._pacer is None or self._shards is None:
            return [entries], []
        try:
            shards = self._shards.current()
        except StreamError as exc:
            if isinstance(exc, StreamNotFoundError):
                raise
            log.warning(
                "puts not paced: the shard map cannot be read stream=%s error=%s", self.stream, exc
            )
            self._pacer = None
            return [entries], []
        return split_to_fit(entries, shards, self._pacer), shards

    def put_entries(
        self,
        entries: list[dict[str, Any]],
        *,
        lease_expires_at_ms: int | None = None,
        turn: int | None = None,
    ) -> list[RecordResult]:
        """PutRecords of ``entries``: one call, or when paced as many as keep each shard's part
        of each within what the shard takes at once, in order; one classified result per entry,
        in request order. Every failure is a result (written, not written, ambiguous), except
        a missing stream.

        ``lease_expires_at_ms``: the end of the lease the entries are put under (the earliest
        of their groups'), for the before-send check the client has (:mod:`producer.fence`:
        the signature fence, or the lease deadline); a request it refuses is not sent:
        NOT_WRITTEN, retriable.

        ``turn``: the caller's place among this process's writers (smaller: older), the
        oldest first when several wait for a shard (:meth:`WritePacer.before_request`).
        """
        requests, shards = self._paced_requests(entries)
        results: list[RecordResult] = []
        for request in requests:
            pacer = self._pacer
            if pacer is None or not shards:
                results += self._put(request, lease_expires_at_ms)
                continue
            paced_with = pacer.share()
            waited_s = pacer.before_request(shard_loads(request, shards), turn=turn)
            if waited_s > 0 and self._on_paced is not None:
                self._on_paced(waited_s)
            answered = self._put(request, lease_expires_at_ms)
            pacer.answered(
                sent=len(answered),
                refused=sum(1 for result in answered if result.throttled),
                paced_with=paced_with,
            )
            results += answered
        return results

    def _put(
        self, entries: list[dict[str, Any]], lease_expires_at_ms: int | None
    ) -> list[RecordResult]:
        try:
            with sending_under(lease_expires_at_ms):
                response = self._client.put_records(StreamName=self.stream, Records=entries)
        except PutFencedError as exc:
            log.warning(
                "put not sent stream=%s records=%d code=%s error=%s",
                self.stream,
                len(entries),
                exc.code,
                exc,
            )
            return [not_written(exc.code, str(exc))] * len(entries)
        except _TRANSPORT_ERRORS as exc:
            failure = transport_failure_of(exc)
            log.warning(
                "put %s stream=%s records=%d code=%s error=%s",
                "ambiguous" if failure.sent else "not sent",
                self.stream,
                len(entries),
                failure,
                exc,
            )
            return [classify_transport_failure(failure, str(exc))] * len(entries)
        except botocore.exceptions.ClientError as exc:
            code = aws_error_code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "ResourceNotFoundException":
                raise StreamNotFoundError(
                    f"stream {self.stream!r} does not exist: run 'keo init'", stream=self.stream
                ) from exc
            result = classify_request_error(
                status, code, exc.response.get("Error", {}).get("Message")
            )
            log.warning(
                "put failed stream=%s records=%d status=%s code=%s kind=%s",
                self.stream,
                len(entries),
                status,
                code,
                result.kind,
            )
            return [result] * len(entries)
        return classify_response(response, len(entries))


def transport_failure_of(exc: BaseException) -> TransportFailure:
    """The transport failure a botocore exception stands for (any unknown one may have been
    sent: it counts as a lost connection)."""
    return next(
        (failure for error, failure in _TRANSPORT_FAILURES if isinstance(exc, error)),
        TransportFailure.CONNECTION_LOST,
    )
