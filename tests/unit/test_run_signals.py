"""harness/run.py's SIGTERM / SIGINT handler ends a run early by setting its stop Event.  A second signal can
land while the first handler is inside ``stop.set()`` holding the Event's lock (a process-group kill reached the
harness twice and the run hung for good, its nodes and lazyfs mounts alive): it must return at once."""

from __future__ import annotations

import signal
import threading

from harness.run import _install_signal_handlers, _restore_signal_handlers


def test_a_second_signal_inside_the_first_handlers_set_does_not_wait_for_its_lock():
    stop = threading.Event()
    previous = _install_signal_handlers(stop)
    try:
        handler = signal.getsignal(signal.SIGTERM)
        real_set = stop.set

        def set_with_a_second_signal() -> None:
            with stop._cond:  # where Event.set holds its lock when the second signal comes
                handler(signal.SIGTERM, None)
            real_set()

        stop.set = set_with_a_second_signal
        worker = threading.Thread(target=handler, args=(signal.SIGTERM, None), daemon=True)
        worker.start()
        worker.join(5.0)
        assert not worker.is_alive(), "the second signal's handler waited on the lock its first holds"
        assert stop.is_set()
    finally:
        _restore_signal_handlers(previous)


def test_the_first_signal_stops_the_run():
    stop = threading.Event()
    previous = _install_signal_handlers(stop)
    try:
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        assert stop.is_set()
    finally:
        _restore_signal_handlers(previous)
