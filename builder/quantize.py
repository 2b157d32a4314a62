"""Weight-only block-wise quantization (int8 / int4), written as standard ONNX ops.

A linear layer's transposed weight W [in, out] becomes signed integer codes c [in, out] and
float32 scales s [in / block, out], one per `block` consecutive input rows of each output column.
Scales, int4's block minimums and its offsets are values float16 holds exactly (GGUF stores the
first two so), so the native CPU kernel keeps min and scale in 2 bytes, a float16 llm.onnx (W4A16)
keeps the offset in 2 bytes, and every form of the engine computes the same weights.

- int8 (symmetric): s = max|W_block| / 127, c = round(W / s), W ~ s * c.
- int4 (asymmetric, float offset): s = (max - min) / 15, c = round((W - min) / s) - 8 in [-8, 7],
  o = min + 8 s, W ~ s * c + o. Four bits are too coarse for a symmetric grid on small models
  (SmolLM2-135M keeps only 58% top-1 agreement); a per-block offset (as GGUF's Q4_1) keeps ~100%.
  Weights that were quantized before (a GGUF's Q4_0 or Q4_K, dequantized) keep their own grid where
  a block's codes do not span it (grid_steps).

The graph computes `MatMul(x, DequantizeLinear(c, s, axis=0, block_size=block))` (zero point 0,
as TensorRT requires) plus, for int4, the offset term `MatMul(blocksum(x), o)` where
blocksum(x)[.., j] = sum of x over block j: x @ (s c + o) = x @ (s c) + blocksum(x) @ o. TensorRT
parses that as a weight-only quantized GEMM. ONNX Runtime engines run each projection as one
trtllm.cpu::MatMulBlockQuant node instead (plugins/cpu, `pack_rows` below: float32 activations,
the offset fused in), or, with `--cpu-kernels onnxruntime`, let ONNX Runtime fuse DequantizeLinear +
MatMul into its MatMulNBits kernel (com.microsoft), with activations quantized to int8 inside the
kernel (accuracy level 4). `--activations int8` has our kernel do the same for its calls of up to 16
rows, and `--activations int16` with a second int8 digit (QuantScheme.activations).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import ml_dtypes
import numpy as np

from trtllm.plugins.cpu import SWIGLU_GROUP

QMAX = {4: 7, 8: 127}
ONNX_DTYPE = {4: ml_dtypes.int4, 8: np.int8}


@dataclass(frozen=True)
class QuantScheme:
    bits: int
    block_size: int = 32
    method: str = "rtn-symmetric"
    ort_accuracy_level: int = 4  # MatMulNBits computes with int8 activations
    lm_head_bits: int | None = None  # None: same as `bits`
    scale_search: bool = False       # per block, pick the scale that minimises the squared error
    asymmetric: bool = False         # per-block float offset (see the module docstring)
    # "int16", "int8": the native kernel quantizes decode steps' activations per block of 32 and
    # multiplies in integers (plugins/cpu/matmul_int8.cc; calls of more than 16 rows stay float32).
    activations: str = "float32"

    @classmethod
    def named(cls, name: str, activations: str = "float32", lm_head: str = "auto") -> "QuantScheme | None":
        # The lm_head in int8 unless asked (--lm-head-quantization int4): on SmolLM2-135M an int4 lm_head
        # alone drops top-1 agreement from 92% to 80% (measured on builder/verify.py's text).
        head = {"auto": None, "int8": 8, "int4": 4}[lm_head]
        return {"none": None, "int8": cls(8, activations=activations, lm_head_bits=None if head == 8 else head),
                "int4": cls(4, method="rtn-asymmetric", asymmetric=True, lm_head_bits=head or 8,
                            activations=activations)}[name]

    def for_lm_head(self) -> "QuantScheme":
        """The lm_head's scheme: `lm_head_bits` when set (int8 symmetric, int4 with offsets as the int4 layers')."""
        if not self.lm_head_bits or self.lm_head_bits == self.bits:
            return self
        four = self.lm_head_bits == 4
        return replace(self, bits=self.lm_head_bits, asymmetric=four,
                       method="rtn-asymmetric" if four else "rtn-symmetric")

    def for_tables(self) -> "QuantScheme":
        """The token tables' scheme (the embedding, Gemma 4's per-layer one: their rows gathered, int8 codes):
        the lm_head's where it is int8 (a tied lm_head and the lookup share one table), int8 otherwise."""
        head = self.for_lm_head()
        return head if head.bits == 8 else replace(head, bits=8, asymmetric=False, method="rtn-symmetric")

    def to_json(self) -> dict:
        return {"scheme": f"int{self.bits}", **asdict(self),
                "weights": "all decoder linear layers, the lm_head in int{} and the token embedding in int8".format(
                    self.lm_head_bits or self.bits),
                "not_quantized": "norms, biases, KV cache, activations between layers"}


# float32 weights quantized at once: the work takes several times its input (16 MiB: 50 MB less at a held
# int4 build's peak than 64, in the same time)
SLICE_BYTES = 16 << 20


def quantize(w_t: np.ndarray, scheme: QuantScheme) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """w_t [in, out] float32 -> (codes [in, out] in the ONNX integer type, scales [blocks, out] f32,
    offsets [blocks, out] f32 or None). `in` must be a multiple of the block size."""
    return quantize_rows(w_t.T, scheme)


def quantize_rows(w, scheme: QuantScheme, packed: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """quantize(w.T) of w [out, in]: an array or anything that gives float32 arrays of its rows (w[a:b],
    w.shape: a held weight's checkpoint.Widened, widened a slice at a time), or with `packed`
    pack_rows() of it, packed a slice at a time too. Done in slices of rows (each row's blocks are its
    own: the same result): the whole of a large embedding at once took 3-4x its bytes more (6 GiB for
    a 128k x 4096 one)."""
    n, k = w.shape
    step = max(1, SLICE_BYTES // (4 * max(k, 1)))
    made = None  # (filled slice by slice: the slices and their concatenation at once took twice the codes)
    for s in range(0, max(n, 1), step):  # (an empty weight: one empty slice)
        part = quantize_columns(np.asarray(w[s:s + step]).T, scheme)
        if packed:  # (rows of pack_rows' [out, ...] arrays)
            part = pack_rows(*part, scheme.bits, scheme.block_size)
        if n <= step:
            return part
        if made is None:
            made = tuple(None if a is None else np.empty((n, *a.shape[1:]) if packed else (a.shape[0], n), a.dtype)
                         for a in part)
        for whole, a in zip(made, part):
            if a is not None and packed:
                whole[s:s + step] = a
            elif a is not None:
                whole[:, s:s + step] = a
    return made


def in_slices(rows, dtype, transposed: bool = False) -> np.ndarray:
    """`rows` (an array, or a held weight's checkpoint.Widened: Weights.rows) as one C-ordered array of
    `dtype`, or of its transpose, widened a slice of rows at a time: widened whole first, a large table
    (gemma-4-E2B's per-layer embeddings: 2.3 G values) took 4 bytes a value more for a while, and a
    transposed lm_head its float32 transpose and a copy besides. The values of
    np.asarray(rows).astype(dtype) (or of its .T)."""
    if isinstance(rows, (np.ndarray, np.generic, list, tuple, float, int)) and not transposed:
        return np.asarray(rows).astype(dtype, copy=False)
    n = rows.shape[0]
    out = np.empty(rows.shape[::-1] if transposed else rows.shape, dtype)
    step = max(1, SLICE_BYTES // (4 * max(1, int(np.prod(rows.shape[1:])))))
    for s in range(0, n, step):  # (assigned as astype casts)
        if transposed:
            out[:, s:s + step] = np.asarray(rows[s:s + step]).T
        else:
            out[s:s + step] = rows[s:s + step]
    return out


def quantize_columns(w_t: np.ndarray, scheme: QuantScheme) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """quantize() of one slice of columns."""
    k, n = w_t.shape
    b = scheme.block_size
    if k % b:
        raise ValueError(f"a weight with {k} input features cannot be split into blocks of {b}")
    grouped = w_t.reshape(k // b, b, n)
    if scheme.asymmetric:
        return quantize_asymmetric(grouped, scheme.bits)
    qmax = QMAX[scheme.bits]
    absmax = np.abs(grouped).max(axis=1)                 # [blocks, n]
    scale = np.where(absmax == 0, 1.0, absmax / qmax).astype(np.float32)
    if scheme.scale_search:
        scale = search_scales(grouped, scale, qmax)
    scale = half_grid(scale)
    scale[scale == 0] = 1.0  # a block of weights below float16's range: all codes 0
    codes = np.clip(np.rint(grouped / scale[:, None, :]), -qmax, qmax).reshape(k, n)
    return codes.astype(np.int8).astype(ONNX_DTYPE[scheme.bits]), scale, None


def quantize_asymmetric(grouped: np.ndarray, bits: int):
    """[blocks, block, out] -> codes in [-2^(bits-1), 2^(bits-1) - 1], scales, offsets."""
    levels, half = 2 ** bits - 1, 2 ** (bits - 1)
    lo, hi = grouped.min(axis=1), grouped.max(axis=1)
    scale = half_grid(np.where(hi > lo, (hi - lo) / grid_steps(grouped, lo, hi, levels), 1.0))
    scale[scale == 0] = 1.0
    lo, scale = both_on_grid(half_grid(lo), scale, half)
    codes = np.clip(np.rint((grouped - lo[:, None, :]) / scale[:, None, :]), 0, levels) - half
    offset = (lo + half * scale).astype(np.float32)
    k = grouped.shape[0] * grouped.shape[1]
    return codes.reshape(k, -1).astype(np.int8).astype(ONNX_DTYPE[bits]), scale, offset


GRID_TOLERANCE = 1e-3  # of a step: float32 rounding of a dequantized value is far below, random data far above


def grid_steps(grouped: np.ndarray, lo: np.ndarray, hi: np.ndarray, levels: int):
    """Per block [blocks, out], the number of steps between its minimum and maximum on the grid its
    values already lie on, where the weight was quantized before (a GGUF's Q4_0 or Q4_K, dequantized
    by its loader): a block whose codes do not reach both ends of 0..15 lies on lo + k (hi - lo) / j
    for some j < 15, and quantizing it again with (hi - lo) / 15 would round every value to another
    grid (a Q4_0 demo model's int4 engine agreed with it at 68%). `levels` (one scalar) for a weight
    none of whose sampled blocks holds as few distinct values as a grid has, and for a block on none."""
    if not any_few_values(grouped, levels):
        return levels
    # decided per GRID_COLUMNS outputs: a fused q|k|v of a GGUF may hold a Q4_K v beside Q3_K q and k
    searched = np.zeros(lo.shape[1], bool)
    for start in range(0, grouped.shape[2], GRID_COLUMNS):
        searched[start:start + GRID_COLUMNS] = quantized_before(grouped[:, :, start:start + GRID_COLUMNS], levels)
    steps = np.full(lo.shape, float(levels), np.float32)
    rows = np.argwhere((hi > lo) & searched)                              # (block, column) pairs
    found = fitting_steps(grouped.transpose(0, 2, 1)[rows[:, 0], rows[:, 1]], levels)
    fits = found > 0
    steps[rows[fits, 0], rows[fits, 1]] = found[fits]
    return steps


GRID_COLUMNS = 32  # outputs whose blocks share one decision: fewer than any part of a fused projection


def any_few_values(grouped: np.ndarray, levels: int, sample: int = 256) -> bool:
    """Whether any of (up to) `sample` blocks holds at most levels + 1 distinct values: a float
    weight's hold 32, and it skips the search at the cost of this sample."""
    distinct = 1 + (np.diff(np.sort(sampled_blocks(grouped, sample), axis=1), axis=1) != 0).sum(axis=1)
    return bool((distinct <= levels + 1).any())


def sampled_blocks(grouped: np.ndarray, sample: int) -> np.ndarray:
    """About `sample` of grouped's [blocks, block, out] blocks, every few outputs, as rows [m, block]."""
    blocks = grouped[:, :, :: max(1, grouped.shape[0] * grouped.shape[2] // sample)]
    return blocks.transpose(0, 2, 1).reshape(-1, blocks.shape[1])


def fitting_steps(values: np.ndarray, levels: int) -> np.ndarray:
    """values [m, block] (each row's max > min) -> per row the most steps j <= levels such that every
    value is min + an integer times (max - min) / j, within GRID_TOLERANCE of a step (any such j
    holds the row exactly: a multiple of its own grid's count), or 0 where none does."""
    low = values.min(axis=1, keepdims=True)
    span = values.max(axis=1, keepdims=True) - low
    out = np.zeros(len(values), np.float32)
    todo = np.arange(len(values))
    for j in range(levels, 0, -1):
        t = (values[todo] - low[todo]) * (j / span[todo])
        fits = np.abs(t - np.rint(t)).max(axis=1) <= GRID_TOLERANCE
        out[todo[fits]] = j
        todo = todo[~fits]
        if not len(todo):
            break
    return out


def quantized_before(grouped: np.ndarray, levels: int, sample: int = 64) -> bool:
    """Whether most of (up to) `sample` blocks lie on a grid of at most `levels` steps: 32 weights of
    a float checkpoint are nearly always 32 values. (Distinct values alone are not enough: a pruned
    float weight's blocks are mostly zeros, and searching each for a grid took 4x the quantization.)"""
    values = sampled_blocks(grouped, sample)
    values = values[values.max(axis=1) > values.min(axis=1)]
    return len(values) > 0 and bool(np.mean(fitting_steps(values, levels) > 0) >= 0.5)


def both_on_grid(lo: np.ndarray, scale: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """Block minimums `lo` (float16 values) moved to the nearest value that keeps both `lo` and the
    offset lo + half * scale on float16's grid: our kernels store `lo` in float16 and a float16
    llm.onnx (TensorRT's W4A16) stores the offset, so both forms hold the same weights. Near-zero-mean
    blocks (every block of the models measured) move by under 1% of a step, or not at all. A block far
    from zero against its range (|mean| >> max - min) may also need a coarser scale, rounded up so
    the block stays covered."""
    best, found = nearest_pair(lo, scale, half)
    for k in range(8):
        if found.all():
            break
        step = float16_step(lo.astype(np.float64) + half * scale.astype(np.float64)) * 2.0 ** k
        coarse = (np.ceil(scale * half / step) * step / half).astype(np.float32)
        scale = np.where(found, scale, coarse)
        retry, now = nearest_pair(lo, scale, half)
        best, found = np.where(found, best, retry), found | now
    if not found.all():
        raise ValueError("a quantization block's minimum and offset cannot both be held in float16")
    return best.astype(np.float32), half_grid(scale)


def nearest_pair(lo: np.ndarray, scale: np.ndarray, half: int, steps: int = 8):
    """Per block, the candidate nearest `lo` among its float16 neighbours and the offset's float16
    neighbours less half * scale, with lo and lo + half * scale both float16 values (float64 sums of
    float16 values are exact). Returns (best as float64, found)."""
    lo64 = lo.astype(np.float64)
    # lo itself where it and its offset are on the grid already (distance 0): 99.9% of the demo
    # model's blocks, and the search below takes 34 passes over the rest (it was 90% of an int4 build's
    # quantization time)
    exact = on_float16_grid(lo64) & on_float16_grid(lo64 + half * scale.astype(np.float64))
    if exact.all():
        return lo64, exact
    rest = ~exact
    best, found = lo64.copy(), exact.copy()
    best[rest], found[rest] = search_pair(lo[rest], scale[rest], half, steps)
    return best, found


def search_pair(lo: np.ndarray, scale: np.ndarray, half: int, steps: int):
    """nearest_pair's search over every candidate, for blocks (1-D) where lo is not the answer."""
    shift = half * scale.astype(np.float64)
    lo64 = lo.astype(np.float64)
    candidates = float16_neighbours(lo, steps)
    candidates += [c - shift for c in float16_neighbours(lo64 + shift, steps)]
    best, distance = lo64.copy(), np.full(lo.shape, np.inf)
    for c in candidates:
        better = on_float16_grid(c) & on_float16_grid(c + shift) & (np.abs(c - lo64) < distance)
        best, distance = np.where(better, c, best), np.where(better, np.abs(c - lo64), distance)
    return best, np.isfinite(distance)


def float16_neighbours(x: np.ndarray, steps: int) -> list[np.ndarray]:
    """x rounded to float16 and its `steps` float16 neighbours each side, as float64."""
    mid = np.asarray(x).astype(np.float16)
    down, up, out = mid, mid, [mid]
    for _ in range(steps):
        down, up = np.nextafter(down, np.float16(-np.inf)), np.nextafter(up, np.float16(np.inf))
        out += [down, up]
    return [v.astype(np.float64) for v in out]


def float16_step(x: np.ndarray) -> np.ndarray:
    """The spacing of float16 values at |x|."""
    a = np.abs(x).astype(np.float16)
    return np.nextafter(a, np.float16(np.inf)).astype(np.float64) - a.astype(np.float64)


def on_float16_grid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).astype(np.float64) == x


def half_grid(values: np.ndarray) -> np.ndarray:
    """float32 values that float16 holds exactly (scales and block minimums, as GGUF stores them), so
    the native CPU kernel keeps them in 2 bytes with no change."""
    with np.errstate(over="ignore"):
        half = np.asarray(values, np.float32).astype(np.float16)
    if not np.isfinite(half).all():
        raise ValueError("a quantization scale or offset is beyond float16's range (|x| > 65504)")
    return half.astype(np.float32)


def search_scales(grouped: np.ndarray, scale: np.ndarray, qmax: int) -> np.ndarray:
    """Shrink each block's scale (clipping its largest values) where that lowers the block's
    squared rounding error: most weights are small, and a finer grid serves them better."""
    best, best_err = scale, None
    for factor in np.linspace(0.70, 1.0, 16, dtype=np.float32):
        s = scale * factor
        err = ((np.clip(np.rint(grouped / s[:, None, :]), -qmax, qmax) * s[:, None, :] - grouped) ** 2).sum(axis=1)
        if best_err is None:
            best, best_err = s, err
        else:
            better = err < best_err
            best, best_err = np.where(better, s, best), np.where(better, err, best_err)
    return best.astype(np.float32)


def dequantize(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray | None, block_size: int) -> np.ndarray:
    """The float32 weight the graph computes with (for tests and error reports)."""
    w = codes.astype(np.float32) * np.repeat(scale, block_size, axis=0)
    return w if offset is None else w + np.repeat(offset, block_size, axis=0)


def pack_nibbles(codes: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """int4 codes (one per byte in numpy) -> two to a byte, and the shape to unpack them to."""
    flat = codes.astype(np.int8).reshape(-1)
    low = flat.view(np.uint8) & 0xF
    if low.size % 2:
        low = np.append(low, np.uint8(0))
    return low[0::2] | (low[1::2] << 4), codes.shape


def unpack_nibbles(packed: tuple[np.ndarray, tuple[int, ...]]) -> np.ndarray:
    """pack_nibbles' inverse."""
    data, shape = packed
    both = np.stack([data & 0xF, data >> 4], axis=-1).reshape(-1)[:int(np.prod(shape))].astype(np.int8)
    return np.where(both > 7, both - 16, both).astype(np.int8).astype(ONNX_DTYPE[4]).reshape(shape)


def pack_rows(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray | None, bits: int, block_size: int = 32):
    """quantize()'s [in, out] layout -> trtllm.cpu::MatMulBlockQuant's row-major one (plugins/cpu):
    codes uint8 [out, in / 2] (int4: q = c + 8 in [0, 15], per block of 32 byte i = q[i] | q[i + 16] << 4,
    GGUF's Q4_1 layout) or [out, in] (int8), scale and offset [out, in / 32] float16 (quantize() put
    them on float16's grid). int4's offset becomes the block minimum o - 8 s: w = s q + offset."""
    if block_size != 32:
        raise ValueError("MatMulBlockQuant takes blocks of 32")
    c = np.ascontiguousarray(codes.astype(np.int8, copy=False).T)  # [out, in] (int8 codes: one copy, not two)
    n, k = c.shape
    if bits == 4:
        q = (c.astype(np.int16) + 8).astype(np.uint8).reshape(n, k // 32, 32)
        packed = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, k // 2)
    else:
        packed = c.view(np.uint8)
    if offset is not None and bits == 4:
        offset = offset - np.float32(8) * scale  # the block minimum, on float16's grid (quantize_asymmetric)
    off = None if offset is None else np.ascontiguousarray(offset.T.astype(np.float16))
    return np.ascontiguousarray(packed), np.ascontiguousarray(scale.T.astype(np.float16)), off


def swiglu_rows(f: int, group: int = SWIGLU_GROUP) -> np.ndarray:
    """The row order of a SwiGLU MatMulBlockQuant over [gate; up] (2f rows): per group of outputs,
    its gate rows then its up rows, so each of the kernel's 32-row tasks holds matching pairs."""
    order = []
    for start in range(0, f, group):
        rows = np.arange(start, min(start + group, f))
        order += [rows, rows + f]
    return np.concatenate(order)
