"""``KinesisQuotaProxy``: kinesalite on 127.0.0.1 behind a proxy that keeps AWS's quotas
(:mod:`devstack.quotas`), answering as Kinesis does past one, with nothing written::

    any process ──POST──> KinesisQuotaProxy ──forward (what the quotas admit)──> kinesalite
                             ├─ PutRecords: each record's shard (MD5 of its partition key, or
                             │    its ExplicitHashKey, against the open shards' hash ranges,
                             │    listed from kinesalite and cached for a second); the records
                             │    over their shard's quota answered ErrorCode
                             │    ProvisionedThroughputExceededException in their place, the
                             │    rest forwarded in order; PutRecord refused whole
                             ├─ GetShardIterator: per shard; the iterator it answers noted
                             ├─ GetRecords: the iterator's shard (noted when the proxy handed
                             │    it out: every reader goes through it), its calls and the
                             │    bytes it answered; an iterator it never saw passes unmetered
                             └─ the control plane: per account or per stream (400
                                  LimitExceededException)

It is a :class:`devstack.fault_proxy.FaultProxy`: a fault schedule and the signature window
work in front of the quotas. ``GET /__keo/report`` answers the counters (calls, throttles,
records and bytes by shard) as JSON, for processes that did not start the proxy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from devstack.fault_proxy import FaultProxy, FaultSchedule
from devstack.quotas import CONTROL_PLANE, Admission, KinesisQuotas, KinesisQuotaState
from kinesis_store.reader import shard_of
from kinesis_store.shards import Shard, open_shards

__all__ = ["KinesisQuotaProxy"]

log = logging.getLogger(__name__)

_TARGET_PREFIX: Final = "Kinesis_20131202."
_SHARD_MAP_TTL_S: Final = 1.0  # a reshard is seen within a second
_ITERATORS_KEPT: Final = 100_000  # the newest iterators handed out (they expire in 5 min)
_JSON: Final = "application/x-amz-json-1.1"

Answer = tuple[int, dict[str, str], bytes]


def _decoded_size(encoded: str) -> int:
    """The bytes of base64 ``encoded`` without decoding it."""
    return len(encoded) * 3 // 4 - encoded[-2:].count("=") if encoded else 0


def _record_size(record: dict[str, Any]) -> int:
    """Data and partition key: what a shard's byte quotas count."""
    return _decoded_size(record.get("Data", "")) + len(record.get("PartitionKey", "").encode())


def _hash_key(record: dict[str, Any]) -> int:
    explicit = record.get("ExplicitHashKey")
    if explicit:
        return int(explicit)
    digest = hashlib.md5(record["PartitionKey"].encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest, "big")


def _stream_of(request: dict[str, Any]) -> str:
    name = request.get("StreamName")
    if name:
        return str(name)
    arn = str(request.get("StreamARN", ""))
    return arn.rpartition("stream/")[2]


def _error(code: str, message: str) -> Answer:
    body = json.dumps({"__type": code, "message": message}).encode()
    return 400, {"Content-Type": _JSON}, body


class KinesisQuotaProxy(FaultProxy):
    """``with KinesisQuotaProxy(kinesis_url) as proxy: use proxy.endpoint``; ``proxy.state``
    holds the buckets and the counters."""

    def __init__(
        self,
        upstream: str,
        quotas: KinesisQuotas | None = None,
        *,
        schedule: FaultSchedule | None = None,
        port: int = 0,
        signature_window_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(upstream, schedule, port=port, signature_window_s=signature_window_s)
        self.state = KinesisQuotaState(quotas or KinesisQuotas())
        self._monotonic = monotonic
        self._quota_lock = threading.Lock()
        self._shard_maps: dict[str, tuple[float, list[Shard]]] = {}
        self._iterators: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def __enter__(self) -> KinesisQuotaProxy:
        self.start()
        return self

    def report(self) -> dict[str, Any]:
        with self._quota_lock:
            return {**super().report(), "quotas": self.state.snapshot()}

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        target = next((v for k, v in headers.items() if k.lower() == "x-amz-target"), "")
        operation = target.removeprefix(_TARGET_PREFIX)
        if not target.startswith(_TARGET_PREFIX) or not body:
            return super().forward(method, path, headers, body)
        request = json.loads(body)
        if operation == "PutRecords":
            return self._put_records(path, headers, request)
        if operation == "PutRecord":
            return self._put_record(path, headers, body, request)
        if operation == "GetRecords":
            return self._get_records(path, headers, body, request)
        if operation == "GetShardIterator":
            return self._get_shard_iterator(path, headers, body, request)
        if operation in CONTROL_PLANE:
            with self._quota_lock:
                decided = self.state.admit_control(
                    operation, _stream_of(request), self._monotonic()
                )
            if not decided.admitted:
                return _error(decided.code, decided.message)
        return super().forward(method, path, headers, body)

    # --- writes -------------------------------------------------------------------------

    def _put_records(self, path: str, headers: dict[str, str], request: dict[str, Any]) -> Answer:
        stream = _stream_of(request)
        records: list[dict[str, Any]] = request.get("Records", [])
        shards = self._shards_of(stream, records, path, headers)
        if shards is None:  # no such stream, or no open shard: kinesalite answers it
            return super().forward("POST", path, headers, json.dumps(request).encode())
        with self._quota_lock:
            decided = self.state.admit_records(
                "PutRecords",
                stream,
                [(shard, _record_size(r)) for shard, r in zip(shards, records, strict=True)],
                self._monotonic(),
            )
        admitted = [r for r, d in zip(records, decided, strict=True) if d.admitted]
        written: list[dict[str, Any]] = []
        if admitted:
            status, answer_headers, answer = super().forward(
                "POST", path, headers, json.dumps({**request, "Records": admitted}).encode()
            )
            if status != 200:
                return status, answer_headers, answer
            written = json.loads(answer)["Records"]
        results = iter(written)
        merged = [next(results) if d.admitted else _refused(d) for d in decided]
        failed = sum(1 for r in merged if "ErrorCode" in r)
        body = json.dumps({"FailedRecordCount": failed, "Records": merged}).encode()
        return 200, {"Content-Type": _JSON}, body

    def _put_record(
        self, path: str, headers: dict[str, str], body: bytes, request: dict[str, Any]
    ) -> Answer:
        stream = _stream_of(request)
        shards = self._shards_of(stream, [request], path, headers)
        if shards is not None:
            with self._quota_lock:
                (decided,) = self.state.admit_records(
                    "PutRecord", stream, [(shards[0], _record_size(request))], self._monotonic()
                )
            if not decided.admitted:
                return _error(decided.code, decided.message)
        return super().forward("POST", path, headers, body)

    def _shards_of(
        self, stream: str, records: list[dict[str, Any]], path: str, headers: dict[str, str]
    ) -> list[str] | None:
        """Each record's open shard, by its hash key; None when the stream has none listed."""
        listed = self._open_shards(stream, path, headers)
        if not listed:
            return None
        found: list[str] = []
        for record in records:
            key = _hash_key(record)
            shard = next((s for s in listed if s.covers(key)), listed[0])
            found.append(shard.shard_id)
        return found

    def _open_shards(self, stream: str, path: str, headers: dict[str, str]) -> list[Shard]:
        now = self._monotonic()
        with self._quota_lock:
            cached = self._shard_maps.get(stream)
        if cached is not None and now - cached[0] < _SHARD_MAP_TTL_S:
            return cached[1]
        listed = self._list_open_shards(stream, path, headers)
        with self._quota_lock:
            self._shard_maps[stream] = (now, listed)
        return listed

    def _list_open_shards(self, stream: str, path: str, headers: dict[str, str]) -> list[Shard]:
        """ListShards on kinesalite itself (not counted: the proxy's own call)."""
        asked = {k: v for k, v in headers.items() if k.lower() != "x-amz-target"}
        asked["X-Amz-Target"] = _TARGET_PREFIX + "ListShards"
        shards: list[Shard] = []
        request: dict[str, Any] = {"StreamName": stream}
        while True:
            status, _, answer = super().forward("POST", path, asked, json.dumps(request).encode())
            if status != 200:
                return []
            page = json.loads(answer)
            shards.extend(open_shards(shard_of(raw) for raw in page.get("Shards", [])))
            token = page.get("NextToken")
            if not token:
                return shards
            request = {"NextToken": token}

    # --- reads --------------------------------------------------------------------------

    def _get_shard_iterator(
        self, path: str, headers: dict[str, str], body: bytes, request: dict[str, Any]
    ) -> Answer:
        stream, shard = _stream_of(request), str(request.get("ShardId", ""))
        with self._quota_lock:
            decided = self.state.admit_iterator(stream, shard, self._monotonic())
        if not decided.admitted:
            return _error(decided.code, decided.message)
        status, answer_headers, answer = super().forward("POST", path, headers, body)
        if status == 200:
            self._note(json.loads(answer).get("ShardIterator"), stream, shard)
        return status, answer_headers, answer

    def _get_records(
        self, path: str, headers: dict[str, str], body: bytes, request: dict[str, Any]
    ) -> Answer:
        with self._quota_lock:
            where = self._iterators.get(str(request.get("ShardIterator", "")))
        if where is None:  # handed out elsewhere: not metered
            return super().forward("POST", path, headers, body)
        stream, shard = where
        with self._quota_lock:
            decided = self.state.admit_read(stream, shard, self._monotonic())
        if not decided.admitted:
            return _error(decided.code, decided.message)
        status, answer_headers, answer = super().forward("POST", path, headers, body)
        if status == 200:
            page = json.loads(answer)
            size = sum(_record_size(record) for record in page.get("Records", []))
            with self._quota_lock:
                self.state.charge_read(stream, shard, size, self._monotonic())
            self._note(page.get("NextShardIterator"), stream, shard)
        return status, answer_headers, answer

    def _note(self, iterator: str | None, stream: str, shard: str) -> None:
        if not iterator:
            return
        with self._quota_lock:
            self._iterators[iterator] = (stream, shard)
            while len(self._iterators) > _ITERATORS_KEPT:
                self._iterators.popitem(last=False)


def _refused(decided: Admission) -> dict[str, str]:
    return {"ErrorCode": decided.code, "ErrorMessage": decided.message}


# --- as a process of the local stack (keo emulators up --quotas aws) ---------------------------

# the exit code of a proxy whose port is taken: the launcher's (emulators/serve.js's) EADDRINUSE
EXIT_ADDRESS_IN_USE: Final = 98


def serve_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    defaults: Any,
    make_proxy: Callable[[str, Any, int], FaultProxy],
) -> int:
    """The command line of a quota proxy of the local stack: ``--upstream URL --port P`` and
    one flag per figure of ``defaults`` (a dataclass of quotas: its float fields); serves until
    SIGTERM. ``make_proxy(upstream, quotas, port)`` builds the proxy."""
    import argparse
    import dataclasses
    import errno
    import signal

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--upstream", required=True, help="the emulator's endpoint")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    figures = [f.name for f in dataclasses.fields(defaults) if f.type == "float"]
    for name in figures:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=float,
            default=getattr(defaults, name),
            help=f"default: AWS's {getattr(defaults, name):g}",
        )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    quotas = dataclasses.replace(defaults, **{name: getattr(args, name) for name in figures})
    try:
        proxy = make_proxy(args.upstream, quotas, args.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return EXIT_ADDRESS_IN_USE
        raise
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with proxy:
        log.info("%s up endpoint=%s upstream=%s", prog, proxy.endpoint, args.upstream)
        stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m devstack.quota_proxy --upstream URL --port P``: serve until SIGTERM."""
    return serve_main(
        argv,
        prog="python -m devstack.quota_proxy",
        description="Kinesis on 127.0.0.1 behind AWS's quotas (devstack.quotas).",
        defaults=KinesisQuotas(),
        make_proxy=lambda upstream, quotas, port: KinesisQuotaProxy(upstream, quotas, port=port),
    )


if __name__ == "__main__":
    raise SystemExit(main())
