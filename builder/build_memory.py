"""What a build takes of the machine's memory: an estimate before the checkpoint loads (a warning where
the machine has less available), and transformers' model let go once the build is done with it.

The estimate is the measured peak (README): about 1.8x the model's float32 weights (transformers'
model, then the engine's session in its stead) above the process itself."""
from __future__ import annotations

import ctypes
import gc
import json
import math
from pathlib import Path

from trtllm.builder import checkpoint as ckpt
from trtllm.builder.verify_logits import available_memory
from trtllm.builder.weight_files import loaded_weight_files

PEAK_PER_WEIGHT = 1.8 * 4  # bytes a float32 weight takes at the build's peak
BASE_BYTES = 0.3 * 2**30   # the Python process with torch and transformers
FLOATS = {"F32", "F16", "BF16", "F64"}


def parameters_in(model_arg: str) -> int | None:
    """The float weights a checkpoint directory's safetensors hold, from their headers (nothing loaded);
    None where that is not known: a GGUF, pickles, or packed integer weights (a GPTQ/AWQ checkpoint)."""
    path = Path(model_arg).expanduser()
    if not path.is_dir():
        return None
    files = loaded_weight_files(path)
    if not files or any(f.suffix != ".safetensors" for f in files):
        return None
    total = 0
    try:
        for f in files:
            with open(f, "rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                if entry["dtype"] not in FLOATS:
                    return None
                total += math.prod(entry["shape"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # (transformers says what is wrong with such a file, when it loads it)
    return total


def memory_note(model_arg: str, log) -> None:
    """Say what the build will take, and warn where the machine has less available (it would be killed
    part way, by the kernel's out-of-memory killer, with nothing said)."""
    params = parameters_in(model_arg)
    if params is None:
        return
    need, have = params * PEAK_PER_WEIGHT + BASE_BYTES, available_memory()
    what = f"{params / 1e9:.2f}B parameters: the build takes about {need / 2**30:.1f} GB of memory"
    if have and need > have:
        log(f"warning: {what}, and {have / 2**30:.1f} GB is available: it may be killed when memory runs out; "
            "close other programs or build on a larger machine (for TensorRT, `--plan-later` exports here and "
            "builds the plan on the device without transformers)")
    else:
        log(f"note: {what}")


def let_model_go(ck: ckpt.Checkpoint) -> None:
    """Drop transformers' model (and a GPTQ/AWQ checkpoint's grids), and hand the freed memory back to the
    system: the engine's session or TensorRT's builder comes next, and the two together were the build's
    peak (2.7x the float32 weights above the process, with the graph held whole as it was written)."""
    ck.model = ck.vision = ck.grids = None
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """glibc's malloc_trim: freed memory its heap keeps (many weights' temporaries) back to the system."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # (not glibc: musl, macOS)
        pass
