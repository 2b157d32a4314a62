"""A vision-language build's steps beside the language model's export (builder/export.py): the
language model's spec with its image inputs, the manifest's vision section, and vision.onnx, by family
(builder/vision.py: InternVL; builder/vision_qwen.py: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE;
builder/vision_idefics3.py: Idefics3, SmolVLM; builder/vision_gemma3.py: Gemma 3; builder/vision_gemma4.py:
Gemma 4)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from trtllm.builder import checkpoint as ckpt
from trtllm.builder import vision, vision_gemma3, vision_gemma4, vision_idefics3, vision_qwen
from trtllm.builder.config import MODERN_MIN_TRT, BuildConfig, ConfigError, parse_trt_version


def family(vlm):
    """The module that writes a vision-language model's encoder: vision_qwen (Qwen-VL), vision_idefics3
    (Idefics3, SmolVLM), vision_gemma3 (Gemma 3), vision_gemma4 (Gemma 4) or vision (InternVL)."""
    for module in (vision_qwen, vision_idefics3, vision_gemma3, vision_gemma4):
        if vlm.config.model_type in module.MODEL_TYPES:
            return module
    return vision


def language_spec(ck: ckpt.Checkpoint, config: BuildConfig, backend: str, spec, encoder):
    """The language model's DecoderSpec with what the images add: their embeddings' inputs, Qwen's
    multimodal RoPE, Qwen3-VL's DeepStack layers and Gemma 3's images seen both ways (Gemma 4's on its
    sliding layers, where its config says so) (`encoder`: the encoder's spec, section's, which
    checked the DeepStack list: its extra rows go to as many first layers); what its engines do not
    take is refused."""
    try:
        mrope = vision.mrope_section(ck.vision.config)
    except ckpt.Unsupported as e:
        raise ckpt.CheckpointError(f"--model {config.model!r}: {e}") from e
    deepstack = encoder.deepstack_layers if family(ck.vision) is vision_qwen else 0
    if deepstack > spec.num_layers:
        raise ckpt.CheckpointError(f"--model {config.model!r}: vision_config.deepstack_visual_indexes must name "
                                   f"at most the language model's {spec.num_layers} layers, got {deepstack}")
    gemma4_both_ways = family(ck.vision) is vision_gemma4 and vision_gemma4.bidirectional(ck.vision.config)
    spec = dataclasses.replace(spec, image_embeds=True, mrope_section=mrope, deepstack_layers=deepstack,
                               mrope_interleaved=vision.mrope_interleaved(ck.vision.config),
                               image_bidirectional=family(ck.vision) is vision_gemma3 or gemma4_both_ways,
                               image_ahead_windows_only=gemma4_both_ways)  # (Gemma 4's placeholders: ck.language_fields)
    refuse(config, backend, spec)
    return spec


def refuse(config: BuildConfig, backend: str, spec) -> None:
    """What a vision-language model's engine does not do yet, named before anything is written."""
    for refused, what in ((config.eagle and spec.mrope_section, "EAGLE-3 heads (its language model's RoPE is "
                           "multimodal, and no head is trained for it here)"),
                          # (Qwen's vision.onnx is opset 24, its attention ONNX's Attention op; the tile
                          # encoders' ops are all opset 20's: the legacy profile writes them so)
                          (parse_trt_version(config.trt_version) < MODERN_MIN_TRT and spec.mrope_section,
                           f"a TensorRT {config.trt_version} profile (its vision graph needs TensorRT >= "
                           f"{MODERN_MIN_TRT[0]}.{MODERN_MIN_TRT[1]}'s ops)")):
        if refused:
            raise ConfigError(f"--model {config.model!r} is a vision-language model, and its engines do not take "
                              f"{what} yet")


def section(ck: ckpt.Checkpoint, config: BuildConfig) -> tuple[dict, object]:
    """The manifest's vision section and the encoder's spec: what a vision-language build refuses,
    before the language model's export."""
    qwen, gemma4 = family(ck.vision) is vision_qwen, family(ck.vision) is vision_gemma4
    # each model's own knob for its image tokens: InternVL's and Idefics3's tiles (Gemma 3's crops), Qwen's
    # pixels (its own grid an image), Gemma 4's token budget
    own = "pixels" if qwen else "tokens" if gemma4 else "tiles"
    wrong = next((name for name in ("tiles", "pixels", "tokens")
                  if name != own and getattr(config, f"max_image_{name}") is not None), None)
    if wrong:
        raise ConfigError(f"--max-image-{wrong} is not for --model {config.model!r}: its images are "
                          + {"pixels": "resized to a grid of their own", "tokens": "resized to a token budget",
                             "tiles": "cut into tiles"}[own] + f"; use --max-image-{own}")
    try:  # (the processor's config is read where the checkpoint was: a directory, or the hub's cache)
        if qwen:
            spec = vision_qwen.spec_of(ck.vision.config)
            return vision_qwen.section(ck.vision, ck.tokenizer, spec, ck.source["model"], config.max_image_pixels), spec
        tiled = family(ck.vision)  # (InternVL's tiles, Idefics3's or Gemma 3's one; Gemma 4's patches)
        spec = tiled.spec_of(ck.vision.config)
        return tiled.section(ck.vision, ck.tokenizer, spec, ck.source["model"],
                             config.max_image_tokens if gemma4 else config.max_image_tiles), spec
    except ckpt.Unsupported as e:
        raise ckpt.CheckpointError(f"--model {config.model!r}: {e}") from e


def native_form(ck: ckpt.Checkpoint, config: BuildConfig, backend: str) -> bool:
    """Whether vision.onnx gets an ONNX Runtime form on our kernels (vision.ort.onnx: its attention as
    trtllm.cpu::SegmentAttention, streamed), as llm.onnx's follows --cpu-kernels: Qwen-VL's (an image's
    patches, up to tens of thousands) and Gemma 3's (4,096 an image); the tile encoders' 1,025 patches
    gain nothing from it. Gemma 4's: up to max_soft_tokens x 9 patches an image (2,520 by default)."""
    from trtllm.plugins import cpu as cpu_kernels

    return (family(ck.vision) in (vision_qwen, vision_gemma3, vision_gemma4) and backend == "onnxruntime"
            and config.cpu_kernels != "onnxruntime" and cpu_kernels.library() is not None)


def write(ck: ckpt.Checkpoint, config: BuildConfig, out_dir: Path, log, made: dict, spec, native: bool = False) -> None:
    """vision.onnx: the image encoder and projector, float32, linted as llm.onnx is (`made`: its section);
    `native` (native_form): and vision.ort.onnx, which reads vision.onnx's weights (made["compiled"] names it)."""
    from trtllm.builder.onnx_files import save_linted
    from trtllm.plugins import cpu as cpu_kernels

    if family(ck.vision) is vision_qwen:
        pre = made["preprocess"]
        log(f"writing the vision graph ({spec.depth} layers, hidden {spec.hidden_size}, "
            + (f"{spec.window_size}px windows, " if spec.window_size else "") + f"up to {pre['max_pixels']} pixels "
            f"an image: {pre['max_pixels'] // (spec.patch_size * spec.spatial_merge_size) ** 2} tokens)")
        # (ONNX's Attention holds all heads' [P, P] scores at once: say what the largest image costs there)
        scores = spec.num_heads * (pre["max_pixels"] // spec.patch_size ** 2) ** 2 * 4
        if scores > 4 * 2**30 and not native:
            log(f"note: an image of max_pixels ({pre['max_pixels']}) takes about {scores / 2**30:.0f} GiB in the vision "
                "encoder's attention; --max-image-pixels lowers it (the memory grows with its square)")
        weights = vision_qwen.weights_of(ck.vision)
        writer = vision_qwen.QwenVisionWriter(spec, weights)
    elif family(ck.vision) is vision_gemma3:
        log(f"writing the vision graph ({spec.num_layers} layers, hidden {spec.hidden_size}, {spec.image_size[0]}px "
            f"images, {spec.tokens_per_tile} tokens an image, seen both ways in the prompt)")
        weights = vision_gemma3.weights_of(ck.vision)
        writer = vision_gemma3.Gemma3Writer(spec, weights)
    elif family(ck.vision) is vision_gemma4:
        log(f"writing the vision graph ({spec.num_layers} layers, hidden {spec.hidden_size}, {spec.patch_size}px "
            f"patches, up to {made['preprocess']['max_soft_tokens']} tokens an image"
            + (", seen both ways in the prompt on the sliding layers" if made["bidirectional"] else "") + ")")
        weights = vision_gemma4.weights_of(ck.vision)
        writer = vision_gemma4.Gemma4Writer(spec, weights)
    elif family(ck.vision) is vision_idefics3:
        log(f"writing the vision graph ({spec.num_layers} layers, hidden {spec.hidden_size}, {spec.image_size[0]}px "
            f"tiles, {spec.tokens_per_tile} tokens a tile, up to {vision_idefics3.most_tiles(made['preprocess'])} "
            "tiles an image)")
        writer = vision_idefics3.Idefics3Writer(spec, vision_idefics3.weights_of(ck.vision))
    else:
        most = made["preprocess"]["max_patches"] if made["preprocess"]["crop_to_patches"] else 1
        log(f"writing the vision graph ({spec.num_layers} layers, hidden {spec.hidden_size}, {spec.image_size[0]}px "
            f"tiles, {spec.tokens_per_tile} tokens a tile, up to {most} tiles an image"
            + " and its thumbnail" * (most > 1) + ")")
        writer = vision.VisionWriter(spec, vision.weights_of(ck.vision))
    writer.g.store_in(out_dir / vision.VISION_NAME)  # (each weight to vision.onnx.data as it is made)
    model = writer.write()
    if config.graph == "legacy" and family(ck.vision) is not vision_qwen:  # (TensorRT 10.3: opset 20 at most)
        from trtllm.builder import legacy_ops

        next(o for o in model.opset_import if o.domain == "").version = legacy_ops.OPSET
    save_linted(model, out_dir, vision.VISION_NAME, "the vision graph", config.trt_version)
    del writer
    if native:
        log(f"lowering the vision graph's attention to {cpu_kernels.SEGMENT_ATTENTION_LOWERING} (plugins/cpu: its "
            f"memory linear in an image's patches) in {vision.VISION_COMPILED}")
        native_writer = {vision_gemma3: vision_gemma3.Gemma3Writer, vision_gemma4: vision_gemma4.Gemma4Writer}.get(
            family(ck.vision), vision_qwen.QwenVisionWriter)
        write_sharing(native_writer(spec, weights, native=True).write(), out_dir)
        made.update(compiled=vision.VISION_COMPILED, lowerings=[cpu_kernels.SEGMENT_ATTENTION_LOWERING])


def write_sharing(model, out_dir: Path) -> None:
    """vision.ort.onnx: `model`, its weights read from vision.onnx.data where vision.onnx keeps the same
    tensor (the two forms differ in their attention only), so an engine holds them once."""
    import onnx

    canonical = onnx.load(str(out_dir / vision.VISION_NAME), load_external_data=False)
    stored = {t.name: t for t in canonical.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    kept = 0
    for t in model.graph.initializer:
        ref = stored.get(t.name)
        if ref is not None and list(ref.dims) == list(t.dims) and ref.data_type == t.data_type \
                and not t.name.startswith("/const/"):  # (constants are numbered per graph: never shared)
            t.CopyFrom(ref)
            kept += 1
    if kept != len(stored):
        raise RuntimeError(f"{vision.VISION_COMPILED} shares {kept} of vision.onnx's {len(stored)} weights: the two "
                           "forms must hold the same ones")
    onnx.save(model, str(out_dir / vision.VISION_COMPILED))
