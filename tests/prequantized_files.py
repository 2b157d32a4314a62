"""GPTQ and AWQ checkpoints made from a tiny float one, packed as AutoGPTQ's QuantLinear.pack and
AutoAWQ's pack_awq lay them out (word by word, as those loops do, not with the loader's vectorised
unpacking), beside the float weights they stand for: the reference the loader is checked against."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from trtllm.builder.quantize import dequantize

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj",
               "w1", "w2", "w3")  # (w1-w3: Mixtral's experts, as its checkpoints name them)
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: nibble i of a word holds output col * 8 + order[i]


def quantize_groups(w_t: np.ndarray, bits: int, group: int, sym: bool, groups: np.ndarray):
    """w_t [in, out] -> (q [in, out], scales [G, out] float16, zeros [G, out]) with each input in
    `groups[i]`, as GPTQ's and AWQ's round-to-nearest steps compute them."""
    maxq = 2 ** bits - 1
    num = int(groups.max()) + 1
    scales = np.zeros((num, w_t.shape[1]), np.float16)
    zeros = np.zeros((num, w_t.shape[1]), np.int64)
    for g in range(num):
        rows = w_t[groups == g]
        lo, hi = np.minimum(rows.min(0), 0), np.maximum(rows.max(0), 0)
        if sym:
            hi = np.maximum(-lo, hi)
            lo = -hi
        s = np.where(hi > lo, (hi - lo) / maxq, 1.0).astype(np.float16)
        scales[g] = s
        zeros[g] = np.full(w_t.shape[1], (maxq + 1) // 2) if sym else np.clip(np.rint(-lo / s.astype(np.float32)), 0, maxq)
    q = np.clip(np.rint(w_t / scales[groups].astype(np.float32)) + zeros[groups], 0, maxq).astype(np.int64)
    return q, scales, zeros


def pack_gptq(q: np.ndarray, zeros: np.ndarray, bits: int):
    """AutoGPTQ's layout: qweight packs `32 / bits` consecutive inputs per word (lowest bits first),
    qzeros consecutive outputs, each zero stored minus 1."""
    per = 32 // bits
    qweight = np.zeros((q.shape[0] // per, q.shape[1]), np.uint32)
    for row in range(qweight.shape[0]):
        for j in range(per):
            qweight[row] |= q[row * per + j].astype(np.uint32) << (bits * j)
    z = (zeros - 1).astype(np.uint32) & np.uint32(2 ** bits - 1)
    qzeros = np.zeros((z.shape[0], z.shape[1] // per), np.uint32)
    for col in range(qzeros.shape[1]):
        for j in range(per):
            qzeros[:, col] |= z[:, col * per + j] << (bits * j)
    return qweight.view(np.int32), qzeros.view(np.int32)


def pack_awq(q: np.ndarray) -> np.ndarray:
    """AutoAWQ's GEMM layout: 8 outputs per word, in AWQ_PACK_ORDER."""
    packed = np.zeros((q.shape[0], q.shape[1] // 8), np.uint32)
    for col in range(packed.shape[1]):
        for i in range(8):
            packed[:, col] |= q[:, col * 8 + AWQ_PACK_ORDER[i]].astype(np.uint32) << (4 * i)
    return packed.view(np.int32)


def write_prequantized(src: Path, out: Path, method: str, bits: int = 4, group: int = 32, sym: bool = True,
                       act_order: bool = False, config_extra: dict | None = None,
                       side_file: bool = False, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """A copy of the float checkpoint `src` with every decoder projection packed (GPTQ or AWQ), but
    those whose names start with one of `skip` (a VLM's vision tower, which releases keep float);
    returns the float weights [out, in] each packed projection stands for, by weight name.
    `side_file`: the quantization config in quantize_config.json (GPTQ) or quant_config.json (AWQ,
    AutoAWQ's field names), as older repositories have it, not in config.json."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, out / f.name)
    tensors, reference = load_file(src / "model.safetensors"), {}
    rng = np.random.default_rng(7)
    for name in [k for k in tensors if k.endswith(".weight") and k.split(".")[-2] in PROJECTIONS
                 and not k.startswith(skip)]:
        w_t = tensors.pop(name).astype(np.float32).T.copy()              # [in, out]
        k = w_t.shape[0]
        groups = np.arange(k) // group
        if act_order:  # GPTQ's desc_act: groups follow a permutation of the inputs
            groups = groups[np.argsort(rng.permutation(k))]
        q, scales, zeros = quantize_groups(w_t, bits, group, sym, groups)
        module = name[:-len(".weight")]
        if method == "gptq":
            tensors[f"{module}.qweight"], tensors[f"{module}.qzeros"] = pack_gptq(q, zeros, bits)
            tensors[f"{module}.g_idx"] = groups.astype(np.int32)
        else:
            tensors[f"{module}.qweight"] = pack_awq(q)
            tensors[f"{module}.qzeros"] = pack_awq(zeros)
        tensors[f"{module}.scales"] = scales
        reference[name] = (scales[groups].astype(np.float32) * (q - zeros[groups])).T.astype(np.float32)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    quant = ({"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym, "desc_act": act_order,
              "checkpoint_format": "gptq"} if method == "gptq" else
             {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": not sym, "version": "gemm"})
    quant = {**quant, **(config_extra or {})}
    if not side_file:
        config["quantization_config"] = quant
    elif method == "gptq":
        (out / "quantize_config.json").write_text(json.dumps({k: v for k, v in quant.items() if k != "quant_method"}))
    else:
        (out / "quant_config.json").write_text(json.dumps({"zero_point": quant["zero_point"], "w_bit": bits,
                                                           "q_group_size": group, "version": "GEMM"}))
    (out / "config.json").write_text(json.dumps(config))
    return reference


def engine_weights(engine_dir, reference: dict) -> dict:
    """The projections an int4 engine's llm.onnx holds (codes, scales and offsets dequantized), under
    the checkpoint's names: q|k|v and gate|up split again (layers 0 and 1 of a tiny model)."""
    model = onnx.load(str(engine_dir / "llm.onnx"))
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = {}
    for fused, parts in (("self_attn.qkv_proj", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
                         ("mlp.gate_up_proj", ["mlp.gate_proj", "mlp.up_proj"]),
                         ("self_attn.o_proj", ["self_attn.o_proj"]), ("mlp.down_proj", ["mlp.down_proj"])):
        for layer in (0, 1):
            p = f"model.layers.{layer}"
            w = dequantize(*(init[f"{p}.{fused}.weight_{k}"] for k in ("q4", "scale", "offset")), 32).T
            sizes = np.cumsum([reference[f"{p}.{part}.weight"].shape[0] for part in parts])[:-1]
            out.update({f"{p}.{part}.weight": np.ascontiguousarray(piece)
                        for part, piece in zip(parts, np.split(w, sizes))})
    return out


def error_in_steps(weights: dict, reference: dict) -> float:
    """The largest |weight - checkpoint weight| in units of (max - min) / 15 of its block of 32 inputs:
    one unit for every variant compared."""
    worst = 0.0
    for name, w in weights.items():
        ref = reference[name]                                             # [out, in]
        blocks = ref.reshape(ref.shape[0], -1, 32)
        step = np.repeat((blocks.max(axis=2) - blocks.min(axis=2)) / 15, 32, axis=1)
        worst = max(worst, float((np.abs(w - ref) / np.maximum(step, 1e-30)).max()))
    return worst
