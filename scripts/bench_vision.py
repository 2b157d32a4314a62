"""What an image costs on the CPU: the vision graph (builder/vision.py, through ONNX Runtime) against
transformers' get_image_features on the same pixels, at InternVL3's encoder size (InternViT-300M: 24
layers, 1,024 wide, 448 x 448 tiles of 1,025 patches, 256 tokens each) or with --model smolvlm at
SmolVLM-256M's (builder/vision_idefics3.py; SigLIP-93M: 12 layers, 768 wide, 512 x 512 tiles of 1,024
patches, 64 tokens each) or with --model gemma3 at gemma-3-4b-it's (builder/vision_gemma3.py; SigLIP-so400m:
27 layers, 1,152 wide, 896 x 896 images of 4,096 patches pooled to 256 tokens) or with --model gemma4 at
gemma-4-E2B-it's (builder/vision_gemma4.py; 16 layers, 768 wide, a 1024 x 768 photo resized to 2,394
patches of 16 px, pooled 3 x 3 to 266 tokens: a "tile" is such a photo, which transformers takes padded to
its processor's 2,520 patches and ours takes as it is, one image a run), with random weights (no
checkpoint is downloaded here).

    python scripts/bench_vision.py [--model internvl|smolvlm|gemma3|gemma4] [--tiles 1 4] [--rounds 3] [--threads 2]

Each round times both on each tile count, alternating, in this one process; the ratio is paired
by round (transformers' time / ours: > 1 is ours faster), as median [min-max]: the machine is
shared, so only ratios of one round mean anything. The outputs are compared too. With --model gemma3
and gemma4, its ONNX Runtime form on our kernels (vision.ort.onnx: attention as trtllm.cpu::SegmentAttention) is timed
beside vision.onnx where our kernel library runs its AVX2 path.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def smolvlm_encoder(tmp: Path):
    """As encoder(), at SmolVLM-256M-Instruct's vision config."""
    import torch
    import transformers

    from trtllm.builder import vision, vision_idefics3
    from trtllm.builder.export import save

    vision_config = transformers.SmolVLMVisionConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                     intermediate_size=3072, image_size=512, patch_size=16)
    text = transformers.LlamaConfig(vocab_size=1000, hidden_size=576, intermediate_size=256, num_hidden_layers=1,
                                    num_attention_heads=9, num_key_value_heads=3)
    config = transformers.SmolVLMConfig(vision_config=vision_config.to_dict(), text_config=text.to_dict(),
                                        scale_factor=4, image_token_id=999)
    torch.manual_seed(0)
    model = transformers.SmolVLMForConditionalGeneration(config).eval()
    spec = vision_idefics3.spec_of(model.config)
    save(vision_idefics3.Idefics3Writer(spec, vision_idefics3.weights_of(model)).write(), tmp, vision.VISION_NAME)
    return model, tmp / vision.VISION_NAME, spec


def gemma3_encoder(tmp: Path):
    """As encoder(), at gemma-3-4b-it's vision config (a tile is an image)."""
    import torch
    import transformers

    from trtllm.builder import vision, vision_gemma3
    from trtllm.builder.export import save

    vision_config = transformers.SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                                                    num_attention_heads=16, image_size=896, patch_size=14,
                                                    hidden_act="gelu_pytorch_tanh", vision_use_head=False)
    text = transformers.Gemma3TextConfig(vocab_size=1000, hidden_size=640, intermediate_size=256, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=1, head_dim=256)
    config = transformers.Gemma3Config(vision_config=vision_config.to_dict(), text_config=text.to_dict(),
                                       mm_tokens_per_image=256, boi_token_index=997, eoi_token_index=998,
                                       image_token_index=999)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # (its init leaves the projection 0: every output would be 0)
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 1152 ** -0.5)
    spec = vision_gemma3.spec_of(model.config)
    weights = vision_gemma3.weights_of(model)
    save(vision_gemma3.Gemma3Writer(spec, weights).write(), tmp, vision.VISION_NAME)
    # (and its ONNX Runtime form on our kernels, vision.ort.onnx, which the engine runs where it can)
    save(vision_gemma3.Gemma3Writer(spec, weights, native=True).write(), tmp, vision.VISION_COMPILED)
    return model, tmp / vision.VISION_NAME, spec


def gemma4_encoder(tmp: Path):
    """As encoder(), at gemma-4-E2B-it's vision config (transformers' Gemma4VisionConfig defaults)."""
    import torch
    import transformers

    from trtllm.builder import vision, vision_gemma4
    from trtllm.builder.export import save

    text = transformers.Gemma4TextConfig(vocab_size=1000, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                                         hidden_size_per_layer_input=0, layer_types=["full_attention"])
    config = transformers.Gemma4Config(vision_config=transformers.Gemma4VisionConfig().to_dict(), audio_config=None,
                                       text_config=text.to_dict(), boi_token_id=997, eoi_token_id=998,
                                       image_token_id=999)
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    spec = vision_gemma4.spec_of(model.config)
    weights = vision_gemma4.weights_of(model)
    save(vision_gemma4.Gemma4Writer(spec, weights).write(), tmp, vision.VISION_NAME)
    save(vision_gemma4.Gemma4Writer(spec, weights, native=True).write(), tmp, vision.VISION_COMPILED)
    return model, tmp / vision.VISION_NAME, spec


def gemma4_inputs(n: int, seed: int) -> tuple[list[dict], dict]:
    """n random 1024 x 768 photos: ours, each image's feeds; transformers', the processor's padded batch."""
    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from trtllm.runtime import images_gemma4

    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(rng.integers(0, 256, (768, 1024, 3), dtype=np.uint8)) for _ in range(n)]
    pre = images_gemma4.preprocess_config({})
    ours = [dict(zip(("pixel_values", "pixel_position_ids"), images_gemma4.pixel_values(p, pre))) for p in photos]
    theirs = Gemma4ImageProcessorPil()(photos, return_tensors="pt")
    return ours, {"pixel_values": theirs["pixel_values"], "image_position_ids": theirs["image_position_ids"]}


def encoder(tmp: Path):
    """(transformers' model, our vision.onnx path, its spec): InternVL3-1B's vision config, a one-layer
    text model (it plays no part), random weights."""
    import torch
    import transformers

    from trtllm.builder import vision
    from trtllm.builder.export import save

    vision_config = transformers.InternVLVisionConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                                      intermediate_size=4096, image_size=448, patch_size=14,
                                                      attention_bias=True)
    text = transformers.Qwen2Config(vocab_size=1000, hidden_size=896, intermediate_size=256, num_hidden_layers=1,
                                    num_attention_heads=14, num_key_value_heads=2)
    config = transformers.InternVLConfig(vision_config=vision_config.to_dict(), text_config=text.to_dict(),
                                         image_token_id=999)
    torch.manual_seed(0)
    model = transformers.InternVLForConditionalGeneration(config).eval()
    spec = vision.spec_of(model.config)
    save(vision.VisionWriter(spec, vision.weights_of(model)).write(), tmp, vision.VISION_NAME)
    return model, tmp / vision.VISION_NAME, spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["internvl", "smolvlm", "gemma3", "gemma4"], default="internvl")
    parser.add_argument("--tiles", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import onnxruntime as ort
    import torch

    from trtllm.builder import vision, vision_idefics3

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model, path, spec = {"smolvlm": smolvlm_encoder, "gemma3": gemma3_encoder,
                             "gemma4": gemma4_encoder}.get(args.model, encoder)(Path(tmp))
        features = (vision_idefics3 if args.model == "smolvlm" else vision).image_features
        from trtllm.plugins import cpu as cpu_kernels

        sessions = {}
        for form, graph in (("vision.onnx", path), ("vision.ort.onnx", path.with_name(vision.VISION_COMPILED))):
            if not graph.exists() or (form != "vision.onnx" and not cpu_kernels.segment_attention_fast()):
                continue
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            if form != "vision.onnx":
                opts.register_custom_ops_library(str(cpu_kernels.library()))
            sessions[form] = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
        times: dict[tuple, list[tuple[float, float]]] = {(form, n): [] for form in sessions for n in args.tiles}
        for r in range(args.rounds):
            for n in args.tiles:
                if args.model == "gemma4":  # (an image a run, as runtime/media.py encodes them)
                    feeds, padded = gemma4_inputs(n, r)
                else:
                    pixels = np.random.default_rng(r).standard_normal((n, 3, *spec.image_size)).astype(np.float32)
                    feeds = [{"pixel_values": pixels}]
                mine, outs = {}, []
                for form, session in sessions.items():
                    began = time.perf_counter()
                    outs.append(np.concatenate([session.run(None, f)[0] for f in feeds]))
                    mine[form] = time.perf_counter() - began
                began = time.perf_counter()
                with torch.no_grad():
                    ref = torch.cat(model.model.get_image_features(**padded, return_dict=True).pooler_output) \
                        if args.model == "gemma4" else features(model, torch.from_numpy(pixels))
                theirs = time.perf_counter() - began
                error = max(float(np.abs(ours - ref.reshape(ours.shape).numpy()).max()) for ours in outs)
                for form in sessions:
                    times[(form, n)].append((mine[form], theirs))
                print(f"round {r + 1}, {n} tile(s): " + ", ".join(f"{form} {t:.2f} s" for form, t in mine.items())
                      + f", transformers {theirs:.2f} s, max |difference| {error:.2e}", flush=True)
        for (form, n), pairs in times.items():
            ratios = [theirs / mine for mine, theirs in pairs]
            print(f"{n} tile(s), {form}: ours best {min(m for m, _ in pairs) / n:.2f} s a tile, transformers best "
                  f"{min(t for _, t in pairs) / n:.2f} s a tile; transformers / ours {statistics.median(ratios):.2f} "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    main()
