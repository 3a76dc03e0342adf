"""The options of format("keo"), checked on the driver before any task runs (no Spark here)."""

from __future__ import annotations

import logging

import pytest

from producer import wiring
from spark_jobs.driver_metrics import MetricsEndpoint
from spark_jobs.errors import OptionsError
from spark_jobs.options import ReadOptions, StreamReadOptions, WriteOptions
from spark_jobs.stream_offsets import StartingPosition, StartingPositionKind

STREAM = {"stream": "orders", "table": "orders-ledger"}


def test_write_options_default_to_key_and_data_columns_and_arrow() -> None:
    # GIVEN only the stream and the table
    # WHEN the write's options are read
    options = WriteOptions.parse(STREAM, streaming=False)
    # THEN the columns are key and data, no routing, Arrow, and the settings travel parsed
    assert (options.key_column, options.data_column, options.routing_key_column) == (
        "key",
        "data",
        None,
    )
    assert options.arrow
    assert options.settings.stream == "orders"


def test_settings_are_options_by_their_lower_case_name() -> None:
    # GIVEN a setting given as an option, in any case (Spark lower-cases option names)
    options = WriteOptions.parse({**STREAM, "Lease_S": "420"}, streaming=False)
    # THEN it is the setting the executors get
    assert options.settings.lease_s == 420


def test_unknown_options_are_refused_by_name() -> None:
    # GIVEN two misspelt options
    # WHEN the write's options are read
    with pytest.raises(OptionsError) as raised:
        WriteOptions.parse({**STREAM, "strem": "x", "key_col": "id"}, streaming=False)
    # THEN the error names both, each with the option it is nearest to
    assert raised.value.options == ["key_col", "strem"]
    assert (
        "unknown options 'key_col' (did you mean 'key_column'?), "
        "'strem' (did you mean 'stream'?)" in str(raised.value)
    )


def test_spark_streaming_options_are_accepted_on_streaming_writes_only() -> None:
    spark_added = {**STREAM, "checkpointLocation": "ckpt", "queryName": "q"}
    assert WriteOptions.parse(spark_added, streaming=True).query_name is None
    with pytest.raises(OptionsError, match="checkpointlocation"):
        WriteOptions.parse(spark_added, streaming=False)


def test_query_name_is_for_streaming_writes() -> None:
    assert WriteOptions.parse({**STREAM, "query_name": "q"}, streaming=True).query_name == "q"
    with pytest.raises(OptionsError, match="query_name names a streaming query"):
        WriteOptions.parse({**STREAM, "query_name": "q"}, streaming=False)


@pytest.mark.parametrize(
    ("given", "kept"),
    [("/data/dlq", "/data/dlq"), ("file:///data/dlq", "/data/dlq"), ("dlq", "dlq")],
)
def test_dead_letters_go_to_local_or_mounted_paths(given: str, kept: str) -> None:
    options = WriteOptions.parse({**STREAM, "dead_letter_path": given}, streaming=False)
    assert options.dead_letter_path == kept


def test_a_dead_letter_path_the_driver_cannot_write_is_refused() -> None:
    with pytest.raises(OptionsError, match=r"for s3:// use a mount"):
        WriteOptions.parse({**STREAM, "dead_letter_path": "s3://b/dlq"}, streaming=False)


def test_a_bad_setting_is_refused_before_any_task() -> None:
    with pytest.raises(OptionsError, match="KEO_LEASE_S=1 is too short"):
        WriteOptions.parse({**STREAM, "lease_s": "1"}, streaming=False)


def test_read_bounds_take_epoch_milliseconds_or_iso_times() -> None:
    options = ReadOptions.parse(
        {**STREAM, "starting_timestamp": "1000", "ending_timestamp": "1970-01-01T00:00:02"}
    )
    assert (options.starting_ms, options.ending_ms) == (1000, 2000)
    assert options.kcl_filter


def test_read_bounds_in_the_wrong_order_are_refused() -> None:
    with pytest.raises(OptionsError, match="ending_timestamp is before starting_timestamp"):
        ReadOptions.parse({**STREAM, "starting_timestamp": "2000", "ending_timestamp": "1000"})


def test_write_options_are_unknown_to_a_read() -> None:
    with pytest.raises(OptionsError, match="read: unknown option 'key_column'"):
        ReadOptions.parse({**STREAM, "key_column": "id"})


def test_metrics_are_served_on_loopback_unless_told() -> None:
    # GIVEN a write with a metrics port, and one with a host as well
    # WHEN their options are read
    served = WriteOptions.parse({**STREAM, "metrics_port": "9109"}, streaming=True).metrics
    anywhere = WriteOptions.parse(
        {**STREAM, "metrics_port": "9109", "metrics_host": "0.0.0.0"},  # noqa: S104
        streaming=True,
    ).metrics
    # THEN the driver serves them on 127.0.0.1 unless metrics_host says where; none by default
    assert served == MetricsEndpoint(9109, "127.0.0.1")
    assert anywhere == MetricsEndpoint(9109, "0.0.0.0")  # noqa: S104
    assert WriteOptions.parse(STREAM, streaming=True).metrics is None


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"metrics_port": "0"}, "metrics_port must be a port number"),
        ({"metrics_port": "65536"}, "metrics_port must be a port number"),
        ({"metrics_port": "9109.5"}, "metrics_port must be a port number"),
        ({"metrics_host": "127.0.0.1"}, "metrics_host needs metrics_port"),
        ({"metrics_port": "9109", "metrics_host": " "}, "metrics_host is empty"),
    ],
)
def test_a_metrics_option_it_cannot_use_is_refused_by_name(
    given: dict[str, str], named: str
) -> None:
    with pytest.raises(OptionsError, match=named) as raised:
        WriteOptions.parse({**STREAM, **given}, streaming=True)
    assert raised.value.options == [next(name for name in given if name in named)]


def test_reads_have_no_metrics_port() -> None:
    with pytest.raises(OptionsError, match="unknown option 'metrics_port'"):
        ReadOptions.parse({**STREAM, "metrics_port": "9109"})


@pytest.fixture
def fresh_driver(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A driver process that has said nothing yet, its warnings captured."""
    monkeypatch.setattr(wiring, "_said", set())
    caplog.set_level(logging.WARNING, logger=wiring.log.name)


def test_writes_with_the_fence_off_say_once_on_the_driver_what_that_cannot_bound(
    fresh_driver: None, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a driver whose writes turn the signature fence off
    # WHEN a streaming write and then a batch write check their options
    WriteOptions.parse({**STREAM, "put_fence": "off"}, streaming=True)
    WriteOptions.parse({**STREAM, "put_fence": "off", "lease_s": "90"}, streaming=False)
    # THEN the driver says once, as a warning, what a put the network holds can do, with the
    # lease it has, and where the bound is documented
    said = [r for r in caplog.records if r.name == wiring.log.name]
    assert [r.levelno for r in said] == [logging.WARNING]
    message = said[0].getMessage()
    assert message.startswith("signature fence off (KEO_PUT_FENCE=off): a put the network holds")
    assert "longer than its lease (60 s)" in message
    assert "docs/guarantees.md" in message


def test_writes_with_the_fence_on_say_nothing_about_it(
    fresh_driver: None, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN writes with the signature fence on, by default or by name, and a read
    # WHEN their options are checked
    WriteOptions.parse(STREAM, streaming=True)
    WriteOptions.parse({**STREAM, "put_fence": "signature"}, streaming=False)
    ReadOptions.parse({**STREAM, "put_fence": "off"})
    # THEN nothing is said: only a write with the fence off puts without it (a read never puts)
    assert [r for r in caplog.records if r.name == wiring.log.name] == []


# --- streaming reads ----------------------------------------------------------------------------


def test_a_streaming_read_starts_at_the_trim_horizon_unbounded_and_fails_on_data_loss() -> None:
    options = StreamReadOptions.parse({"stream": "orders"})
    assert options.stream == "orders"
    assert options.starting_position == StartingPosition(StartingPositionKind.TRIM_HORIZON)
    assert (options.max_records_per_trigger, options.max_records_per_shard_per_trigger) == (
        None,
        None,
    )
    assert options.fail_on_data_loss
    assert options.kcl_filter
    assert not options.fail_on_malformed_aggregate  # read it as the KCL does, and go on


def test_a_read_stops_at_a_malformed_aggregate_only_when_told_to() -> None:
    # GIVEN reads, batch and streaming, with and without fail_on_malformed_aggregate
    told = {"stream": "orders", "fail_on_malformed_aggregate": "true"}
    # THEN only those told stop at one
    assert StreamReadOptions.parse(told).fail_on_malformed_aggregate
    assert ReadOptions.parse(told).fail_on_malformed_aggregate
    assert not ReadOptions.parse({"stream": "orders"}).fail_on_malformed_aggregate


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("LATEST", StartingPosition(StartingPositionKind.LATEST)),
        ("trim_horizon", StartingPosition(StartingPositionKind.TRIM_HORIZON)),
        ("1767225600000", StartingPosition(StartingPositionKind.AT_TIMESTAMP, 1_767_225_600_000)),
        (
            "2026-01-01T00:00:00+00:00",
            StartingPosition(StartingPositionKind.AT_TIMESTAMP, 1_767_225_600_000),
        ),
    ],
)
def test_a_starting_position_is_a_name_or_a_time(given: str, expected: StartingPosition) -> None:
    options = StreamReadOptions.parse({"stream": "orders", "starting_position": given})
    assert options.starting_position == expected


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("starting_position", "earliest"),
        ("max_records_per_trigger", "0"),
        ("max_records_per_shard_per_trigger", "ten"),
        ("fail_on_data_loss", "maybe"),
        ("fail_on_malformed_aggregate", "sometimes"),
        ("query_name", " "),
        ("metrics_port", "http"),
        ("metrics_host", "127.0.0.2"),  # without metrics_port
    ],
)
def test_a_streaming_read_option_it_cannot_use_is_refused_by_name(option: str, value: str) -> None:
    with pytest.raises(OptionsError) as refused:
        StreamReadOptions.parse({"stream": "orders", option: value})
    assert refused.value.options == [option]


def test_a_batch_read_bound_is_refused_on_a_streaming_read() -> None:
    with pytest.raises(OptionsError, match="bound a batch read") as refused:
        StreamReadOptions.parse({"stream": "orders", "ending_timestamp": "0"})
    assert refused.value.options == ["ending_timestamp"]


def test_a_streaming_read_counts_its_reads_on_its_metrics_port_under_its_query_name() -> None:
    options = StreamReadOptions.parse(
        {"stream": "orders", "metrics_port": "9464", "query_name": "orders-in"}
    )
    assert options.metrics == MetricsEndpoint(9464, "127.0.0.1")
    assert options.query_name == "orders-in"
    assert StreamReadOptions.parse({"stream": "orders"}).metrics is None
