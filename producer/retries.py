"""When to try again, and until when: every retry and poll of keo runs on tenacity.

Whether to try again is our data: a put result's ``retriable``, an error's type or
``retriable``, a poll's answer. tenacity supplies the rest: the waits (exponential backoff,
with jitter where parties contend), the stop rules (attempts, deadlines) and the hook that logs
before each sleep. ``sleep`` is injectable everywhere (tests pass one that moves a fake clock),
and jitter draws from an injectable ``random.Random``, so a seeded run is repeatable.

A non-idempotent call is never retried whole here: a PutRecords is never sent again blindly;
only records classified *not written* are resent (``ExactlyOnceProducer._send``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_fixed,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base, wait_exponential

_T = TypeVar("_T")

# The defaults of a put's resends (ProducerPolicy, ReplayPolicy, the put_max_attempts setting):
# a record definitely not written is sent again, at most PUT_MAX_ATTEMPTS sends in all, each
# after a wait with full jitter whose cap doubles from PUT_RETRY_INITIAL_MS to PUT_RETRY_MAX_MS.
PUT_MAX_ATTEMPTS: Final = 8
PUT_RETRY_INITIAL_MS: Final = 100
PUT_RETRY_MAX_MS: Final = 5_000
# The defaults of a wait on another producer's claim (ProducerPolicy, the wait_* settings):
# looks again after CLAIM_WAIT_INITIAL_MS, doubling up to CLAIM_WAIT_MAX_MS, no jitter.
CLAIM_WAIT_INITIAL_MS: Final = 100
CLAIM_WAIT_MAX_MS: Final = 5_000

Sleep = Callable[[float], None]
BeforeSleep = Callable[[RetryCallState], None]


class wait_full_jitter(wait_exponential):  # noqa: N801 - named like tenacity's own waits
    """Exponential backoff with full jitter: a wait drawn uniformly from ``[0, cap]``, where
    ``cap = min(max_s, initial_s * 2 ** (attempt - 1))``.

    tenacity's ``wait_random_exponential``, drawing from ``rng`` instead of the ``random``
    module, so that tests can seed it.
    """

    def __init__(self, *, initial_s: float, max_s: float, rng: random.Random) -> None:
        super().__init__(multiplier=initial_s, max=max_s)
        self._rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        return self._rng.uniform(0, super().__call__(retry_state))


def repeat_while(
    work: Callable[[], _T],
    *,
    more: Callable[[_T], bool],
    wait: wait_base,
    stop: stop_base,
    sleep: Sleep = time.sleep,
    before_sleep: BeforeSleep | None = None,
) -> _T:
    """Call ``work`` again while ``more(result)`` holds, waiting ``wait`` between calls, until
    ``stop`` says enough; return its last result (what was still left to do, if anything).

    An exception from ``work`` is never retried: it reaches the caller at once.
    """
    retrying = Retrying(
        retry=retry_if_result(more),
        wait=wait,
        stop=stop,
        sleep=sleep,
        before_sleep=before_sleep,
        retry_error_callback=_last_result,
    )
    return retrying(work)


def poll_until(
    check: Callable[[], _T], *, timeout_s: float, interval_s: float, sleep: Sleep = time.sleep
) -> _T:
    """Call ``check`` every ``interval_s`` until it answers something true or ``timeout_s`` has
    passed; return its last answer (false on a timeout)."""
    return repeat_while(
        check,
        more=_is_false,
        wait=wait_fixed(interval_s),
        stop=stop_after_delay(timeout_s),
        sleep=sleep,
    )


def call_retrying(
    call: Callable[[], _T],
    *,
    attempts: int,
    wait: wait_base,
    sleep: Sleep = time.sleep,
    before_sleep: BeforeSleep | None = None,
) -> _T:
    """``call()``, tried again while it raises an error whose ``retriable`` says so, at most
    ``attempts`` times; the last error reaches the caller. Only for idempotent calls (reads,
    or writes conditional on what the caller holds)."""
    retrying = Retrying(
        retry=retry_if_exception(_is_retriable),
        wait=wait,
        stop=stop_after_attempt(attempts),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(call)


def _is_retriable(error: BaseException) -> bool:
    return bool(getattr(error, "retriable", False))


def _is_false(answer: object) -> bool:
    return not answer


def _last_result(retry_state: RetryCallState) -> Any:
    outcome = retry_state.outcome
    if outcome is None:  # pragma: no cover - tenacity stops only after an attempt
        raise RuntimeError("stopped before the first attempt")
    return outcome.result()
