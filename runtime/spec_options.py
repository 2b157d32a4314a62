"""trtllm-run's speculative options read against the engine: whether the model verifies the guesses
of --spec-ngram and --spec-draft-engine (and why not, a warning), the draft engine checked before the
model loads, and the proposer the runner is given."""
from __future__ import annotations

from pathlib import Path

from trtllm.runtime.manifest import Manifest


class OptionError(Exception):
    """A speculative option this run cannot take (trtllm-run exits 2 with it)."""


def ignores_guesses(manifest: Manifest, draft_step: int | str) -> str:
    """Why an engine leaves --spec-ngram's or --spec-draft-engine's guesses unused ("" where it checks
    them): its EAGLE head drafts (unless --spec-draft-step 0 turns it off), it has recurrent layers, or its
    graph does not give the logits of the positions a step checks."""
    if manifest.eagle and draft_step != 0:
        return "its EAGLE head drafts"
    if manifest.model.state_shapes:
        return "its recurrent (Mamba) layers' state cannot be rolled back to the guesses a step accepts"
    if manifest.backend == "tensorrt":
        return "a TensorRT plan does not give the checked positions' logits"
    if manifest.prompt_logits or manifest.eagle.get("logprobs"):
        return ""
    return "its graph does not give the checked positions' logits (rebuild it with trtllm-build)"


def check_draft(draft_dir: Path | None, draft_step: int | str, engine_dir: Path, manifest: Manifest | None) -> bool:
    """--spec-draft-engine, before the model loads, so that a draft it cannot use is said at once:
    True where the model will draft with it. Only such a model goes on the pool of workers the two
    share (backends/onnxruntime.session_options: once made, every later session of the process
    runs on it). A model that ignores the draft (said once it loads) has only the draft's manifest read."""
    if draft_dir is None or draft_step == 0:
        return False
    from trtllm.runtime import draft_model
    from trtllm.runtime import manifest as mf
    from trtllm.runtime.tokenizer import Tokenizer

    drafting = manifest is not None and not ignores_guesses(manifest, draft_step)
    try:
        vocab = Tokenizer.from_engine_dir(engine_dir, manifest.files).vocab() if drafting else None
    except Exception:  # noqa: BLE001 - a broken tokenizer file: said where the engine loads
        vocab, drafting = None, False
    try:
        if vocab is None:
            mf.load(draft_dir)
        else:
            draft_model.check(draft_dir, manifest, engine_dir, vocab)
    except (mf.ManifestError, draft_model.DraftError) as e:
        raise OptionError(f"--spec-draft-engine: {e}") from None
    return drafting


def proposer(engine_dir: Path, manifest: Manifest, ngram: int, draft_dir: Path | None, draft_step: int | str,
             say, **load_options):
    """The guesses a run's runner checks (runner.lookup): prompt lookup's, a draft engine's, or None
    (neither asked, or the engine ignores them: `say` warns why). `load_options`: the draft engine's
    (threads, huge pages, spinning)."""
    if not (ngram or draft_dir):
        return None
    what = "--spec-ngram" if ngram else "--spec-draft-engine"
    why = ignores_guesses(manifest, draft_step)
    if why:
        say(f"warning: {what} ignored: {engine_dir}: {why}")
        return None
    if ngram:
        from trtllm.runtime.ngram import Lookup

        found = Lookup(ngram)
    elif draft_step == 0:  # (no drafting)
        return None
    else:
        from trtllm.runtime import draft_model
        from trtllm.runtime.manifest import ManifestError

        try:
            found = draft_model.load(draft_dir, draft_step, shared_threads=True, **load_options)
        except ManifestError as e:
            raise OptionError(f"--spec-draft-engine: {e}") from None
    if not manifest.samples_verified:
        say(f"warning: {what}: requests that sample decode without it: {engine_dir} was built "
            "before its graph sampled the checked positions (rebuild it with trtllm-build)")
    return found
