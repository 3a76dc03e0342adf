"""``keo bench``: measure throughput and cost; figures go to a file, nothing is asserted."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from cli.options import exit_on_errors, exit_without_spark, load_settings, use_local_stack

if TYPE_CHECKING:
    from producer.settings import ProducerSettings

# the docs page's sections this command rewrites: (begin, end) markers
PRODUCER_SECTION: Final = ("<!-- bench:begin (written by keo bench) -->", "<!-- bench:end -->")
QUOTA_SECTION: Final = (
    "<!-- quota-bench:begin (written by keo bench) -->",
    "<!-- quota-bench:end -->",
)
SPARK_SECTION: Final = (
    "<!-- spark-bench:begin (written by keo bench) -->",
    "<!-- spark-bench:end -->",
)


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None


def bench(
    messages: Annotated[int, typer.Option(min=100, help="messages per producer run")] = 4000,
    size: Annotated[int, typer.Option(min=32, max=1_000_000, help="bytes per message")] = 200,
    concurrency: Annotated[
        str, typer.Option(help="ledger concurrencies to compare, comma-separated")
    ] = "8,32,64",
    reconcile: Annotated[
        str, typer.Option(help="stale-claim counts for the reconciler, comma-separated")
    ] = "100,10000",
    reconcile_lease_s: Annotated[
        float,
        typer.Option(
            min=4.0,
            help="the lease of the stale claims the reconciler resolves (fence off): the "
            "wait before it runs",
        ),
    ] = 10.0,
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            max=20,
            help="runs of the baseline, and of the ceiling and producer back to back per "
            "concurrency; the medians are reported (rates swing on a shared machine)",
        ),
    ] = 3,
    replay_messages: Annotated[
        int,
        typer.Option(
            min=100,
            help="replay mode: messages per run of the replay producer, keo send --dedupe "
            "replay and plain put_records, side by side in --repeat rounds",
        ),
    ] = 20_000,
    rows_per_task: Annotated[
        int, typer.Option(min=1, help="replay mode: rows per task of the metered batches")
    ] = 500,
    replay_tasks: Annotated[
        str,
        typer.Option(
            help="replay mode: tasks per metered batch, comma-separated (each task's attempts "
            "have an item of their own: the cost per row stays flat as tasks grow)"
        ),
    ] = "10,40,200",
    recovery_rows: Annotated[
        int,
        typer.Option(
            min=2,
            help="replay mode: rows of the replayed run, once all put before, once half",
        ),
    ] = 100_000,
    recovery_lease_s: Annotated[
        float,
        typer.Option(
            min=4.0,
            help="replay mode: the lease of the first attempt the recoveries replay (fence "
            "off): how long the replay of a half-put run may wait",
        ),
    ] = 10.0,
    resend_messages: Annotated[
        int,
        typer.Option(
            min=100,
            help="the resend path: delivered keys sent again (every one DUPLICATE) through "
            "the metering proxy",
        ),
    ] = 20_000,
    output: Annotated[
        Path | None, typer.Option(help="JSON results (default bench/results/<date>.json)")
    ] = None,
    quotas: Annotated[
        bool,
        typer.Option(
            "--quotas/--no-quotas",
            help="then each writer (keo send in both modes, plain put_records, and with --spark "
            "format('keo') and ExactlyOnceSink) behind the quota mode's proxies, offered 1.5 "
            "times its shards' write quota: its share of the quota, throttles, delays, what it "
            "lost or doubled; and keo audit draining a backlog beside another consumer (default)",
        ),
    ] = True,
    quota_seconds: Annotated[
        float, typer.Option(min=4.0, help="how long each writer is offered rows at 1.5x its quota")
    ] = 10.0,
    spark: Annotated[
        bool,
        typer.Option(
            "--spark/--no-spark",
            help="then, in a local Spark session, time format('keo')'s Arrow and row writers "
            "against keo send and a plain foreachBatch put_records sink on the same rows "
            "(default; needs the spark extra)",
        ),
    ] = True,
    spark_rows: Annotated[
        int, typer.Option(min=100, help="rows each Spark sink and keo send write")
    ] = 20_000,
    spark_stream_records: Annotated[
        int,
        typer.Option(
            min=100,
            help="records of the stream readStream.format('keo') and the relay read, timed "
            "against a boto3 GetRecords loop and an at-least-once relay",
        ),
    ] = 50_000,
    spark_output: Annotated[
        Path | None,
        typer.Option(help="Spark JSON results (default bench/results/spark-writers-<date>.json)"),
    ] = None,
    docs: Annotated[
        Path, typer.Option(help="markdown page whose results table is rewritten")
    ] = Path("docs/performance.md"),
    state_dir: Annotated[Path, typer.Option(help="state of the local stack")] = Path(".keo"),
    dynamodb_emulator: Annotated[
        str,
        typer.Option(
            "--dynamodb-emulator",
            envvar="KEO_DYNAMODB_EMULATOR",
            help="the local stack's DynamoDB, when the endpoints are not set: dynamodb-local "
            "(default: Amazon's, the code path AWS runs, 25 claims a request; started with its "
            "JVM tuned for throughput) or dynalite (no PartiQL: key mode claims a key a request)",
        ),
    ] = "dynamodb-local",
) -> None:
    """Run the benchmark on the embedded local stack (started if needed): the plain
    put_records baseline, the exactly-once producer at several concurrencies next to the
    ledger's own ceiling, aggregation on and off, and the reconciler. Then replay mode
    (dedupe=replay): the replay producer and keo send --dedupe replay against plain
    put_records, metered; batches of --replay-tasks tasks of --rows-per-task rows, metered;
    the recovery of a replayed run of --recovery-rows rows, all of them put before, then
    half. Writes the figures to bench/results/<date>.json and the tables in
    docs/performance.md.

    Then, unless --no-spark, the Spark data source in a local[2] session:
    format('keo') with its Arrow and its row writer, keo send (a subprocess)
    and a plain foreachBatch put_records sink each write the same --spark-rows
    rows (200 bytes) into a stream of their own, new then again (DUPLICATE);
    format('keo') with dedupe=replay, metered, in rounds with the plain sink;
    and each writer's interface is timed by itself; readStream.format('keo')
    reads a stream of --spark-stream-records records next to a boto3
    GetRecords loop, and the relay copies it exactly once next to at least
    once. Writes bench/results/spark-writers-<date>.json and the Spark table
    in docs/performance.md.

    Before Spark, unless --no-quotas, each writer against AWS's write quota
    (devstack/quota_bench.py): bench/results/quotas-<date>.json and its table.
    """
    from devstack.bench import run
    from devstack.emulators import DYNAMODB_EMULATORS

    if dynamodb_emulator not in DYNAMODB_EMULATORS:
        raise typer.BadParameter(
            f"{dynamodb_emulator!r}: one of {', '.join(DYNAMODB_EMULATORS)}",
            param_hint="'--dynamodb-emulator' / KEO_DYNAMODB_EMULATOR",
        )
    concurrencies, reconcile_sizes = _ints(concurrency), _ints(reconcile)
    spark_bench = _spark_bench() if spark else None  # missing pyspark fails before the run
    use_local_stack(state_dir, "bench", dynamodb=dynamodb_emulator, for_bench=True)
    settings = load_settings()
    with exit_on_errors():
        results = run(
            settings,
            messages=messages,
            size=size,
            concurrencies=concurrencies,
            reconcile_sizes=reconcile_sizes,
            repeat=repeat,
            replay_messages=replay_messages,
            rows_per_task=rows_per_task,
            replay_tasks=_ints(replay_tasks),
            recovery_rows=recovery_rows,
            recovery_lease_s=recovery_lease_s,
            reconcile_lease_s=reconcile_lease_s,
            resend_messages=resend_messages,
            say=_say,
        )
    target = output or Path("bench/results") / f"{time.strftime('%Y-%m-%d')}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    table = render_table(results)
    _rewrite_section(docs, PRODUCER_SECTION, table)
    typer.echo(table)
    typer.echo(f"keo bench: results in {target}", err=True)
    if quotas:
        _bench_quotas(settings, quota_seconds, docs, spark=spark_bench is not None)
    if spark_bench is None:
        return
    with exit_on_errors():
        spark_results = spark_bench.bench(
            _endpoints(settings),
            rows=spark_rows,
            stream_records=spark_stream_records,
            say=_say,
        )
    spark_target = spark_output or spark_bench.default_output()
    spark_bench.write(spark_results, spark_target)
    spark_table = render_spark_table(spark_results)
    _rewrite_section(docs, SPARK_SECTION, spark_table)
    typer.echo(spark_table)
    typer.echo(f"keo bench: Spark results in {spark_target}", err=True)


def _bench_quotas(settings: ProducerSettings, seconds: float, docs: Path, *, spark: bool) -> None:
    from devstack import quota_bench

    with exit_on_errors():
        writers, readers = quota_bench.measure(settings, seconds=seconds, spark=spark, say=_say)
    target = Path("bench/results") / f"quotas-{time.strftime('%Y-%m-%d')}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    results = quota_bench.as_json(writers, readers)
    target.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    table = quota_bench.render_writers(writers) + "\n\n" + quota_bench.render_readers(readers)
    _rewrite_section(docs, QUOTA_SECTION, table)
    typer.echo(table)
    typer.echo(f"keo bench: writers against the write quota in {target}", err=True)


def _say(text: str) -> None:
    typer.echo(f"keo bench: {text}", err=True)


def _spark_bench() -> ModuleType:
    try:
        from devstack import spark_bench
    except ImportError as exc:
        exit_without_spark("bench", exc)
    return spark_bench


def _endpoints(settings: ProducerSettings) -> dict[str, str]:
    """The settings' endpoints and region as ``format("keo")`` options."""
    values = {
        "kinesis_endpoint_url": settings.kinesis_endpoint_url,
        "dynamodb_endpoint_url": settings.dynamodb_endpoint_url,
        "region": settings.resolved_region(),
    }
    return {name: value for name, value in values.items() if value is not None}


def _load(machine: dict[str, Any]) -> str:
    load = machine["load_average"]
    return f"load average {load['start'][0]} at the start, {load['end'][0]} at the end"


def render_table(results: dict[str, Any]) -> str:
    """The producer bench's figures: key mode against plain put_records (new keys and resent
    ones), the resend path's bill, the DynamoDB cost, aggregation, the reconciler, keo's start,
    and replay mode's figures when the run has them."""
    lines = [
        *_producer_rows(results),
        *_resend_lines(results),
        *_cost_rows(results),
        *_aggregation_rows(results),
        *_reconcile_rows(results),
        *_startup_rows(results),
    ]
    if "replay" in results:
        lines += ["", *render_replay(results)]
    return "\n".join(lines)


def _producer_rows(results: dict[str, Any]) -> list[str]:
    """The machine, then key mode's table: each concurrency, new keys and resent ones."""
    baseline = results["baseline"]
    lines = [
        f"Measured {results['date']} on {results['machine']['cpus']} CPUs "
        f"({_load(results['machine'])}), "
        f"{results['machine']['memory_gib']} GiB, Python {results['machine']['python']}, "
        f"{results['machine']['backends']}; {results['message_bytes']}-byte messages.",
        "",
        "| producer | path | concurrency | msg/s | vs baseline | ledger ceiling msg/s "
        "| of ceiling | DynamoDB requests/msg | write requests/msg | billed WU/msg "
        "| billed RU/msg | client CPU ms/msg | records/PutRecords |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| plain put_records (baseline) | new | - | {baseline['messages_per_second']} | 1.00 "
        "| - | - | 0 | 0 | 0 | 0 | - | 500 |",
    ]
    for run in results["exactly_once"]:
        ceiling = run["ledger_ceiling"]["messages_per_second_ceiling"]
        for label, path in (("new", run), ("resend (DUPLICATE)", run["duplicate_path"])):
            lines.append(
                f"| exactly-once | {label} | {run['concurrency']} | {path['messages_per_second']} "
                f"| {path['ratio_to_baseline']:.2f} | {ceiling} | {path['ceiling_fraction']:.0%} "
                f"| {path['dynamodb_requests_per_message']} "
                f"| {path['dynamodb_write_requests_per_message']} "
                f"| {path['billed_write_units_per_message']} "
                f"| {path['billed_read_units_per_message']} "
                f"| {path['client_cpu_ms_per_message']} | {run['mean_batch_fill']} |"
            )
    return lines


def _resend_lines(results: dict[str, Any]) -> list[str]:
    """The resend path's bill, measured alone (figures that have it)."""
    if "resend" not in results:
        return []
    resend = results["resend"]
    return [
        "",
        f"The resend path alone: {resend['messages']:,} delivered keys sent again (every "
        f"one DUPLICATE) at concurrency {resend['concurrency']}, through the metering "
        f"proxy: {resend['dynamodb_requests_per_message']} DynamoDB requests/msg "
        f"({_operations(resend)}), {resend['billed_write_units_per_message']} billed "
        f"WU/msg, {resend['billed_read_units_per_message']} billed RU/msg.",
    ]


def _cost_rows(results: dict[str, Any]) -> list[str]:
    """DynamoDB's cost at the best concurrency, on demand and provisioned."""
    cost = results["best"]["cost"]
    return [
        "",
        f"DynamoDB cost at the best concurrency ({results['best']['concurrency']}), "
        f"{cost['prices']}:",
        "",
        "| | per million messages | per day at 2 billion messages |",
        "|---|---|---|",
        f"| on-demand | ${cost['on_demand_per_million_messages_usd']} "
        f"| {_usd(cost['on_demand_per_day_at_2_billion_usd'])} |",
        f"| provisioned (full utilisation) | ${cost['provisioned_per_million_messages_usd']} "
        f"| {_usd(cost['provisioned_per_day_at_2_billion_usd'])} |",
    ]


def _aggregation_rows(results: dict[str, Any]) -> list[str]:
    """Key mode with KPL aggregation off and on."""
    on = results["aggregation"]["on"]
    lines = [
        "",
        "| aggregation | msg/s | Kinesis records/msg | Kinesis requests/msg |",
        "|---|---|---|---|",
    ]
    for label, run in (("off", results["aggregation"]["off"]), ("on", on)):
        lines.append(
            f"| {label} | {run['messages_per_second']} | {run['kinesis_records_per_message']} "
            f"| {run['kinesis_requests_per_message']} |"
        )
    return lines


def _reconcile_rows(results: dict[str, Any]) -> list[str]:
    """The reconciler's rate and GetRecords calls for each number of stale claims."""
    lines = [
        "",
        "| reconciler: stale claims | shards | claims/s | GetRecords calls | per claim | per shard |",
        "|---|---|---|---|---|---|",
    ]
    for rec in results["reconcile"]:
        lines.append(
            f"| {rec['stale_claims']} | {rec['shards']} | {rec['claims_per_second']} "
            f"| {rec['get_records_calls']} | {rec['get_records_calls_per_claim']} "
            f"| {rec['get_records_calls_per_shard']} |"
        )
    return lines


def _startup_rows(results: dict[str, Any]) -> list[str]:
    """keo's start in CPU seconds (figures that have it)."""
    startup = results.get("cli_startup_cpu_s")
    if startup is None:
        return []
    return [
        "",
        "| keo's start, CPU s (median of 5) | --version | --help | send, an empty file "
        "| send --dedupe replay, an empty file |",
        "|---|---|---|---|---|",
        f"| | {startup['version']} | {startup['help']} | {startup['send_empty']} "
        f"| {startup.get('send_empty_replay', '')} |",  # figures written before it: none
    ]


def render_replay(results: dict[str, Any]) -> list[str]:
    """Replay mode next to key mode: the bill, the rates, the cost, then its recoveries."""
    key, replay = results["best"], results["replay"]
    rounds = len(replay["rounds"])
    lines = [
        f"Key mode at concurrency {key['concurrency']} (above) and replay mode "
        f"(`dedupe=replay`), {replay['messages']:,} messages a run, in the same run; rates "
        f"against plain put_records in {rounds} rounds side by side (the median round; the "
        "median of each ratio over the rounds in brackets). Cost: DynamoDB on-demand.",
        "",
        "| mode | rows per attempt | msg/s | vs plain put_records | DynamoDB requests/msg "
        "| billed WU/msg | billed RU/msg | per million msg | per day at 2 billion |",
        "|---|---|---|---|---|---|---|---|---|",
        _mode_row(
            "key: the producer",
            "-",
            key["messages_per_second"],
            f"{key['ratio_to_baseline']:.2f}",
            key,
            key["cost"],
        ),
    ]
    return [*lines, *_replay_mode_rows(replay), "", *_recovery_rows(replay)]


def _replay_mode_rows(replay: dict[str, Any]) -> list[str]:
    """Replay mode's rows of the modes' table: the producer, keo send (its start in and out),
    a batch in tasks."""
    producer, command = replay["producer"], replay["keo_send"]
    medians = replay["median_ratios"]
    return [
        _mode_row(
            "replay: the producer (`send_run`)",
            f"{producer['rows_per_attempt']:,}",
            producer["messages_per_second"],
            f"{replay['producer_vs_baseline']:.2f} ({medians['producer_vs_baseline']:.2f})",
            producer,
            producer["cost"],
        ),
        _mode_row(
            "replay: `keo send --dedupe replay`, its start included",
            f"{command['messages']:,}",
            command["messages_per_second"],
            f"{replay['keo_send_vs_baseline']:.2f} ({medians['keo_send_vs_baseline']:.2f})",
            command,
            command["cost"],
        ),
        _mode_row(
            f"replay: `keo send`, its {command['startup_s']} s start left out",
            f"{command['messages']:,}",
            command["messages_per_second_after_start"],
            f"{replay['keo_send_after_start_vs_baseline']:.2f} "
            f"({medians['keo_send_after_start_vs_baseline']:.2f})",
            command,
            command["cost"],
        ),
        *(
            _mode_row(
                f"replay: a batch in {batch['attempts']} tasks",
                f"{batch['rows_per_attempt']:,}",
                batch["messages_per_second"],
                "-",
                batch,
                batch["cost"],
            )
            for batch in replay["batches"]
        ),
    ]


def _recovery_rows(replay: dict[str, Any]) -> list[str]:
    """Replay mode's recoveries: what an attempt found, sent and waited for."""
    lines = [
        "| replay: recovery of | rows put before | rows found | rows sent | seconds "
        "| the first read | waiting | without the wait | GetRecords calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in replay["recovery"]:
        lines.append(
            f"| {rec['rows']:,} rows | {rec['landed_before']:,} | {rec['rows_found']:,} "
            f"| {rec['rows_sent']:,} | {rec['seconds']} | {rec['first_read_s']} "
            f"| {rec['wait_s']} (lease {rec['lease_s']:g} s) | {rec['seconds_without_wait']} "
            f"| {rec['get_records_calls']} |"
        )
    return lines


def _mode_row(
    label: str,
    rows: str,
    rate: float,
    ratio: str,
    figures: dict[str, Any],
    cost: dict[str, Any],
) -> str:
    return (
        f"| {label} | {rows} | {rate:,.0f} | {ratio} "
        f"| {figures['dynamodb_requests_per_message']} "
        f"| {figures['billed_write_units_per_message']} "
        f"| {figures['billed_read_units_per_message']} "
        f"| ${cost['on_demand_per_million_messages_usd']} "
        f"| {_usd(cost['on_demand_per_day_at_2_billion_usd'])} |"
    )


def _usd(dollars: float) -> str:
    """Dollars as the tables show them: whole above $100, cents below."""
    return f"${dollars:,.0f}" if dollars >= 100 else f"${dollars:,.2f}"


_SPARK_SINKS: Final = (
    ("arrow", 'format("keo"), Arrow record batches (default)'),
    ("rows", 'format("keo"), Spark rows (`arrow=false`)'),
    ("replay", 'format("keo"), `dedupe=replay` (Arrow)'),
    ("keo_send", "`keo send`, the same producer in one process"),
    ("plain_foreach_batch", "plain `foreachBatch` put_records, at least once"),
)


def render_spark_table(results: dict[str, Any]) -> str:
    """The Spark bench's figures: each sink end to end, the ratios, each interface alone."""
    machine, rows = results["machine"], results["rows"]
    end_to_end, ratios = results["end_to_end"], results["ratios"]
    lines = [
        f"Measured {results['measured_at']} on {machine['cpus']} CPUs ({_load(machine)}), "
        f"pyspark {machine['pyspark']}, pyarrow {machine['pyarrow']}, {machine['master']}, "
        f"{machine['partitions']} partitions; {rows:,} rows of {machine['payload_bytes']} "
        "bytes, each sink into a stream and table of its own. `keo send`'s start "
        f"({end_to_end['keo_send']['startup_s']} s on an empty file) is in its time.",
        "",
        "| sink | new rows/s | DUPLICATE rows/s | new, vs keo send "
        "| DUPLICATE, vs keo send | new, vs plain foreachBatch |",
        "|---|---|---|---|---|---|",
    ]
    for name, label in _SPARK_SINKS:
        figures, ratio = end_to_end[name], ratios[name]
        duplicate = figures.get("duplicate")  # the plain sink has none
        lines.append(
            f"| {label} | {figures['new']['rows_per_s']:,.0f} "
            f"| {_or_dash(None if duplicate is None else duplicate['rows_per_s'], '{:,.0f}')} "
            f"| {ratio['new_vs_keo_send']:.2f} "
            f"| {_or_dash(ratio['duplicate_vs_keo_send'], '{:.2f}')} "
            f"| {ratio['new_vs_plain_foreach_batch']:.2f} |"
        )
    replay = end_to_end.get("replay")
    if replay is not None:
        rounds = results["replay_vs_plain"]
        new, again = replay["new"], replay["duplicate"]
        lines += [
            "",
            f"`dedupe=replay` against the plain sink in {rounds['rounds']} rounds side by side: "
            f"{', '.join(f'{r:.2f}' for r in rounds['ratio_per_round'])} (median "
            f"**{rounds['median_ratio']:.2f}**). Its bill, metered through a proxy in front "
            f"of DynamoDB ({replay['rows_per_partition']:,} rows per task): new, "
            f"{new['dynamodb_requests_per_message']} DynamoDB requests and "
            f"{new['billed_write_units_per_message']} billed WU per row "
            f"({_operations(new)}); again (COMPLETE, nothing sent), "
            f"{again['dynamodb_requests_per_message']} and "
            f"{again['billed_write_units_per_message']} ({_operations(again)}).",
        ]
    if "streaming" in results:
        lines += ["", *render_streaming(results["streaming"], machine)]
    interface = results["interface"]
    counts = list(interface["arrow"])
    repeats = len(interface["arrow"][counts[0]]["seconds"])
    lines += [
        "",
        f"| writer interface alone (median of {repeats}) | "
        + " | ".join(f"{int(count):,} rows" for count in counts)
        + " |",
        "|---|" + "---|" * len(counts),
    ]
    for name, label in _SPARK_SINKS[:2]:
        cells = [
            f"{statistics.median(figures['seconds']):.2f} s ({figures['rows_per_s']:,.0f} rows/s)"
            for figures in interface[name].values()
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# the names of devstack.stream_bench's figures (not imported: it brings Spark's job modules)
LOOP: Final = "boto3_get_records"
PACED_LOOP: Final = "boto3_get_records_paced"
READ_BATCHES: Final = "keo_read_stream_batches"


def render_streaming(streaming: dict[str, Any], machine: dict[str, Any]) -> list[str]:
    """``readStream.format("keo")`` against a boto3 GetRecords loop (and the same loop paced to
    AWS's read limits, in figures that have it), the query's batches alone against both, and
    the relay exactly once against at least once: each pair's rates and its median ratio over
    the rounds (``machine``: the master and the load average of the run); then a line on a
    running query's planning and batches (figures that have them)."""
    read, relay = streaming["read"], streaming["relay"]
    return [
        f"Streaming: stream A of {streaming['records']:,} records of "
        f"{streaming['payload_bytes']} bytes, read in {streaming['rounds']} rounds, each "
        f"measure next to its reference; {machine['master']}, {_load(machine)}.",
        "",
        "| streaming | records/s (median) | seconds per round | of the reference, median "
        "(per round) |",
        "|---|---|---|---|",
        _streaming_row(
            'readStream.format("keo"), `Trigger.AvailableNow`, into `noop`',
            read["keo_read_stream"],
            _of_reference(read),
        ),
        *_batches_alone_rows(read),
        _streaming_row(
            "reference: a boto3 GetRecords loop, a thread per shard",
            read[LOOP],
            "1",
        ),
        *_paced_loop_rows(read),
        _streaming_row(
            "relay A to B, exactly once (`dedupe=replay`)",
            relay["relay_exactly_once"],
            _of_reference(relay),
        ),
        _streaming_row(
            "reference: relay A to B at least once (`foreachBatch` put_records)",
            relay["relay_at_least_once"],
            "1",
        ),
        *(_running(streaming["running"]) if "running" in streaming else []),
    ]


def _streaming_row(label: str, figures: dict[str, Any], of_reference: str) -> str:
    """A row of the streaming table: the median rate, each round's seconds, the ratio."""
    seconds = ", ".join(f"{s:.2f}" for s in figures["seconds"])
    return f"| {label} | {figures['records_per_s']:,.0f} | {seconds} | {of_reference} |"


def _of_reference(pair: dict[str, Any]) -> str:
    """A pair's median ratio in bold, then the ratio of each round."""
    rounds = ", ".join(f"{r:.2f}" for r in pair["ratio_per_round"])
    return f"**{pair['median_ratio']:.2f}** ({rounds})"


def _batches_alone_rows(read: dict[str, Any]) -> list[str]:
    """The query's batches alone against both loops (older figures do not have them)."""
    batches = read.get(READ_BATCHES)
    if batches is None:
        return []
    return [
        _streaming_row(
            "the same query's batches alone (Spark's `triggerExecution`: no start, "
            "no tail search before its first batch)",
            batches,
            f"{_of_reference(batches['ratios'][LOOP])}{_paced_bound(read)}; of the paced "
            f"loop: {_of_reference(batches['ratios'][PACED_LOOP])}",
        )
    ]


def _paced_loop_rows(read: dict[str, Any]) -> list[str]:
    """The loop paced to AWS's read limits, the query against it (figures that have it)."""
    paced = read.get("ratios", {}).get(PACED_LOOP)
    if paced is None:
        return []
    return [
        _streaming_row(
            "reference: the same loop paced to 5 calls and 2 MB a second per shard "
            '(readStream.format("keo") against it in the last column)',
            read[PACED_LOOP],
            _of_reference(paced),
        )
    ]


def _paced_bound(read: dict[str, Any]) -> str:
    """What a reader within AWS's read limits can reach of the unpaced loop: the paced loop's
    share of it (kinesalite enforces no limit; the unpaced loop reads past 2 MB a second)."""
    if PACED_LOOP not in read:
        return ""
    bound = statistics.median(read[LOOP]["seconds"]) / statistics.median(
        read[PACED_LOOP]["seconds"]
    )
    return f" (at most {bound:.2f} within 2 MB a second a shard: the paced loop's)"


def _running(running: dict[str, Any]) -> list[str]:
    """The running query's line under the streaming table."""
    planning, batch = running["planning_ms"], running["batch_ms"]
    return [
        "",
        f"A query that runs on over a stream fed {running['fed_records_per_s']:,} records a "
        f"second ({running['seconds']:g} s, {running['batches']} batches): its planning (each "
        f"shard's new end, Spark's `latestOffset`) {planning['median']:g} ms median (p90 "
        f"{planning['p90']:g}), its batch {batch['median']:g} ms median (p90 {batch['p90']:g}), "
        f"{running['records_per_batch']['median']:g} records a batch.",
    ]


def _operations(figures: dict[str, Any]) -> str:
    calls = figures["dynamodb_requests_by_operation"]
    return ", ".join(f"{n} {operation}" for operation, n in sorted(calls.items()))


def _or_dash(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _rewrite_section(path: Path, markers: tuple[str, str], table: str) -> None:
    """Replace what lies between ``markers`` in ``path``; a page without them is left alone."""
    if not path.exists():
        return
    text = path.read_text(encoding="utf-8")
    begin, end = markers
    if begin not in text or end not in text:
        return
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}", encoding="utf-8")
