"""A GGUF's keys checked against what it holds, before transformers' GGUF loader reads it (which
takes defaults for missing keys, drops layers it has no place for and respells some tokens: the
build's check, comparing with the same loader's model, would pass a wrong engine)."""
from __future__ import annotations

import re

from trtllm.builder.config import CheckpointError, listed


# The keys llama.cpp will not load a model without (transformers' loader takes its defaults instead:
# a context of 2048, an epsilon of 1e-6)
GGUF_REQUIRED = ("context_length", "embedding_length", "block_count", "attention.head_count",
                 "attention.layer_norm_rms_epsilon")


def layout(reader, value, arch: str, path: str) -> None:
    """What the file's keys must agree with, refused where they do not (the build's check would pass
    a wrong model, or a wrong tokenizer, as it compares with the same loader's): the keys llama.cpp
    requires, a qwen3 head size other than 128 (the loader reads 128), layers past block_count (it
    drops them without a word), and control tokens of
    a byte-level vocabulary written outside its byte alphabet (DeepSeek-R1-Distill's
    `<｜User｜>`: the loader respells them, and they are split into bytes or added twice)."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # (GPT-2's byte-level alphabet)

    missing = [f"{arch}.{key}" for key in GGUF_REQUIRED if value(f"{arch}.{key}") is None]
    if missing:
        raise CheckpointError(f"--model {path!r} lacks {listed(missing, 5)}, which llama.cpp requires (transformers' "
                              "GGUF loader would take its defaults)")
    head = value("qwen3.attention.key_length") if arch == "qwen3" else None
    if head is not None and int(head) != 128:  # (its qwen3 mapping leaves the key out: Qwen3Config's 128)
        raise CheckpointError(f"--model {path!r} is a qwen3 GGUF with heads of {int(head)} "
                              "(qwen3.attention.key_length), which transformers' GGUF loader reads as 128, Qwen3's "
                              "default: build from the Hugging Face checkpoint directory instead")
    count = int(value(f"{arch}.block_count"))
    past = [t.name for t in reader.tensors if (m := re.match(r"blk\.(\d+)\.", t.name)) and int(m.group(1)) >= count]
    if past:
        raise CheckpointError(f"--model {path!r} holds tensors of layers past its {arch}.block_count ({count}): "
                              f"{listed(past, 4)}, which transformers' GGUF loader would drop")
    if value("tokenizer.ggml.model") != "gpt2" or "tokenizer.ggml.token_type" not in reader.fields:
        return
    alphabet = set(bytes_to_unicode().values())  # (the loader's own test: a space is outside it too)
    tokens, types = reader.fields["tokenizer.ggml.tokens"], reader.fields["tokenizer.ggml.token_type"]
    odd = [text for i, text in ((i, bytes(tokens.parts[tokens.data[i]]).decode("utf-8", "replace"))
                                for i in range(len(tokens.data)))
           if int(types.parts[types.data[i]][0]) in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)
           and not set(text) <= alphabet]
    if odd:
        raise CheckpointError(f"--model {path!r} has control tokens written outside its byte-level vocabulary's "
                              f"alphabet ({listed(odd, 4)}), which transformers' GGUF loader respells: they would be "
                              "split into bytes, or added again. Build from the Hugging Face checkpoint directory")
