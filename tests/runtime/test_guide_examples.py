"""The examples of TensorRT Edge-LLM's input-format guide (transcribed) all run: text ones answer,
those needing features this engine lacks (images, LoRA) fail alone."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.hf

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
EXAMPLES = {
    "basic": ({"batch_size": 1, "max_generate_length": 16,
               "requests": [{"messages": [{"role": "user", "content": "What is machine learning?"}]}]}, ["ok"]),
    "multi_turn": ({"requests": [{"messages": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "What is the population?"}]}], "max_generate_length": 16}, ["ok"]),
    "full_header": ({"batch_size": 1, "temperature": 1.0, "top_p": 0.8, "top_k": 50, "max_generate_length": 16,
                     "apply_chat_template": True, "enable_thinking": False, "available_lora_weights": {},
                     "requests": [{"messages": [SYSTEM, {"role": "user", "content": "Introduce NVIDIA."}],
                                   "save_system_prompt_kv_cache": False, "disable_spec_decode": False,
                                   "stop": ["optional_stop_string"]}]}, ["ok"]),
    "multimodal": ({"requests": [{"messages": [{"role": "user", "content": [
        {"type": "image", "image": "/path/to/image.jpg"}, {"type": "text", "text": "Describe this image."}]}]}]},
        ["error"]),
    "lora": ({"available_lora_weights": {"french": "/path/to/french_adapter.safetensors"},
              "requests": [{"messages": [{"role": "user", "content": "Translate to French."}],
                            "lora_name": "french"}]}, ["error"]),
    "system_prompt_cache": ({"requests": [{"messages": [{"role": "system", "content": "Long system prompt..."},
                                                         {"role": "user", "content": "Question?"}],
                                           "save_system_prompt_kv_cache": True}]}, ["ok"]),
    "raw_format": ({"apply_chat_template": False, "max_generate_length": 16, "requests": [
        {"messages": [{"role": "user", "content": "Raw text without special tokens"}]}]}, ["ok"]),
    "disable_spec_decode": ({"max_generate_length": 16, "requests": [
        {"messages": [{"role": "user", "content": "Your question here"}], "disable_spec_decode": True}]}, ["ok"]),
    "stop_strings": ({"max_generate_length": 16, "requests": [
        {"messages": [{"role": "user", "content": "Write a short answer ending before '###'."}],
         "stop": ["###", "\n\nUser:"]}]}, ["ok"]),
    "batch_mixed": ({"batch_size": 2, "max_generate_length": 16, "requests": [
        {"messages": [SYSTEM, {"role": "user", "content": "What is machine learning?"}]},
        {"messages": [SYSTEM, {"role": "user", "content": [{"type": "image", "image": "diagram.png"},
                                                          {"type": "text", "text": "Explain this diagram."}]}]}]},
        ["ok", "error"]),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_guide_example_runs(name, run_cli, tiny_engine):
    payload, expected = EXAMPLES[name]
    result, out = run_cli(tiny_engine("llama"), payload)
    assert result.exit_code == (1 if "error" in expected else 0), result.output
    got = ["error" if r["finish_reason"] == "error" else "ok" for r in out["responses"]]
    assert got == expected
    for r in out["responses"]:
        if r["finish_reason"] == "error":
            assert r["error"]
        else:
            assert r["finish_reason"] in ("end-of-sequence", "max-length", "stop-words")
