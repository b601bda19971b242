"""The one retry/backoff helper: pure delay schedule, and the async loop's retry/give-up policy."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeinspect.errors import InvalidInput, Unavailable
from edgeinspect.services.common.retry import backoff_delays, retry_async


def test_delays_double_from_base_until_the_cap():
    assert backoff_delays(0.1, 2.0, 1.0, attempts=7) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_one_attempt_has_no_delays():
    assert backoff_delays(0.1, 2.0, 1.0, attempts=1) == []


@given(
    base=st.floats(0.0, 5.0),
    factor=st.floats(1.0, 4.0),
    cap=st.floats(0.0, 30.0),
    attempts=st.integers(1, 20),
    jitter=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
)
def test_delays_are_bounded_by_the_cap_and_never_shrink_without_jitter(base, factor, cap, attempts, jitter, seed):
    plain = backoff_delays(base, factor, cap, attempts)
    jittered = backoff_delays(base, factor, cap, attempts, jitter=jitter, seed=seed)
    assert len(plain) == len(jittered) == attempts - 1
    assert all(0.0 <= d <= cap for d in plain + jittered)
    assert all(a <= b for a, b in zip(plain, plain[1:], strict=False))
    assert all((1 - jitter) * p - 1e-12 <= j <= p for p, j in zip(plain, jittered, strict=True))


def test_jitter_with_a_seed_is_reproducible_and_actually_varies():
    first = backoff_delays(1.0, 2.0, 60.0, attempts=6, jitter=0.5, seed=7)
    assert first == backoff_delays(1.0, 2.0, 60.0, attempts=6, jitter=0.5, seed=7)
    assert first != backoff_delays(1.0, 2.0, 60.0, attempts=6)


@pytest.mark.parametrize(
    "kwargs",
    [dict(attempts=0), dict(base_s=-1.0), dict(factor=0.5), dict(jitter=1.5)],
)
def test_nonsense_schedules_are_refused(kwargs):
    args = dict(base_s=0.1, factor=2.0, max_s=1.0, attempts=3) | kwargs
    with pytest.raises(ValueError):
        backoff_delays(**args)


class Flaky:
    """Fails with `error` the first `failures` calls, then answers "ok"."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


async def test_retries_unavailable_until_it_succeeds_and_reports_each_retry():
    fn = Flaky(2, Unavailable("stage 1 restarting"))
    seen = []
    result = await retry_async(
        fn, attempts=4, base_s=0.001, max_s=0.002, on_retry=lambda n, exc, d: seen.append((n, str(exc)))
    )
    assert result == "ok"
    assert fn.calls == 3
    assert seen == [(1, "stage 1 restarting"), (2, "stage 1 restarting")]


async def test_gives_up_after_the_last_attempt_with_the_last_error():
    fn = Flaky(10, TimeoutError("no answer"))
    with pytest.raises(TimeoutError):
        await retry_async(fn, attempts=3, base_s=0.001, max_s=0.001)
    assert fn.calls == 3


async def test_errors_outside_retry_codes_fail_at_once():
    fn = Flaky(1, InvalidInput("bad frame"))
    with pytest.raises(InvalidInput):
        await retry_async(fn, attempts=5, base_s=0.001, max_s=0.001)
    assert fn.calls == 1


async def test_retry_codes_are_the_callers_choice():
    fn = Flaky(1, InvalidInput("bad frame"))
    result = await retry_async(
        fn, attempts=2, base_s=0.001, max_s=0.001, retry_codes=(grpc.StatusCode.INVALID_ARGUMENT,)
    )
    assert result == "ok"
