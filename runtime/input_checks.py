"""Per-request checks of an input file that need the engine (its vocabulary, its sampler's top-k
limit): each problem fails that request alone, with a message naming the JSON path."""

from __future__ import annotations

from trtllm.runtime.input_format import InputFile


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")


def check_against_engine(inp: InputFile, vocab_size: int) -> list[tuple[int, str]]:
    """Per-request problems that need the engine: (request index, message naming the JSON path).

    Token ids in `logit_bias`, `stop_token_ids`, `allowed_token_ids` and `prompt_token_ids` must be
    below `vocab_size`."""
    _check_positive("vocab_size", vocab_size)
    problems = []
    for i, req in enumerate(inp.requests):
        if i in inp.invalid:  # failed already
            continue
        bias_path, stop_path = req.where(i, "logit_bias"), req.where(i, "stop_token_ids")
        bad = [(f'{bias_path}["{token_id}"]', token_id) for token_id in sorted(req.logit_bias)]
        bad += [(f"{stop_path}[{j}]", token_id) for j, token_id in enumerate(req.stop_token_ids)]
        allowed_path = req.where(i, "allowed_token_ids")
        bad += [(f"{allowed_path}[{j}]", token_id) for j, token_id in enumerate(req.allowed_token_ids or ())]
        bad += [(f"requests[{i}].prompt_token_ids[{j}]", token_id)
                for j, token_id in enumerate(req.prompt_token_ids or ())]
        problems += [(i, f"`{path}` must be a token id below the vocabulary size {vocab_size}, "
                         f"got {token_id}") for path, token_id in bad if token_id >= vocab_size]
    return problems


def check_limits(inp: InputFile, max_top_k: int, vocab_size: int) -> list[tuple[int, str]]:
    """Per-request settings the engine's sampler cannot run: (request index, message).

    The sampler's top-k/top-p work among the `max_top_k` most likely tokens (manifest.json), so a
    `top_k` between that and the vocabulary size cannot be honoured; `>= vocab_size` means all. A
    greedy request (temperature 0) or a beam search does not sample: its top_k plays no part."""
    _check_positive("max_top_k", max_top_k)
    _check_positive("vocab_size", vocab_size)
    return [(i, f"`{req.where(i, 'top_k')}` must be <= {max_top_k} (the engine's sampler limit) "
                f"or >= the vocabulary size {vocab_size} (all tokens), got {req.top_k}")
            for i, req in enumerate(inp.requests) if i not in inp.invalid and max_top_k < req.top_k < vocab_size
            and req.temperature != 0 and req.num_beams <= 1]
