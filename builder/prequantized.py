"""Pre-quantized GPTQ and AWQ checkpoints: each packed projection (qweight, qzeros, scales, g_idx)
read back into the float weight it stands for, and its integer grid kept for --quantization int4.

The formats, as the kernels that run them decode them (weight [in, out] = scale * (q - zero), per
group of `group_size` inputs; q and zero unsigned `bits`-bit integers packed into int32):
- GPTQ (AutoGPTQ's "gptq" checkpoint format; 4 or 8 bits): qweight [in / (32/bits), out] packs
  consecutive inputs, the first in the lowest bits; qzeros [groups, out / (32/bits)] packs
  consecutive outputs so, and holds each zero minus 1 (AutoGPTQ's pack subtracts it, its kernels
  add it back); scales [groups, out]; g_idx [in], each input's group (act order: not i // group_size).
- AWQ (AutoAWQ's GEMM version; 4 bits): qweight [in, out / 8] and qzeros [groups, out / 8] pack 8
  outputs each, output 8c + ORDER[i] in bits 4i..4i+3 (AWQ_ORDER); zeros as they are; scales [groups, out].

The float weight is computed exactly (float16 scale times a small integer fits float32): the model
transformers is given, and the engine is checked against, is the checkpoint's own. A float16
kernel would round the product to float16; that is the kernel's rounding, not the checkpoint's.
With --quantization int4, a projection whose groups split into our blocks of 32 keeps its codes and
scales (on_blocks) instead of being quantized again from the float weight.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from trtllm.builder.config import CheckpointError, Unsupported, listed
from trtllm.builder.quantize import ONNX_DTYPE, QuantScheme, nearest_pair, on_float16_grid, quantize

METHODS = ("gptq", "awq")
PACKED = ("qweight", "qzeros", "scales", "g_idx")  # a packed projection's tensors
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's GEMM layout: nibble i of a word holds output 8c + AWQ_ORDER[i]


@dataclass(frozen=True)
class Packing:
    """What a checkpoint's quantization_config says of its packed projections."""
    method: str
    bits: int
    group_size: int  # -1: one group over all inputs

    def to_json(self) -> dict:
        return {"method": self.method, "bits": self.bits, "group_size": self.group_size}


@dataclass
class Grid:
    """One projection as the checkpoint holds it: w_t [in, out] = scales[group] * (codes - zeros[group]),
    its codes kept packed (half a byte a weight at 4 bits; unpacked, a byte)."""
    method: str
    bits: int
    qweight: np.ndarray | None  # the checkpoint's int32 words (None: `plain` holds the codes)
    scales: np.ndarray          # [groups, out] float32 (float16 values)
    zeros: np.ndarray           # [groups, out] int16
    groups: np.ndarray          # [in] each input's group
    plain: np.ndarray | None = None  # [in, out] uint8: codes of a slice that split AWQ's words

    def codes(self) -> np.ndarray:
        """[in, out] uint8."""
        if self.plain is not None:
            return self.plain
        if self.method == "gptq":
            return unpack(self.qweight, self.bits, axis=0)
        return awq_columns(unpack(self.qweight, self.bits, axis=1))

    def weight_t(self) -> np.ndarray:
        """The float weight [in, out], exactly."""
        g = self.groups
        return (self.scales[g] * (self.codes().astype(np.int16) - self.zeros[g])).astype(np.float32)

    def columns(self, start: int, stop: int) -> "Grid":
        """Outputs start..stop-1 (a part of a projection stored whole: Phi-3's q|k|v)."""
        part = replace(self, scales=self.scales[:, start:stop], zeros=self.zeros[:, start:stop])
        if self.plain is not None:
            return replace(part, plain=self.plain[:, start:stop])
        if self.method == "gptq":  # a word packs inputs: whole columns
            return replace(part, qweight=self.qweight[:, start:stop])
        if start % 8 == 0 and stop % 8 == 0:  # AWQ: a word packs 8 outputs
            return replace(part, qweight=self.qweight[:, start // 8:stop // 8])
        return replace(part, qweight=None, plain=self.codes()[:, start:stop])

    def keepable(self, block: int = 32) -> bool:
        """Whether --quantization int<bits>'s blocks of `block` inputs can hold this grid: each block in
        one group, whose scale is a float16 value (our kernels keep scales in float16); at 8 bits,
        symmetric (int8's blocks have no offset: every zero 128)."""
        k = len(self.groups)
        return (k % block == 0 and bool((self.groups.reshape(-1, block) == self.groups[::block, None]).all())
                and bool(on_float16_grid(self.scales[self.groups[::block]].astype(np.float64)).all())
                and (self.bits == 4 or self.bits == 8 and bool((self.zeros == 128).all())))


def as_written(grids: dict[str, Grid], spec) -> dict[str, Grid]:
    """The grids under the names DecoderWriter reads (architectures.weights_of): a projection the
    checkpoint stores whole (Phi-3's qkv_proj and gate_up_proj, GLM's gate_up_proj) split by outputs
    into q/k/v and gate/up, as its weight is."""
    out = dict(grids)
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        for whole, parts in ((f"{p}.self_attn.qkv_proj", {"self_attn.q_proj": q, "self_attn.k_proj": kv,
                                                          "self_attn.v_proj": kv}),
                             (f"{p}.mlp.gate_up_proj", {"mlp.gate_proj": None, "mlp.up_proj": None})):
            grid = out.pop(f"{whole}.weight", None)
            if grid is None:
                continue
            n, start = grid.scales.shape[1], 0
            for name, size in parts.items():
                size = size or n // 2
                out[f"{p}.{name}.weight"] = grid.columns(start, start + size)
                start += size
    return out


def side_config(path: Path) -> dict | None:
    """The quantization config of an older AutoGPTQ (quantize_config.json) or AutoAWQ (quant_config.json)
    repository, whose config.json has none, as a quantization_config."""
    for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        if (path / name).is_file():
            try:
                found = json.loads((path / name).read_text())
            except (OSError, ValueError) as e:
                raise CheckpointError(f"{path / name} cannot be read: {e}") from e
            if not isinstance(found, dict):
                raise CheckpointError(f"{path / name} must hold a JSON object")
            return {"quant_method": method, **found, SOURCE: name}
    return None


SOURCE = "_read_from"  # the key side_config adds: the file a quantization config came from


def packing_of(quant: dict, model_arg: str) -> Packing:
    """config.quantization_config of a GPTQ or AWQ checkpoint, checked for a layout this module reads."""
    method = str(quant.get("quant_method")).lower()
    where = (f"--model {model_arg!r}: {quant[SOURCE]}'s " if SOURCE in quant else
             f"--model {model_arg!r}: config.quantization_config.")

    def refuse(field: str, value, takes: str):
        article = "an" if method == "awq" else "a"
        raise Unsupported(f"{where}{field} is {value!r}; {article} {method.upper()} checkpoint is read with {takes} "
                          "(build from the unquantized checkpoint otherwise, with --quantization int4 or int8)")

    # (AutoAWQ's quant_config.json names them w_bit and q_group_size)
    bits_field = "bits" if "bits" in quant else "w_bit"
    group_field = "group_size" if "group_size" in quant else "q_group_size"
    bits, group = quant.get(bits_field), quant.get(group_field, 128)
    if method == "gptq":
        if bits not in (4, 8):
            refuse(bits_field, bits, "4 or 8")
        # (transformers' GPTQConfig calls it `format`, `checkpoint_format` before)
        field = "checkpoint_format" if quant.get("checkpoint_format") else "format"
        fmt = quant.get(field) or "gptq"
        if fmt != "gptq":  # gptq_v2 stores zeros without the minus one; marlin, bitblas: other layouts
            refuse(field, fmt, 'the "gptq" format (AutoGPTQ\'s; gptqmodel saves it by default)')
    else:
        if bits != 4:
            refuse(bits_field, bits, "4")
        # (transformers' AwqConfig calls it `format`, and reads the older `version` first; its backend
        # names a kernel, but "llm-awq" is MIT's own layout)
        field = "version" if quant.get("version") is not None else "format"
        if str(quant.get(field) or "gemm").lower() != "gemm":
            refuse(field, quant.get(field), 'AutoAWQ\'s "gemm" layout')
        if str(quant.get("backend")).lower() == "llm-awq":
            refuse("backend", quant.get("backend"), 'AutoAWQ\'s "gemm" layout')
        if quant.get("zero_point", True) is not True:
            refuse("zero_point", quant.get("zero_point"), "zero points")
    if isinstance(group, bool) or not isinstance(group, int) or not (group == -1 or group > 0):
        refuse(group_field, group, "a positive group size or -1")
    return Packing(method, bits, group)


def unpack(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words [r, c] -> their 32/bits unsigned fields (uint8), lowest bits first, along `axis`:
    0 gives [r * per, c], 1 gives [r, c * per]. One field at a time (a whole int64 copy of a large
    projection's fields took 8 bytes a weight)."""
    per, mask = 32 // bits, np.uint32((1 << bits) - 1)
    u = np.ascontiguousarray(words).view(np.uint32)
    out = np.empty((u.shape[0], per, u.shape[1]) if axis == 0 else (u.shape[0], u.shape[1], per), np.uint8)
    for j in range(per):
        field = (u >> np.uint32(bits * j)) & mask
        if axis == 0:
            out[:, j, :] = field
        else:
            out[:, :, j] = field
    return out.reshape(-1, u.shape[1]) if axis == 0 else out.reshape(u.shape[0], -1)


def awq_columns(fields: np.ndarray) -> np.ndarray:
    """AWQ's unpacked fields [r, out] (word c's field i at column 8c + i) in output order."""
    out = np.empty_like(fields)
    out.reshape(fields.shape[0], -1, 8)[:, :, AWQ_ORDER] = fields.reshape(fields.shape[0], -1, 8)
    return out


def grid_of(packing: Packing, tensors: dict, prefix: str) -> Grid:
    """A packed projection's Grid, its shapes checked (a layout misread gives a wrong model, not an error)."""
    qweight, qzeros, scales = (np.asarray(tensors[k]) for k in ("qweight", "qzeros", "scales"))
    bits, per = packing.bits, 32 // packing.bits
    zeros = unpack(qzeros, bits, axis=1).astype(np.int16)                     # [groups, out]
    if packing.method == "gptq":
        k, n, zeros = qweight.shape[0] * per, qweight.shape[1], zeros + 1
    else:
        k, n, zeros = qweight.shape[0], qweight.shape[1] * per, awq_columns(zeros)
    size = k if packing.group_size == -1 else packing.group_size
    if "g_idx" in tensors and packing.method == "gptq":
        groups = np.asarray(tensors["g_idx"]).astype(np.int64)
    else:
        groups = np.arange(k) // size
    num_groups = -(-k // size)
    expect = {"scales": (num_groups, n), "qzeros": (num_groups, n // per), "g_idx": (k,)}
    got = {"scales": scales.shape, "qzeros": qzeros.shape, "g_idx": groups.shape}
    bad = [f"{prefix}.{name} {list(got[name])} (expected {list(shape)})" for name, shape in expect.items()
           if got[name] != shape]
    if bad or groups.min(initial=0) < 0 or groups.max(initial=0) >= max(scales.shape[0], 1):
        raise CheckpointError(f"{packing.method.upper()} tensors of another layout than quantization_config "
                              f"says (bits {bits}, group_size {packing.group_size}): "
                              f"{listed(bad) or prefix + '.g_idx'}")
    return Grid(packing.method, bits, qweight, scales.astype(np.float32), zeros, groups)


def read_grids(files: list[Path], packing: Packing) -> dict[str, Grid]:
    """Every packed projection in the weight files: {"<module>.weight": Grid}."""
    from safetensors import safe_open

    found: dict[str, dict] = {}
    for path in files:
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{packing.method.upper()} weights are read from safetensors files, and "
                                  f"{path.name} is not one")
        with safe_open(str(path), framework="numpy") as f:
            for key in f.keys():
                module, _, field = key.rpartition(".")
                if field in PACKED:
                    found.setdefault(module, {})[field] = f.get_tensor(key)
    missing = [f"{m}.{t}" for m, parts in found.items() for t in ("qweight", "qzeros", "scales") if t not in parts]
    if missing:
        raise CheckpointError(f"a {packing.method.upper()} projection lacks tensors: {listed(sorted(missing))}")
    return {f"{m}.weight": grid_of(packing, parts, m) for m, parts in sorted(found.items())}


# A mixture of experts' stacked parameters (transformers 5), and the per-expert Linear weights GPTQ and
# AutoAWQ pack in their place: gate and up (Mixtral's w1 and w3) side by side in gate_up_proj
# [E, 2I, H], down (w2) alone in down_proj [E, H, I], as transformers merges a float checkpoint's
EXPERT_PARTS = {"gate_up_proj": (("gate_proj", "up_proj"), ("w1", "w3")), "down_proj": (("down_proj",), ("w2",))}
EXPERT_NAME = re.compile(r"(.*\.experts)\.(\d+)\.(\w+)\.weight$")
# where transformers 5 moved an older checkpoint's experts (its conversion mapping renames Mixtral's)
EXPERT_HOLDERS = ((".block_sparse_moe.experts", ".mlp.experts"),)


def experts_into(model, grids: dict[str, Grid], model_arg: str) -> set[str]:
    """Each expert's packed projections (`<holder>.experts.<e>.<name>.weight`) read back into the
    model's stacked expert parameters (EXPERT_PARTS), exactly as the dense ones are; the names filled.
    A packed expert projection with no such place, or a set missing one of its experts, is refused."""
    import torch

    found: dict[str, dict] = {}
    for name, grid in grids.items():
        match = EXPERT_NAME.match(name)
        if match:
            found.setdefault(match.group(1), {})[int(match.group(2)), match.group(3)] = grid
    params, filled = dict(model.named_parameters()), set()
    for packed, parts in found.items():
        holder = next((packed.replace(old, new) for old, new in EXPERT_HOLDERS
                       if old in packed and f"{packed.replace(old, new)}.down_proj" in params), packed)
        stack = model.get_submodule(holder) if f"{holder}.down_proj" in params else None
        if getattr(stack, "is_transposed", False):
            # ([E, H, 2I] and its kin: a stack the shape check alone could not tell from ours where H = 2I)
            raise Unsupported(f"--model {model_arg!r}: {packed}'s packed experts: the model stacks them transposed "
                              f"({type(stack).__name__}), which is not read here")
        experts, left = 1 + max(e for e, _ in parts), set(parts)
        for target, spellings in EXPERT_PARTS.items():
            names = next((s for s in spellings if any(p in s for _, p in parts)), None)
            if names is None:
                continue
            want = {(e, p) for e in range(experts) for p in names}
            name = f"{holder}.{target}"
            if not want <= set(parts) or name not in params:
                why = (f"the model holds no {name} to put them in" if name not in params else
                       f"{listed(sorted(f'{packed}.{e}.{p}' for e, p in want - set(parts)))} are not packed with them")
                raise Unsupported(f"--model {model_arg!r}: {packed}'s packed {'/'.join(names)} experts: {why}")
            stacked = np.stack([np.concatenate([parts[e, p].weight_t().T for p in names]) for e in range(experts)])
            param = params[name]
            if tuple(param.shape) != stacked.shape:
                raise CheckpointError(f"{packed}'s packed experts unpack to {list(stacked.shape)} for {name}, and the "
                                      f"model's is {list(param.shape)}")
            with torch.no_grad():
                param.copy_(torch.from_numpy(np.ascontiguousarray(stacked)))
            filled.add(name)
            left -= want
        if left:
            raise Unsupported(f"--model {model_arg!r}: packed expert projections with no stacked parameter here: "
                              f"{listed(sorted(f'{packed}.{e}.{p}' for e, p in left))}")
    return filled


def renamed(grids: dict[str, Grid], names: set[str]) -> dict[str, Grid]:
    """`grids` under the model's parameter names: a name the model does not have is matched by its
    tail from its layer container on ("layers.0.self_attn.q_proj.weight"), where exactly one parameter
    ends so: the older names vision-language checkpoints keep ("model.layers..." or
    "language_model.model.layers..." for transformers 5's "model.language_model.layers..."). A packed
    module with no such match keeps its name (an unused tensor, or a mixture of experts' expert)."""
    out = {}
    for name, grid in grids.items():
        parts, found = name.split("."), name
        first = 0 if name in names else next((i for i, p in enumerate(parts) if p.isdigit()), 0)
        for k in range(1, first):  # (the tail keeps "<container>.<i>")
            matches = [n for n in names if n.endswith("." + ".".join(parts[k:]))]
            if len(matches) == 1:
                found = matches[0]
                break
        out[found] = grid
    return out


def consumed(unexpected: list[str], grids: dict[str, Grid]) -> list[str]:
    """transformers' unexpected keys less the packed tensors read here."""
    modules = {name[:-len(".weight")] for name in grids}
    return [k for k in unexpected if not (k.rpartition(".")[2] in PACKED and k.rpartition(".")[0] in modules)]


def on_blocks(grids: list[Grid], w_t: np.ndarray, scheme: QuantScheme):
    """quantize(w_t, scheme)'s (codes, scales, offsets), taken from the checkpoint's grids of w_t's
    parts (joined along the outputs: q|k|v, gate|up) instead of found again; None where they do not
    fit the scheme's blocks: 4-bit grids for int4, symmetric 8-bit ones for int8 (symmetric_codes),
    whose groups hold whole blocks (not act order's mixed ones), and that give w_t exactly (a weight
    the architecture renamed or reordered is quantized from its floats).
    Codes and scales (float16 values, as our kernels keep them) are the checkpoint's; each block's
    minimum, -scale * zero, moves to the nearest value that keeps it and the offset on float16's grid
    (quantize.nearest_pair; a fraction of a float16 step); a block with no such pair takes quantize()'s
    own codes, scale and offset."""
    b, k = scheme.block_size, w_t.shape[0]
    if scheme.asymmetric != (scheme.bits == 4) or any(len(g.groups) != k or g.bits != scheme.bits for g in grids):
        return None
    if not all(g.keepable(b) for g in grids):
        return None
    scale = np.concatenate([g.scales[g.groups[::b]] for g in grids], axis=1)            # [blocks, out]
    codes = np.concatenate([g.codes() for g in grids], axis=1)
    zero = np.concatenate([g.zeros[g.groups[::b]] for g in grids], axis=1)
    held = (codes.reshape(k // b, b, -1).astype(np.int16) - zero[:, None, :]) * scale[:, None, :]
    if not np.array_equal(held.reshape(k, -1), w_t):
        return None
    del held
    if scheme.bits == 8:
        return symmetric_codes(codes, scale, w_t, scheme)
    lo, found = nearest_pair((-scale * zero).astype(np.float32), scale, 8)
    offset = (lo + 8 * scale.astype(np.float64)).astype(np.float32)
    return own_where(~found, w_t, scheme, codes.astype(np.int8) - 8, scale, offset)


def symmetric_codes(codes: np.ndarray, scale: np.ndarray, w_t: np.ndarray, scheme: QuantScheme):
    """A symmetric 8-bit grid (zero 128) as int8's (codes, scales, None): codes q - 128, but a block
    holding -128 (the grid's lowest level, which our int8 codes leave out: they span -127..127) takes
    quantize()'s own codes and scale."""
    signed = codes.astype(np.int16) - 128
    full = (signed.reshape(-1, scheme.block_size, signed.shape[1]) == -128).any(axis=1)   # [blocks, out]
    return own_where(full, w_t, scheme, signed, scale.astype(np.float32), None)


def own_where(bad: np.ndarray, w_t: np.ndarray, scheme: QuantScheme, codes: np.ndarray, scale: np.ndarray,
              offset: np.ndarray | None):
    """(codes [in, out] as small integers, scale, offset) in the scheme's types, with the blocks
    `bad` [blocks, out] (a grid our blocks cannot hold there) taken from quantize()'s own result."""
    if bad.any():
        own = quantize(w_t, scheme)
        codes = np.where(np.repeat(bad, scheme.block_size, axis=0), own[0].astype(np.int16), codes)
        scale = np.where(bad, own[1], scale)
        offset = None if offset is None else np.where(bad, own[2], offset)
    return codes.astype(np.int8).astype(ONNX_DTYPE[scheme.bits]), scale, offset


def grid_note(packing: dict, quant: QuantScheme | None, grids: dict[str, Grid], kept: list[str], spec,
              takes_quantization: bool = True) -> str:
    """What the build did with a GPTQ/AWQ checkpoint's packed projections (`packing`: the manifest's
    source.prequantized; `grids` as written, `kept` those int4 or int8 took as they are;
    `takes_quantization`: whether this build's graph and dtype take --quantization)."""
    what = f"{packing['method'].upper()} {packing['bits']}-bit checkpoint (group size {packing['group_size']})"
    return _grid_note(packing, quant, grids, kept, spec, takes_quantization, what) + (
        f"; its experts ({packing['experts']} stacked parameters) are read back to the float weights they stand for"
        + (f" and quantized again to int{quant.bits} from them" if quant is not None else "")
        if packing.get("experts") else "")


def _grid_note(packing: dict, quant, grids: dict[str, Grid], kept: list[str], spec, takes_quantization: bool,
               what: str) -> str:
    packed = sorted(name[:-len(".weight")] for name in grids)
    bits = packing["bits"]
    why = (f"its grid is kept by --quantization int{bits} only" if quant is not None and quant.bits != bits else
           "act order or a group size that mixes groups within a block of 32, scales that are not float16 "
           "values, " + ("zero points (int8's blocks have none), " if bits == 8 else "") +
           "an int8 lm_head, or q|k|v of an interleaved RoPE, whose rows the build reorders")
    if quant is None:
        if not takes_quantization:
            return (f"note: the {what} is built with float weights (its projections unpacked exactly); its grid "
                    f"is kept only by --quantization int{bits}, on the modern graph in float32 or float16")
        fits = [name for name, grid in grids.items() if grid.keepable() and name != "lm_head.weight"
                and not (spec.interleaved_rope and name.split(".")[-2] in ("q_proj", "k_proj", "v_proj"))]
        return (f"note: the {what} is built with float weights (its projections unpacked exactly); " +
                (f"--quantization int{bits} would keep the codes and scales of {len(fits)} of its {len(packed)} "
                 "packed projections in a smaller engine" if fits else
                 f"--quantization int{bits} would quantize them again from those weights ({why})"))
    again = sorted(set(packed) - set(kept))
    if not set(kept) & set(packed):
        return (f"note: the {what}: its projections are quantized again to int{quant.bits} from their exact float "
                f"weights ({why})")
    return (f"the {what}: int{quant.bits} keeps its codes and scales for {len(packed) - len(again)} of "
            f"{len(packed)} packed projections"
            + (f"; quantized again from their float weights: {listed(again)} ({why})" if again else ""))
