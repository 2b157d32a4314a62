"""trtllm-run's requests with num_beams > 1 (runtime/runner.py): what the engine cannot run (the
request fails alone), each request's search (runtime/beam_candidates.py BeamParams, from its first sample's
row), and the answers, replayed into the samples' rows as plain decoding would have produced them."""
from __future__ import annotations

import itertools

from trtllm.runtime.beam import Hypothesis, Interrupted, Stuck, run_many
from trtllm.runtime.beam_candidates import BeamParams


def unrunnable(req, index: int, manifest) -> str | None:
    """Why this engine cannot run a request's beam search (it fails alone), or None."""
    where = req.where(index, "num_beams")
    if req.num_beams <= 1:
        return None
    if req.num_beams > manifest.limits.max_batch_size:
        return (f"`{where}` must be at most the engine's max_batch_size {manifest.limits.max_batch_size} (each beam "
                f"is a batch row), got {req.num_beams}; rebuild with a larger --max-batch-size")
    return None


def searched(samples: list) -> list:
    """The samples (runner.Sample, rows made) that beam search answers: num_beams > 1 with something to
    generate (with nothing, a beam request runs as a plain one: it scores its prompt, prompt_logprobs)."""
    return [smp for smp in samples if smp.prepared.request.num_beams > 1 and smp.row.max_new_tokens > 0]


def params_for(req, row, capacity: int) -> BeamParams:
    """A request's beam search as its first sample's row has it: the EOS ids it stops at (none with
    ignore_eos) and its stop_token_ids, min_new_tokens, and max_generate_length within the KV
    capacity (as plain decoding caps it); its adapter, num_logprobs, stop strings, logit_bias,
    repetition_penalty, bad_words, allowed_token_ids and no_repeat_ngram_size."""
    return BeamParams(num_beams=req.num_beams, max_new_tokens=max(0, min(row.max_new_tokens,
                                                                           capacity + 1 - len(row.prompt_ids))),
                      eos_ids=row.banned, min_new_tokens=req.min_new_tokens, length_penalty=req.length_penalty,
                      early_stopping=req.early_stopping, adapter=row.adapter, num_logprobs=req.num_logprobs,
                      text=row.text.fork() if row.text is not None and row.text.stops else None,
                      logit_bias=tuple(sorted(req.logit_bias.items())), repetition_penalty=req.repetition_penalty,
                      prefix_ids=row.prefix_ids, save_prefix=row.save_prefix, context_lookup=row.context_lookup,
                      context_commit=row.context_commit, scorer=row if row.prompt_logprobs is not None else None,
                      guide=row.guide, bad_words=row.params.bad_words,
                      allowed_token_ids=row.params.allowed_token_ids,
                      no_repeat_ngram_size=row.params.no_repeat_ngram_size, where=row.params.where,
                      images=row.images)


def replay(row, hypothesis: Hypothesis, max_new_tokens: int, finish: bool = True) -> None:
    """A hypothesis into a sample's row, token by token as plain decoding takes them (its text,
    its finish reason: an EOS id, a stop token, the length; its logprobs). `finish` False: an
    interrupted search's, which its caller cancels (no finish reason here, no end of its text)."""
    row.max_new_tokens = max_new_tokens
    for i, token in enumerate(hypothesis.tokens):
        if hypothesis.logprobs:
            values, ids, own = hypothesis.logprobs[i]
            row.accept(token, (values, ids), own)
        else:
            row.accept(token, None)
        if row.finish_reason:
            break
    if not finish:  # (an EOS it ended with: still cancelled, its search was not over; its text ends as it did)
        row.ended, row.finish_reason = row.finish_reason, None
        return
    row.finish_reason = row.finish_reason or "max-length"  # (max_generate_length 0: no token)


class Unfinished(RuntimeError):
    """Fewer hypotheses finished than the request's n."""


def answer(engine, samples: list, timing, on_token=None, rows: int | None = None, prefixes=None,
           contexts=None) -> None:
    """trtllm-run's requests with num_beams > 1 (runtime/runner.py Samples, a request's n adjacent),
    their searches sharing the engine's steps (run_many): sample i gets the i-th best hypothesis, its
    score `beam_score`, as its search ends. A failure of one fails that request alone."""
    capacity = engine.manifest.limits.max_kv_cache_capacity
    groups = [list(group) for _, group in itertools.groupby(samples, key=lambda smp: smp.prepared)]
    jobs = [(group[0].prepared.prompt_ids, params_for(group[0].prepared.request, group[0].row, capacity))
            for group in groups]
    for group, (_, params) in zip(groups, jobs):
        if params.max_new_tokens == 0:  # (as a plain request: no step, no slot, an empty answer, no score)
            for smp in group:
                replay(smp.row, Hypothesis((), 0.0), 0)
                if on_token is not None:
                    on_token(smp.row)
    kept = [i for i, (_, params) in enumerate(jobs) if params.max_new_tokens]
    groups, jobs = [groups[i] for i in kept], [jobs[i] for i in kept]

    def done(job: int, found, base: int) -> None:
        group, params = groups[job], jobs[job][1]
        if not isinstance(found, Exception) and not all(h.finished for h in found[:len(group)]):
            ended = sum(h.finished for h in found)
            prepared = group[0].prepared  # (its settings named by JSON path: its own or the top level's)
            n, penalty = (prepared.request.where(prepared.index, name) for name in ("n", "length_penalty"))
            found = Unfinished(f"{found.stuck}, and {ended} hypotheses had finished, fewer than `{n}` "
                               f"({len(group)})" if found.stuck else
                               f"it ended with {ended} finished hypotheses, fewer than `{n}` ({len(group)}): no "
                               f"running beam could beat an empty placeholder's score under `{penalty}` "
                               f"{params.length_penalty} (transformers gives up there too, and answers with the "
                               f"placeholders); use a `{penalty}` nearer 0 or a smaller `{n}`")
        for smp in group:
            smp.row.batch_idx = base  # (its beams took slots base .. base + B - 1)
        if isinstance(found, Interrupted):  # Ctrl-C: each sample what the search had for it, cancelled
            for smp, hypothesis in zip(group, found.so_far):
                replay(smp.row, hypothesis, params.max_new_tokens, finish=False)
            for smp in group:
                smp.row.cancel()
                if on_token is not None:
                    on_token(smp.row)
            return
        if isinstance(found, Exception):  # its own failure, not its neighbours'
            why = str(found) if isinstance(found, (Unfinished, Stuck)) else f"{type(found).__name__}: {found}"
            for smp in group:
                smp.row.fail(f"beam search failed ({why})")
            found = []
        for smp, hypothesis in zip(group, found):
            smp.beam_score = hypothesis.score
            replay(smp.row, hypothesis, params.max_new_tokens)
        for smp in group:
            if on_token is not None:
                on_token(smp.row)

    if jobs:
        run_many(engine, jobs, timing, done, rows, prefixes, contexts)
