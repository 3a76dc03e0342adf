"""``make bench-compare`` reports medians of figures taken within each round: two producers run
side by side drift together on a shared machine, so their ratio is taken per round."""

from __future__ import annotations

from typing import Any

import pytest

from devstack.compare import summary


def _round(ceiling: float, baseline: float, before: float, after: float) -> dict[str, Any]:
    return {
        "ceiling_messages_per_second": ceiling,
        "baseline_messages_per_second": baseline,
        "before": {"messages_per_second": before, "client_cpu_ms_per_message": 2.0},
        "after": {"messages_per_second": after, "client_cpu_ms_per_message": 1.0},
    }


def test_ratios_are_taken_within_each_round_then_their_median() -> None:
    # GIVEN three rounds on a machine whose speed halves, then doubles, between rounds
    rounds = [
        _round(1000, 20_000, 400, 900),
        _round(500, 10_000, 200, 420),  # everything at half speed: the ratio holds
        _round(1000, 20_000, 450, 700),  # one round where the new producer lagged
    ]
    # WHEN they are summarised
    found = summary(rounds)
    # THEN the speed-up is the median of the per-round ratios, not a ratio of medians
    assert found["after_over_before"]["messages_per_second"] == pytest.approx(2.1, abs=1e-4)
    assert found["after_over_before"]["rounds_at_least_2x"] == 2
    assert found["after_over_before"]["client_cpu_ms_per_message"] == pytest.approx(0.5)
    # AND each side's ratio to the baseline and to the ceiling is per round too
    assert found["after"]["ratio_to_baseline"] == pytest.approx(0.042)
    assert found["before"]["ceiling_fraction"] == pytest.approx(0.4)
    assert found["rounds"] == 3
