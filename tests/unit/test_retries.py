"""The retry and polling policies: tenacity's waits and stops, our data deciding whether."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tenacity import RetryCallState, stop_after_attempt, stop_never, wait_none

from producer.retries import poll_until, repeat_while, wait_full_jitter


@dataclass
class Sleeps:
    """An injectable ``sleep`` that only records."""

    seconds: list[float] = field(default_factory=list)

    def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def wait_after(wait: wait_full_jitter, attempt: int) -> float:
    state = RetryCallState(None, None, (), {})
    state.attempt_number = attempt
    return wait(state)


# --- backoff with full jitter -------------------------------------------------------------------


class Fixed(random.Random):
    """A random source that always draws ``value`` in [0, 1)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("attempt", "cap_s"),
    [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (6, 3.2), (7, 5.0), (60, 5.0)],
)
def test_the_cap_doubles_per_attempt_up_to_the_maximum(attempt: int, cap_s: float) -> None:
    # GIVEN a backoff of 100 ms doubling to 5 s, and a draw just under 1
    wait = wait_full_jitter(initial_s=0.1, max_s=5.0, rng=Fixed(0.999999))
    # WHEN the wait after an attempt is drawn
    # THEN it is (just under) the cap, which doubles per attempt and never passes the maximum
    assert wait_after(wait, attempt) == pytest.approx(cap_s, rel=1e-5)


def test_the_jitter_draw_scales_within_the_cap() -> None:
    # GIVEN the third attempt (cap 400 ms)
    wait = wait_full_jitter(initial_s=0.1, max_s=5.0, rng=Fixed(0.5))
    # WHEN a draw of one half is applied
    # THEN the wait is half the cap
    assert wait_after(wait, 3) == pytest.approx(0.2)


def test_a_seeded_random_source_makes_the_waits_repeatable() -> None:
    # GIVEN two backoffs drawing from sources seeded alike
    first = wait_full_jitter(initial_s=0.1, max_s=5.0, rng=random.Random(7))
    second = wait_full_jitter(initial_s=0.1, max_s=5.0, rng=random.Random(7))
    # WHEN each draws the waits of the same attempts
    # THEN they wait the same
    assert [wait_after(first, n) for n in range(1, 9)] == [
        wait_after(second, n) for n in range(1, 9)
    ]


@given(
    attempt=st.integers(1, 200),
    initial_s=st.floats(0.001, 10.0),
    max_s=st.floats(0.001, 60.0),
    seed=st.integers(0, 2**32),
)
def test_a_wait_never_exceeds_the_cap_nor_goes_negative(
    attempt: int, initial_s: float, max_s: float, seed: int
) -> None:
    # GIVEN any attempt, initial wait, cap and random source
    wait = wait_full_jitter(initial_s=initial_s, max_s=max_s, rng=random.Random(seed))
    # WHEN the wait is drawn
    seconds = wait_after(wait, attempt)
    # THEN it lies within [0, min(cap, initial * 2**(attempt-1))]
    assert 0 <= seconds <= min(max_s, initial_s * 2.0 ** min(attempt - 1, 1000)) * (1 + 1e-9)


# --- repeating work -----------------------------------------------------------------------------


def test_work_is_repeated_while_something_is_left_and_the_wait_comes_between() -> None:
    # GIVEN work that leaves fewer items each round, and a recording sleep
    left = [3, 1, 0]
    sleeps = Sleeps()
    # WHEN it is repeated while something is left, with no stop rule
    result = repeat_while(
        lambda: left.pop(0),
        more=bool,
        wait=wait_full_jitter(initial_s=0.1, max_s=1.0, rng=Fixed(0.5)),
        stop=stop_never,
        sleep=sleeps,
    )
    # THEN it ran three times, slept between runs only (backoff growing), and returned 0
    assert result == 0
    assert sleeps.seconds == pytest.approx([0.05, 0.1])


def test_the_stop_rule_ends_the_repeats_with_what_is_still_left() -> None:
    # GIVEN work that never finishes
    calls: list[int] = []

    def work() -> list[str]:
        calls.append(1)
        return ["still refused"]

    sleeps = Sleeps()
    # WHEN it may run three times
    result = repeat_while(
        work, more=bool, wait=wait_none(), stop=stop_after_attempt(3), sleep=sleeps
    )
    # THEN it ran three times, slept twice, and hands back what is still left (no exception)
    assert (len(calls), len(sleeps.seconds), result) == (3, 2, ["still refused"])


def test_an_exception_is_never_retried() -> None:
    # GIVEN work that fails
    calls: list[int] = []

    def work() -> int:
        calls.append(1)
        raise RuntimeError("cannot continue")

    # WHEN it is repeated
    # THEN the failure reaches the caller after one call
    with pytest.raises(RuntimeError, match="cannot continue"):
        repeat_while(work, more=bool, wait=wait_none(), stop=stop_never, sleep=Sleeps())
    assert len(calls) == 1


def test_a_poll_returns_the_first_true_answer() -> None:
    # GIVEN a check that answers on its third call
    answers = [None, None, {"StreamStatus": "ACTIVE"}]
    sleeps = Sleeps()
    # WHEN polled
    answer = poll_until(lambda: answers.pop(0), timeout_s=60, interval_s=0.1, sleep=sleeps)
    # THEN the answer comes back after two waits of the interval
    assert answer == {"StreamStatus": "ACTIVE"}
    assert sleeps.seconds == [0.1, 0.1]


def test_a_poll_that_times_out_returns_its_last_false_answer() -> None:
    # GIVEN a check that never answers yes
    # WHEN polled with no time to wait
    # THEN the last (false) answer comes back
    assert poll_until(lambda: False, timeout_s=0, interval_s=0.01, sleep=Sleeps()) is False
