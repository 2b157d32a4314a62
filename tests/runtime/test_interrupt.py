"""runtime/interrupt.py: SIGTERM as Ctrl-C, and a write during which an interrupt waits."""
from __future__ import annotations

import os
import signal

import pytest

from trtllm.runtime.interrupt import deferred


def test_an_interrupt_during_a_deferred_block_comes_after_it():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the write")
    assert done == ["the write"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back


def test_an_interrupt_is_kept_over_an_error_of_the_block():
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            raise OSError("disk full")


def test_not_wanted_defers_nothing():
    with pytest.raises(KeyboardInterrupt):
        with deferred(wanted=False):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
            pytest.fail("not interrupted")
