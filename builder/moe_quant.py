"""int4 experts (--quantization int4 on a mixture of experts), held so that both forms of the
engine compute the very same weights.

Each expert's weight [N, K] is quantized by row, in blocks of 32 inputs, with a float32 scale s and
an integer zero point z (GPTQ's asymmetric form; each block's range widened to hold 0):
w ~ s (q - z), q and z in [0, 15]. ONNX Runtime's QMoE node (com.microsoft) takes exactly that: q
and z two to a byte (low nibble first), s as is. llm.onnx (TensorRT's) writes the same weights
in our int4 form (builder/quantize.py): codes c = q - 8 for DequantizeLinear, whose zero point
TensorRT wants 0, and an offset o = (8 - z) s per block: s c + o = s (q - z).

Not our dense int4 grid (a float offset per block, which QMoE cannot hold), nor int8: ONNX
Runtime's 8-bit QMoE rounds the activations to 8 bits as well, so its answers would not be the
canonical graph's.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

BLOCK = 32
LEVELS = 15


@dataclass
class Experts:
    """One projection of every expert, quantized: q, z uint8 [E, N, K] and [E, N, K / 32], s float32."""

    q: np.ndarray
    scale: np.ndarray
    zero: np.ndarray

    def packed(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """QMoE's inputs (codes, scales, zero points), rows in `rows`' order (gate|up interleaved)."""
        q, s, z = (a if rows is None else a[:, rows] for a in (self.q, self.scale, self.zero))
        return nibbles(q), s, nibbles(z)

    def canonical(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """llm.onnx's (codes int4 [E*K, N], scales and offsets [E*K / 32, N]): DequantizeLinear on axis
        0 in blocks of 32, which never cross an expert (K is a multiple of 32), reshaped to [E, K, N]."""
        e, n, k = self.q.shape

        def stacked(a):  # [E, N, X] -> [E*X, N]
            return np.ascontiguousarray(a.transpose(0, 2, 1)).reshape(e * a.shape[2], n)
        codes = stacked(self.q.astype(np.int8) - 8).astype(ml_dtypes.int4)
        offset = (8 - self.zero.astype(np.float32)) * self.scale
        return codes, stacked(self.scale), stacked(offset)


def quantize_experts(w: np.ndarray) -> Experts:
    """w [E, N, K] float32 -> its int4 codes, scales and zero points, by row and block of 32 inputs;
    one expert at a time (the work takes a few times its input)."""
    e, n, k = w.shape
    if k % BLOCK:
        raise ValueError(f"experts with {k} inputs cannot be split into blocks of {BLOCK}")
    q, scale, zero = np.empty((e, n, k), np.uint8), np.empty((e, n, k // BLOCK), np.float32), \
        np.empty((e, n, k // BLOCK), np.uint8)
    for i in range(e):
        blocks = w[i].reshape(n, k // BLOCK, BLOCK)
        lo, hi = np.minimum(blocks.min(axis=-1), 0), np.maximum(blocks.max(axis=-1), 0)
        s = ((hi - lo) / LEVELS).astype(np.float32)
        if not np.isfinite(s).all():
            raise ValueError(f"expert {i} has weights whose range float32 cannot hold")
        s[s == 0] = 1.0  # a block of zeros: any scale, codes all at the zero point
        z = np.clip(np.rint(-lo / s), 0, LEVELS)
        q[i] = (np.clip(np.rint(blocks / s[..., None]) + z[..., None], 0, LEVELS)).reshape(n, k)
        scale[i], zero[i] = s, z
    return Experts(q, scale, zero)


def handed_on(experts: Experts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the build's first writer leaves for the second: the codes two to a byte."""
    return nibbles(experts.q), experts.scale, experts.zero


def taken(handed: tuple[np.ndarray, np.ndarray, np.ndarray]) -> Experts:
    """handed_on's Experts back (K is a multiple of 32: no padding to drop)."""
    packed, scale, zero = handed
    q = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.uint8)
    q[..., 0::2], q[..., 1::2] = packed & 15, packed >> 4
    return Experts(q, scale, zero)


def nibbles(a: np.ndarray) -> np.ndarray:
    """uint8 values < 16 along the last axis, two to a byte, low nibble first (an odd count padded with 0)."""
    if a.shape[-1] % 2:
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (a[..., 0::2] | (a[..., 1::2] << 4)).astype(np.uint8)


def dequantized(experts: Experts) -> np.ndarray:
    """The weights both forms compute, [E, N, K] (tests)."""
    e, n, k = experts.q.shape
    q = experts.q.reshape(e, n, k // BLOCK, BLOCK).astype(np.float32)
    return ((q - experts.zero[..., None]) * experts.scale[..., None]).reshape(e, n, k)
