"""The build's check, as the build runs it: transformers' side first, then the model let go, so that
transformers' model and the engine's session (or TensorRT's builder) are never in memory together;
the engine's side (verify.check_engine) comes after the engine is compiled."""
from __future__ import annotations

from pathlib import Path

from trtllm.builder import checkpoint as ckpt
from trtllm.builder import vision, vision_export
from trtllm.builder.config import BuildConfig
from trtllm.builder.verify_logits import VISION_REFERENCE_NAME, number_format


def transformers_side(ck: ckpt.Checkpoint, config: BuildConfig, tmp: Path, manifest, backend: str, image_section: dict,
                      vision_spec, log) -> tuple:
    """What the build's check needs of transformers, before the model goes (let_model_go): its side of
    the language model's check (verify.transformers_side) and, for a vision-language model, the vision
    graph checked against its tower (the graph run by ONNX Runtime, its plan later against the
    reference kept here). A near miss's float64 opinion loads the checkpoint again."""
    from trtllm.builder.verify import VerifyError
    from trtllm.builder.verify import transformers_side as language_side

    log("computing transformers' side of the check")
    try:
        side = language_side(ck, manifest, tmp, config.eagle, model_again=lambda: ckpt.load(config.model).model)
    except VerifyError as e:  # (a broken checkpoint: the report the build writes beside the engine it kept)
        e.report = {"quantization": number_format(manifest)}
        raise
    if vision_spec is None:
        return side, None
    compiled = {"compiled": tmp / image_section["compiled"]} if image_section.get("compiled") else {}
    if backend == "tensorrt":  # (transformers' side kept: the vision plan is checked against it)
        compiled["save"] = tmp / VISION_REFERENCE_NAME
    report = vision_export.family(ck.vision).verify(tmp / vision.VISION_NAME, ck.vision, vision_spec, **compiled)
    log(f"verified the vision graph: max |error| {report['max_abs_error']:.2e} of the image embeddings" +
        (f"; its ONNX Runtime form's {report['compiled_max_abs_error']:.2e}" if "compiled" in compiled else ""))
    return side, report
