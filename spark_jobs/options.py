"""The options of ``format("keo")``, read and checked once, on the driver (pure: no pyspark).

Every ``KEO_*`` setting is an option under its lower-case name without the prefix
(``kinesis_endpoint_url``, ``lease_s``, ...); the rest say which columns hold what, where dead
letters go, which query a streaming write belongs to, and where the driver serves its metrics. Spark hands options over
lower-cased; an option nobody knows is refused, naming it, before any row is read.

An option left unset falls back to the driver's ``KEO_*`` environment, then to the setting's
default; the values are resolved on the driver and shipped to the executors as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

from dedupe_store.settings import ENV_PREFIX, unknown_names
from producer.guarantees import Guarantee, guarantee_of
from producer.settings import ProducerSettings
from producer.wiring import warn_if_unfenced
from spark_jobs.driver_metrics import MetricsEndpoint
from spark_jobs.errors import OptionsError
from spark_jobs.stream_offsets import StartingPosition, StartingPositionKind
from spark_jobs.writer import producer_settings, settings_from_env

FORMAT: Final = "keo"

# Every setting of the producer, by its field name (KEO_LEASE_S -> lease_s).
SETTING_OPTIONS: Final = frozenset(ProducerSettings.model_fields)
# Write options beyond the settings, with their defaults.
WRITE_OPTIONS: Final = {
    "key_column": "key",
    "data_column": "data",
    "routing_key_column": None,
    "dead_letter_path": None,
    "query_name": None,
    "run_id": None,
    "arrow": "true",
    "metrics_port": None,
    "metrics_host": None,  # 127.0.0.1 when metrics_port is set
}
# Read options beyond the settings, with their defaults.
READ_OPTIONS: Final = {
    "starting_timestamp": None,
    "ending_timestamp": None,
    "kcl_filter": "true",
    "fail_on_malformed_aggregate": "false",  # true: stop at one, instead of reading as KCL does
}
# Streaming read options beyond the settings, with their defaults.
STREAM_READ_OPTIONS: Final = {
    "starting_position": "trim_horizon",
    "max_records_per_trigger": None,
    "max_records_per_shard_per_trigger": None,
    "fail_on_data_loss": "true",
    "fail_on_malformed_aggregate": "false",  # true: stop at one, instead of reading as KCL does
    "kcl_filter": "true",
    "query_name": None,  # the metrics' query label
    "metrics_port": None,
    "metrics_host": None,
    "simple_reader": "false",  # the driver reads each batch itself: no task per shard
}
# Spark adds these to a streaming write's options itself.
SPARK_STREAMING_OPTIONS: Final = frozenset({"checkpointlocation", "queryname"})
_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no"})


def refuse_unknown(options: Mapping[str, str], known: frozenset[str], doing: str) -> None:
    unknown = sorted(name for name in options if name.lower() not in known)
    if unknown:
        raise OptionsError(
            f"format('keo') {doing}: {unknown_names(unknown, sorted(known), what='option')}; "
            f"known: {', '.join(sorted(known))}",
            options=unknown,
        )


def settings_of(options: Mapping[str, str]) -> ProducerSettings:
    """The settings the executors receive, parsed once, here: the options over the driver's
    environment, validated so that a bad value fails the query before any task runs (the
    executors get them typed, pickled with the plan, and never read their own environment)."""
    values = settings_from_env(
        None, **{name: options[name] for name in options if name in SETTING_OPTIONS}
    )
    try:
        return producer_settings(values)
    except ValueError as exc:  # pydantic's ValidationError names the field and the rule
        raise OptionsError(f"format('keo'): {exc}", options=_named_in(str(exc))) from exc


def setting_options(values: Mapping[str, str]) -> dict[str, str]:
    """The ``format("keo")`` options of a set of ``KEO_*`` values, settings only
    (``KEO_LEASE_S`` -> ``lease_s``; a ``KEO_*`` variable that is no setting is left out)."""
    options = {name.removeprefix(ENV_PREFIX).lower(): value for name, value in values.items()}
    return {name: value for name, value in options.items() if name in SETTING_OPTIONS}


def _named_in(message: str) -> list[str]:
    return sorted(name for name in SETTING_OPTIONS if name in message)


@dataclass(frozen=True)
class WriteOptions:
    """A write's options, checked; ``settings`` are the executors' settings, parsed once."""

    settings: ProducerSettings
    key_column: str
    data_column: str
    routing_key_column: str | None
    dead_letter_path: str | None
    query_name: str | None
    arrow: bool
    metrics: MetricsEndpoint | None = None  # Prometheus metrics on the driver
    run_id: str | None = None  # replay mode, a batch write: the run a re-run continues

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, streaming: bool) -> WriteOptions:
        """The options of a write, checked on the driver; with ``put_fence`` off, the driver
        says once on stderr what that mode cannot bound (the executors do not repeat it)."""
        options = {name.lower(): value for name, value in raw.items()}
        known = SETTING_OPTIONS | frozenset(WRITE_OPTIONS)
        if streaming:
            known |= SPARK_STREAMING_OPTIONS
        refuse_unknown(options, known, "write")
        chosen = {name: options.get(name, default) for name, default in WRITE_OPTIONS.items()}
        query_name = chosen["query_name"]
        if query_name is not None and not streaming:
            raise OptionsError(
                "format('keo'): query_name names a streaming query, whose batch ids name the "
                "same rows on a replay; a batch write has no such id (in key mode the per-key "
                "claims already make running it again safe; in replay mode name it with run_id)",
                options=["query_name"],
            )
        _named(query_name)
        for name in ("key_column", "data_column", "routing_key_column", "run_id"):
            value = chosen[name]
            if value is not None and not value.strip():
                raise OptionsError(f"format('keo'): {name} is empty", options=[name])
        settings = settings_of(options)
        _check_run_names(guarantee_of(settings), query_name, chosen["run_id"], streaming=streaming)
        warn_if_unfenced(settings)
        return cls(
            settings=settings,
            key_column=chosen["key_column"] or "key",
            data_column=chosen["data_column"] or "data",
            routing_key_column=chosen["routing_key_column"],
            dead_letter_path=local_path(chosen["dead_letter_path"]),
            query_name=query_name,
            arrow=flag("arrow", chosen["arrow"] or "true"),
            metrics=metrics_endpoint(chosen["metrics_port"], chosen["metrics_host"]),
            run_id=chosen["run_id"],
        )


def _check_run_names(
    guarantee: Guarantee, query_name: str | None, run_id: str | None, *, streaming: bool
) -> None:
    """A guarantee whose writes are named runs (replay mode) names them: a streaming query by
    ``query_name`` (its batches are ``<query_name>/<batch id>``), a batch write by ``run_id``
    if it is to be re-run."""
    if run_id is not None and (not guarantee.named_runs or streaming):
        raise OptionsError(
            "format('keo'): run_id names a batch write in replay mode (dedupe=replay); a "
            "streaming query's runs are its batches, named by query_name",
            options=["run_id"],
        )
    if guarantee.named_runs and streaming and query_name is None:
        raise OptionsError(
            f"format('keo'): dedupe={guarantee.dedupe} needs query_name on a streaming write: "
            "a replayed batch is found by <query_name>/<batch id>, and Spark's query id is not "
            "known to the writer; give a name unique to this query and its checkpoint (a new "
            "checkpoint restarts batch ids: give it a new query_name)",
            options=["query_name", "dedupe"],
        )


def _named(query_name: str | None) -> str | None:
    if query_name is not None and not query_name.strip():
        raise OptionsError("format('keo'): query_name is empty", options=["query_name"])
    return query_name


def metrics_endpoint(port: str | None, host: str | None) -> MetricsEndpoint | None:
    """Where the driver serves the write's metrics: loopback unless ``metrics_host`` says."""
    if port is None:
        if host is not None:
            raise OptionsError(
                "format('keo'): metrics_host needs metrics_port", options=["metrics_host"]
            )
        return None
    text = port.strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise OptionsError(
            f"format('keo'): metrics_port must be a port number, 1 to 65535, got {port!r}",
            options=["metrics_port"],
        )
    address = "127.0.0.1" if host is None else host.strip()
    if not address:
        raise OptionsError("format('keo'): metrics_host is empty", options=["metrics_host"])
    return MetricsEndpoint(int(text), address)


def local_path(value: str | None) -> str | None:
    """A dead-letter folder the driver can write with plain file calls: a local or mounted
    path, or a ``file:`` URI. Other schemes (``s3://``, ``hdfs://``) are refused by name: the
    data source's commit runs in a Python process of the driver, which has no Spark session
    to write through (``foreachBatch(ExactlyOnceSink)`` writes dead letters with Spark)."""
    if value is None:
        return None
    parsed = urlparse(value)
    if parsed.scheme == "file":
        return str(Path(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter: a Windows drive
        raise OptionsError(
            f"format('keo'): dead_letter_path {value!r}: only local or mounted paths (or "
            f"file: URIs) are written; for {parsed.scheme}:// use a mount, or "
            "foreachBatch(ExactlyOnceSink), which writes through Spark",
            options=["dead_letter_path"],
        )
    return str(Path(value))


def flag(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise OptionsError(
        f"format('keo'): {name} must be true or false, got {value!r}", options=[name]
    )


@dataclass(frozen=True)
class ReadOptions:
    """A read's options, checked; time bounds in epoch milliseconds."""

    settings: ProducerSettings
    starting_ms: int | None
    ending_ms: int | None
    kcl_filter: bool
    planned_ms: int  # when the read was planned: the end of a read given only a start
    fail_on_malformed_aggregate: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> ReadOptions:
        options = {name.lower(): value for name, value in raw.items()}
        refuse_unknown(options, SETTING_OPTIONS | frozenset(READ_OPTIONS), "read")
        chosen = {name: options.get(name, default) for name, default in READ_OPTIONS.items()}
        starting_ms = _epoch_ms("starting_timestamp", chosen["starting_timestamp"])
        ending_ms = _epoch_ms("ending_timestamp", chosen["ending_timestamp"])
        if starting_ms is not None and ending_ms is not None and ending_ms < starting_ms:
            raise OptionsError(
                "format('keo'): ending_timestamp is before starting_timestamp",
                options=["starting_timestamp", "ending_timestamp"],
            )
        return cls(
            settings=settings_of(options),
            starting_ms=starting_ms,
            ending_ms=ending_ms,
            kcl_filter=flag("kcl_filter", chosen["kcl_filter"] or "true"),
            planned_ms=int(datetime.now(UTC).timestamp() * 1000),
            fail_on_malformed_aggregate=_fail_on_malformed(chosen),
        )


@dataclass(frozen=True)
class StreamReadOptions:
    """A streaming read's options, checked (``spark.readStream.format("keo")``)."""

    settings: ProducerSettings
    starting_position: StartingPosition
    max_records_per_trigger: int | None
    max_records_per_shard_per_trigger: int | None
    fail_on_data_loss: bool
    kcl_filter: bool
    query_name: str | None = None
    metrics: MetricsEndpoint | None = None  # where each task's reads are counted
    simple_reader: bool = False
    fail_on_malformed_aggregate: bool = False

    @property
    def stream(self) -> str:
        return self.settings.stream

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> StreamReadOptions:
        options = {name.lower(): value for name, value in raw.items()}
        known = SETTING_OPTIONS | frozenset(STREAM_READ_OPTIONS)
        if "starting_timestamp" in options or "ending_timestamp" in options:
            raise OptionsError(
                "format('keo'): a streaming read starts at starting_position (trim_horizon, "
                "latest, or a time) and has no end; starting_timestamp and ending_timestamp "
                "bound a batch read",
                options=sorted({"starting_timestamp", "ending_timestamp"} & options.keys()),
            )
        refuse_unknown(options, known, "streaming read")
        chosen = {name: options.get(name, default) for name, default in STREAM_READ_OPTIONS.items()}
        return cls(
            settings=settings_of(options),
            starting_position=_starting_position(chosen["starting_position"] or "trim_horizon"),
            max_records_per_trigger=_positive("max_records_per_trigger", chosen),
            max_records_per_shard_per_trigger=_positive(
                "max_records_per_shard_per_trigger", chosen
            ),
            fail_on_data_loss=flag("fail_on_data_loss", chosen["fail_on_data_loss"] or "true"),
            kcl_filter=flag("kcl_filter", chosen["kcl_filter"] or "true"),
            query_name=_named(chosen["query_name"]),
            metrics=metrics_endpoint(chosen["metrics_port"], chosen["metrics_host"]),
            simple_reader=flag("simple_reader", chosen["simple_reader"] or "false"),
            fail_on_malformed_aggregate=_fail_on_malformed(chosen),
        )


def _fail_on_malformed(chosen: Mapping[str, str | None]) -> bool:
    """Stop a read at a malformed KPL aggregate (true), or read it as the KCL does (false: its
    members before the fault, or the record raw; logged and counted) and go on."""
    value = chosen["fail_on_malformed_aggregate"] or "false"
    return flag("fail_on_malformed_aggregate", value)


def _starting_position(value: str) -> StartingPosition:
    text = value.strip().lower()
    if text in {StartingPositionKind.TRIM_HORIZON, StartingPositionKind.LATEST}:
        return StartingPosition(StartingPositionKind(text))
    try:
        moment = _epoch_ms("starting_position", value)
    except OptionsError:
        raise OptionsError(
            "format('keo'): starting_position must be trim_horizon, latest, or a time (epoch "
            f"milliseconds or ISO-8601), got {value!r}",
            options=["starting_position"],
        ) from None
    return StartingPosition(StartingPositionKind.AT_TIMESTAMP, moment)


def _positive(name: str, chosen: Mapping[str, str | None]) -> int | None:
    value = chosen[name]
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise OptionsError(
            f"format('keo'): {name} must be a whole number of records, 1 or more, got {value!r}",
            options=[name],
        )
    return int(text)


def _epoch_ms(name: str, value: str | None) -> int | None:
    """Epoch milliseconds, or an ISO-8601 time (UTC unless it names its offset)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise OptionsError(
            f"format('keo'): {name} must be epoch milliseconds or an ISO-8601 time, got {value!r}",
            options=[name],
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
