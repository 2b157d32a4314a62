"""A GGUF's tokenizer as the build reads it: its own (never files beside it), its named chat
templates, its control tokens, llama.cpp's text split (tokenizer.ggml.pre), and no chat template."""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from trtllm.builder import checkpoint  # noqa: E402
from trtllm.builder import gguf as gguf_loader  # noqa: E402

from tests.gguf_files import write_llama_gguf  # noqa: E402

pytestmark = pytest.mark.hf


def test_a_gguf_beside_another_models_files_reads_its_own(untied_llama, tmp_path):
    """transformers prefers a tokenizer.json (and a config.json) beside the GGUF to what the file
    holds: a review's GGUF next to SmolLM2's files got a 49,152-token tokenizer, and the build's
    check, comparing numbers only, passed. The file's own are read."""
    import shutil

    (tmp_path / "a").mkdir()
    alone = checkpoint.load(str(write_llama_gguf(untied_llama, tmp_path / "a" / "m.gguf")))
    beside = tmp_path / "b"
    beside.mkdir()
    write_llama_gguf(untied_llama, beside / "m.gguf")
    other = tmp_path / "other"
    from tests.tiny_models import make_checkpoint

    make_checkpoint("qwen2", other, num_layers=1)
    vocab = (other / "tokenizer.json").read_text()
    (other / "tokenizer.json").write_text(vocab.replace('"Ġ', '"Ġx'))  # (another vocabulary)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(other / name, beside / name)
    got = checkpoint.load(str(beside / "m.gguf"))
    assert got.tokenizer.get_vocab() == alone.tokenizer.get_vocab()
    assert got.model.config.num_hidden_layers == alone.model.config.num_hidden_layers == 2


def test_a_ggufs_named_chat_templates_are_kept(untied_llama, tmp_path):
    """llama.cpp's converter writes a tool_use template beside the default (Hermes 2 Pro/3, Command R):
    transformers' loader kept the default alone, and a request with tools was refused."""
    path = write_llama_gguf(untied_llama, tmp_path / "m.gguf", fields={
        "tokenizer.chat_template": "{{ messages[0].content }}", "tokenizer.chat_template.tool_use": "{{ tools }}"})
    templates = checkpoint.load(str(path)).tokenizer.chat_template
    assert templates == {"default": "{{ messages[0].content }}", "tool_use": "{{ tools }}"}
    # alone, it is kept too: the engine renders requests with tools by it (and refuses the others)
    path = write_llama_gguf(untied_llama, tmp_path / "alone.gguf", fields={"tokenizer.chat_template.tool_use": "T"})
    tok = checkpoint.load(str(path)).tokenizer
    assert tok.chat_template == {"tool_use": "T"}
    tok.save_pretrained(tmp_path / "engine")
    from trtllm.runtime.chat_template import ChatTemplate

    ours = ChatTemplate.from_engine_dir(tmp_path / "engine")
    assert ours.tools_only and ours.for_tools([{"type": "function"}]).render([]) == "T"


@pytest.mark.parametrize("token", ["<｜User｜>", "<|im start|>"])
def test_control_tokens_outside_the_byte_alphabet_are_refused(untied_llama, tmp_path, monkeypatch, token):
    """DeepSeek-R1-Distill's `<｜User｜>`, or a space (GPT-2's alphabet writes it Ġ): transformers'
    loader respells such tokens (a review saw them split into bytes, or added again past the
    embedding): refused, naming them."""
    import gguf

    add_list = gguf.GGUFWriter.add_token_list

    def respelled(self, tokens):
        add_list(self, [token if t == "<|im_start|>" else t for t in tokens])

    monkeypatch.setattr(gguf.GGUFWriter, "add_token_list", respelled)
    path = write_llama_gguf(untied_llama, tmp_path / "m.gguf")
    with pytest.raises(checkpoint.CheckpointError, match="control tokens written outside its byte-level vocabulary's "
                                                         f"alphabet .*{re.escape(token)}"):
        checkpoint.load(str(path))


@pytest.mark.parametrize("pre, want", [("smollm", ["x", "ĠĠ", "1", "2"]), ("starcoder", ["x", "ĠĠ", "1", "2"]),
                                       ("mellum", ["x", "Ġ", "Ġ12"]), ("gpt-2", ["x", "Ġ", "Ġ12"])])
def test_the_text_is_split_as_llama_cpp_splits_it(untied_llama, tmp_path, monkeypatch, pre, want):
    """tokenizer.ggml.pre says how llama.cpp splits text before merging. SmolLM's (the demo model's)
    and StarCoder's split each digit off first, which transformers' GGUF loader does not know: it split
    as GPT-2, so "\n\n1" came as three tokens where llama.cpp (and SmolLM2's own tokenizer.json)
    has two, and the answers changed. The wrong variant, the loader's split, is GPT-2's."""
    path = write_llama_gguf(untied_llama, tmp_path / "t.gguf", pre=pre)
    split = lambda: [piece for piece, _ in checkpoint.load(str(path)).tokenizer.backend_tokenizer  # noqa: E731
                     .pre_tokenizer.pre_tokenize_str("x  12")]
    assert split() == want
    if pre == "smollm":
        monkeypatch.setattr(gguf_loader, "pre_tokenizer", lambda *args: False)
        assert split() == ["x", "Ġ", "Ġ12"]


@pytest.mark.parametrize("pre, said", [("deepseek-llm", "tokenizer.ggml.pre 'deepseek-llm'"),
                                       ("default", "tokenizer.ggml.pre 'default'"),
                                       (None, "no tokenizer.ggml.pre \\(llama.cpp's default split\\)")])
def test_a_text_split_the_loader_does_not_make_is_refused(untied_llama, tmp_path, pre, said):
    """llama.cpp's "default" split (also where the key is missing) takes punctuation and digit runs
    first: not GPT-2's, which the loader would make."""
    path = write_llama_gguf(untied_llama, tmp_path / "t.gguf", pre=pre)
    with pytest.raises(checkpoint.CheckpointError, match=f"{said}, a text split transformers' GGUF loader does "
                                                         "not make"):
        checkpoint.load(str(path))
    assert checkpoint.load(str(write_llama_gguf(untied_llama, tmp_path / "l.gguf", pre="llama-bpe")))  # (it knows)



def test_a_gguf_without_a_chat_template_builds_with_a_note_that_fits_it(untied_llama, tmp_path):
    """No tokenizer.chat_template: the build says so, and, a GGUF being read alone (a template
    beside it is never read), names what helps: the checkpoint directory or the GGUF's own key."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    path = write_llama_gguf(untied_llama, tmp_path / "plain.gguf")
    logs: list[str] = []
    build(BuildConfig(model=str(path), output=str(tmp_path / "engine"), max_batch_size=1, max_input_len=16,
                      max_kv_cache_capacity=64, verify=False), log=logs.append)
    note = next(line for line in logs if line.startswith("note: the checkpoint has no chat template"))
    assert "write tokenizer.chat_template into the GGUF" in note and "chat_template.jinja" not in note
