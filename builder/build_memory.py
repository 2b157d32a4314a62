"""What a build takes of the machine's memory: an estimate before the checkpoint loads (a warning where
the machine has less available), and transformers' model let go once the build is done with it.

The estimate is the measured peak (README), above the process itself: about 1.8x the model's float32
weights (transformers' model, then the engine's session in its stead); for a checkpoint held in its
16-bit type (builder/held.py), about 1.5x for a float32 engine (its session) and 1.1x for the others
(the held model and one weight widened at a time; an int4 build's codes wait on disk: builder/handoff.py)."""
from __future__ import annotations

import ctypes
import gc
from pathlib import Path

from trtllm.builder import checkpoint as ckpt
from trtllm.builder import held
from trtllm.builder.verify_logits import available_memory
from trtllm.builder.weight_files import float_counts

PEAK_PER_WEIGHT = 1.8 * 4  # bytes a float32 weight takes at the build's peak
HELD_PEAK_PER_WEIGHT = {True: 1.5 * 4, False: 1.1 * 4}  # held: {a float32 engine: ..., another: ...}
BASE_BYTES = 0.3 * 2**30   # the Python process with torch and transformers


def parameters_in(model_arg: str) -> int | None:
    """The float weights a checkpoint directory's safetensors hold, from their headers (nothing loaded);
    None where that is not known (weight_files.float_counts)."""
    counts = float_counts(Path(model_arg).expanduser())
    return None if counts is None else sum(counts.values())


def memory_note(model_arg: str, log, hold: bool = False, float32_engine: bool = True) -> None:
    """Say what the build will take, and warn where the machine has less available (it would be killed
    part way, by the kernel's out-of-memory killer, with nothing said). `hold`: the build would hold a
    16-bit checkpoint in its type (checkpoint.load's)."""
    params = parameters_in(model_arg)
    if params is None:
        return
    kind = held.held_dtype(model_arg)[0] if hold else None
    per_weight = PEAK_PER_WEIGHT if kind is None else HELD_PEAK_PER_WEIGHT[float32_engine]
    need, have = params * per_weight + BASE_BYTES, available_memory()
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
