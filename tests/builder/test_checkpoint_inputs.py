"""How checkpoints are stored in the wild (builder/checkpoint.py): what loads as the model it is,
and what is refused with one line naming --model and the file or field (exit 2), never a library's
advice that leads nowhere or a build of a model other than the checkpoint's."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from trtllm.builder.cli import main

pytestmark = pytest.mark.hf
LIMITS = ["--max-batch-size", "1", "--max-input-len", "32", "--max-kv-cache-capacity", "64"]


def edited(tiny_checkpoint, tmp_path, **config):
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("llama"), model)
    if config:
        path = model / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return model


def build(model, tmp_path, *extra):
    return CliRunner().invoke(main, ["--model", str(model), "--output", str(tmp_path / "e"), *LIMITS, *extra])


def bad_generation_config(model):
    (model / "generation_config.json").write_text('{"eos_token_id": [2, 5], "temperature": 0.6,}')


def other_head_dim(model):
    path = model / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "head_dim": 32}))


def no_fast_tokenizer(model):  # (a class with no fast form: transformers loads it slow, beside tokenizer.json)
    path = model / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_class": "ByT5Tokenizer"}))


def string_eps(model):
    path = model / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rms_norm_eps": "1e-6"}))


@pytest.mark.parametrize("damage, needle", [
    # transformers passes over a generation_config.json it cannot read: its eos ids would be lost
    (bad_generation_config, "generation_config.json' is not a valid JSON file"),
    # transformers' own error speaks of ignore_mismatched_sizes, an option nobody set
    (other_head_dim, "has other shapes for weights the model needs: model.layers.0.self_attn.k_proj.weight"),
    (no_fast_tokenizer, "its tokenizer (ByT5Tokenizer) has no fast (tokenizer.json) form"),
    # the reason is on the error's second line
    (string_eps, "Validation error for field 'rms_norm_eps': TypeError: Field 'rms_norm_eps' expected float"),
])
def test_a_checkpoint_stored_wrong_is_one_line_naming_it(tiny_checkpoint, tmp_path, damage, needle):
    model = edited(tiny_checkpoint, tmp_path)
    damage(model)
    result = build(model, tmp_path)
    assert result.exit_code == 2 and f"--model '{model}'" in result.output and needle in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "e").exists()


@pytest.mark.parametrize("method", ["bitsandbytes", "compressed-tensors"])
def test_a_pre_quantized_checkpoint_is_refused_by_its_config(tiny_checkpoint, tmp_path, method):
    """transformers would ask for optimum or gptqmodel, then load packed integer modules the builder
    cannot read: the config says what it is."""
    model = edited(tiny_checkpoint, tmp_path, quantization_config={"quant_method": method, "bits": 4})
    result = build(model, tmp_path)
    assert result.exit_code == 2, result.output
    assert f"config.quantization_config (quant_method '{method}'): a pre-quantized checkpoint" in result.output
    assert "pip install" not in result.output


@pytest.mark.parametrize("key", ["_attn_implementation", "attn_implementation"])
def test_a_config_that_names_flash_attention_builds_as_the_model(tiny_checkpoint, tmp_path, key):
    """A fine-tune saved with flash_attention_2 names a GPU kernel, not a property of the model."""
    model = edited(tiny_checkpoint, tmp_path, **{key: "flash_attention_2"})
    result = build(model, tmp_path)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "e" / "verify.json").read_text())["tokens_agree"]


def test_the_weights_hash_is_of_what_transformers_loads(tiny_checkpoint, tmp_path):
    """Mistral's repositories ship consolidated.safetensors beside the shards; training state sits
    beside weights: neither is the model, and the engine's source hash does not read them."""
    plain = edited(tiny_checkpoint, tmp_path)
    assert build(plain, tmp_path).exit_code == 0
    want = json.loads((tmp_path / "e" / "manifest.json").read_text())["source"]["sha256"]
    (plain / "consolidated.safetensors").write_bytes(b"\0" * 4096)
    (plain / "training_args.bin").write_bytes(b"\1" * 64)
    shutil.rmtree(tmp_path / "e")
    assert build(plain, tmp_path).exit_code == 0
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["source"]["sha256"] == want
    # shards and their index beside the single file: transformers loads the single file, and so is it hashed
    from trtllm.builder.weight_files import loaded_weight_files

    (plain / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    assert loaded_weight_files(plain) == [plain / "model.safetensors"]


def test_a_sentencepiece_only_tokenizer_builds_and_encodes_as_transformers(tmp_path):
    """tokenizer.model without tokenizer.json (older Llama and Mistral repositories): converted with
    sentencepiece (the builder's extra), its ids the same in the runtime's tokenizer."""
    import sentencepiece
    import torch
    import transformers
    from transformers import AutoTokenizer

    from trtllm.runtime.tokenizer import Tokenizer

    lines = ["The quick brown fox jumps over the lazy dog.", "Hello there, how are you today?",
             "Numbers 0 1 2 3 4 5 6 7 8 9 and letters a b c d e f g h i j k l m n o p q r s t u v w x y z."]
    (tmp_path / "corpus.txt").write_text("\n".join(lines * 100))
    sentencepiece.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"),
                                             vocab_size=400, model_type="bpe", bos_id=1, eos_id=2, unk_id=0,
                                             pad_id=-1, byte_fallback=True, minloglevel=2)
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(tmp_path / "sp.model", model / "tokenizer.model")
    (model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
                                                            "eos_token": "</s>", "unk_token": "<unk>"}))
    config = transformers.LlamaConfig(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model)
    result = build(model, tmp_path)
    assert result.exit_code == 0, result.output
    theirs, ours = AutoTokenizer.from_pretrained(model), Tokenizer.from_engine_dir(tmp_path / "e")
    for text in ["Hello there, quick fox", " leading space", "Zebra ümlaut 日本 9", "a\nb  c"]:
        assert ours.encode(text, add_special_tokens=True) == theirs(text).input_ids
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs(text, add_special_tokens=False).input_ids)
