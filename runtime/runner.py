"""The front end of trtllm-run: requests -> prompts -> samples in KV slots -> responses.

Text lives only here (chat template, tokenizer, stop strings); below this the engine sees ids.
A request that cannot be served becomes an `error` response; its neighbours still run.
"""
from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from trtllm.runtime import input_format as fmt
from trtllm.runtime import beam_requests, interrupt, media, reasoning, request_checks, run_profile, tool_calls
from trtllm.runtime.chat_template import ChatTemplate, ChatTemplateError, FormattedPrompt, raw_prompt
from trtllm.runtime.engine import Engine
from trtllm.runtime.generate import PrefixSource, RowState, Timing, run_rows
from trtllm.runtime.grammar import Grammars
from trtllm.runtime.lora import AdapterError, AdapterSet
from trtllm.runtime.prefix_cache import PrefixCacheWarning
from trtllm.runtime.sampling import SamplingParams
from trtllm.runtime.streams import Streams
from trtllm.runtime.text import TextStream
from trtllm.runtime.tokenizer import Tokenizer

FAILED_TEXT = "trtllm-edge cannot handle this request."


@dataclass
class Prepared:
    """One request turned into ids, or the reason it cannot run."""

    index: int
    request: fmt.Request
    text: str = ""
    system_prefix: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    prefix_ids: tuple[int, ...] = ()  # the system prefix's tokens, when they start prompt_ids
    adapter: object = None            # its LoRA adapter (runtime/lora.py), None for the base model
    bad_words: tuple[tuple[int, ...], ...] = ()  # its bad_words as token sequences (runtime/bans.py)
    guide: object = None              # its guided_decoding's matcher at the start (runtime/grammar.py), checked
    error: str | None = None
    scorer: RowState | None = None    # prompt_logprobs: the sample that scores the prompt for all (the first)
    thinking: bool = False            # the template was given enable_thinking true (reasoning.split)
    images: object = None             # its prompt's images (runtime/media.py PromptImages), None without


@dataclass
class Sample:
    """One of a request's n samples: one batch slot."""

    prepared: Prepared
    sample_idx: int
    row: RowState | None = None
    message: dict | None = None  # what message_of read out of its answer, once it finished
    beam_score: float | None = None  # beam search: its hypothesis' score (runtime/beam.py)


def sampling_params(req: fmt.Request, bad_words: tuple[tuple[int, ...], ...] = (),
                    index: int | None = None) -> SamplingParams:
    """`bad_words`: the request's, tokenized (bans.request_sequences); `index`: its place in the file,
    whose JSON paths an error names (its grammar's: where it was given, guided_decoding or tool_choice)."""
    guide_at = req.guided_decoding.path if req.guided_decoding is not None else None
    return SamplingParams(
        temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
        repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, logit_bias=req.logit_bias, num_logprobs=req.num_logprobs,
        max_new_tokens=req.max_generate_length, min_new_tokens=req.min_new_tokens, stop=req.stop,
        stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos, bad_words=bad_words,
        allowed_token_ids=None if req.allowed_token_ids is None else frozenset(req.allowed_token_ids),
        no_repeat_ngram_size=req.no_repeat_ngram_size,
        where=None if index is None else lambda name: guide_at if name == "guided_decoding" and guide_at
        else req.where(index, name))


def sample_rng(req: fmt.Request, sample_idx: int) -> np.random.Generator:
    """Sample i of a seeded request draws from PCG64(seed + i); unseeded requests get fresh entropy."""
    return np.random.default_rng(None if req.seed is None else req.seed + sample_idx)


class Runner:
    def __init__(self, engine: Engine, tokenizer: Tokenizer, template: ChatTemplate | None,
                 prefixes: PrefixSource | None = None, drafter=None, prefill_chunk: int = 0):
        """`drafter`: an EAGLE engine's draft head (runtime/speculative.py Drafter), or None.
        `prefill_chunk`: while other requests generate, prefill a prompt this many tokens per step
        (0: whole; trtllm-run's --prefill-chunk)."""
        self.engine, self.tokenizer, self.template, self.prefixes = engine, tokenizer, template, prefixes
        self.drafter, self.prefill_chunk = drafter, prefill_chunk
        self.timing = Timing()
        self.contexts = None  # --context-reuse: runtime/context_cache.py's ContextCache
        self.lookup = None  # --spec-ngram: runtime/ngram.py's Lookup; --spec-draft-engine: draft_model.py's DraftModel
        self._grammars = None  # guided decoding's, made when a request first asks for it
        self.cancelled = False  # a Ctrl-C ended the run: unfinished samples are "cancelled"
        # where a request's relative image paths start (trtllm-run: the input file's directory); None:
        # images come as data: URLs only (trtllm-serve: a client's image is in its body)
        self.media_dir = None
        self._images = None  # a vision-language engine's image encoder, made at its first image

    def grammars(self) -> Grammars:
        if self._grammars is None:
            m = self.engine.manifest
            self._grammars = Grammars(self.tokenizer.to_json(), m.model.vocab_size, m.eos_token_ids,
                                      self.tokenizer.vocab_size)
        return self._grammars

    def check_guide(self, p: Prepared) -> str | None:
        """Why the request's guided_decoding cannot run (it does not compile, or allows no first
        token), or None with p.guide set: its matcher, holding that first mask for its samples."""
        guide = p.request.guided_decoding
        if guide is None:
            return None
        try:  # its first step's mask: a grammar that matches nothing says so here
            matcher = self.grammars().matcher(guide)
            error = matcher.bias(np.zeros(self.engine.manifest.model.vocab_size, np.float32), {})
        except ValueError as e:
            return request_checks.uncompiled_tool(p.request, p.index, self.grammars) or str(e)
        except ImportError as e:  # a runtime installed without its dependencies
            return f"`{guide.path}`: guided decoding needs llguidance ({e}): pip install llguidance"
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - anything else llguidance raises (a Rust panic is a
            # BaseException) fails this request, not the run
            return f"`{guide.path}` cannot be used: {type(e).__name__}: {e}"
        if error is None:
            p.guide = matcher
        return error

    def prepare(self, index: int, req: fmt.Request, inp: fmt.InputFile, adapters: AdapterSet,
                counting: bool = False) -> Prepared:
        """The request as ids (`prepared`), or why it cannot run; a failure of ours in doing so is
        that request's error alone. `counting`: only its prompt's ids are wanted (trtllm-serve's
        /tokenize): its grammar is not compiled, and a prompt too long to run is no error."""
        try:
            return self.prepared(index, req, inp, adapters, counting)
        except Exception as e:  # noqa: BLE001 - one request's failure is its own, whatever it is
            return Prepared(index, req, error=f"`requests[{index}]` could not be prepared ({type(e).__name__}: {e}; "
                                              "a bug in trtllm-edge: please report it with this request)")

    def prepared(self, index: int, req: fmt.Request, inp: fmt.InputFile, adapters: AdapterSet,
                 counting: bool = False) -> Prepared:
        p = Prepared(index, req)
        m = self.engine.manifest
        p.error = (request_checks.unsupported(req, index, m) or request_checks.unscored(req, index, m)
                   or beam_requests.unrunnable(req, index, m) or (None if counting else self.check_guide(p)))
        if p.error:
            return p
        if req.lora_name is not None and not counting:  # (an adapter changes no token of the prompt)
            try:
                p.adapter = adapters.get(req.lora_name)
            except AdapterError as e:  # (the input's entry is the value to fix, where it names one)
                where = f"available_lora_weights[{json.dumps(req.lora_name)}]` (`requests[{index}].lora_name`)" \
                    if req.lora_name in adapters.given else f"requests[{index}].lora_name` {req.lora_name!r}"
                p.error = f"`{where}: {e}"
                return p
        if req.prompt_token_ids is not None:  # vLLM's tokens prompt: the ids as they are (no template, no tokenizer)
            p.error = request_checks.unseen_tools(index, req, None) or request_checks.unread_kwargs(index, req, None)
            if p.error:  # (tools and template variables would not reach the model: no template runs)
                return p
            ids, vocab = list(req.prompt_token_ids), m.model.vocab_size
            if m.vision and m.vision["image_token_id"] in ids:  # (no image to give them: messages take images)
                p.error = (f"`requests[{index}].prompt_token_ids[{ids.index(m.vision['image_token_id'])}]` is the "
                           "image token, and token ids come without images: give images as messages' content items")
                return p
            bad = next((j for j, t in enumerate(ids) if t >= vocab), None)
            if bad is not None:  # (input_checks says so too; decoding it would fail otherwise)
                p.error = (f"`requests[{index}].prompt_token_ids[{bad}]` must be a token id below the vocabulary size "
                           f"{vocab}, got {ids[bad]}")
                return p
            fp = FormattedPrompt(text=self.tokenizer.decode(ids, skip_special_tokens=False, clean_up=False),
                                 system_prefix="")
            p.thinking = fp.text.rstrip().endswith("<think>")  # (a prompt that opens the thought, as templated)
            return self.tokenized(p, index, ids, fp, templated=False, counting=counting)
        # Without the template the text goes to the tokenizer as a plain string, so it gets the
        # tokenizer's own special tokens (a base model's BOS), as transformers' tokenizer(text) does;
        # a template writes its special tokens into the text itself.
        templated = inp.apply_chat_template and self.template is not None
        tools = list(req.tools) if req.tools else None  # (a request's [] is none: the docs' "[] none", not a list
        try:
            template = self.template.for_tools(tools) if templated else None  # a template reads as "tools given")
        except ChatTemplateError as e:
            p.error = f"`requests[{index}].tools`: {e}"
            return p
        parts = templated and template.takes_parts
        messages = [{"role": m.role, "content": m.parts() if parts else m.text(), **m.fields()} for m in req.messages]
        p.error = request_checks.unseen_tools(index, req, template) or request_checks.unread_kwargs(index, req,
                                                                                                   template)
        if p.error:
            return p
        try:
            if templated:
                extra = {"enable_thinking": inp.enable_thinking, **(req.chat_template_kwargs or {}),
                         **({"tools": tools} if tools is not None else {})}
                fp = template.format(messages, add_generation_prompt=inp.add_generation_prompt,
                                     default_system_prompt=inp.default_system_prompt,
                                     continue_final_message=req.continue_final_message, **extra)
                # thinking is on where the template reads the switch (SmolLM2's ignores it: the answer
                # has no thought, and a qwen3 split made all of it reasoning), or where its prompt
                # opens the thought itself (Qwen3-Thinking-2507's ends `<think>` whatever it is given)
                p.thinking = (extra["enable_thinking"] is True and template.reads("enable_thinking")
                              or fp.text.rstrip().endswith("<think>"))
            else:
                if inp.default_system_prompt is not None and not any(m["role"] == "system" for m in messages):
                    messages = [{"role": "system", "content": inp.default_system_prompt}, *messages]
                fp = raw_prompt(messages)
        except ChatTemplateError as e:
            p.error = f"`requests[{index}].messages`: the chat template failed: {e}"
            return p
        # (Gemma 3's processor writes each image's tokens into the text before tokenizing: so do we)
        text = fp.text
        if m.vision:
            try:
                text = media.expanded_text(text, m.vision, media.crop_counts(req, index, m.vision, self.media_dir))
            except media.MediaError as e:
                p.error = str(e)
                return p
        ids = self.tokenizer.encode(text, add_special_tokens=not templated)
        if m.vision:
            try:
                ids, p.images = media.place(ids, req, index, m.vision, None if counting else self.image_encoder(),
                                            self.media_dir)
            except media.MediaError as e:
                p.error = str(e)
                return p
        placed = len(ids)
        p = self.tokenized(p, index, ids, fp, templated, counting)
        if p.images is not None and not p.error:
            if len(p.prompt_ids) != placed:  # (its last tokens: an image cut in two, or left out)
                p.error = (f"`{req.where(index, 'truncate_prompt_tokens')}` would cut the prompt's images: "
                           f"it holds {placed} tokens with them")
            elif not counting:
                self.timing.images += p.images.count
                self.timing.image_tokens += len(p.images.positions)
        return p

    def image_encoder(self) -> media.ImageEncoder:
        if self._images is None:
            self._images = media.ImageEncoder(self.engine.engine_dir, self.engine.manifest, lambda: self.timing,
                                              getattr(self.engine, "num_threads", None))
        return self._images

    def tokenized(self, p: Prepared, index: int, ids: list[int], fp: FormattedPrompt, templated: bool,
                  counting: bool = False) -> Prepared:
        """p with its prompt's ids (truncated where the request asks) and its reusable system prefix."""
        req = p.request
        p.text, p.system_prefix, p.prompt_ids = fp.text, fp.system_prefix, ids
        limit = self.engine.manifest.limits.max_input_len
        keep = limit if req.truncate_prompt_tokens == -1 else req.truncate_prompt_tokens
        if keep and keep > limit:  # (vLLM refuses one past the model's length too)
            p.error = (f"`{req.where(index, 'truncate_prompt_tokens')}` must be at most the engine's max_input_len "
                       f"{limit}, or -1 (that), got {keep}")
            return p
        truncated = keep and len(p.prompt_ids) > keep
        if truncated:  # vLLM's: its last tokens (no system prefix starts it then)
            p.prompt_ids, fp = p.prompt_ids[-keep:], dataclasses.replace(fp, system_prefix="")
        if fp.system_prefix:
            # Reusable only if tokenising the prefix alone gives the prompt's first tokens
            # (a BPE merge across the boundary would make the saved KV belong to other tokens).
            prefix = self.tokenizer.encode(fp.system_prefix, add_special_tokens=not templated)
            if p.prompt_ids[: len(prefix)] == prefix:
                p.prefix_ids = tuple(prefix)
        if req.save_system_prompt_kv_cache and not p.prefix_ids:  # (asked, and nothing can be: say so)
            warnings.warn(request_checks.unsaved(req, index, templated, truncated, fp.system_prefix),
                          PrefixCacheWarning, stacklevel=2)
        if not counting:
            p.error = request_checks.token_problem(p, req, index, self.tokenizer, self.engine.manifest)
        return p

    def make_row(self, smp: Sample) -> RowState:
        p, req = smp.prepared, smp.prepared.request
        params = sampling_params(req, p.bad_words, p.index)
        row = RowState(prompt_ids=p.prompt_ids, params=params, rng=sample_rng(req, smp.sample_idx),
                        eos_ids=frozenset(self.engine.manifest.eos_token_ids),
                        text=TextStream(self.tokenizer, req.stop, req.include_stop_str_in_output,
                                        req.skip_special_tokens), prefix_ids=p.prefix_ids,
                        save_prefix=req.save_system_prompt_kv_cache, adapter=p.adapter, images=p.images,
                        guide=p.guide and p.guide.copy(),  # (each sample its own place, the first mask shared)
                        speculative=not req.disable_spec_decode,  # (guided: greedy ones, runtime/speculative.py)
                        guesses=req.spec_proposal_sampling != "greedy",
                        context_lookup=req.context_cache_lookup_policy == "use_cache",
                        context_commit=req.context_cache_commit_policy)
        if req.prompt_logprobs is not None and smp.sample_idx == 0:  # one sample scores the prompt for all
            row.prompt_logprobs, p.scorer = req.prompt_logprobs, row
        return row

    def generate(self, samples: list[Sample], num_slots: int, on_text=None) -> None:
        """Run every sample that can run, num_slots at a time (in-flight: a finished sample's slot
        goes to the next one). `on_text(sample, text, finish_reason, token_ids)` streams text as it
        is made, with the ids generated since the sample's last call (its text may lag them); a
        sample that fails is not ended there (its one error line comes with the responses)."""
        live = [smp for smp in samples if smp.prepared.error is None]
        for smp in live:
            smp.row = self.make_row(smp)
        for smp in samples:
            smp.prepared.guide = None  # (each row has its copy: the checked one's mask goes)
        streams = Streams(self, on_text)
        for smp in live:
            streams.add(smp)
        on_token = streams.on_token

        # trtllm-run: once generation is over (settle), an interrupt waits until the answers are
        # written; before, the first one ends generation, caught below wherever it lands
        try:
            try:
                searched = beam_requests.searched(live)
                beam_requests.answer(self.engine, searched, self.timing, on_token if on_text else None, num_slots,
                                     self.prefixes, self.contexts)
                beams = {id(smp) for smp in searched}
                run_rows(self.engine, [smp.row for smp in live if id(smp) not in beams], num_slots,
                         self.timing,
                         on_token if on_text else None, self.prefixes, self.drafter, self.prefill_chunk,
                         self.contexts, self.lookup)
            except Exception as e:  # the engine itself failed: fail what did not finish, keep the rest
                interrupt.settle()
                for smp in live:  # per sample: a request's finished samples (n > 1) keep their answers
                    if not smp.row.finish_reason:
                        smp.row.fail(f"the engine failed: {type(e).__name__}: {e}")
            interrupt.settle()
        except KeyboardInterrupt:  # Ctrl-C: keep what finished, end the rest with what they have
            interrupt.settle()  # (another one now waits for the answers)
            for smp in live:
                if not smp.row.finish_reason:
                    smp.row.cancel()
                    if on_text:
                        on_token(smp.row)  # its last line: the text held back, and "cancelled"
            self.cancelled = True
        for smp in live:  # a sample with nothing to generate is done when its prompt is scored (prompt_logprobs)
            scorer = smp.prepared.scorer
            ended = scorer is not None and scorer is not smp.row and scorer.finish_reason in ("cancelled", "error")
            if ended and smp.row.max_new_tokens <= 0:
                smp.row.finish_reason, smp.row.error = scorer.finish_reason, scorer.error

    def response(self, smp: Sample) -> dict:
        p, row = smp.prepared, smp.row
        slot = None if row is None else row.batch_idx  # the KV slot it was admitted to; None if it never ran
        res = {"output_text": FAILED_TEXT, "request_idx": p.index, "batch_idx": slot, "finish_reason": "error",
               "messages": [m.to_json() for m in p.request.messages],
               "formatted_system_prompt": p.system_prefix, "formatted_complete_request": p.text}
        if p.request.n > 1:
            res["sample_idx"] = smp.sample_idx
        if p.error is not None or row is None or not row.finish_reason or row.error:
            res["error"] = p.error or (row and row.error) or "the request did not finish"
            return res
        res["finish_reason"] = row.finish_reason
        res["output_text"] = self.answer(smp)
        res.update(self.message_of(smp))  # vLLM's message fields: reasoning, content, tool calls
        # vLLM's and Edge-LLM's forks' counts: every generated id, a final EOS or stop token included
        res.update(output_ids=list(row.output_ids), prompt_tokens=len(row.prompt_ids),
                   output_tokens=len(row.output_ids))
        if row.finish_reason == "stop-words":  # what ended it: the stop string the text is cut at, or the token
            res["stop_reason"] = row.text.stopped_by if row.text.stop_at is not None else row.output_ids[-1]
        if p.request.num_logprobs > 0:
            res["logprobs"] = [self.logprob_step(vals, toks, p.request.num_logprobs) for vals, toks in row.logprobs]
            # each generated token's own logprob, in or out of the top ones (a sampled token may be neither)
            res["token_logprobs"] = [self.logprob_entry(t, v) for t, v in zip(row.output_ids, row.token_logprobs)]
        res.update(self.prompt_logprobs(p))
        if smp.beam_score is not None:
            res["beam_score"] = smp.beam_score
        return res

    def streamed_logprobs(self, smp: Sample, start: int) -> dict:
        """A stream line's `logprobs` and `token_logprobs`: those of its ids (output_ids[start:]), as
        the output file has them, where the request asks for them."""
        row, k = smp.row, smp.prepared.request.num_logprobs
        if not k or len(row.logprobs) < len(row.output_ids):
            return {}
        return {"logprobs": [self.logprob_step(v, t, k) for v, t in row.logprobs[start:]],
                "token_logprobs": [self.logprob_entry(t, v) for t, v in zip(row.output_ids[start:],
                                                                           row.token_logprobs[start:])]}

    def prompt_logprobs(self, p: Prepared) -> dict:
        """vLLM's prompt_logprobs, once the prompt is scored (a cancelled run may not have): the first
        prompt token has none (null), as in vLLM."""
        row, k = p.scorer, p.request.prompt_logprobs
        if row is None or len(row.prompt_scores) != len(row.prompt_ids) - 1:
            return {}
        out = {"prompt_token_logprobs": [None] + [self.logprob_entry(t, own) for t, (own, _, _)
                                                  in zip(row.prompt_ids[1:], row.prompt_scores)]}
        if k:
            out["prompt_logprobs"] = [None] + [self.logprob_step(vals, ids, k) for _, vals, ids in row.prompt_scores]
        return out

    def answer(self, smp: Sample) -> str:
        """A finished sample's output_text."""
        row = smp.row
        if row.text.stop_at is not None:  # (a stop string found: "stop-words", or a replayed beam then cancelled)
            return row.text.final_text()
        return self.tokenizer.decode(row.visible_ids(), smp.prepared.request.skip_special_tokens)

    def message_of(self, smp: Sample) -> dict:
        """vLLM's message fields read out of a finished sample's answer: `reasoning_content` (with a
        reasoning_parser), then `content` and `tool_calls` from the rest (runtime/tool_calls.py);
        none where nothing was read."""
        if smp.message is not None:  # (read for its stream's last line already)
            return smp.message
        p = smp.prepared
        req, text, out = p.request, self.answer(smp), {}
        forced = tool_calls.forced(req.tool_choice)
        if req.reasoning_parser and not forced:  # (a forced call is JSON alone: no thought to split off)
            out["reasoning_content"], text = reasoning.split(text, req.reasoning_parser, p.thinking)
            out["content"] = text
        calls = tool_calls.extract_or_none(text or "", req.tool_choice, req.tool_call_parser, req.tools,
                                           self.calls_key(smp), req.parallel_tool_calls) if req.tools else None
        if calls is not None:
            out["content"], out["tool_calls"] = calls
        smp.message = out
        return out

    @staticmethod
    def calls_key(smp: Sample) -> str:
        """What a sample's call ids are made from besides the call (tool_calls.extract's key)."""
        return f"{smp.prepared.index}\0{smp.sample_idx}\0{smp.prepared.text}"

    def logprob_step(self, values: np.ndarray, ids: np.ndarray, k: int) -> list[dict]:
        """One token's top-k entries (numpy to Python once per step, with tolist: 4,096 tokens x
        50 logprobs made 200,000 numpy scalars)."""
        return [self.logprob_entry(t, v) for v, t in zip(values[:k].tolist(), ids[:k].tolist())]

    def logprob_entry(self, token_id: int, value: float) -> dict:
        raw = self.tokenizer.token_bytes(token_id)  # (cached per id by the tokenizer)
        return {"token_id": token_id, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw),
                "logprob": value if math.isfinite(value) else None}  # -inf: JSON has none

    def run(self, inp: fmt.InputFile, errors: dict[int, str] | None = None, on_text=None,
            adapters: AdapterSet | None = None) -> list[dict]:
        """Answer every request; `errors` (request index -> message) fail requests up front.
        Each request becomes n samples; batch_size of them (at most the engine's max_batch_size) run
        at once, in order. `adapters`: the
        LoRA adapters requests may name (default: the engine's and the input's available_lora_weights,
        relative paths from the current directory)."""
        if adapters is None:
            adapters = AdapterSet.for_run(self.engine, inp.available_lora_weights)
        samples = []
        for i, req in enumerate(inp.requests):
            if i in inp.invalid:  # it could not be read: it fails alone (fmt.parse_input's isolate)
                p = Prepared(i, req, error=inp.invalid[i])
            else:
                p = self.prepare(i, req, inp, adapters)
            if errors and i in errors:  # (both where it has both: fixed in one go, not one run each; once
                # where preparing found what the engine's checks did: a prompt id past the vocabulary)
                p.error = errors[i] if p.error is None or p.error in errors[i] else f"{errors[i]}; {p.error}"
            samples += [Sample(p, k) for k in range(req.n)]
        # batch_size at most the engine's max_batch_size: the rest waits for a free slot
        self.generate(samples, min(inp.batch_size, self.engine.manifest.limits.max_batch_size), on_text)
        return [self.response(smp) for smp in samples]

    def warm_up(self, inp: fmt.InputFile, times: int, adapters: AdapterSet | None = None,
                failing: frozenset[int] = frozenset()) -> None:
        """Edge-LLM's --warmup: answer the first request that can run (not unreadable, not in
        `failing`, prepared without an error) `times` times before the run, with no saved
        system-prompt KV read or written (the run's own reuse stays what it would be) and nothing
        streamed; the profile then starts afresh. A Ctrl-C sets `cancelled` and ends it."""
        if times <= 0:
            return
        if adapters is None:
            adapters = AdapterSet.for_run(self.engine, inp.available_lora_weights)
        first = next((i for i, req in enumerate(inp.requests) if i not in inp.invalid and i not in failing
                      and self.prepare(i, req, inp, adapters).error is None), None)  # (one that runs)
        if first is None:
            return
        req = dataclasses.replace(inp.requests[first], save_system_prompt_kv_cache=False)
        one = dataclasses.replace(inp, requests=(req,), invalid={})
        (prefixes, contexts), self.prefixes, self.contexts = (self.prefixes, self.contexts), None, None
        try:
            for _ in range(times):
                if self.cancelled:
                    break
                self.run(one, adapters=adapters)  # (which settles interrupts as it ends: resumed)
                self.cancelled = self.cancelled or not interrupt.resume()
        finally:
            self.prefixes, self.contexts = prefixes, contexts
            if self._images is not None:  # (the run encodes its images as without a warm-up, as it keeps no KV of it)
                self._images.kept.clear()
        self.timing = Timing()

    def profile(self) -> dict:
        """The --profile file's object (runtime/run_profile.py)."""
        return run_profile.of(self)
