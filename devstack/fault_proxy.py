"""A fault proxy on 127.0.0.1: sits between any process and an emulator and injects faults.

Chosen by the request's ``X-Amz-Target`` (e.g. ``Kinesis_20131202.PutRecords``,
``DynamoDB_20120810.UpdateItem``) and a seeded schedule, so a failing run can be replayed.
Usable from processes the tests cannot hook into (``keo send`` subprocesses, Spark
executors): point their endpoint at the proxy.

Faults:
    drop_response     forward, then close the connection without answering (written, lost)
    error_after       forward, then answer 500 InternalFailure (written, looks failed)
    error_before      answer 500 without forwarding (not written, looks ambiguous)
    delay             forward after sleeping ``delay_s`` (past the client's read timeout)
    hold              keep the request until the rule's ``release`` event is set (at most
                      ``delay_s`` when it is not 0), then go on as if it arrived only then:
                      a request whose process stalled after signing it; ``held`` is set when
                      one is being held
    throttle          answer 400 ProvisionedThroughputExceededException without forwarding
    expire_iterator   answer 400 ExpiredIteratorException without forwarding (GetRecords: the
                      iterator was older than its 5 minutes)
    partial           PutRecords: forward a subset of the records and answer per-record
                      ProvisionedThroughputExceededException for the rest (truly not written);
                      BatchGetItem: forward a subset of the keys and answer the rest as
                      ``UnprocessedKeys`` (DynamoDB throttled their reads)

The signature window (``signature_window_s``): the emulators do not check signatures, AWS does.
With a window, a request whose ``X-Amz-Date`` is more than the window before (or after) its
arrival at the proxy is answered 400 ``InvalidSignatureException`` ("Signature expired: ...
is now earlier than ...", as AWS words it) and not forwarded. Arrival is read from ``clock``
(seconds, default the wall clock), after any delay or hold. Refusals are counted in
``signatures_refused`` by operation.

``GET /__keo/report`` answers what the proxy saw (:meth:`FaultProxy.report`), as JSON.

``keo emulators proxy --signature-window-s 4`` runs one in front of the local stack's
kinesalite, for processes started by hand.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

FAULTS = (
    "drop_response",
    "error_after",
    "error_before",
    "delay",
    "hold",
    "throttle",
    "expire_iterator",
    "partial",
)
_SIGNED_AT_FORMAT = "%Y%m%dT%H%M%SZ"
REPORT_PATH = "/__keo/report"  # GET: the proxy's counters, as JSON
# headers a proxy does not forward: hop-by-hop (RFC 9110 7.6.1), and the length it sets again
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


@dataclass
class FaultRule:
    """Apply ``fault`` to requests whose target ends with ``operation``, with ``probability``,
    at most ``limit`` times (None: no limit)."""

    operation: str
    fault: str
    probability: float = 1.0
    limit: int | None = None
    delay_s: float = 0.0
    fraction: float = 0.5  # for partial: the share of records refused
    used: int = 0
    # for hold: set when a request is being held; setting ``release`` lets it (and later ones) go
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known: {', '.join(FAULTS)}")


@dataclass
class FaultSchedule:
    rules: list[FaultRule]
    seed: int = 0
    injected: Counter[str] = field(default_factory=Counter)
    _rng: random.Random = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def pick(self, target: str) -> FaultRule | None:
        with self._lock:
            for rule in self.rules:
                if not target.endswith("." + rule.operation):
                    continue
                if rule.limit is not None and rule.used >= rule.limit:
                    continue
                if self._rng.random() < rule.probability:
                    rule.used += 1
                    self.injected[f"{rule.operation}:{rule.fault}"] += 1
                    return rule
            return None

    def choose_refused(self, count: int, fraction: float) -> set[int]:
        with self._lock:
            refused = {i for i in range(count) if self._rng.random() < fraction}
        return refused or ({0} if count else set())


class FaultProxy:
    """``with FaultProxy(upstream, schedule) as proxy: use proxy.endpoint``."""

    def __init__(
        self,
        upstream: str,
        schedule: FaultSchedule | None = None,
        *,
        port: int = 0,
        signature_window_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        if signature_window_s is not None and signature_window_s <= 0:
            raise ValueError(f"signature window must be positive, got {signature_window_s}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.schedule = schedule if schedule is not None else FaultSchedule([])
        self.signature_window_s = signature_window_s
        self._clock = clock
        self.received: Counter[str] = Counter()  # requests that reached the proxy, by operation
        self.signatures_refused: Counter[str] = Counter()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = _Server(("127.0.0.1", port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def report(self) -> dict[str, Any]:
        """What the proxy saw, as JSON-ready data (``GET /__keo/report``): requests received
        and signatures refused by operation, faults injected."""
        with self._lock:
            received, refused = dict(self.received), dict(self.signatures_refused)
        return {
            "received": received,
            "signatures_refused": refused,
            "injected": dict(self.schedule.injected),
        }

    def count(self, target: str) -> None:
        with self._lock:
            self.received[_operation(target)] += 1

    def signature_refusal(self, signed: str | None, target: str) -> str | None:
        """AWS's answer to a request signed at ``signed`` (its ``X-Amz-Date``) arriving now,
        when that is outside the window: the message of the InvalidSignatureException; else
        None."""
        window_s = self.signature_window_s
        if window_s is None or signed is None:
            return None
        try:
            signed_at = datetime.strptime(signed, _SIGNED_AT_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            return None
        now = datetime.fromtimestamp(self._clock(), tz=UTC)
        window = timedelta(seconds=window_s)
        span = f"{window_s / 60:g} min." if window_s % 60 == 0 else f"{window_s:g} sec."
        if signed_at < now - window:
            message = (
                f"Signature expired: {signed} is now earlier than {_stamp(now - window)} "
                f"({_stamp(now)} - {span})"
            )
        elif signed_at > now + window:
            message = (
                f"Signature not yet current: {signed} is still later than "
                f"{_stamp(now + window)} ({_stamp(now)} + {span})"
            )
        else:
            return None
        with self._lock:
            self.signatures_refused[_operation(target)] += 1
        log.info("fault proxy refused a signature target=%s message=%s", target, message)
        return message

    def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # the listen backlog: socketserver's 5 overflows when Spark's tasks open connections in a
    # burst on a busy machine, and a connection dropped from a full queue is later reset
    request_queue_size = 128


class _Handler(BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"
    # an answer leaves in two writes (headers, body): with Nagle's algorithm the body waits for
    # the client's delayed ACK, 40 ms a call, which serial callers (a read-back) pay every time
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fault proxy request %s", format % args)

    def do_GET(self) -> None:
        if self.path != REPORT_PATH:
            return self._answer(404, _error_body("NotFound", f"only {REPORT_PATH} is served"))
        return self._answer(200, json.dumps(self.proxy.report()).encode(), "application/json")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        # a proxy forwards no hop-by-hop header (RFC 9110 7.6.1): a client's Connection: close
        # is about its own connection, not the one to the upstream
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
        target = self.headers.get("X-Amz-Target", "")
        self.proxy.count(target)
        rule = self.proxy.schedule.pick(target)
        fault = rule.fault if rule else None
        if rule is not None and fault == "delay":
            time.sleep(rule.delay_s)
        if rule is not None and fault == "hold":
            rule.held.set()
            rule.release.wait(rule.delay_s or None)
        # the request arrives now: AWS checks its signature before anything else
        refusal = self.proxy.signature_refusal(self.headers.get("X-Amz-Date"), target)
        if refusal is not None:
            return self._answer(400, _error_body("InvalidSignatureException", refusal))
        if fault == "error_before":
            return self._answer(500, _error_body("InternalFailure", "injected before the write"))
        if fault == "throttle":
            return self._answer(
                400, _error_body("ProvisionedThroughputExceededException", "injected throttle")
            )
        if fault == "expire_iterator":
            return self._answer(
                400, _error_body("ExpiredIteratorException", "injected: iterator expired")
            )
        if rule is not None and fault == "partial" and target.endswith(".PutRecords"):
            return self._partial(body, headers, rule)
        if rule is not None and fault == "partial" and target.endswith(".BatchGetItem"):
            return self._unprocessed(body, headers, rule)
        status, upstream_headers, answer = self.proxy.forward("POST", self.path, headers, body)
        if fault == "drop_response":
            self.close_connection = True
            self.connection.close()
            return None
        if fault == "error_after":
            return self._answer(500, _error_body("InternalFailure", "injected after the write"))
        return self._answer(status, answer, upstream_headers.get("Content-Type"))

    def _partial(self, body: bytes, headers: dict[str, str], rule: FaultRule) -> None:
        request = json.loads(body)
        records = request["Records"]
        refused = self.proxy.schedule.choose_refused(len(records), rule.fraction)
        kept = [r for i, r in enumerate(records) if i not in refused]
        results: list[dict[str, Any]] = []
        upstream: list[dict[str, Any]] = []
        if kept:
            request["Records"] = kept
            written = self._forward_part(request, headers)
            if written is None:
                return None
            upstream = written["Records"]
        forwarded = iter(upstream)
        for i in range(len(records)):
            if i in refused:
                results.append(
                    {
                        "ErrorCode": "ProvisionedThroughputExceededException",
                        "ErrorMessage": "injected: rate exceeded for shard",
                    }
                )
            else:
                results.append(next(forwarded))
        failed = sum(1 for r in results if "ErrorCode" in r)
        return self._answer(
            200, json.dumps({"FailedRecordCount": failed, "Records": results}).encode()
        )

    def _unprocessed(self, body: bytes, headers: dict[str, str], rule: FaultRule) -> None:
        """BatchGetItem: each table's chosen keys answered as ``UnprocessedKeys``, the rest read."""
        request = json.loads(body)
        asked: dict[str, Any] = request["RequestItems"]
        kept: dict[str, Any] = {}
        unprocessed: dict[str, Any] = {}
        for table, reads in asked.items():
            refused = self.proxy.schedule.choose_refused(len(reads["Keys"]), rule.fraction)
            for chosen, into in ((False, kept), (True, unprocessed)):
                keys = [k for i, k in enumerate(reads["Keys"]) if (i in refused) is chosen]
                if keys:
                    into[table] = {**reads, "Keys": keys}
        answer: dict[str, Any] = {"Responses": {table: [] for table in asked}}
        if kept:
            request["RequestItems"] = kept
            read = self._forward_part(request, headers)
            if read is None:
                return None
            answer["Responses"].update(read.get("Responses", {}))
            for table, reads in (read.get("UnprocessedKeys") or {}).items():
                unprocessed.setdefault(table, {**reads, "Keys": []})["Keys"] += reads["Keys"]
        answer["UnprocessedKeys"] = unprocessed
        return self._answer(200, json.dumps(answer).encode(), "application/x-amz-json-1.0")

    def _forward_part(self, request: dict[str, Any], headers: dict[str, str]) -> Any:
        """Forward the part of a batch a ``partial`` fault lets through; its answer, parsed.
        An upstream error goes back to the client as it came, and then this is None."""
        status, _, answer = self.proxy.forward(
            "POST", self.path, headers, json.dumps(request).encode()
        )
        if status != 200:
            self._answer(status, answer)
            return None
        return json.loads(answer)

    def _answer(self, status: int, body: bytes, content_type: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type or "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:  # asked by the client: say so, or it may send on a closed one
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"__type": code, "message": message}).encode()


def _operation(target: str) -> str:
    """``Kinesis_20131202.PutRecords`` -> ``PutRecords``."""
    return target.rpartition(".")[2] or "unknown"


def _stamp(moment: datetime) -> str:
    return moment.strftime(_SIGNED_AT_FORMAT)
