"""--sampling-defaults model: the sampling transformers' `generate()` does with a model's
generation_config.json, as an input file's top-level settings. Stdlib only: this runs on the device."""
from __future__ import annotations

from trtllm.runtime.strict_json import fail as _fail

# Our setting -> the generation_config.json key it is read from, where the names differ
CONFIG_NAMES = {"max_generate_length": "max_new_tokens"}


def model_defaults(config: dict) -> dict:
    """The sampling transformers' generate() does with a model's generation_config.json, as
    top-level settings: greedy unless it sets do_sample, else its temperature; its top_k and top_p
    (GenerationConfig's 50 and 1.0 where it has none) and min_p, which a request that samples
    itself (its own temperature) uses too; its repetition_penalty and no_repeat_ngram_size, its
    max_new_tokens as max_generate_length, and without do_sample its num_beams, length_penalty and early_stopping
    (beam search)."""
    def given(name: str, default=None):
        return config[name] if config.get(name) is not None else default

    if not isinstance(given("do_sample", False), bool):  # (transformers refuses it too)
        _fail("do_sample", "true or false", config["do_sample"])
    if given("do_sample") and given("temperature", 1.0) == 0:  # transformers: "has to be a strictly positive float"
        _fail("temperature", "above 0 with `do_sample` (greedy is do_sample false)", 0)
    out = {"temperature": given("temperature", 1.0) if given("do_sample") else 0,
           "top_k": given("top_k", 50), "top_p": given("top_p", 1.0)}
    for ours in ("min_p", "repetition_penalty", "no_repeat_ngram_size", "max_generate_length"):
        name = CONFIG_NAMES.get(ours, ours)
        if given(name) is not None:
            out[ours] = config[name]
    if not given("do_sample") and given("num_beams", 1) != 1:  # beam search (not beam sampling: do_sample)
        out.update((name, config[name]) for name in ("num_beams", "length_penalty", "early_stopping")
                   if given(name) is not None)
    return out
