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
def deferred(wanted: bool = True):
    """Within the block (the main thread, if `wanted`), Ctrl-C, SIGTERM and SIGHUP wait for its end,
    then raise KeyboardInterrupt: for a write that must not be cut short (a run's answers, a file
    written and renamed into place in milliseconds). Python runs its handlers in the main thread,
    so setting them is enough (a signal mask would not be: ONNX Runtime's threads take the signal)."""
    caught, previous = [], {}
    if wanted:
        try:
            for sig in SIGNALS:
                previous[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
        except ValueError:  # not the main thread
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:  # (over an error of the write too: the interrupt is what was asked for)
            raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block (the main thread), SIGTERM and SIGHUP raise KeyboardInterrupt."""
    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _interrupt)
    except ValueError:  # not the main thread (an embedding application's): leave its handlers alone
        pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
