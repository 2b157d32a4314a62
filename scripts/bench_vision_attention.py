"""One full-attention layer's attention of a Qwen-VL image encoder (its qkv projection, 2-D rotary,
attention over the whole image and output projection) on the CPU: vision.onnx's ops (ONNX's Attention
with the image mask), vision.ort.onnx's (one trtllm.cpu::SegmentAttention node) and transformers'
attention module (torch's scaled_dot_product_attention), on the same rows, at Qwen2.5-VL-3B's or
Qwen3-VL-2B's encoder width (scripts/bench_vision_qwen.py's MODELS), random weights.

    python scripts/bench_vision_attention.py [--model qwen2.5-vl|qwen3-vl] [--patches 1024 3072 5120]
                                             [--rounds 5] [--threads 2]

This is the part vision.ort.onnx changes; bench_vision_qwen.py times whole encoders, where the MLPs'
matrix products (the same in all three) take about half the time and a shared machine's noise hides
the rest. Each round times each contender once per size (best of 3 calls), in this one process; the
ratios are paired by round (transformers' time / ours: > 1 is ours faster), median [min-max]."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_vision_qwen import MODELS, model_of, summary  # noqa: E402


def layer(name: str):
    """(transformers' model, its spec, {form: ONNX model bytes}): MODELS[name]'s encoder with two layers,
    layer 0 of full attention, whose attention alone each graph computes."""
    from trtllm.builder import vision_qwen as vq
    from trtllm.plugins import cpu

    vision = MODELS[name][1]
    model = model_of(name, depth=2, **({"fullatt_block_indexes": [0]} if "fullatt_block_indexes" in vision else {}),
                     **({"deepstack_visual_indexes": [1]} if "deepstack_visual_indexes" in vision else {}))
    spec = vq.spec_of(model.config)
    weights = vq.weights_of(model)
    graphs = {}
    for form, native in (("vision.onnx", False), ("vision.ort.onnx", True)):
        if native and cpu.library() is None:
            continue
        w = vq.QwenVisionWriter(spec, weights, native=native)
        g = w.g
        x = g.input("x", vq.F32, ["patches", spec.hidden_size])
        positions, ids = g.input(vq.POSITIONS, vq.I64, ["patches", 2]), g.input(vq.IMAGE_IDS, vq.I64, ["patches"])
        mask = ids if native else w.mask("/vision/image_mask", ids)
        g.op("Identity", "/out", [w.attention(0, x, w.rotary(positions), mask, None)], outputs=["y"])
        g.output("y", vq.F32, ["patches", spec.hidden_size])
        graphs[form] = g.model("trtllm-edge", {cpu.DOMAIN: 1} if native else None).SerializeToString()
    return model, spec, weights, graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-vl")
    parser.add_argument("--patches", type=int, nargs="+", default=[1024, 3072, 5120])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import onnxruntime as ort
    import torch

    from trtllm.plugins import cpu

    torch.set_num_threads(args.threads)
    model, spec, weights, graphs = layer(args.model)
    sessions = {}
    for form, graph in graphs.items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        if form == "vision.ort.onnx":
            opts.register_custom_ops_library(str(cpu.library()))
        sessions[form] = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
    attn = model.model.visual.blocks[0].attn

    def best(fn):
        out, times = None, []
        for _ in range(3):
            began = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - began)
        return min(times), out

    times: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for p in args.patches:
            rng = np.random.default_rng(r)
            x = rng.standard_normal((p, spec.hidden_size)).astype(np.float32)
            side = int(np.ceil(np.sqrt(p)))  # (rows of one square-ish image: positions on its grid)
            positions = np.stack([np.arange(p) // side, np.arange(p) % side], -1).astype(np.int64)
            angles = (positions[:, :, None] * weights["rotary_pos_emb.inv_freq"]).reshape(p, -1)
            angles = torch.from_numpy(np.concatenate([angles, angles], -1).astype(np.float32))
            with torch.no_grad():
                theirs, ref = best(lambda: attn(torch.from_numpy(x), cu_seqlens=torch.tensor([0, p], dtype=torch.int32),
                                                position_embeddings=(angles.cos(), angles.sin())).numpy())
            feeds = {"x": x, "patch_positions": positions, "image_ids": np.zeros(p, np.int64)}
            line = []
            for form, session in sessions.items():
                mine, out = best(lambda: session.run(None, feeds)[0])
                times.setdefault((p, form), []).append((mine, theirs))
                line.append(f"{form} {mine * 1e3:.0f} ms (max |difference| {float(np.abs(out - ref).max()):.1e})")
            print(f"round {r + 1}, {p} patches: transformers {theirs * 1e3:.0f} ms; " + "; ".join(line), flush=True)
    summary({(f"{p} patches", form): pairs for (p, form), pairs in times.items()}, unit="ms")


if __name__ == "__main__":
    main()
