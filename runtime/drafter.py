"""The draft head trtllm-run hands the EAGLE scheduler (runtime/speculative.py): its engine and how
many tokens it drafts per cycle (fixed, or `auto`), chain or tree, read against the manifest."""
from __future__ import annotations

from dataclasses import dataclass

from trtllm.runtime.manifest import Manifest, ManifestError

AUTO_MAX_STEP = 4  # the most `auto` drafts per cycle (or the engine's draft_step, if higher)


@dataclass
class Drafter:
    """What trtllm-run hands the scheduler: the draft engine and how many tokens to draft per step:
    `step` drafts every cycle, or with `auto` (runtime/draft_policy.py) 0 to `step` per cycle, chosen
    as the run goes, starting from `start`."""

    engine: "DraftEngine"  # noqa: F821 (runtime/backends/onnxruntime.py, imported when used)
    step: int
    auto: bool = False
    start: int = 0
    top_k: int = 1  # candidates per node of a draft tree (1: a chain, the head's best at each depth)
    verify_size: int = 0  # a tree's most nodes verified in a step, with the root (0: top_k x depth + 1)
    guess: bool = True  # sampled rows draft guesses at their draws (sampling.propose); False: the head's argmax

    @classmethod
    def load(cls, engine_dir, manifest: Manifest, step: int | str | None = "auto", top_k: int | str | None = "auto",
             verify_size: int | str | None = "auto", **options) -> "Drafter | None":
        """`step`: "auto" (also None), or a fixed number of drafts per cycle (a tree's depth).
        `top_k`: "auto" (the engine's draft_top_k) or the candidates per tree node (1: a chain).
        `verify_size`: "auto" or the most tree nodes a step verifies. None when the engine has no
        draft head or `step` is 0 (speculation off)."""
        if not manifest.eagle or step == 0:
            return None
        top_k = draft_top_k(manifest, top_k)
        size = 0 if verify_size in (None, "auto") else int(verify_size)
        if size and top_k == 1:
            raise ManifestError("--spec-verify-size: a chain (--spec-draft-top-k 1) verifies its drafts alone; "
                                "it sizes draft trees")
        start = manifest.eagle.get("draft_step", 2)
        auto = step in (None, "auto")
        # A tree node's window is counted from its position, but the kernels bound it by slot: a tree
        # as deep as a sliding window would let a deep node see an ancestor placed after a sibling
        # that plain decoding hides there. Trees stay shallower (real windows are 512 and more).
        window = manifest.model.sliding_window if top_k > 1 else None
        if window is not None and not auto and int(step) >= window:
            raise ManifestError(f"--spec-draft-step {step}: a draft tree must be shallower than the model's sliding "
                                f"window ({window}): at most {window - 1}, or --spec-draft-top-k 1 (a chain)")
        if manifest.backend == "tensorrt":
            from trtllm.runtime.backends.tensorrt import TensorRTDraftEngine as DraftEngine
        else:
            from trtllm.runtime.backends.onnxruntime import DraftEngine
        engine = DraftEngine(engine_dir, manifest, **options)
        if auto:
            deepest = max(AUTO_MAX_STEP, start)
            if window is not None:
                deepest = max(1, min(deepest, window - 1))
            return cls(engine, deepest, True, min(start, deepest), top_k, size)
        return cls(engine, int(step), top_k=top_k, verify_size=size)

    def close(self) -> None:
        self.engine.close()


def draft_top_k(manifest: Manifest, top_k: int | str | None) -> int:
    """--spec-draft-top-k: "auto" is the engine's (1 where its graphs take no draft trees)."""
    e = manifest.eagle
    if top_k in (None, "auto"):
        return e.get("draft_top_k", 1) if e.get("tree") else 1
    if int(top_k) > 1 and not e.get("tree"):
        raise ManifestError("--spec-draft-top-k: this engine drafts chains only: it was built for ONNX Runtime's "
                            "GroupQueryAttention, which takes no tree mask (--cpu-kernels onnxruntime, or our kernels "
                            "unavailable), or before draft trees; use --spec-draft-top-k 1")
    if int(top_k) > e.get("top_k", 1):
        raise ManifestError(f"--spec-draft-top-k {top_k}: the engine's draft head gives its {e.get('top_k', 1)} best "
                            "proposals at most")
    return int(top_k)
