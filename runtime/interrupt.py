"""SIGTERM and SIGHUP handled as Ctrl-C (KeyboardInterrupt) while a command runs, and a run's
interrupts that wait for its answers to be written.

`timeout`, systemd, `docker stop` and a closed terminal send them; Python's default for SIGTERM
ends the process at once, so a build left its partial engine directory behind and a run lost the
answers it had. As a KeyboardInterrupt, each command's own Ctrl-C path runs: the build cleans up,
the run writes what finished (exit 130).

A KeyboardInterrupt raised while Python runs a finalizer (a `__del__`, a weakref callback: an
import's module lock has one) is printed as "Exception ignored" and dropped: the command went on
as if no signal had come (a build then wrote its engine and exited 0). Python hands each dropped
exception to sys.unraisablehook: while a command runs, a dropped KeyboardInterrupt is owed there,
and `check()` raises it again at the points that must not pass one (a build before its engine
replaces the old one; a run's next engine step).
"""
from __future__ import annotations

import contextlib
import signal
import sys


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_owed = False  # a KeyboardInterrupt Python dropped in a finalizer (`_dropped_interrupts`), not raised again yet


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def check() -> None:
    """Raise the interrupt a finalizer swallowed, if one did."""
    global _owed
    if _owed:
        _owed = False
        raise KeyboardInterrupt


@contextlib.contextmanager
def _dropped_interrupts():
    """Within the block, a KeyboardInterrupt Python drops (sys.unraisablehook: "Exception ignored
    in ...") is owed (`check`); the hook before it still sees every one."""
    global _owed
    previous = sys.unraisablehook

    def hook(unraisable):
        global _owed
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            _owed = True
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook, _owed = previous, False


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


class Watch:
    """A run's Ctrl-C, SIGTERM and SIGHUP (trtllm-run, from loading to its last write). The first
    raises KeyboardInterrupt while the run loads or generates: loading stops (nothing is written),
    generating ends with the answers so far. Once it has, or once generation is over (`settle`:
    the answers are being put together and written), one more is kept for after the writes, so no
    answer is lost to it (a second Ctrl-C, or a Ctrl-C and then the terminal closing); a further
    one raises, for a write that hangs (a pipe nobody reads)."""

    def __init__(self):
        self.raised = self.settled = False
        self.kept: list[int] = []
        self.holding = self.pending = False  # in a `held` block; an interrupt waits for its end

    def handle(self, signum, frame):
        if not self.raised and not self.settled:
            if self.holding and not self.pending:  # the first, in a held block: after it
                self.pending = True
                return
            self.raised, self.pending = True, False  # (a second one in a held block: now, for a write that hangs)
            raise KeyboardInterrupt
        if _owed and not self.settled:  # the first was dropped (a finalizer): this one ends generation instead
            check()
        self.kept.append(signum)
        if len(self.kept) > 1:
            raise KeyboardInterrupt


_watch: Watch | None = None


@contextlib.contextmanager
def watch():
    """Within the block (the main thread), interrupts as `Watch` says; yields the Watch."""
    global _watch
    outer, _watch = _watch, Watch()
    try:
        with _handling(SIGNALS, _watch.handle), _dropped_interrupts():
            yield _watch
    finally:
        _watch = outer


@contextlib.contextmanager
def held():
    """Within the block, the interrupt that would stop generation waits for its end (a streamed
    line is written whole, not cut where the signal came); a second one does not wait (a write that
    hangs). Nothing outside `watch`."""
    w = _watch
    if w is None or w.holding:
        yield
        return
    w.holding, done = True, False
    try:
        yield
        done = True
    finally:
        w.holding = False  # (then a signal raises at once, and clears pending: not raised twice)
        if w.pending:
            w.pending, w.raised = False, True
            if done:  # (not over an exception already on its way out: a sys.exit, an error)
                raise KeyboardInterrupt


def settle() -> None:
    """Generation is over (trtllm-run's answers are being written): an interrupt now waits for the
    writes. Nothing outside `watch` (the Python API)."""
    if _watch is not None:
        _watch.settled = True


def resume() -> bool:
    """Generation starts again after `settle` (trtllm-run --warmup's pass, before the run): the first
    interrupt ends it again. False, leaving it settled, if one came meanwhile (or ended the pass)."""
    if _watch is None:
        return True
    if _watch.kept or _watch.raised:
        return False
    _watch.settled = False
    return True


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block (the main thread), SIGTERM and SIGHUP raise KeyboardInterrupt, as SIGINT
    does; one a finalizer drops is owed (`check`)."""
    with _handling(SIGNALS, _interrupt), _dropped_interrupts():
        yield
