"""SIGTERM and SIGHUP handled as Ctrl-C (KeyboardInterrupt) while a command runs.

`timeout`, systemd, `docker stop` and a closed terminal send them; Python's default for SIGTERM
ends the process at once, so a build left its partial engine directory behind and a run lost the
answers it had. As a KeyboardInterrupt, each command's own Ctrl-C path runs: the build cleans up,
the run writes what finished (exit 130).
"""
from __future__ import annotations

import contextlib
import signal


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def _handling(signals, handler):
    """Within the block, `handler` for `signals`; the previous handlers after it. Off the main thread
    (an embedding application's), nothing is changed: Python sets handlers there only."""
    previous = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def deferred(wanted: bool = True):
    """Within the block (the main thread, if `wanted`), Ctrl-C, SIGTERM and SIGHUP wait for its end,
    then raise KeyboardInterrupt: for a write that must not be cut short (a run's answers, a file
    written and renamed into place in milliseconds). Python runs its handlers in the main thread,
    so setting them is enough (a signal mask would not be: ONNX Runtime's threads take the signal)."""
    caught = []
    try:
        with _handling(SIGNALS if wanted else (), lambda signum, frame: caught.append(signum)):
            yield
    finally:
        if caught:  # (over an error of the write too: the interrupt is what was asked for)
            raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block (the main thread), SIGTERM and SIGHUP raise KeyboardInterrupt."""
    with _handling((signal.SIGTERM, signal.SIGHUP), _interrupt):
        yield
