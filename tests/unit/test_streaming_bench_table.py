"""``keo bench``'s streaming rows: the read next to the boto3 loop, and next to the same loop
paced to AWS's read limits when the figures have it (older files do not)."""

from __future__ import annotations

from typing import Any

from cli.bench import render_streaming

MACHINE = {"master": "local[2]", "load_average": {"start": [1.0, 1.0, 1.0], "end": [2.0, 2.0, 2.0]}}


def figures(seconds: float) -> dict[str, Any]:
    return {"seconds": [seconds], "records_per_s": 1000 / seconds}


def streaming(*, paced: bool, batches: bool = False) -> dict[str, Any]:
    read: dict[str, Any] = {
        "keo_read_stream": figures(4.0),
        "boto3_get_records": figures(2.0),
        "ratio_per_round": [0.5],
        "median_ratio": 0.5,
    }
    if paced:
        read["boto3_get_records_paced"] = figures(3.0)
        read["ratios"] = {
            "boto3_get_records": {"ratio_per_round": [0.5], "median_ratio": 0.5},
            "boto3_get_records_paced": {"ratio_per_round": [0.75], "median_ratio": 0.75},
        }
    if batches:
        read["keo_read_stream_batches"] = {
            **figures(2.5),
            "ratios": {
                "boto3_get_records": {"ratio_per_round": [0.8], "median_ratio": 0.8},
                "boto3_get_records_paced": {"ratio_per_round": [1.2], "median_ratio": 1.2},
            },
            "before_first_batch_s": [1.5],
        }
    relay = {
        "relay_exactly_once": figures(5.0),
        "relay_at_least_once": figures(4.0),
        "ratio_per_round": [0.8],
        "median_ratio": 0.8,
    }
    return {"records": 1000, "payload_bytes": 200, "rounds": 1, "read": read, "relay": relay}


def test_the_paced_loop_has_a_row_with_the_read_measured_against_it() -> None:
    lines = render_streaming(streaming(paced=True), MACHINE)
    paced = [line for line in lines if "paced to 5 calls" in line]
    assert len(paced) == 1
    assert paced[0].endswith("| **0.75** (0.75) |")
    assert any(line.endswith("| **0.50** (0.50) |") for line in lines if "format(" in line)


def test_figures_without_the_paced_loop_render_as_before() -> None:
    lines = render_streaming(streaming(paced=False), MACHINE)
    assert not any("paced" in line for line in lines)
    assert sum(line.startswith("| ") for line in lines) == 5


def test_the_query_s_batches_alone_have_a_row_against_both_loops() -> None:
    lines = render_streaming(streaming(paced=True, batches=True), MACHINE)
    alone = [line for line in lines if "batches alone" in line]
    assert len(alone) == 1
    # the bound against the unpaced loop: the paced loop's share of it (2.0 s against 3.0 s)
    assert alone[0].endswith(
        "| **0.80** (0.80) (at most 0.67 within 2 MB a second a shard: the paced loop's); "
        "of the paced loop: **1.20** (1.20) |"
    )


def test_a_running_query_has_a_line_with_its_planning_and_batches() -> None:
    figures = streaming(paced=True)
    figures["running"] = {
        "fed_records_per_s": 1000,
        "seconds": 20.0,
        "batches": 97,
        "planning_ms": {"median": 22.0, "p90": 27.0},
        "batch_ms": {"median": 224.0, "p90": 300.0},
        "records_per_batch": {"median": 200.0, "p90": 250.0},
    }
    lines = render_streaming(figures, MACHINE)
    assert lines[-1] == (
        "A query that runs on over a stream fed 1,000 records a second (20 s, 97 batches): its "
        "planning (each shard's new end, Spark's `latestOffset`) 22 ms median (p90 27), its "
        "batch 224 ms median (p90 300), 200 records a batch."
    )
