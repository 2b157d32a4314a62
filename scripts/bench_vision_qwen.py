"""What an image costs on the CPU on Qwen2.5-VL or Qwen3-VL: the vision graph (builder/vision_qwen.py, through ONNX
Runtime, its inputs from runtime/images_qwen.py) in both its forms (vision.onnx, ONNX's Attention;
vision.ort.onnx, trtllm.cpu::SegmentAttention, where the kernel library is built) against transformers'
get_image_features on the same pixels, at Qwen2.5-VL-3B's encoder size (32 layers, 1,280 wide, 16 heads, 112 px windows, full
attention in 4 layers) or Qwen3-VL-2B's (24 layers, 1,024 wide, full attention, DeepStack), with random
weights (no checkpoint is downloaded here).

    python scripts/bench_vision_qwen.py [--model qwen2.5-vl|qwen3-vl] [--sizes 448x448 896x672] [--rounds 3]
                                        [--threads 2]

An image of W x H pixels (multiples of 28; Qwen3-VL: 32) is (H/14) x (W/14) patches (Qwen3-VL: /16) and
a quarter as many tokens.
Each round times all of them on each size, one after another, in this one process; the ratio is paired by round
(transformers' time / ours: > 1 is ours faster), as median [min-max]: the machine is shared, so only
ratios of one round mean anything. The outputs are compared too.
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


# the encoders' configs: Qwen2.5-VL-3B's (windowed) and Qwen3-VL-2B's (full attention, a learned
# position grid, DeepStack mergers on 3 layers)
MODELS = {
    "qwen2.5-vl": ("Qwen2_5_VL", {"depth": 32, "hidden_size": 1280, "num_heads": 16, "intermediate_size": 3420,
                                  "out_hidden_size": 2048, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                                  "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2,
                                  "hidden_act": "silu"}),
    "qwen3-vl": ("Qwen3VL", {"depth": 24, "hidden_size": 1024, "num_heads": 16, "intermediate_size": 4096,
                             "out_hidden_size": 2048, "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17],
                             "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                             "hidden_act": "gelu_pytorch_tanh"}),
}


def model_of(name: str, **vision_changes):
    """transformers' model for MODELS[name]'s vision config (with `vision_changes`), a one-layer text
    model (it plays no part), random weights."""
    import torch
    import transformers

    prefix, vision = MODELS[name]
    text = {"vocab_size": 1000, "hidden_size": 2048, "intermediate_size": 256, "num_hidden_layers": 1,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}}
    config = getattr(transformers, f"{prefix}Config")(vision_config={**vision, **vision_changes}, text_config=text,
                                                      image_token_id=999)
    torch.manual_seed(0)
    return getattr(transformers, f"{prefix}ForConditionalGeneration")(config).eval()


def encoder(tmp: Path, name: str):
    """(transformers' model, our vision.onnx path, its spec): model_of(name); and vision.ort.onnx beside
    vision.onnx where our kernels are built."""
    from trtllm.builder import vision_qwen
    from trtllm.builder.export import save
    from trtllm.builder.vision_export import write_sharing
    from trtllm.plugins import cpu

    model = model_of(name)
    spec = vision_qwen.spec_of(model.config)
    weights = vision_qwen.weights_of(model)
    save(vision_qwen.QwenVisionWriter(spec, weights).write(), tmp, "vision.onnx")
    if cpu.library() is not None:
        write_sharing(vision_qwen.QwenVisionWriter(spec, weights, native=True).write(), tmp)
    return model, tmp / "vision.onnx", spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-vl")
    parser.add_argument("--sizes", nargs="+", default=["448x448", "896x672"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import onnxruntime as ort
    import torch

    from trtllm.plugins import cpu
    from trtllm.runtime.images_qwen import encoder_inputs

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model, path, spec = encoder(Path(tmp), args.model)
        sessions = {}  # form -> session
        for form, name in (("vision.onnx", "vision.onnx"), ("our kernels", "vision.ort.onnx")):
            if (Path(tmp) / name).exists():
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = args.threads
                if form == "our kernels":
                    opts.register_custom_ops_library(str(cpu.library()))
                sessions[form] = ort.InferenceSession(str(Path(tmp) / name), opts, providers=["CPUExecutionProvider"])
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (size, form) -> (ours, transformers) a round
        for r in range(args.rounds):
            for size in args.sizes:
                width, height = (int(n) for n in size.split("x"))
                grid = (1, height // spec.patch_size, width // spec.patch_size)
                pixels = np.random.default_rng(r).standard_normal((grid[1] * grid[2], spec.patch_dim)).astype(np.float32)
                mine, ours = {}, {}
                for form, session in sessions.items():
                    takes = {i.name for i in session.get_inputs()}
                    began = time.perf_counter()
                    at = encoder_inputs([grid], spec.spatial_merge_size, spec.window_size, spec.patch_size,
                                        spec.num_grid_per_side)
                    feeds = {"pixel_values": pixels[at["order"]], **{k: v for k, v in at.items() if k in takes}}
                    ours[form] = session.run(None, feeds)[0][at["reverse"]]
                    mine[form] = time.perf_counter() - began
                began = time.perf_counter()
                with torch.no_grad():
                    out = model.model.get_image_features(torch.from_numpy(pixels), torch.tensor([grid]),
                                                         return_dict=True)
                ref = np.concatenate([out.pooler_output[0].numpy(), *(  # (Qwen3-VL: DeepStack's rows beside)
                    f[0].numpy() for f in getattr(out, "deepstack_features", None) or ())], axis=-1)
                theirs = time.perf_counter() - began
                for form in sessions:
                    times.setdefault((size, form), []).append((mine[form], theirs))
                print(f"round {r + 1}, {size} ({len(ref)} tokens): transformers {theirs:.2f} s; " + "; ".join(
                    f"{form} {mine[form]:.2f} s (max |difference| {float(np.abs(ours[form] - ref).max()):.2e})"
                    for form in sessions), flush=True)
        summary(times)


def summary(times: dict, unit: str = "s") -> None:
    """Each (size, form)'s best round, transformers' and ours, and the ratio paired by round, median [min-max];
    `times`: (size, form) -> [(ours, transformers) a round], in seconds (shown in `unit`: s or ms)."""
    scale, digits = (1e3, 0) if unit == "ms" else (1.0, 2)
    for (size, form), pairs in times.items():
        ratios = [theirs / mine for mine, theirs in pairs]
        print(f"{size}, {form}: best {min(m for m, _ in pairs) * scale:.{digits}f} {unit}, transformers best "
              f"{min(t for _, t in pairs) * scale:.{digits}f} {unit}; transformers / ours "
              f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    main()
