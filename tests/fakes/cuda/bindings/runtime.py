"""A stand-in for cuda-python's `cuda.bindings.runtime`, on host memory, for tests without a GPU.

Same call shapes as the real module (every call returns a tuple that starts with the error code),
and strict where a real GPU would fail or corrupt memory: a copy's direction must match where its
pointers live (device = memory from cudaMalloc), and every device range must be allocated.
FAKE_GPU_NAME / FAKE_GPU_CC set the device that cudaGetDeviceProperties reports, FAKE_GPU_INTEGRATED=1
an integrated one (Jetson); cudaMemGetInfo counts what cudaMalloc holds as in use.
"""
from __future__ import annotations

import ctypes
import enum
import itertools
import os


class cudaError_t(enum.IntEnum):  # noqa: N801 - the real names
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3


OK = cudaError_t.cudaSuccess
TOTAL_MEMORY = 141 * 2**30
_allocations: dict[int, tuple[ctypes.Array, int]] = {}  # aligned pointer -> (backing buffer, size)
_streams = itertools.count(0x5000)
live_streams: set[int] = set()


class cudaStream_t:  # noqa: N801
    def __init__(self, handle: int):
        self.handle = handle

    def __int__(self) -> int:
        return self.handle


class cudaDeviceProp:  # noqa: N801
    def __init__(self):
        major, minor = os.environ.get("FAKE_GPU_CC", "9.0").split(".")
        self.name = os.environ.get("FAKE_GPU_NAME", "Fake H200").encode()
        self.major, self.minor = int(major), int(minor)
        self.integrated = int(os.environ.get("FAKE_GPU_INTEGRATED", "0"))
        self.totalGlobalMem = TOTAL_MEMORY


def is_device(ptr: int, nbytes: int = 1) -> bool:
    return any(start <= ptr and ptr + nbytes <= start + size for start, (_, size) in _allocations.items())


def _copy_ok(dst: int, src: int, nbytes: int, kind) -> bool:
    want_dst = kind in (cudaMemcpyKind.cudaMemcpyHostToDevice, cudaMemcpyKind.cudaMemcpyDeviceToDevice)
    want_src = kind in (cudaMemcpyKind.cudaMemcpyDeviceToHost, cudaMemcpyKind.cudaMemcpyDeviceToDevice)
    return is_device(dst, nbytes) == want_dst and is_device(src, nbytes) == want_src


def cudaGetErrorString(err):  # noqa: N802
    return OK, cudaError_t(err).name.encode()


def cudaGetDeviceCount():  # noqa: N802
    return OK, 1


def cudaGetDevice():  # noqa: N802
    return OK, 0


def cudaGetDeviceProperties(device):  # noqa: N802
    return (OK, cudaDeviceProp()) if device == 0 else (cudaError_t.cudaErrorInvalidValue, None)


def cudaMalloc(nbytes):  # noqa: N802
    if nbytes <= 0:
        return cudaError_t.cudaErrorInvalidValue, 0
    buf = ctypes.create_string_buffer(int(nbytes) + 256)  # cudaMalloc is at least 256-byte aligned
    ptr = -(-ctypes.addressof(buf) // 256) * 256
    _allocations[ptr] = (buf, int(nbytes))
    return OK, ptr


def cudaMemGetInfo():  # noqa: N802
    return OK, TOTAL_MEMORY - sum(size for _, size in _allocations.values()), TOTAL_MEMORY


def cudaFree(ptr):  # noqa: N802
    return (OK,) if _allocations.pop(int(ptr), None) is not None else (cudaError_t.cudaErrorInvalidValue,)


def cudaMemset(ptr, value, nbytes):  # noqa: N802
    if not is_device(ptr, nbytes):
        return (cudaError_t.cudaErrorInvalidValue,)
    ctypes.memset(ptr, value, nbytes)
    return (OK,)


def cudaMemsetAsync(ptr, value, nbytes, stream):  # noqa: N802
    if int(stream) not in live_streams or not is_device(ptr, nbytes):
        return (cudaError_t.cudaErrorInvalidValue,)
    ctypes.memset(ptr, value, nbytes)
    return (OK,)


def cudaMemcpyAsync(dst, src, nbytes, kind, stream):  # noqa: N802
    if int(stream) not in live_streams or not _copy_ok(dst, src, nbytes, kind):
        return (cudaError_t.cudaErrorInvalidValue,)
    ctypes.memmove(dst, src, nbytes)
    return (OK,)


def cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream):  # noqa: N802
    if width > min(dpitch, spitch) or int(stream) not in live_streams:
        return (cudaError_t.cudaErrorInvalidValue,)
    for row in range(height):
        if not _copy_ok(dst + row * dpitch, src + row * spitch, width, kind):
            return (cudaError_t.cudaErrorInvalidValue,)
        ctypes.memmove(dst + row * dpitch, src + row * spitch, width)
    return (OK,)


def cudaStreamCreate():  # noqa: N802
    handle = next(_streams)
    live_streams.add(handle)
    return OK, cudaStream_t(handle)


def cudaStreamSynchronize(stream):  # noqa: N802
    return (OK,) if int(stream) in live_streams else (cudaError_t.cudaErrorInvalidValue,)


def cudaStreamDestroy(stream):  # noqa: N802
    live_streams.discard(int(stream))
    return (OK,)
