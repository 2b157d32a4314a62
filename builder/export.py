"""trtllm-build's pipeline: checkpoint -> canonical ONNX -> lint -> backend form -> engine dir -> verify.

The backend form is `llm.ort.onnx` (ONNX Runtime: offline-optimised, optionally lowered to contrib
ops) or `llm.plan` (TensorRT: built from llm.onnx on this machine's GPU, builder/tensorrt.py).

The engine directory is assembled in a fresh `.<output>.partial-XXXX` beside it and renamed into
place at the end, so a failed or interrupted build never leaves a half-written engine where a good
one was. Its names are new each build: a user's `<output>.old` or `<output>.partial` is not ours.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import uuid
from importlib import metadata
from pathlib import Path

from trtllm.builder import checkpoint as ckpt
from trtllm.builder.gguf import gguf_int4_hint
from trtllm.builder import tensorrt as trt_build
from trtllm.builder.architectures import spec_for, weights_of
from trtllm.builder.config import MODERN_MIN_TRT, BuildConfig, ConfigError, legacy_profile_hint, listed, parse_trt_version
from trtllm.builder import eagle, lora, prequantized, provenance, vision, vision_export
from trtllm.builder.build_check import transformers_side
from trtllm.builder.build_memory import let_model_go, memory_note
# (ORT_NAME and save: the names other modules, scripts and tests import from here)
from trtllm.builder.onnx_files import ONNX_NAME, ORT_NAME, ORT_SOURCE, compile_onnxruntime, save, save_linted  # noqa: F401
from trtllm.builder.plan import build_tensorrt
from trtllm.builder.verify_logits import REFERENCE_NAME, check_vision_plan, number_format
from trtllm.builder.decoder import DecoderWriter
from trtllm.builder.handoff import HANDOFF_NAME, Handoff
from trtllm.builder.decoder_spec import attention_supported, gqa_supported, half_supported
from trtllm.builder.engine_dir import (binary_sizes, check_output, in_place, readable_by_all, replace_engine,
                                       write_checksums)
from trtllm.builder.lora_sites import lora_sites
from trtllm.builder.model_limits import (check_blocks, lora_on_experts, refuse_for_convolutions, refuse_for_experts,
                                         refuse_for_mamba)
from trtllm.builder.tokenizer_files import OPTIONAL_FILES, save_tokenizer
from trtllm.builder.kernel_choice import half_obstacle, ort_activations, refuse_bfloat16, use_native_kernels
from trtllm.builder.moe import kernel_takes as moe_kernel_takes
from trtllm.builder.moe import ort_node_takes
from trtllm.builder.quantize import QuantScheme
from trtllm.plugins import cpu as cpu_kernels
from trtllm.runtime import interrupt
from trtllm.runtime import manifest as mf

MAX_TOP_K = 1024  # the sampler's top-k/top-p candidate set; TensorRT's TopK needs K < 3840


def image_flag(config: BuildConfig) -> str | None:
    """The first image option the build was given (--max-image-tiles, -pixels or -tokens), or None."""
    return next((f"--max-image-{name}" for name in ("tiles", "pixels", "tokens")
                 if getattr(config, f"max_image_{name}") is not None), None)


def versions() -> dict:
    out = {}
    for dist in ("trtllm-edge", "torch", "transformers", "onnx", "onnxruntime", "tokenizers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def export_onnx(ck: ckpt.Checkpoint, config: BuildConfig, out_dir: Path, log, backend: str = "onnxruntime",
                encoder=None) -> tuple:
    """llm.onnx and, for ONNX Runtime, the lowered source of its compiled form; with --eagle, the
    draft head's graphs too (export_draft); `encoder`: a vision-language model's encoder spec
    (vision_export.section's). Returns (spec, max_top_k, num_positions, lowerings, eagle section)."""
    try:  # what the architecture's checks refuse (MLP biases, a config its class ignores) names --model
        spec = spec_for(ck.model)
        weights = weights_of(ck.model, spec)
    except ckpt.Unsupported as e:
        raise ckpt.CheckpointError(f"--model {config.model!r}: {e}") from e
    if spec.conv_layers:
        refuse_for_convolutions(config, spec)
    if spec.mamba_layers:
        refuse_for_mamba(config, spec, backend)
    spec = dataclasses.replace(spec, **ck.language_fields)
    if ck.vision is not None:
        spec = vision_export.language_spec(ck, config, backend, spec, encoder)
    elif flag := image_flag(config):
        raise ConfigError(f"{flag} is for vision-language models, and --model {config.model!r} is a text model")
    # (the target's table as rows: a held one is widened a slice at a time where the head's graph is written)
    draft = eagle.load(config.eagle, spec, weights.rows("model.embed_tokens.weight")) if config.eagle else None
    most = ck.model.config.max_position_embeddings
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:  # (0 failed later, naming a temporary dir)
        raise ckpt.CheckpointError(f"--model {config.model!r}: config.max_position_embeddings must be an integer "
                                   f">= 1, got {most!r}")
    num_positions = min(config.max_kv_cache_capacity, most)
    what = "the model's max_position_embeddings"
    limit = ckpt.rope_position_limit(ck.model)
    if limit is not None and limit < num_positions:
        num_positions, what = limit, "LongRoPE's original_max_position_embeddings (its short factors' range)"
    if num_positions < config.max_kv_cache_capacity:
        log(f"note: KV capacity {config.max_kv_cache_capacity} lowered to {what} "
            f"{num_positions}" + (f" (and max_input_len {config.max_input_len} with it)"
                                  if config.max_input_len > num_positions else ""))
    if backend == "tensorrt":
        num_positions = trt_build.aligned_capacity(num_positions, spec, config.dtype, log,
                                                   draft=draft.spec if draft else None)
    cos, sin = ckpt.rope_tables(ck.model, num_positions)
    local = ckpt.rope_tables(ck.model, num_positions, "sliding_attention") if spec.local_rope else None
    log(f"writing the {spec.architecture} graph ({config.graph} profile; {spec.num_layers} layers, hidden "
        f"{spec.hidden_size}, {spec.num_heads}/{spec.num_kv_heads} heads)")
    max_top_k = min(MAX_TOP_K, spec.vocab_size)
    quant = QuantScheme.named(config.quantization, config.activations, config.lm_head_quantization)
    if quant:
        check_blocks(spec, quant, "the model")
        if draft:
            check_blocks(draft.spec, quant, f"the EAGLE head {config.eagle}")
        log(f"quantizing the linear layers to int{quant.bits} (block {quant.block_size}, {quant.method})")
    if config.max_lora_rank:
        log(f"LoRA inputs on every layer's qkv, o, gate|up and down projections (rank <= {config.max_lora_rank})"
            if spec.moe is None else f"LoRA inputs on every layer's qkv and o projections, the dense layers' and "
            f"shared expert's MLP, the router and the routed experts (rank <= {config.max_lora_rank}; none on the "
            "experts where ONNX Runtime's MoE node runs them)")
    joint = (draft.aux_layers, draft.fc) if draft else None
    if draft:
        log(f"EAGLE-3 draft head {config.eagle}: hidden states of layers {list(draft.aux_layers)}, draft vocabulary "
            f"{draft.spec.vocab_size}")
    # What runs where on ONNX Runtime, decided before anything is written: a refusal costs no export
    half = half_supported(spec, config.dtype, quant)  # only on the native kernels
    ours = attention_supported(spec, ort_activations(config, quant))
    native = backend == "onnxruntime" and config.graph == "modern" and use_native_kernels(
        config, ours or half or bool(spec.mamba_layers), log)
    native_experts = native and moe_kernel_takes(spec, quant)  # (False without experts)
    native_mamba = native and bool(spec.mamba_layers)  # (MambaScan: False without Mamba layers)
    if spec.moe is not None:
        refuse_for_experts(config, spec, backend, native_experts)
    gqa = ours if native else gqa_supported(spec, config.dtype)  # attention as one node: ours, or ONNX Runtime's
    quant_native = native and quant is not None
    if quant is not None and config.activations != "float32" and not quant_native:
        raise ConfigError(f"--activations {config.activations} needs our CPU kernels: {cpu_kernels.missing_hint()}")
    half = half and native
    if config.kv_cache_dtype == "int8" and not (native and (ours or half)):
        # (a 16-bit model's form runs our attention too: `half`; the library missing is said only where it is)
        raise ConfigError("--kv-cache-dtype int8 is read by our attention kernel alone, and " +
                          (f"it needs a head size that is a multiple of 16 (this model's: {spec.head_dim})"
                           if spec.head_dim % 16 else cpu_kernels.missing_hint() if cpu_kernels.library() is None else
                           f"{half_obstacle(spec)}: use --dtype float32" if config.dtype != "float32" else
                           "this model's attention is not one it runs"))
    # Draft trees need a tree mask in both graphs the runtime runs (the model's and the head's):
    # not where either's attention is ONNX Runtime's GroupQueryAttention, which takes none.
    # Nor with short convolutions (LFM2), which read the slots before a token's: a tree's are not its parents'.
    ort_gqa = backend == "onnxruntime" and config.graph == "modern" and not native
    tree = draft is not None and not (ort_gqa and (gqa or gqa_supported(draft.spec, ort_activations(config, quant)))) \
        and not spec.conv_layers
    refuse_bfloat16(config, backend, half, spec)
    if backend == "onnxruntime" and quant is not None and config.dtype != "float32" and not (quant_native and ours):
        why = ("ONNX Runtime's own (MatMulNBits, GroupQueryAttention) take one type for both, and --cpu-kernels "
               "onnxruntime asks for them" if config.cpu_kernels == "onnxruntime" else
               cpu_kernels.missing_hint() if not quant_native else
               f"their attention needs a head size that is a multiple of 16 (this model's: {spec.head_dim})")
        raise ConfigError(f"--quantization {config.quantization} --dtype {config.dtype} on ONNX Runtime runs on our CPU "
                          f"kernels (float32 activations, a 16-bit KV cache), and {why}; use --dtype float32")
    if draft:
        refuse_bfloat16(config, backend, native and half_supported(draft.spec, config.dtype, quant), draft.spec,
                        f"the EAGLE head {config.eagle}")
    grids = prequantized.as_written(ck.grids, spec) if ck.grids else None
    # An ONNX Runtime form follows llm.onnx: it takes llm.onnx's quantized weights (WeightWriter.quantize_weight)
    # (a float32, `half` or quantized mixture of experts: one node a layer computes only the chosen experts)
    moe_node = spec.moe is not None and (config.dtype == "float32" or half or (native_experts and quant is not None)) \
        and (native_experts or ort_node_takes(spec))  # (ONNX Runtime's nodes: SiLU experts routed by softmax only)
    # quantized experts on our kernel: quantized as the other projections, in both graphs
    dense_experts = native_experts and quant is not None
    ort_form = backend == "onnxruntime" and config.graph == "modern" and (
        gqa or quant is not None or half or moe_node or native_mamba)
    handoff = Handoff(out_dir / HANDOFF_NAME) if ort_form and quant is not None else None
    # LoRA on the routed experts: in both graphs, unless ONNX Runtime's MoE node runs them (it takes none)
    lora_experts = lora_on_experts(spec, ort_form and moe_node and not native_experts)
    writer = DecoderWriter(spec, weights, cos, sin, max_top_k, quant=quant, dtype=config.dtype,
                           graph=config.graph, lora_rank=config.max_lora_rank, eagle=joint, local_rope=local,
                           tree=tree, verify_logits=backend == "onnxruntime", grids=grids,
                           hand_on=handoff, dense_experts=dense_experts, lora_experts=lora_experts)
    writer.g.store_in(out_dir / ONNX_NAME)
    save_linted(writer.write(), out_dir, ONNX_NAME, "the exported graph", config.trt_version)
    if grids:
        log(prequantized.grid_note(ck.source["prequantized"], quant, grids, writer.kept, spec,
                                   takes_quantization=config.graph == "modern" and config.dtype != "bfloat16"))
    del writer
    lowerings = []
    if ort_form:
        # The ONNX Runtime form starts from a graph whose attention is a fused kernel (ours or ORT's)
        # and whose quantized or float16 MatMuls are ours (or left for ORT to fuse as MatMulNBits,
        # the embedding looked up in int8: DecoderWriter.quantized_embedding); the canonical
        # llm.onnx (what TensorRT parses) keeps the standard ops.
        if gqa or half:
            attention = cpu_kernels.ATTENTION_LOWERING if native else "GroupQueryAttention"
            # (a model without pre-norms, OLMo 2, has no residual add followed by a norm to fuse)
            skip = ["SkipSimplifiedLayerNormalization"] if spec.pre_norms else []
            log(f"lowering attention to {attention}" + ", residual + RMSNorm to SkipSimplifiedLayerNormalization" * bool(skip))
            lowerings += [attention, *skip]
        if moe_node:
            node = ((cpu_kernels.MOE_LOWERING if quant is None else cpu_kernels.MOE_QUANT_LOWERING) if native_experts
                    else "MoE" if quant is None else "QMoE")
            where = node if cpu_kernels.needed_by([node]) else f"com.microsoft {node}"
            log(f"lowering the mixtures of experts to {where} (each token's chosen experts only)")
            lowerings.append(node)
        if quant_native:
            log(f"lowering the quantized MatMuls to {cpu_kernels.LOWERING} (plugins/cpu)")
            lowerings.append(cpu_kernels.LOWERING)
        if half:
            log(f"lowering the {config.dtype} MatMuls to {cpu_kernels.HALF_LOWERING} (plugins/cpu: {config.dtype} "
                "weights and cache, float32 arithmetic)")
            lowerings.append(cpu_kernels.HALF_LOWERING)
        if native:
            log(f"lowering the sampler to {cpu_kernels.SAMPLE_LOWERING} (plugins/cpu)")
            lowerings.append(cpu_kernels.SAMPLE_LOWERING)
        if native_mamba:
            log(f"lowering the Mamba-2 layers' convolution and scan to {cpu_kernels.MAMBA_LOWERING} (plugins/cpu)")
            lowerings.append(cpu_kernels.MAMBA_LOWERING)
        if native and config.max_lora_rank:
            log(f"lowering the LoRA deltas to {cpu_kernels.LORA_LOWERING} (plugins/cpu: one node per projection)")
            lowerings.append(cpu_kernels.LORA_LOWERING)
        writer = DecoderWriter(spec, weights, cos, sin, max_top_k, quant=quant, dtype=config.dtype,
                               ort_attention=gqa or half, native_kernels=native,
                               lora_rank=config.max_lora_rank, eagle=joint, local_rope=local, ort_form=True,
                               tree=tree, verify_logits=True, kv_int8=config.kv_cache_dtype == "int8",
                               grids=grids, handoff=handoff, dense_experts=dense_experts, lora_experts=lora_experts)
        writer.g.store_in(out_dir / ORT_SOURCE)
        save(writer.write(), out_dir, ORT_SOURCE)
        del writer
        if handoff is not None:  # (whatever the second did not take; a failed build's goes with its directory)
            handoff.close()
    section = export_draft(draft, config, out_dir, log, num_positions, quant, native, backend, tree) if draft else {}
    return spec, max_top_k, num_positions, lowerings, section


def export_draft(draft: "eagle.Draft", config: BuildConfig, out_dir: Path, log, num_positions: int,
                 quant: QuantScheme | None, native: bool, backend: str, tree: bool) -> dict:
    """eagle/draft.onnx (canonical, linted) and, for ONNX Runtime, the source of its compiled form,
    lowered as the base graph is; returns the manifest's eagle section."""
    (out_dir / eagle.DRAFT_DIR).mkdir()
    cos, sin = eagle.rope_tables(draft, num_positions)
    writer = eagle.DraftWriter(draft, cos, sin, tree, quant=quant, dtype=config.dtype, graph=config.graph)
    writer.g.store_in(out_dir / eagle.DRAFT_ONNX)
    save_linted(writer.write(), out_dir, eagle.DRAFT_ONNX, "the draft graph", config.trt_version)
    spec, lowerings = draft.spec, []
    gqa = (attention_supported if native else gqa_supported)(spec, ort_activations(config, quant))
    half = native and half_supported(spec, config.dtype, quant)
    if backend == "onnxruntime" and config.graph == "modern" and (gqa or half or (native and quant is not None)):
        lowerings = [cpu_kernels.ATTENTION_LOWERING if native else "GroupQueryAttention",
                     "SkipSimplifiedLayerNormalization"] if gqa or half else []
        lowerings += [cpu_kernels.LOWERING] if native and quant is not None else []
        lowerings += [cpu_kernels.HALF_LOWERING] if half else []
        writer = eagle.DraftWriter(draft, cos, sin, tree, quant=quant, dtype=config.dtype, ort_attention=gqa or half,
                                   native_kernels=native)
        writer.g.store_in(out_dir / eagle.DRAFT_SOURCE)
        save(writer.write(), out_dir, eagle.DRAFT_SOURCE)
    log(f"wrote the draft head's graph ({', '.join(lowerings) or 'standard ops'})")
    compiled = {"onnxruntime": {"compiled": eagle.DRAFT_COMPILED}, "tensorrt": {"plan": eagle.DRAFT_PLAN}}[backend]
    return {"onnx": eagle.DRAFT_ONNX, **compiled, "aux_layers": list(draft.aux_layers),
            "model": dataclasses.asdict(mf.ModelShape(
                vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_layers=1, num_heads=spec.num_heads,
                num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, kv_dtype=config.dtype)),
            "lowerings": lowerings, "draft_step": eagle.DRAFT_STEP[backend],
            # verify_ids are sampled, each position with its own random number (verify_uniform):
            # sampled requests speculate too; engines without it verify greedy rows only
            "verify": "sampled",
            # the verified positions' logits come out too (verify_logits), so rows that ask for
            # logprobs speculate; not in a TensorRT plan, whose output buffers are sized for the
            # widest step (max_input_len x vocabulary per row)
            "logprobs": backend == "onnxruntime",
            # draft trees (trtllm-run --spec-draft-top-k): the head's best per position, the run's default
            "tree": tree, "top_k": min(eagle.TOP_K, spec.vocab_size),
            "draft_top_k": min(eagle.DRAFT_TOP_K[backend], eagle.TOP_K, spec.vocab_size) if tree else 1,
            "source": {"path": str(draft.path.resolve()), "sha256": ckpt.weights_hash(sorted(draft.path.glob("*.safetensors")))}}


def quant_activations(config: BuildConfig, backend: str, lowerings) -> str:
    """What the quantized MatMuls multiply their weights with: --activations on our kernel
    (MatMulBlockQuant); int8 on ONNX Runtime's MatMulNBits (accuracy level 4, whatever --activations
    says: it is "float32" there); the engine's float on TensorRT (weight-only dequantization)."""
    if backend == "onnxruntime" and config.quantization != "none" and cpu_kernels.LOWERING not in lowerings:
        return "int8"
    return config.activations


def quant_section(scheme: QuantScheme | None, spec, lowerings=()) -> dict:
    """The manifest's quantization_scheme: the scheme, and for a mixture of experts how its experts
    are held (as the other projections on our kernel; builder/moe_quant.py's on QMoE) and what stays float."""
    if scheme is None:
        return {}
    section = scheme.to_json()
    if spec.moe is not None:
        section["experts"] = ((f"int{scheme.bits} as the other projections (trtllm.cpu::MoEBlockQuant)"
                               if cpu_kernels.MOE_QUANT_LOWERING in lowerings else
                               "int4 by row, blocks of 32 inputs, a float32 scale and an integer zero point each " +
                               ("(ONNX Runtime's QMoE node)" if "QMoE" in lowerings else
                                "(standard ops: every expert on every token)")) +
                              ", computed with float32 activations whatever `activations` says")
        section["not_quantized"] += ", the experts' router" + " and the shared expert's gate" * spec.moe.shared_gate
    return section


def make_manifest(ck, config: BuildConfig, backend: str, spec, max_top_k: int, num_positions: int,
                  lowerings: list[str] = (), eagle_section: dict | None = None,
                  vision_section: dict | None = None) -> mf.Manifest:
    pad = ck.tokenizer.pad_token_id
    activations = quant_activations(config, backend, lowerings)
    compiled = {"onnxruntime": {"compiled": ORT_NAME}, "tensorrt": {"plan": trt_build.PLAN_NAME}}[backend]
    return mf.Manifest(
        architecture=spec.architecture, backend=backend, dtype=config.dtype, graph_profile=config.graph,
        quantization=config.quantization,
        quantization_scheme=quant_section(QuantScheme.named(config.quantization, activations,
                                                            config.lm_head_quantization), spec, lowerings),
        limits=mf.Limits(max_batch_size=config.max_batch_size, max_input_len=min(config.max_input_len, num_positions),
                         max_kv_cache_capacity=num_positions, max_lora_rank=config.max_lora_rank),
        model=mf.ModelShape(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_layers=spec.num_layers,
                            num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                            sliding_window=spec.sliding_window, sliding_layers=spec.sliding_layers,
                            kv_dtype="int8" if config.kv_cache_dtype == "int8" else config.dtype,
                            kv_layers=spec.kv_layers(), state_shapes=spec.state_shapes()),
        eos_token_ids=tuple(ckpt.eos_ids(ck)), max_top_k=max_top_k, pad_token_id=int(pad) if pad is not None else 0,
        files={"onnx": ONNX_NAME, **compiled, "tokenizer": "tokenizer.json",
               "tokenizer_config": "tokenizer_config.json", "chat_template": "chat_template.jinja",
               "generation_config": "generation_config.json",
               **({"vision": vision_section["graph"]} if vision_section else {}),
               **({"vision_compiled": vision_section["compiled"]} if vision_section.get("compiled") else {}),
               **({"vision_plan": trt_build.VISION_PLAN_NAME} if vision_section and backend == "tensorrt" else {})},
        build_config=config.to_json(), source=ck.source, versions=versions(), build_id=uuid.uuid4().hex,
        lowerings=tuple(lowerings),
        lora=({"sites": lora_sites(spec, lora_on_experts(spec, bool({"MoE", "QMoE"} & set(lowerings)))), "adapters": {},
               **({"interleaved_rope": spec.rotary_dim or spec.head_dim} if spec.interleaved_rope else {}),
               # (a multimodal checkpoint's adapters name its language model's layers: the whole model's)
               **({"prefix": vision.language_prefix(ck.vision)} if spec.image_embeds else
                  {"prefix": vision.LANGUAGE_PREFIX} if ck.left_out else {})}
              if config.max_lora_rank else {}),
        eagle=eagle_section or {},
        vision=vision_section or {},
        # verify_index in, verify_logits out (DecoderWriter's verify_logits): every prompt position's
        # logits on request. Not in a TensorRT plan, whose outputs are sized for the widest step.
        prompt_logits=backend == "onnxruntime",
        # and their tokens drawn as the sampler draws (verify_ids): prompt lookup speculates sampled rows
        verify_sampler=backend == "onnxruntime",
    )


def resolve_backend(config: BuildConfig, log) -> str:
    """onnxruntime or tensorrt; auto takes TensorRT when it imports and a GPU is there, and says why."""
    if config.backend == "onnxruntime":
        return "onnxruntime"
    if config.plan_later:
        log(f"backend tensorrt, its plan built later on the device (python -m trtllm.builder.plan {config.output}); "
            f"the graph linted for TensorRT {config.trt_version}")
        return "tensorrt"
    usable, why = trt_build.availability()
    if config.backend == "tensorrt" and not usable:
        raise trt_build.TensorRTUnavailable(f"--backend tensorrt needs TensorRT and a CUDA GPU: {why}; "
                                            "build on the target device, or use --backend onnxruntime")
    if usable:  # (auto too: a JetPack 6 Orin's TensorRT 10.3 failed the lint after the whole export)
        installed = trt_build.minor_version(trt_build.import_tensorrt())
        if config.graph == "modern" and parse_trt_version(installed) < MODERN_MIN_TRT:
            picked = "" if config.backend == "tensorrt" else "--backend auto picked it: "
            raise trt_build.TensorRTUnavailable(f"TensorRT {installed} cannot parse the modern graph (it needs "
                                                f">= 10.15; {picked}use {legacy_profile_hint(installed)}, the legacy "
                                                "graph, or --backend onnxruntime)")
    if config.backend == "tensorrt":
        log(f"backend tensorrt: {why}")
        return "tensorrt"
    log(f"backend auto: {'tensorrt' if usable else 'onnxruntime'} ({why})")
    if not usable and config.tensorrt_options:
        log(f"warning: {', '.join(config.tensorrt_options)} ignored: TensorRT build options, and the backend "
            "is onnxruntime")
    return "tensorrt" if usable else "onnxruntime"


def build(config: BuildConfig, log=print) -> Path:
    """Run the whole build; returns the engine directory."""
    config = lora.with_rank(config)
    backend = resolve_backend(config, log)
    if backend == "tensorrt":  # --backend auto picked TensorRT: what only ONNX Runtime's kernels do is refused
        for option, value, default in (("--activations", config.activations, "float32"),
                                       ("--cpu-kernels", config.cpu_kernels, "auto"),
                                       ("--kv-cache-dtype", config.kv_cache_dtype, "auto")):
            if value not in (default, "onnxruntime"):
                raise ConfigError(f"{option} {value} is for ONNX Runtime's CPU kernels, and --backend auto picked "
                                  "TensorRT: add --backend onnxruntime")
    config.refuse_dtype_combinations(backend)  # (--backend auto: what it picked, before the checkpoint loads)
    out_dir = Path(config.output).expanduser().resolve()
    check_output(config, out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = out_dir if in_place(out_dir) else out_dir.parent
    failed_report = out_dir.parent / f"{out_dir.name}.verify-failed.json"  # beside the engine a failure keeps
    code = provenance.code_fingerprint()  # (the check's report: whether it changed under the build)
    tmp = Path(tempfile.mkdtemp(dir=stage, prefix=f".{out_dir.name}.partial-"))
    ck = None
    try:
        log(f"loading {config.model}")
        memory_note(config.model, log, hold=True,
                    float32_engine=config.dtype == "float32" and config.quantization == "none")
        ck = ckpt.load(config.model, hold=True)
        if ck.held:
            log(f"holding the checkpoint's {ck.held} weights as they are (widened to float32 where they are used: "
                "half the memory of a float32 model)")
        if ck.left_out:
            log(f"note: {config.model} is a multimodal checkpoint whose {' and '.join(ck.left_out)} encoder"
                f"{'s are' if len(ck.left_out) > 1 else ' is'} not built yet: the engine takes "
                + ("text and images" if ck.vision is not None else "text alone (its language model)"))
        if ck.unused:  # (the engine is the model transformers loads, without them, and is checked against it)
            log(f"warning: {config.model} holds tensors its config gives the model no place for, which "
                f"transformers drops and so does the engine: {listed(ck.unused)}")
        if not save_tokenizer(ck, tmp, config.model):  # first: a chat template that cannot be used fails the build now
            fix = ("build from the Hugging Face checkpoint directory, or write tokenizer.chat_template into the GGUF"
                   if ck.source.get("kind") == "gguf" else "put the model's chat_template.jinja in the checkpoint")
            log("note: the checkpoint has no chat template: trtllm-run will join a request's messages with newlines "
                f"(llama-server would format them as ChatML); {fix} to chat with it")
        image_section, vision_spec = vision_export.section(ck, config) if ck.vision is not None else ({}, None)
        spec, max_top_k, num_positions, lowerings, eagle_section = export_onnx(ck, config, tmp, log, backend,
                                                                               vision_spec)
        if vision_spec is not None:
            vision_export.write(ck, config, tmp, log, image_section, vision_spec,
                                native=vision_export.native_form(ck, config, backend))
        manifest = make_manifest(ck, config, backend, spec, max_top_k, num_positions, lowerings, eagle_section,
                                 image_section)
        if config.lora:
            manifest = lora.bundle(config, manifest, tmp, log)
        side, vision_report = transformers_side(ck, config, tmp, manifest, backend, image_section, vision_spec, log) \
            if config.verify else (None, None)
        let_model_go(ck)  # (what is left of the build and its check is ONNX Runtime's or TensorRT's)
        if backend == "tensorrt" and config.plan_later:
            manifest = dataclasses.replace(manifest, tensorrt=dict(mf.PLAN_PENDING))
        elif backend == "tensorrt":
            manifest = build_tensorrt(tmp, config, manifest, log)
        else:
            quant = QuantScheme.named(config.quantization, config.activations, config.lm_head_quantization)
            compile_onnxruntime(tmp, log, quant, native=cpu_kernels.needed_by(lowerings))
            if eagle_section:
                compile_onnxruntime(tmp, log, quant, native=cpu_kernels.needed_by(eagle_section["lowerings"]),
                                    names=(eagle.DRAFT_ONNX, eagle.DRAFT_SOURCE, eagle.DRAFT_COMPILED))
        # a base model's tokenizer has no chat template, and transformers writes no file for it: the
        # manifest lists the files there are (the runtime refuses a listed file that is missing)
        manifest = dataclasses.replace(manifest, files={k: v for k, v in manifest.files.items()
                                                        if k not in OPTIONAL_FILES or (tmp / v).is_file()},
                                       sizes=binary_sizes(tmp))
        mf.save(manifest, tmp)
        if config.verify:
            from trtllm.builder.verify import check_engine

            engine = draft_engine = None
            if config.plan_later:  # no plan yet: its graphs, through ONNX Runtime
                from trtllm.runtime.backends.onnxruntime import DraftEngine, OnnxRuntimeEngine

                engine = OnnxRuntimeEngine(tmp, manifest, graph="onnx", huge_pages=False)
                draft_engine = DraftEngine(tmp, manifest, huge_pages=False, graph="onnx") if config.eagle else None
            log("verifying the engine against transformers" + " (llm.onnx, through ONNX Runtime)" * config.plan_later)
            # a TensorRT engine keeps transformers' side: its plan is checked against it where it is built again
            reference = tmp / REFERENCE_NAME if backend == "tensorrt" else None
            report = {**check_engine(tmp, side, number_format(manifest), engine=engine, reference=reference,
                                     draft_engine=draft_engine), "code": code}
            if vision_report is not None:
                report["vision"] = vision_report
                if backend == "tensorrt" and not config.plan_later:
                    report["vision_plan"] = check_vision_plan(tmp, manifest)
                    log(f"verified the vision plan: max |error| {report['vision_plan']['max_abs_error']:.2e}")
            (tmp / "verify.json").write_text(json.dumps(report, indent=2) + "\n")
            log(f"verified: max |logit error| {report['max_abs_error']:.2e} over {report['num_positions']} "
                f"positions (greedy tokens agree: {report['tokens_agree']}); top-1 agreement "
                f"{report['top1_agreement']:.1%} over {report['agreement_positions']} positions of a fixed text")
            for name, a in report.get("adapters", {}).items():
                log(f"verified adapter {name}: max |logit error| {a['max_abs_error']:.2e} (greedy tokens agree: "
                    f"{a['tokens_agree']}); top-1 agreement {a['top1_agreement']:.1%}")
            if "eagle" in report:
                e = report["eagle"]
                log(f"verified the EAGLE outputs: eagle_hidden within {e['hidden_max_abs_error']:.2e}, the draft head "
                    f"within {e['draft_max_abs_error']:.2e}, proposals agree: {e['proposals_agree']}")
        write_checksums(tmp)
        readable_by_all(tmp)
        interrupt.check()  # (one a finalizer swallowed: the engine must not replace the old one)
        replace_engine(tmp, out_dir, stage)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        report = getattr(e, "report", None)  # a failed verification: its figures
        if report is not None:
            changed = provenance.code_fingerprint() != code
            report.update(code=code, code_changed_during_build=changed)
            failed_report.write_text(json.dumps(report, indent=2) + "\n")
            e.args = (f"{e} (the report: {failed_report})" + (
                "; the trtllm sources or the CPU kernel library changed during the build: run it again" * changed)
                + (gguf_int4_hint(ck.source, config.quantization) if ck is not None else ""),)
        raise
    failed_report.unlink(missing_ok=True)  # an earlier failure's
    return out_dir
