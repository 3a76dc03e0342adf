"""Failpoints: a test names a step and an action; the process fails exactly there, nowhere else."""

from __future__ import annotations

import os
import pickle
import signal
import threading
from collections.abc import Iterator

import pytest

from devstack import failpoints
from devstack.failpoints import STEPS, FailpointError, Failpoints, from_env
from producer.errors import ConfigurationError
from producer.hooks import NO_HOOKS, Step

armed = Failpoints()


@pytest.fixture(autouse=True)
def no_failpoints_after_the_test() -> Iterator[None]:
    yield
    armed.disarm()


def configure(spec: str) -> None:
    armed.arm(spec)


def hit(step: str) -> None:
    armed.at(Step(step))


@pytest.fixture
def recorded_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    sleeps: list[float] = []
    monkeypatch.setattr(failpoints.time, "sleep", sleeps.append)
    return sleeps


# --- parsing the spec ---------------------------------------------------------------------------


def test_unknown_step_is_rejected_by_name() -> None:
    # GIVEN a spec naming a step the producer does not have (a typo)
    # WHEN parsed
    with pytest.raises(ConfigurationError, match="unknown step 'after_clam'") as excinfo:
        failpoints.parse("after_clam=raise")
    # THEN the message names it, the variable, and the steps that exist
    assert "KEO_FAILPOINTS" in str(excinfo.value)
    assert "after_claim" in str(excinfo.value)


@pytest.mark.parametrize("action", ["explode", "", "KILL", "sleep"])
def test_unknown_action_is_rejected_by_name(action: str) -> None:
    # GIVEN a spec with an action that does not exist
    # WHEN parsed
    # THEN the message names the action and its step
    with pytest.raises(ConfigurationError, match=f"unknown action '{action}' for before_put"):
        failpoints.parse(f"before_put={action}")


def test_step_without_action_is_rejected() -> None:
    # GIVEN a step with no "=action"
    # WHEN parsed
    # THEN it is refused rather than ignored
    with pytest.raises(ConfigurationError, match="unknown action '' for after_put"):
        failpoints.parse("after_put")


def test_spec_with_several_failpoints_and_spaces_is_read() -> None:
    # GIVEN a spec with several entries, spaces and an empty entry
    spec = " after_claim=raise , before_mark=sleep:0.5,, after_mark=kill, before_put=stop "
    # WHEN parsed
    # THEN each step gets its action
    assert failpoints.parse(spec) == {
        "after_claim": "raise",
        "before_mark": "sleep:0.5",
        "after_mark": "kill",
        "before_put": "stop",
    }


def test_empty_spec_means_no_failpoints() -> None:
    # GIVEN an unset or empty KEO_FAILPOINTS
    # WHEN parsed
    # THEN nothing is armed
    assert failpoints.parse("") == {}


def test_every_documented_step_can_be_armed() -> None:
    # GIVEN the steps the module documents
    documented = {
        "after_claim",
        "before_put",
        "after_put",
        "before_mark",
        "after_mark",
        "reconcile_before_mark",
        "batch_after_puts",
        "batch_before_complete",
        "replay_before_register",
        "replay_after_register",
    }
    # WHEN each is armed
    # THEN it is accepted, and there are no others
    assert set(STEPS) == documented
    assert failpoints.parse(",".join(f"{step}=raise" for step in documented)).keys() == documented


@pytest.mark.parametrize("action", ["sleep:", "sleep:soon", "sleep:-1"])
def test_sleep_with_a_bad_duration_is_rejected_at_parse_time(action: str) -> None:
    # GIVEN a sleep action whose duration is not a non-negative number
    # WHEN parsed
    # THEN it is refused up front, naming the action
    with pytest.raises(ConfigurationError, match=f"unknown action '{action}'"):
        failpoints.parse(f"before_put={action}")


# --- hitting a step -----------------------------------------------------------------------------


def test_armed_raise_fails_exactly_at_its_step() -> None:
    # GIVEN after_claim armed to raise
    configure("after_claim=raise")
    # WHEN the producer reaches after_claim
    with pytest.raises(FailpointError) as excinfo:
        hit("after_claim")
    # THEN it raises, naming the step
    assert excinfo.value.step == "after_claim"
    assert "after_claim" in str(excinfo.value)


def test_other_steps_do_nothing() -> None:
    # GIVEN after_claim armed to raise
    configure("after_claim=raise")
    # WHEN the producer reaches another step
    # THEN nothing happens
    hit("before_mark")
    hit("before_put")


def test_sleep_pauses_for_the_given_seconds(recorded_sleeps: list[float]) -> None:
    # GIVEN before_put armed to sleep a quarter of a second
    configure("before_put=sleep:0.25")
    # WHEN the producer reaches before_put
    hit("before_put")
    # THEN it pauses that long
    assert recorded_sleeps == [0.25]


@pytest.fixture
def resumes_heard() -> Iterator[None]:
    """SIGCONT goes back to its default action after the test."""
    yield
    signal.signal(signal.SIGCONT, signal.SIG_DFL)


def test_pause_holds_its_thread_until_the_process_receives_sigcont(resumes_heard: None) -> None:
    # GIVEN before_put armed to pause (on the main thread, which takes the signal)
    configure("before_put=pause")
    # WHEN a producer thread reaches before_put
    # THEN it waits there, whatever else the process does, until a SIGCONT comes
    assert_pauses_until_sigcont(armed, Step.BEFORE_PUT)


def assert_pauses_until_sigcont(hooks: Failpoints, step: Step) -> None:
    reached, passed = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def producer() -> None:
        reached.set()
        try:
            hooks.at(step)
        except BaseException as exc:  # reported below, on the test's thread
            failures.append(exc)
        passed.set()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    assert reached.wait(timeout=10)
    assert not passed.wait(timeout=10 * failpoints.PAUSE_POLL_S)
    os.kill(os.getpid(), signal.SIGCONT)
    assert passed.wait(timeout=30)
    thread.join(timeout=30)
    assert failures == []


def test_pause_armed_off_the_main_thread_raises_rather_than_wait_forever(
    resumes_heard: None,
) -> None:
    # GIVEN before_put armed to pause from a thread that cannot take SIGCONT (nothing hears it)
    signal.signal(signal.SIGCONT, signal.SIG_DFL)
    arming = threading.Thread(target=configure, args=("before_put=pause",))
    arming.start()
    arming.join(timeout=30)
    assert armed.armed == {"before_put": "pause"}
    # WHEN a producer reaches before_put
    # THEN it fails there, saying why, instead of waiting for a signal nobody counts
    with pytest.raises(
        FailpointError, match="nothing in this process counts the SIGCONT"
    ) as excinfo:
        hit("before_put")
    assert excinfo.value.step == "before_put"


def test_unpickled_pause_listens_for_sigcont(resumes_heard: None) -> None:
    # GIVEN failpoints with a pause, shipped the way Spark ships them to an executor
    signal.signal(signal.SIGCONT, signal.SIG_DFL)
    shipped = pickle.dumps(Failpoints("after_put=pause"))
    signal.signal(signal.SIGCONT, signal.SIG_DFL)
    # WHEN unpickled on the executor's main thread
    received = pickle.loads(shipped)  # noqa: S301 - our own bytes
    # THEN the same step is armed, and pauses there until a SIGCONT (rather than raise: unheard)
    assert received.armed == {"after_put": "pause"}
    assert_pauses_until_sigcont(received, Step.AFTER_PUT)


def test_configure_replaces_what_was_armed() -> None:
    # GIVEN after_claim armed
    configure("after_claim=raise")
    # WHEN another spec is configured
    configure("after_put=raise")
    # THEN only the new one is armed
    hit("after_claim")
    with pytest.raises(FailpointError):
        hit("after_put")


def test_configure_empty_disarms_everything() -> None:
    # GIVEN a failpoint armed
    configure("after_mark=raise")
    # WHEN configured with an empty spec
    configure("")
    # THEN no step fails
    for step in STEPS:
        hit(step)


def test_configure_rejects_a_bad_spec() -> None:
    # GIVEN a spec with an unknown step
    # WHEN configured
    # THEN it is refused rather than half-applied silently
    with pytest.raises(ConfigurationError, match="unknown step"):
        configure("before_putt=raise")


# --- installed by entry points ------------------------------------------------------------------


def test_an_unset_or_blank_variable_installs_the_no_op_hooks() -> None:
    # GIVEN no KEO_FAILPOINTS, or a blank one
    # WHEN an entry point reads the environment
    # THEN the product gets the no-op hooks
    assert from_env({}) is NO_HOOKS
    assert from_env({"KEO_FAILPOINTS": "  "}) is NO_HOOKS


def test_the_variable_arms_the_hooks_an_entry_point_installs() -> None:
    # GIVEN KEO_FAILPOINTS naming a step
    hooks = from_env({"KEO_FAILPOINTS": "before_put=raise"})
    # WHEN the product reaches it
    # THEN it raises there
    with pytest.raises(FailpointError):
        hooks.at(Step.BEFORE_PUT)


def test_hooks_survive_pickling_as_spark_ships_them_to_executors() -> None:
    # GIVEN armed failpoints and the no-op hooks
    # WHEN pickled and unpickled (a Spark task's closure)
    shipped = pickle.loads(pickle.dumps(Failpoints("after_put=raise")))  # noqa: S301 - our own bytes
    # THEN the armed step still fires, and the no-op stays the singleton
    with pytest.raises(FailpointError):
        shipped.at(Step.AFTER_PUT)
    assert pickle.loads(pickle.dumps(NO_HOOKS)) is NO_HOOKS  # noqa: S301 - our own bytes
