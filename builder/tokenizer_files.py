"""The engine's tokenizer files: the checkpoint's tokenizer (its fast form, which the runtime reads), its
generation config, and its chat template, checked as trtllm-run will use it."""
from __future__ import annotations

from pathlib import Path

from trtllm.builder import checkpoint as ckpt

OPTIONAL_FILES = ("chat_template", "generation_config")  # files a checkpoint may not give


def save_tokenizer(ck: ckpt.Checkpoint, out_dir: Path, model_arg: str) -> bool:
    """The tokenizer's files and generation_config.json into out_dir; whether it has a chat template."""
    ck.tokenizer.save_pretrained(out_dir)
    ck.model.generation_config.to_json_file(out_dir / "generation_config.json")
    if not (out_dir / "tokenizer.json").is_file():
        raise ckpt.CheckpointError(f"--model {model_arg!r}: its tokenizer ({type(ck.tokenizer).__name__}) has no fast "
                                   "(tokenizer.json) form, which the runtime needs")
    return check_chat_template(out_dir, model_arg)


def check_chat_template(out_dir: Path, model_arg: str) -> bool:
    """The chat template as trtllm-run will read it: one that does not compile (trtllm-run would
    refuse the engine, and rebuilding it would not help), or fails on a plain user turn (every chat
    request would fail), is the checkpoint's to fix. Its own raise_exception on that turn is left
    to the requests it refuses. Whether there is one."""
    from trtllm.runtime.chat_template import ChatTemplate, ChatTemplateError, TemplateRaised

    try:
        template = ChatTemplate.from_engine_dir(out_dir)
        if template is not None:
            template.render([{"role": "user", "content": "Hello"}])
        return template is not None
    except ChatTemplateError as e:
        if not isinstance(e.__cause__, TemplateRaised):
            raise ckpt.CheckpointError(f"--model {model_arg!r}: its chat template cannot be used: {e}") from e
    except Exception as e:  # noqa: BLE001 - jinja2's syntax errors, a chat_template that is no string
        raise ckpt.CheckpointError(f"--model {model_arg!r}: its chat template cannot be used: "
                                   f"{type(e).__name__}: {e}") from e
    return True  # (one that raises on a plain turn: it is there)
