"""The few CUDA runtime calls the TensorRT backend needs, through cuda-python (no torch).

cuda-python >= 12.8 exposes the runtime API as `cuda.bindings.runtime`; older releases as
`cuda.cudart`. Every call returns (error, *values); `check` turns an error into an exception.
"""
from __future__ import annotations

import numpy as np


def cudart():
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime
        except ImportError:
            raise RuntimeError("cuda-python is not installed (pip install cuda-python); the TensorRT backend "
                               "uses it for device memory and streams") from None
    return runtime


def check(result):
    """Unpack a cuda-python result tuple, raising on an error code (cudaSuccess is 0)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        _, text = cudart().cudaGetErrorString(err)
        raise RuntimeError(f"CUDA error {int(err)}: {text.decode() if isinstance(text, bytes) else text}")
    return values[0] if len(values) == 1 else (tuple(values) or None)


def device_info() -> dict:
    """Name and compute capability of the current device: a plan runs only where it was built."""
    rt = cudart()
    count = check(rt.cudaGetDeviceCount())
    if not count:
        raise RuntimeError("no CUDA device")
    props = check(rt.cudaGetDeviceProperties(check(rt.cudaGetDevice())))
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return {"name": name, "compute_capability": f"{props.major}.{props.minor}"}


def memory_in_use() -> tuple[int, bool]:
    """(bytes of device memory in use, the GPU is integrated): total - free as cudaMemGetInfo reports
    it, the whole device's (other processes count); on an integrated GPU (Jetson) that memory is the
    system's, shared with the CPU."""
    rt = cudart()
    free, total = check(rt.cudaMemGetInfo())
    props = check(rt.cudaGetDeviceProperties(check(rt.cudaGetDevice())))
    return int(total) - int(free), bool(getattr(props, "integrated", 0))


class DeviceBuffer:
    """`nbytes` of device memory, freed with close()."""

    def __init__(self, nbytes: int):
        self.rt = cudart()  # kept: close() may run from a finalizer, late in interpreter shutdown
        self.nbytes = max(int(nbytes), 1)  # TensorRT wants a non-null address even for empty tensors
        self.ptr = int(check(self.rt.cudaMalloc(self.nbytes)))
        check(self.rt.cudaMemset(self.ptr, 0, self.nbytes))

    def close(self) -> None:
        if self.ptr:
            check(self.rt.cudaFree(self.ptr))
            self.ptr = 0


class Stream:
    def __init__(self):
        self.rt = cudart()
        self.handle = check(self.rt.cudaStreamCreate())

    def __int__(self) -> int:
        return int(self.handle)

    def upload(self, dst: int, array: np.ndarray) -> None:
        """Asynchronous host -> device copy; `array` must stay alive until sync()."""
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        check(self.rt.cudaMemcpyAsync(dst, array.ctypes.data, array.nbytes, kind, self.handle))

    def download(self, array: np.ndarray, src: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        check(self.rt.cudaMemcpyAsync(array.ctypes.data, src, array.nbytes, kind, self.handle))

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        check(self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, self.handle))

    def zero(self, dst: int, nbytes: int) -> None:
        """`nbytes` of device memory set to 0, in stream order."""
        check(self.rt.cudaMemsetAsync(dst, 0, nbytes, self.handle))

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
                kind: str) -> None:
        """`height` rows of `width` bytes; kind is "h2d", "d2h" or "d2d"."""
        k = {"h2d": "cudaMemcpyHostToDevice", "d2h": "cudaMemcpyDeviceToHost", "d2d": "cudaMemcpyDeviceToDevice"}
        check(self.rt.cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height,
                                        getattr(self.rt.cudaMemcpyKind, k[kind]), self.handle))

    def sync(self) -> None:
        check(self.rt.cudaStreamSynchronize(self.handle))

    def close(self) -> None:
        if self.handle is not None:
            check(self.rt.cudaStreamDestroy(self.handle))
            self.handle = None
