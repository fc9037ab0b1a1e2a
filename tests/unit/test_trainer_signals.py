"""A stop signal sets the stop event from a thread, never inside the handler (trainer/signals.py)."""
from __future__ import annotations

import os
import signal
import threading

from trainer.signals import set_on_signal


def test_a_signal_sets_the_event_while_the_main_thread_waits_on_it() -> None:
    stop = threading.Event()
    seen: list[str] = []
    handler = set_on_signal(stop)

    def recording(*args: object) -> None:
        seen.append(threading.current_thread().name)
        handler(*args)

    previous = signal.signal(signal.SIGUSR1, recording)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        waited = 0
        while not stop.wait(0.01) and waited < 500:  # the pacer's and the syncer's loop: short waits
            waited += 1
        assert stop.is_set(), "the signal did not set the stop event within 5 s"
        assert seen == ["MainThread"], "a handler runs in the main thread; the set must not"
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_on_signal_runs_its_action_off_the_main_thread() -> None:
    """The unit supervisor's stop (it sets the Event its restart backoff waits on) goes this way."""
    from trainer.signals import on_signal

    ran = threading.Event()
    where: list[str] = []

    def action() -> None:
        where.append(threading.current_thread().name)
        ran.set()

    previous = signal.signal(signal.SIGUSR1, on_signal(action))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ran.wait(5.0), "the action did not run within 5 s of the signal"
        assert where and where[0] != "MainThread", f"the action ran on {where}"
    finally:
        signal.signal(signal.SIGUSR1, previous)
