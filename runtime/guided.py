"""Guided decoding (structured output): a request's `guided_decoding` confines its answer to a JSON
schema, any JSON object, a regular expression, a grammar or a list of choices.

At each step the grammar's matcher (llguidance, the library onnxruntime-genai and TensorRT-LLM use)
says which tokens may come next; every other token gets a logit bias of -inf on the row's
`logit_bias` input (stage 1 of the sampler, docs/sampling.md), so the sampler, greedy or not, draws
only among them and the logprobs are those of that constrained distribution. EOS is allowed exactly
where the grammar is complete, so an answer that ends with end-of-sequence is a whole match.

This module is stdlib only (the input reader runs it on the device); runtime/grammar.py compiles a
guide and masks with it, importing llguidance when a run first asks, so a run without guides never
loads it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from trtllm.runtime import gbnf, structural_tag
from trtllm.runtime.strict_json import (array, boolean, check_keys, check_value, compact, fail, json_object,
                                        key_path, read_json, string)

KINDS = ("json_schema", "json_object", "regex", "ebnf", "choice", "structural_tag")
MAX_CHOICES = 1024
MAX_GUIDE_BYTES = 128 * 1024  # a schema, pattern or grammar, UTF-8 bytes


@dataclass(frozen=True, slots=True)
class Guide:
    kind: str  # one of KINDS
    text: str  # the schema as JSON, the pattern, the grammar, or the choices as a JSON array
    path: str  # where the input gave it (`requests[2].guided_decoding.regex`), for compile errors

    def grammar(self, special: dict[str, int] | None = None) -> str:
        """llguidance's grammar for it (raises ValueError where it does not compile); `special`: the
        tokenizer's special tokens, which a structural tag's trigger may be."""
        from llguidance import LLMatcher, grammar_from

        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema('{"type": "object"}')
        if self.kind == "structural_tag":
            return structural_tag.lark(json.loads(self.text), special)
        if self.kind == "ebnf":  # GBNF or Lark, chosen here (gbnf.py)
            return grammar_from("ebnf", gbnf.llama_cpp(self.text)) if gbnf.is_gbnf(self.text) else \
                grammar_from("lark", self.text)
        return grammar_from(self.kind, self.text)  # (its formats are named as KINDS are)


def _sized(text: str, path: str, value: object) -> str:
    size = len(text.encode("utf-8"))
    if size > MAX_GUIDE_BYTES:
        fail(path, f"at most {MAX_GUIDE_BYTES} UTF-8 bytes (128 KiB)", value, shown=f"{size} bytes")
    return text


_check_schema = check_value  # (a schema's values: what every other field of the file is held to)


OPENAI_WRAPPER = {"name", "schema", "strict", "description"}


def parse(value: object, path: str) -> Guide:
    """`guided_decoding`: an object with exactly one key of KINDS."""
    obj = json_object(value, path, "one of " + ", ".join(KINDS))
    check_keys(obj, path, KINDS, "guided_decoding")
    if len(obj) != 1:
        fail(path, f"an object with exactly one of {', '.join(KINDS)}", value, shown=f"{len(obj)} keys")
    (kind, v), = obj.items()
    at = key_path(path, kind)
    if kind == "json_object":
        if not boolean(v, at):
            fail(at, "true (omit guided_decoding for no constraint)", v)
        return Guide(kind, "", at)
    if kind == "json_schema":
        what = "a JSON schema (an object or a boolean, or a string of JSON holding one)"
        if isinstance(v, str):  # a schema written as a string of JSON, as some clients send it
            v = read_json(v, at, what)
        if isinstance(v, dict) and "schema" in v and set(v) <= OPENAI_WRAPPER:
            # OpenAI's response_format.json_schema, {"name", "schema", "strict"}: read as a schema
            # it has no keyword and would allow any JSON (the answer went unconstrained)
            v, at = v["schema"], key_path(at, "schema")
            if isinstance(v, str):
                v = read_json(v, at, what)
        if not isinstance(v, (dict, bool)):
            fail(at, what, v)
        _check_schema(v, at)
        return Guide(kind, _sized(compact(v, at, what), at, v), at)
    if kind == "structural_tag":
        tags = structural_tag.parse(v, at, read_json, _check_schema)
        return Guide(kind, _sized(compact(tags, at, "a structural tag"), at, v), at)
    if kind == "choice":
        items = array(v, at, "non-empty strings", MAX_CHOICES)
        if not items:
            fail(at, f"a non-empty array of at most {MAX_CHOICES} non-empty strings", v)
        choices = [string(c, f"{at}[{i}]", nonempty=True) for i, c in enumerate(items)]
        return Guide(kind, _sized(compact(choices, at, "choices"), at, v), at)
    return Guide(kind, _sized(string(v, at, nonempty=True), at, v), at)
