"""``keo bench``: measure throughput and cost; figures go to a file, nothing is asserted."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.options import exit_on_errors, load_settings, use_local_stack

_BEGIN = "<!-- bench:begin (written by keo bench) -->"
_END = "<!-- bench:end -->"


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
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            max=20,
            help="ceiling and producer runs back to back per concurrency; the median ratio "
            "is reported (rates swing on a shared machine)",
        ),
    ] = 3,
    output: Annotated[
        Path | None, typer.Option(help="JSON results (default bench/results/<date>.json)")
    ] = None,
    docs: Annotated[
        Path, typer.Option(help="markdown page whose results table is rewritten")
    ] = Path("docs/performance.md"),
    state_dir: Annotated[Path, typer.Option(help="state of the local stack")] = Path(".keo"),
) -> None:
    """Run the benchmark on the embedded local stack (started if needed): the plain
    put_records baseline, the exactly-once producer at several concurrencies next to the
    ledger's own ceiling, aggregation on and off, and the reconciler. Writes the figures to
    bench/results/<date>.json and the table in docs/performance.md.
    """
    from devstack.bench import run

    concurrencies, reconcile_sizes = _ints(concurrency), _ints(reconcile)
    use_local_stack(state_dir, "bench")
    settings = load_settings()
    with exit_on_errors():
        results = run(
            settings,
            messages=messages,
            size=size,
            concurrencies=concurrencies,
            reconcile_sizes=reconcile_sizes,
            repeat=repeat,
            say=lambda text: typer.echo(f"keo bench: {text}", err=True),
        )
    target = output or Path("bench/results") / f"{time.strftime('%Y-%m-%d')}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    table = render_table(results)
    if docs.exists():
        _rewrite_section(docs, table)
    typer.echo(table)
    typer.echo(f"keo bench: results in {target}", err=True)


def render_table(results: dict[str, Any]) -> str:
    baseline = results["baseline"]
    lines = [
        f"Measured {results['date']} on {results['machine']['cpus']} CPUs, "
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
    cost = results["best"]["cost"]
    lines += [
        "",
        f"DynamoDB cost at the best concurrency ({results['best']['concurrency']}), "
        f"{cost['prices']}:",
        "",
        "| | per million messages | per day at 2 billion messages |",
        "|---|---|---|",
        f"| on-demand | ${cost['on_demand_per_million_messages_usd']} "
        f"| ${cost['on_demand_per_day_at_2_billion_usd']:,.0f} |",
        f"| provisioned (full utilisation) | ${cost['provisioned_per_million_messages_usd']} "
        f"| ${cost['provisioned_per_day_at_2_billion_usd']:,.0f} |",
    ]
    on = results["aggregation"]["on"]
    lines += [
        "",
        "| aggregation | msg/s | Kinesis records/msg | Kinesis requests/msg |",
        "|---|---|---|---|",
    ]
    for label, run in (("off", results["aggregation"]["off"]), ("on", on)):
        lines.append(
            f"| {label} | {run['messages_per_second']} | {run['kinesis_records_per_message']} "
            f"| {run['kinesis_requests_per_message']} |"
        )
    lines += [
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
    return "\n".join(lines)


def _rewrite_section(path: Path, table: str) -> None:
    text = path.read_text(encoding="utf-8")
    if _BEGIN not in text or _END not in text:
        return
    head, rest = text.split(_BEGIN, 1)
    _, tail = rest.split(_END, 1)
    path.write_text(f"{head}{_BEGIN}\n{table}\n{_END}{tail}", encoding="utf-8")
