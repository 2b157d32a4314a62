"""trtllm-run's stdout: the printing of --stream's lines, the answers and the summaries, which a
failing stdout stops without stopping the run, and a stdout closed at the start (`>&-`) held on
/dev/null; and its stderr (`say`), which a failure silences, never failing a request or the run."""
from __future__ import annotations

import contextlib
import os
import sys

import click

from trtllm.runtime import files, interrupt


class Printer:
    """What goes to stdout: --stream's JSON lines, the answers' JSON, the one-line summaries. A
    stdout that fails (its reader went away: `| head`; a full device; none at all: `>&-`) stops the
    printing, not the run, while --output still wants the answers. Without it no one is left to
    answer: the run ends as a program killed by SIGPIPE would (141), or, for another failure, with
    3 (what could not be written)."""

    def __init__(self, answers_wanted: bool, tell: bool = True):
        self.answers_wanted, self.tell, self.gone = answers_wanted, tell, False  # tell: warn when it fails
        self.error: BaseException | None = None  # why it stopped

    def line(self, record: dict) -> None:
        with interrupt.held():  # a Ctrl-C now comes after the line, not in the middle of it
            try:
                self.text(files.json_text(record))
            except KeyboardInterrupt:  # a second one, breaking a write that hangs (a pipe nobody reads)
                if self.answers_wanted:  # print no more (the cancelled rows' lines would hang again)
                    self.gone = True  # and --output gets the answers
                raise

    def text(self, text: str) -> None:
        if self.gone:
            return
        try:
            if sys.stdout is None:  # closed when Python started (>&-)
                raise OSError("stdout is closed")
            write(text + "\n")
        except (OSError, ValueError) as e:  # ValueError: a file object closed under us
            self.gone, self.error = True, e
            if sys.stdout is not None:
                silence()
            pipe = isinstance(e, BrokenPipeError)
            if not self.answers_wanted:
                if not pipe:
                    say(f"error: stdout could not be written ({e}); the answers are lost")
                sys.exit(141 if pipe else 3)
            if not pipe and self.tell:
                say(f"warning: stdout could not be written ({e}); the run goes on for --output")

    def chunk(self, sample, text: str, finish_reason: str | None, token_ids: list[int], fields=None) -> None:
        """One streamed piece: {"request_idx", "sample_idx", "text", "token_ids"[, "finish_reason"][,
        "logprobs", "token_logprobs"][, "reasoning_text", "content_text"][, "new_tool_calls", "tool_call_deltas"][,
        "reasoning_content", "content", "tool_calls"]} per line (the logprobs of its ids, where asked;
        with a reasoning_parser or an answer read for calls, the text's reasoning and content parts,
        and the calls that ended in it; what was read out of the answer, on its last line)."""
        record = {"request_idx": sample.prepared.index, "sample_idx": sample.sample_idx, "text": text,
                  "token_ids": token_ids}
        if finish_reason:
            record["finish_reason"] = finish_reason
        self.line({**record, **(fields or {})})


def write(text: str) -> None:
    """To descriptor 1 itself, as UTF-8 (what JSON is): Python's buffered stdout loses the error of
    a write its reader cut short (`| head -c 10` after the first 64 KiB of a big answer: the rest
    was dropped and the run exited 0). A stdout with no descriptor (click's test runner) is written
    as a stream."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # (io.UnsupportedOperation is both)
        click.echo(text, nl=False)
        sys.stdout.flush()
        return
    sys.stdout.flush()  # what Python holds goes first
    files.write_all(fd, text.encode("utf-8"))


def say(message: str) -> None:
    """One line to stderr: a warning, an error, a summary. A stderr that fails (its reader went away:
    `2>&1 | head -1`; a closed terminal; /dev/full) is put on /dev/null: a warning raised inside
    generation failed every request with BrokenPipeError, one before it stopped the run, and a clean
    run ended with exit 1 and no --profile."""
    try:
        click.echo(message, err=True)
    except (OSError, ValueError):  # (ValueError: a file object closed under us)
        with contextlib.suppress(OSError, ValueError):
            if sys.stderr.fileno() == 2:  # (Python would report it again as it exits)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 2)


def silence() -> None:
    """Descriptor 1 onto /dev/null once stdout has failed: Python would otherwise report the
    failure again as it exits (flushing what is left)."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)


CLOSED = False  # descriptor 1 was closed when the run started (hold)


def hold() -> None:
    """With descriptor 1 closed (`>&-`), the next file opened would get it, and anything written to
    stdout would land in that file: hold it open on /dev/null (the printing fails as a closed
    stdout, Printer)."""
    global CLOSED
    if sys.stdout is not None:
        return
    CLOSED = True
    opened = []
    with contextlib.suppress(OSError):
        while not opened or opened[-1] < 1:  # (0 too may be closed)
            opened.append(os.open(os.devnull, os.O_WRONLY))
    for fd in opened:
        if fd != 1:
            os.close(fd)
