"""Why one request cannot run on this engine, found while it is prepared (runtime/runner.py): each
reason fails that request alone, naming the setting's JSON path. Checks that need no engine are
the input file's (runtime/input_format.py); those of ids against the vocabulary, input_checks.py."""
from __future__ import annotations

from trtllm.runtime import bans, grammar, tool_calls
from trtllm.runtime import input_format as fmt


def unsupported(req: fmt.Request, index: int, manifest=None) -> str | None:
    """Features this engine cannot serve yet: the request fails, its neighbours do not."""
    media = req.media_types()
    if media and not (manifest is not None and manifest.vision):
        return f"`requests[{index}].messages` contain {', '.join(sorted(media))} content: this engine is text-only"
    if media - {"image"}:
        return (f"`requests[{index}].messages` contain {', '.join(sorted(media - {'image'}))} content: this engine "
                "takes images only")
    return None


def unscored(req: fmt.Request, index: int, manifest) -> str | None:
    """Why the engine cannot give the request's prompt_logprobs: its graph has no verify_logits."""
    m = manifest
    if req.prompt_logprobs is None or m.prompt_logits:
        return None
    where = req.where(index, "prompt_logprobs")
    why = ("a TensorRT plan does not give them" if m.backend == "tensorrt" else
           "it was built before they were; rebuild it with trtllm-build")
    return f"`{where}`: the engine's graph does not give every prompt position's logits ({why})"


def unseen_tools(index: int, req: fmt.Request, template) -> str | None:
    """Why the request's tools, or its messages' tool calls, would not reach the model: a
    template that never reads them (or none) would leave it unaware of them."""
    calls = next((i for i, m in enumerate(req.messages) if "tool_calls" in m.fields()), None)
    if req.tools:
        where, shown = req.where(index, "tools"), "tools"
    elif calls is not None:
        where, shown = f"requests[{index}].messages[{calls}].tool_calls", "tool calls"
    else:
        return None
    if template is None:
        return f"`{where}` needs the chat template (apply_chat_template, and an engine with one)"
    if shown == "tools" and not template.reads("tools") and any(
            name.endswith("_tools") and template.reads(name) for name in req.chat_template_kwargs or ()):
        return None  # (SmolLM3's template shows its tools from xml_tools: the request gives them there)
    if not (template.reads("tools") if shown == "tools" else "tool_calls" in template.source):
        return f"`{where}`: the engine's chat template does not show {shown} to the model"
    return None


def unsaved(req: fmt.Request, index: int, templated: bool, truncated: bool, system_prefix: str) -> str:
    """Why a request that asks to save its system prompt's KV saves nothing (a warning: its answer
    is the same, only later runs recompute the prompt)."""
    why = ("without the chat template a prompt has no system prompt to save" if not templated else
           "truncate_prompt_tokens cut the prompt's start" if truncated else
           "the chat template gives this prompt no system prompt" if not system_prefix else
           "a BPE merge joins the system prompt's last token to the text after it, so its tokens alone are not "
           "the prompt's first ones")
    return f"`{req.where(index, 'save_system_prompt_kv_cache')}`: nothing is saved: {why}"


def unread_kwargs(index: int, req: fmt.Request, template) -> str | None:
    """Why a chat_template_kwargs variable would change nothing: no template, or one that never
    reads it (the setting would be silently lost)."""
    if not req.chat_template_kwargs:
        return None
    where = req.where(index, "chat_template_kwargs")
    if template is None:
        return f"`{where}` needs the chat template (apply_chat_template, and an engine with one)"
    unread = [name for name in req.chat_template_kwargs if not template.reads(name)]
    return f"`{where}.{unread[0]}`: the engine's chat template does not read it" if unread else None


def token_problem(p, req: fmt.Request, index: int, tokenizer, manifest) -> str | None:
    """Why the request cannot run with its prompt tokenized (`p`: runner.Prepared, whose bad_words
    it sets): a bad word with a token past the vocabulary, bans that leave no first token whatever
    the model says, a prompt empty or longer than max_input_len."""
    if req.bad_words:
        p.bad_words, error = bans.request_sequences(req.bad_words, tokenizer.encode, manifest.model.vocab_size,
                                                    req.where(index, "bad_words"))
        if error:
            return error
    if req.allowed_token_ids is not None:
        held = frozenset(req.stop_token_ids) | frozenset(() if req.ignore_eos else manifest.eos_token_ids)
        n = req.no_repeat_ngram_size
        why = bans.dead_end(frozenset(req.allowed_token_ids), p.bad_words, held if req.min_new_tokens else frozenset(),
                            bans.RepeatedNgrams(n, p.prompt_ids).banned() if n else frozenset())
        if why:
            return f"`{req.where(index, 'allowed_token_ids')}`: {why}: no token could come"
    limit = manifest.limits.max_input_len
    prompt = f"requests[{index}].{'messages' if req.prompt_token_ids is None else 'prompt_token_ids'}"
    if not p.prompt_ids:
        return f"`{prompt}`: the prompt is empty: there is nothing to generate from"
    if len(p.prompt_ids) > limit:
        asked = (manifest.build_config or {}).get("max_input_len")
        # (a build asked for more and was lowered to the model's positions: a rebuild cannot raise it)
        lowered = isinstance(asked, int) and asked > limit
        if p.images is not None:  # (truncating would cut an image: fewer tiles or pixels are the way)
            arch = manifest.vision["architecture"]
            # (Gemma 3's images are 256 tokens each, and their pan-and-scan crops as many: fewer crops)
            knob = "--max-image-tiles" if arch in ("internvl", "idefics3") or manifest.vision["preprocess"].get(
                "pan_and_scan") else None if arch == "gemma3" else "--max-image-tokens" if arch == "gemma4" \
                else "--max-image-pixels"
            more = " (the model's position limit)" if lowered else "; rebuild with a larger --max-input-len"
            return (f"`{prompt}`: the prompt is {len(p.prompt_ids)} tokens, {len(p.images.positions)} of them its "
                    f"images', more than the engine's max_input_len {limit}{more}, or give fewer "
                    + (f"or smaller images (or rebuild with a lower {knob})" if knob else "images"))
        fix = " (the model's position limit: a rebuild cannot raise it); give" if lowered \
            else "; rebuild with a larger --max-input-len, or give"
        return (f"`{prompt}`: the prompt is {len(p.prompt_ids)} tokens, more than the engine's "
                f"max_input_len {limit}{fix} truncate_prompt_tokens (-1 keeps its last max_input_len)")
    return None


def uncompiled_tool(req: fmt.Request, index: int, grammars) -> str | None:
    """A forced tool choice whose grammar does not compile: the tool whose parameters do not alone,
    by its path (the choice itself is sound); `grammars()`: the run's runtime/grammar.py Grammars."""
    if not tool_calls.forced(req.tool_choice) or not req.tools:
        return None
    tools = [(f"{req.where(index, 'tools')}[{j}].function.parameters", tool["function"].get("parameters"))
             for j, tool in enumerate(req.tools) if isinstance(tool.get("function"), dict)
             and req.tool_choice.name in (None, tool["function"].get("name"))]
    try:
        return grammar.first_schema_error([(at, schema) for at, schema in tools if schema is not None],
                                          grammars().tokenizer())
    except Exception:  # noqa: BLE001 - only a better message: the whole grammar's error stands
        return None
