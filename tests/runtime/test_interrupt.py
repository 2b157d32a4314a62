"""runtime/interrupt.py: a run's Ctrl-C, SIGTERM and SIGHUP. The first stops loading or generating;
once generation is over, or after that first one, one more waits for the answers to be written;
a further one stops the run at once."""
from __future__ import annotations

import os
import signal

import pytest

from trtllm.runtime import interrupt


def signal_now(sig=signal.SIGINT):
    os.kill(os.getpid(), sig)
    for _ in range(1000):  # the handler runs between bytecodes
        pass


def test_the_first_interrupt_stops_loading_or_generating():
    with interrupt.watch() as watch:
        with pytest.raises(KeyboardInterrupt):
            signal_now(signal.SIGTERM)
        signal_now(signal.SIGHUP)  # the next is kept: the answers so far are being written
        assert watch.kept == [signal.SIGHUP]
        with pytest.raises(KeyboardInterrupt):  # and one more stops the run (a write that hangs)
            signal_now()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are back
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_after_generation_one_interrupt_waits_for_the_writes():
    with interrupt.watch() as watch:
        interrupt.settle()
        signal_now()
        assert watch.kept == [signal.SIGINT]
        with pytest.raises(KeyboardInterrupt):
            signal_now(signal.SIGTERM)


def test_settle_outside_a_watch_changes_nothing():
    interrupt.settle()  # the Python API: no handlers of ours
    with pytest.raises(KeyboardInterrupt):
        signal_now()


def test_a_held_block_finishes_before_the_interrupt():
    """A streamed line is written whole: the interrupt that comes in the middle of it is raised
    after it (and counts as the first); outside a held block it is raised at once."""
    done = []
    with interrupt.watch() as watch:
        with pytest.raises(KeyboardInterrupt):
            with interrupt.held():
                signal_now()
                done.append("the rest of the line")
        assert done == ["the rest of the line"] and watch.raised
        signal_now()  # the next one waits for the answers, as after any first one
        assert watch.kept == [signal.SIGINT]
    with interrupt.held():  # outside a watch: nothing held
        with pytest.raises(KeyboardInterrupt):
            signal_now()


def test_a_second_interrupt_in_a_held_block_does_not_wait():
    """A write that hangs (a pipe nobody reads) inside a held block: the first interrupt waits for
    it, a second one stops it; nothing is left pending for the next block."""
    with interrupt.watch() as watch:
        with pytest.raises(KeyboardInterrupt):
            with interrupt.held():
                signal_now()
                signal_now(signal.SIGTERM)  # raised here, in the block
                pytest.fail("not interrupted")
        assert watch.raised and not watch.pending
        with interrupt.held():  # the next block ends without a stale interrupt
            pass


def test_a_held_block_that_exits_keeps_its_exit():
    with interrupt.watch():
        with pytest.raises(SystemExit):
            with interrupt.held():
                signal_now()
                raise SystemExit(141)  # (stdout's reader went away): the exit, not the interrupt


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the dropped one)
def test_only_an_interrupt_python_dropped_is_owed():
    """An interrupt raised in a finalizer is dropped by Python ("Exception ignored"): check() raises
    it at the next point that must not pass it, once. One that was raised and caught is not owed:
    the next signal is kept, as ever."""
    class Dropped:
        def __del__(self):
            signal_now()

    with interrupt.watch() as watch:
        Dropped()  # (its __del__ runs at once: the handler's KeyboardInterrupt is dropped there)
        assert watch.raised
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        interrupt.check()  # (raised once)
    with interrupt.watch() as watch:
        with pytest.raises(KeyboardInterrupt):
            signal_now()
        interrupt.check()  # caught: nothing owed
        signal_now()
        assert watch.kept == [signal.SIGINT]
