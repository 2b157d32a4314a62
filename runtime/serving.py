"""trtllm-serve's generation loop: one thread owns the engine and runs a Scheduler whose feed
(generate.py) admits each request as it arrives, into the batch already running (continuous
batching). HTTP threads hand requests over as Jobs and read their stream lines and answers from
the job's queue; everything that touches the engine, the tokenizer's templates and the grammars
runs on the loop's thread.
"""
from __future__ import annotations

import queue
import threading
import time

from trtllm.runtime import beam_requests
from trtllm.runtime import input_format as fmt
from trtllm.runtime.generate import run_rows
from trtllm.runtime.runner import Runner, Sample
from trtllm.runtime.streams import Streams


class Job:
    """One HTTP request's samples: its requests' (a completion's prompts: one each), request by request.
    `events` carries, in order: ("line", choice, text, finish_reason, fields) while it streams (choice:
    the sample's place among them), then ("done", responses, cached_tokens), or ("error", message[,
    HTTP status, 400 unless given]) where it could not run. `echo`: each response also gets
    `prompt_first`, its prompt's first token (an entry with no logprob: echoed answers open with it).
    `counting` (/tokenize): it is prepared, not run, and answers ("tokens", each request's prompt ids)."""

    def __init__(self, inp: fmt.InputFile, stream: bool, echo: bool = False, counting: bool = False):
        self.inp, self.stream, self.echo, self.counting = inp, stream, echo, counting
        self.samples: list[Sample] = []
        self.choice: dict[int, int] = {}  # id(sample) -> its place in samples
        self.events: queue.Queue = queue.Queue()
        self.cancelled = False  # its client went away: its rows end at the next step


class Service:
    def __init__(self, runner: Runner, adapters, num_slots: int):
        self.runner, self.adapters, self.num_slots = runner, adapters, num_slots
        self.incoming: queue.Queue = queue.Queue()  # Jobs, and None to wake the loop (a cancel, close)
        self.queued = 0  # the Jobs in `incoming` (its size counts the wake-ups too)
        self.jobs: list[Job] = []  # admitted, not answered yet
        self.job_of: dict[int, Job] = {}  # id(sample) -> its job, while it is admitted
        self.closed = False
        self.lock = threading.Lock()  # (submit and close: no job goes in after the loop's last look)
        self.streams = Streams(runner, self.line)
        self.thread = threading.Thread(target=self.loop, name="trtllm-serve generation", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> bool:
        """Queue a job; False once the server is closing."""
        with self.lock:
            if self.closed:
                return False
            self.queued += 1
            self.incoming.put(job)
            return True

    def cancel(self, job: Job) -> None:
        job.cancelled = True
        self.incoming.put(None)

    def counts(self) -> tuple[int, int]:
        """(requests generating, requests waiting for a KV slot), read from another thread: a moment's view."""
        running = sum(1 for job in list(self.jobs) if any(s.row.slot is not None for s in job.samples))
        return running, len(self.jobs) - running + self.queued

    def close(self, timeout: float | None = None) -> None:
        """Cancel what runs (its text so far is its answer, "abort") and stop the loop."""
        with self.lock:
            self.closed = True
            self.incoming.put(None)
        self.thread.join(timeout)

    # --- the loop's thread ------------------------------------------------------------------------

    def loop(self) -> None:
        r = self.runner
        while not self.closed:
            try:
                run_rows(r.engine, [], self.num_slots, r.timing, self.streams.on_token, r.prefixes, r.drafter,
                         r.prefill_chunk, r.contexts, r.lookup, feed=self.feed)
            except Exception as e:  # noqa: BLE001 - the engine failed: what runs fails, the server goes on
                for job in self.jobs:
                    for smp in job.samples:
                        if not smp.row.finish_reason:
                            smp.row.fail(f"the engine failed: {type(e).__name__}: {e}")
                time.sleep(0.1)  # (an engine that fails at once every time: not a busy loop)
            self.settle()
        while True:  # (jobs that came as it closed)
            try:
                job = self.incoming.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.events.put(("error", "the server is shutting down", 503))

    def feed(self, wait: bool) -> list | None:
        """The Scheduler's feed: rows of the jobs that came, waiting for one when `wait`."""
        self.settle()
        rows = []
        while not self.closed:
            try:
                job = self.incoming.get(block=wait and not rows)
            except queue.Empty:
                return rows
            if job is None and not self.closed:  # a cancel: settle ends its rows at the next call
                return rows
            if job is not None:
                with self.lock:
                    self.queued -= 1
                rows += self.admit(job)
                self.settle()  # (a beam request's answers are there already: sent before the loop waits again)
        # closing: what runs ends with what it has (the rows just admitted too: their jobs are ended)
        for job in self.jobs:
            self.end(job)
        return None

    def admit(self, job: Job) -> list:
        """The job's rows, or none where it cannot run (its error goes to its queue)."""
        if job.cancelled:
            return []
        r, prepared = self.runner, []
        for i, req in enumerate(job.inp.requests):  # (one that cannot run fails the job: OpenAI's 400)
            p = r.prepare(i, req, job.inp, self.adapters, job.counting)
            if p.error is not None:  # (a failure of ours in preparing it is no fault of the request's)
                job.events.put(("error", p.error, 500 if "a bug in trtllm-edge" in p.error else 400))
                return []
            prepared.append(p)
        if job.counting:  # (the template and tokenizer run here, on the loop's thread, as for a request)
            job.events.put(("tokens", [p.prompt_ids for p in prepared]))
            return []
        try:
            job.samples = [Sample(p, k) for p in prepared for k in range(p.request.n)]
            for place, smp in enumerate(job.samples):
                smp.row = r.make_row(smp)
                job.choice[id(smp)] = place
        except Exception as e:  # noqa: BLE001 - this request fails, not the loop
            job.events.put(("error", f"the request could not be started ({type(e).__name__}: {e}; a bug in "
                                     "trtllm-edge: please report it with this request)", 500))
            return []
        for smp in job.samples:
            self.streams.add(smp)
            self.job_of[id(smp)] = job
        for p in prepared:
            p.guide = None  # (each row has its copy)
        self.jobs.append(job)
        # num_beams > 1: its searches run whole, here, between the running rows' steps (those wait for
        # them), in KV of their own, as trtllm-run runs them (runtime/beam_requests.py); its answers come
        # then, each sample one of the best beams
        searched = beam_requests.searched(job.samples)
        if searched:
            try:
                beam_requests.answer(r.engine, searched, r.timing, self.streams.on_token, self.num_slots,
                                     r.prefixes, r.contexts)
            except Exception as e:  # noqa: BLE001 - the engine failed in the search: its request alone
                for smp in searched:
                    if not smp.row.finish_reason:
                        smp.row.fail(f"the engine failed: {type(e).__name__}: {e}")
        beamed = {id(smp) for smp in searched}
        return [smp.row for smp in job.samples if id(smp) not in beamed]

    def end(self, job: Job) -> None:
        for smp in job.samples:
            if not smp.row.finish_reason:
                smp.row.cancel()
                self.streams.on_token(smp.row)  # its last line: the text held back, "cancelled"

    def line(self, smp: Sample, text: str, finish_reason, token_ids, fields=None) -> None:
        """Streams' on_text, for a job that streams."""
        job = self.job_of.get(id(smp))
        if job is not None and job.stream and not job.cancelled:
            job.events.put(("line", job.choice[id(smp)], text, finish_reason, fields or {}))

    def settle(self) -> None:
        """Answer the jobs whose samples all ended; end the rows of jobs whose client went away."""
        for job in list(self.jobs):
            try:
                if job.cancelled:
                    self.end(job)
                if not all(smp.row.finish_reason for smp in job.samples):
                    continue
                self.forget(job)
                responses = [self.runner.response(smp) for smp in job.samples]
                if job.echo:
                    for r, smp in zip(responses, job.samples):
                        r["prompt_first"] = self.runner.logprob_entry(smp.prepared.prompt_ids[0], float("-inf"))
                reused: dict[int, int] = {}  # each request's prompt once: the most any of its samples reused
                for smp in job.samples:
                    reused[smp.prepared.index] = max(reused.get(smp.prepared.index, 0), smp.row.num_reused)
                cached = sum(reused.values())
                job.events.put(("done", responses, cached))
            except Exception as e:  # noqa: BLE001 - this request fails, not the loop
                for smp in job.samples:
                    if not smp.row.finish_reason:
                        smp.row.cancel()  # (its slot is released at the next step)
                if job in self.jobs:
                    self.forget(job)
                job.events.put(("error", f"the answer could not be made ({type(e).__name__}: {e}; a bug in "
                                         "trtllm-edge: please report it with this request)", 500))

    def forget(self, job: Job) -> None:
        self.jobs.remove(job)
        for smp in job.samples:
            self.streams.drop(smp)
            self.job_of.pop(id(smp), None)
