"""The forge scheduler and its budget: fair turns between clients, and a limit that climbs
while latency holds and falls on rising latency, overload and Retry-After."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from conftest import wait_for

from dropbox_eval.app import forge_scheduler
from dropbox_eval.config import load_settings
from dropbox_eval.errors import ConfigError, ForgeRetryable
from dropbox_eval.forge.limiter import Limiter, Outcome
from dropbox_eval.forge.scheduler import SERVICE, ForgeScheduler, current_client, on_behalf_of
from dropbox_eval.forge.transport import forge_outcome


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_limit_climbs_while_latency_holds_and_stays_within_bounds() -> None:
    clock = Clock()
    limiter = Limiter(initial=4, floor=2, ceiling=10, clock=clock)
    for _ in range(200):
        limiter.record(Outcome(0.04), in_flight=limiter.limit)
    assert limiter.limit == 10  # the ceiling, not beyond
    for _ in range(50):
        clock.now += 1
        limiter.record(Outcome(0.04, overloaded=True), in_flight=limiter.limit)
    assert limiter.limit == 2  # the floor, not below


def test_an_unused_budget_does_not_climb() -> None:
    limiter = Limiter(initial=4, ceiling=64, clock=Clock())
    for _ in range(500):
        limiter.record(Outcome(0.04), in_flight=1)
    assert limiter.limit == 4


def test_rising_latency_backs_off_once_per_round_trip() -> None:
    clock = Clock()
    changes: list[int] = []
    limiter = Limiter(initial=20, ceiling=64, clock=clock, on_change=changes.append)
    limiter.record(Outcome(0.05), in_flight=20)
    limiter.record(Outcome(0.5), in_flight=20)  # ten times the lowest: the forge is queueing
    assert limiter.limit == 16 and changes == [16]
    limiter.record(Outcome(0.5), in_flight=20)  # the same round trip: no second cut
    assert limiter.limit == 16
    clock.now += 1.0
    limiter.record(Outcome(0.5), in_flight=16)
    assert limiter.limit == 12


def test_overload_halves_and_retry_after_pauses() -> None:
    clock = Clock()
    limiter = Limiter(initial=16, ceiling=64, clock=clock)
    error = ForgeRetryable("POST /x: forge answered 429", 429, retry_after=3.0)
    outcome = forge_outcome(error)
    assert outcome.overloaded and outcome.retry_after == 3.0
    limiter.record(Outcome(0.1, True, 3.0), in_flight=16)
    assert limiter.limit == 8 and limiter.paused_for() == 3.0
    clock.now += 3.0
    assert limiter.paused_for() == 0
    assert not forge_outcome(ForgeRetryable("GET /x: forge answered 404", 404)).overloaded


def test_after_an_overload_the_budget_slow_starts_back_to_half_of_before() -> None:
    clock = Clock()
    limiter = Limiter(initial=40, ceiling=64, clock=clock)
    for _ in range(5):  # a burst of 503s: halved once per round trip, down to 2
        limiter.record(Outcome(0.1, overloaded=True), in_flight=limiter.limit)
        clock.now += 1.0
    assert limiter.limit == 1
    calls = 0
    while limiter.limit < 20:  # slow start: one more per good call, up to 40 x 0.5
        limiter.record(Outcome(0.1), in_flight=limiter.limit)
        calls += 1
    assert calls <= 20
    limiter.record(Outcome(0.1), in_flight=limiter.limit)
    assert limiter.limit == 20  # past half of before: one more per round trip again
    for _ in range(19):
        limiter.record(Outcome(0.1), in_flight=limiter.limit)
    assert limiter.limit == 20


def test_rising_latency_ends_a_slow_start() -> None:
    clock = Clock()
    limiter = Limiter(initial=40, ceiling=64, clock=clock)
    limiter.record(Outcome(0.1), in_flight=40)
    limiter.record(Outcome(0.1, overloaded=True), in_flight=40)
    assert limiter.limit == 20
    clock.now += 1.0
    limiter.record(Outcome(1.0), in_flight=20)  # busy, not gone: the slow start is over
    assert limiter.limit == 16
    for _ in range(10):
        limiter.record(Outcome(0.1), in_flight=limiter.limit)
    assert limiter.limit == 16


def _queueing_forge(limiter: Limiter, clock: Clock, seconds: float, floor: float) -> list[int]:
    """Drive `limiter` against a forge that serves 16 calls at once in `floor` s each and
    queues the rest (latency grows with the calls in flight past 16); the budget after each
    call, the budget fully used."""
    limits = []
    end = clock.now + seconds
    while clock.now < end:
        in_flight = limiter.limit
        latency = floor * max(1.0, in_flight / 16)
        limiter.record(Outcome(latency), in_flight=in_flight)
        clock.now += latency / in_flight  # calls finish at in_flight / latency per second
        limits.append(limiter.limit)
    return limits


def test_the_budget_settles_at_the_forges_knee_not_its_ceiling() -> None:
    clock = Clock()
    limiter = Limiter(initial=4, ceiling=64, clock=clock)
    limits = _queueing_forge(limiter, clock, 120.0, floor=0.1)
    settled = sorted(limits[len(limits) // 2 :])
    assert settled[len(settled) // 4] >= 16  # the forge kept busy (but while probing)
    assert settled[-1] <= 40  # not climbing to the ceiling as the queue grows
    assert limiter.lowest_latency == pytest.approx(0.1)


def test_a_forge_slower_for_good_becomes_the_new_normal() -> None:
    clock = Clock()
    limiter = Limiter(initial=4, ceiling=64, clock=clock)
    _queueing_forge(limiter, clock, 30.0, floor=0.1)
    limits = _queueing_forge(limiter, clock, 60.0, floor=0.4)  # four times slower, for good
    assert limiter.lowest_latency == pytest.approx(0.4)
    settled = sorted(limits[len(limits) // 2 :])
    assert settled[len(settled) // 2] >= 20  # back at the knee, not held at the floor


def test_an_occasional_quick_answer_is_not_taken_for_the_floor() -> None:
    clock = Clock()
    limiter = Limiter(initial=4, ceiling=64, clock=clock)
    limits = []
    next_quick, end = clock.now, clock.now + 60.0
    while clock.now < end:
        if clock.now >= next_quick:  # a health check's /version, a 404: 2 ms, every 5 s
            limiter.record(Outcome(0.002), in_flight=limiter.limit)
            next_quick += 5.0
        in_flight = limiter.limit
        latency = 0.05 * max(1.0, in_flight / 16)
        limiter.record(Outcome(latency), in_flight=in_flight)
        clock.now += latency / in_flight
        limits.append(limiter.limit)
    settled = sorted(limits[len(limits) // 2 :])
    assert settled[len(settled) // 2] >= 16  # not held at the floor by the quick answers


def test_every_exchange_runs_as_its_client() -> None:
    seen: list[str] = []
    scheduler = ForgeScheduler(Limiter(initial=2))
    scheduler.call(lambda: seen.append(current_client()))
    with on_behalf_of("acme"):
        scheduler.call(lambda: seen.append(current_client()))
    assert seen == [SERVICE, "acme"]


def _blocked_calls(
    scheduler: ForgeScheduler, release: threading.Event, order: list[str]
) -> Callable[[str], threading.Thread]:
    def start(client: str) -> threading.Thread:
        def work() -> None:
            release.wait(60)
            order.append(client)

        def run() -> None:
            with on_behalf_of(client):
                scheduler.call(work)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    return start


def test_one_clients_backlog_never_stands_before_anothers_first_call() -> None:
    scheduler = ForgeScheduler(Limiter(initial=1, ceiling=1))
    release = threading.Event()
    order: list[str] = []
    start = _blocked_calls(scheduler, release, order)
    threads = [start("flood")]  # holds the one slot
    assert wait_for(lambda: scheduler.in_flight == 1, 30)
    threads += [start("flood") for _ in range(10)]
    assert wait_for(lambda: scheduler.waiting() == {"flood": 10}, 30)
    threads.append(start("small"))
    assert wait_for(lambda: scheduler.waiting() == {"flood": 10, "small": 1}, 30)
    release.set()
    for thread in threads:
        thread.join(60)
    assert len(order) == 12
    # the call in flight, at most one more of the flood's turn, then the small client
    assert order.index("small") <= 2, order


def test_weights_give_turns_in_proportion() -> None:
    settings = load_settings(
        client_weights="heavy=3", intake_concurrency=1, forge_max_inflight=1
    )  # SAAS_EVAL_CLIENT_WEIGHTS; `light` has the default weight, 1
    scheduler = forge_scheduler(settings)
    release = threading.Event()
    order: list[str] = []
    start = _blocked_calls(scheduler, release, order)
    threads = [start("light")]
    assert wait_for(lambda: scheduler.in_flight == 1, 30)
    threads += [start("heavy") for _ in range(6)]
    assert wait_for(lambda: scheduler.waiting() == {"heavy": 6}, 30)
    threads += [start("light") for _ in range(2)]
    assert wait_for(lambda: scheduler.waiting() == {"heavy": 6, "light": 2}, 30)
    release.set()
    for thread in threads:
        thread.join(60)
    assert order == ["light", *["heavy"] * 3, "light", *["heavy"] * 3, "light"]


def test_a_paused_forge_gets_nothing_until_the_pause_ends() -> None:
    limiter = Limiter(initial=2, ceiling=2)
    scheduler = ForgeScheduler(limiter)
    limiter.record(Outcome(0.01, overloaded=True, retry_after=0.5), in_flight=1)
    done = threading.Event()
    thread = threading.Thread(target=lambda: scheduler.call(done.set), daemon=True)
    thread.start()
    assert wait_for(lambda: scheduler.waiting() == {SERVICE: 1} or done.is_set(), 30)
    assert not done.is_set() or limiter.paused_for() == 0  # only after the pause
    assert wait_for(done.is_set, 30)  # the timer resumes the queue without another call


@pytest.mark.parametrize("text", ["acme", "acme=0", "acme=x", "=3", "acme=101"])
def test_a_bad_weight_is_a_one_line_error_naming_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match="^SAAS_EVAL_CLIENT_WEIGHTS: "):
        load_settings(client_weights=text)
