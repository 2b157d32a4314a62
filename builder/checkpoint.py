"""Load a checkpoint (HF directory, .gguf file or hub ID) into a float32 transformers model (or one held in
its 16-bit type that computes as the float32 one: builder/held.py)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from trtllm.builder.weight_files import loaded_weight_files, weights_hash  # noqa: F401 - ckpt.weights_hash
from trtllm.builder import held, prequantized, vision
from trtllm.builder.entry_map import EntryMap
from trtllm.builder.config import CheckpointError, Unsupported, listed  # noqa: F401 - raised as ckpt.CheckpointError


# What a tokenizer's vocabulary comes in (fast, SentencePiece, GPT-2 BPE, WordPiece); config files alone are not one
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


@dataclass
class Checkpoint:
    model: "torch.nn.Module"
    tokenizer: object
    source: dict  # {"model": arg, "kind": dir|gguf|hub, "sha256": hash of the weight files}
    unused: tuple[str, ...] = ()  # tensors of the checkpoint transformers' model does not load (dropped)
    # a GPTQ/AWQ checkpoint's packed projections as it holds them (builder/prequantized.py), by weight name
    grids: dict | None = None
    # a vision-language checkpoint's whole model (builder/vision.py); `model` is then its language model
    vision: "torch.nn.Module | None" = None
    # the encoders of a multimodal checkpoint the build does not take yet (vision.left_out: Gemma 4's
    # audio one); the engine takes what the others and the language model take
    left_out: tuple[str, ...] = ()
    # DecoderSpec fields the whole model gives a language model built alone (Gemma 4's placeholder tokens,
    # which its token tables read as the pad: vision_gemma4.placeholders)
    language_fields: dict = field(default_factory=dict)
    held: str | None = None  # "bfloat16" or "float16": the model held in its checkpoint's type (builder/held.py)


@contextlib.contextmanager
def unreadable(model_arg: str):
    """transformers', safetensors' and gguf's errors on a checkpoint they cannot read (a truncated
    weight file, an invalid config.json, an architecture transformers does not know, weights of
    other shapes) as one CheckpointError naming --model, with their first line."""
    try:
        yield
    except (CheckpointError, MemoryError, ImportError):  # (a missing optional package is no bad checkpoint)
        raise
    except Exception as e:  # noqa: BLE001 - each library has its own error types
        raise CheckpointError(f"--model {model_arg!r} cannot be loaded: {type(e).__name__}: {gist(e)}") from e


def gist(e: Exception) -> str:
    """An error's first line, with the next where the first only introduces it ("Validation error
    for field 'rms_norm_eps':" / "expected float, got str")."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    return text[:300]


# quantization_config methods transformers turns back into float weights on the CPU (the model then
# loads as any other); GPTQ and AWQ this builder unpacks itself (builder/prequantized.py); the others
# load as packed integer modules, not the weights this builder reads
DEQUANTIZED = ("fp8",)
# attention a config may name for its own training or serving that the CPU reference cannot run: the
# model is the same with transformers' default
GPU_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention", "paged_attention")


def load_config(source, model_arg: str):
    """(config.json, the Packing of a GPTQ/AWQ checkpoint or None), checked for what the builder
    cannot take, with transformers' default attention where it names a GPU kernel (a fine-tune saved
    with flash_attention_2 carries it). A GPTQ/AWQ config loses its quantization_config: transformers
    then makes a float model, whose projections load_model fills from the packed ones."""
    config = AutoConfig.from_pretrained(source)
    quant, packing = getattr(config, "quantization_config", None), None
    if quant is None and Path(str(source)).is_dir():
        quant = prequantized.side_config(Path(str(source)))
        if quant is not None:
            config.quantization_config = quant  # (deleted below: the packing is read from it)
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
        method = getattr(method, "value", method)
        if str(method).lower() in prequantized.METHODS:
            packing = prequantized.packing_of(quant if isinstance(quant, dict) else quant.to_dict(), model_arg)
            del config.quantization_config
        elif str(method) not in DEQUANTIZED:
            raise Unsupported(f"--model {model_arg!r}: config.quantization_config (quant_method {method!r}): a "
                              "pre-quantized checkpoint cannot be built; build from the unquantized one, with "
                              "--quantization int8 or int4 for a smaller engine")
    named = str(getattr(config, "_attn_implementation", None) or "")
    if named in GPU_ATTENTION or "flash" in named:  # (also a hub kernel's name, "kernels-community/flash-attn")
        config._attn_implementation = None
    return config, packing


def check_generation_config(path: Path) -> None:
    """transformers passes over a generation_config.json it cannot read (and takes config.json's
    eos id): its stop ids and sampling defaults would be lost without a word."""
    if (path / "generation_config.json").is_file():
        GenerationConfig.from_pretrained(path)


def load(model_arg: str, hold: bool = False) -> Checkpoint:
    """`hold`: a checkpoint of 16-bit weights alone is held in their type where it can be (builder/held.py)."""
    path = Path(model_arg).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise CheckpointError(f"--model {model_arg!r}: no such GGUF file")
        from trtllm.builder.gguf import load_gguf  # (it reads a Checkpoint of this module)

        return check_vocab(load_gguf(path), model_arg)
    if path.is_file():
        raise CheckpointError(f"--model {model_arg!r} is a file: pass the checkpoint's directory (with config.json), "
                              "or a .gguf file")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"--model {model_arg!r} must be a Hugging Face checkpoint directory "
                                  "(with config.json), a .gguf file or a hub ID; config.json is missing")
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise CheckpointError(f"--model {model_arg!r} has no tokenizer ({', '.join(TOKENIZER_FILES)}): the engine "
                                  "needs one; copy the model's tokenizer files into the directory")
        with unreadable(model_arg):
            check_generation_config(path)
            model, info, tok = load_model(path, model_arg, hold)
        source = {"model": str(path.resolve()), "kind": "dir", "sha256": weights_hash(loaded_weight_files(path))}
        if info.get("packing"):  # (with a mixture of experts' stacked parameters read back from packed experts)
            source["prequantized"] = {**info["packing"].to_json(),
                                      **({"experts": len(info["experts"])} if info.get("experts") else {})}
        model, whole = split_vision(model)
        if info.get("language_fields", {}).get("placeholder_ids"):
            read_as_pad(model, **info["language_fields"])
        grids = info.get("grids")
        if grids and whole is not None:  # the language model's own names (its projections are what the build keeps)
            own = {id(p): name for name, p in model.named_parameters()}
            params = dict(whole.named_parameters())
            grids = {own[id(params[name])]: grid for name, grid in grids.items() if id(params[name]) in own}
        return check_vocab(Checkpoint(model.eval(), tok, source, tuple(sorted(info.get("unexpected_keys") or ())),
                                      grids=grids, vision=whole, left_out=tuple(info.get("left_out", ())),
                                      language_fields=info.get("language_fields", {}),
                                      held=info.get("held")), model_arg)
    if model_arg.startswith((".", "/", "~")) or model_arg.count("/") > 1:  # a path, not "org/name"
        raise CheckpointError(f"--model {model_arg!r}: no such directory or file")
    return load_hub(model_arg)


def load_model(source, model_arg: str, hold: bool = False):
    """(model, loading info, tokenizer); weights of other shapes are loaded as missing ones (not
    transformers' error about an option nobody set) so that check_loaded names them."""
    config, packing = load_config(source, model_arg)
    if packing is not None and not Path(str(source)).is_dir():
        raise CheckpointError(f"--model {model_arg!r} is a {packing.method.upper()} checkpoint, whose packed weights "
                              "are read from a local directory: download it (hf download) and pass its directory")
    kind = getattr(config, "model_type", None)
    hold = hold and packing is None
    if kind in vision.MODEL_TYPES:
        with quiet_loading(packing is not None):
            model, info = held.loaded(lambda dtype: vision.load(source, config, dtype), source, hold,
                                      language=lambda vlm: [vision.language_module(vlm), vlm.lm_head])
        if packing is not None:  # (AWQ / GPTQ releases of VLMs pack the language model's projections)
            info = unpacked_into(model, info, packing, loaded_weight_files(Path(source)), model_arg)
        check_loaded(info, model_arg)
        if vision.left_out(config):  # (Gemma 4's audio encoder: the engine takes text and images)
            info = {**info, "left_out": vision.left_out(config)}
        info = {**info, "language_fields": vision.language_fields(config)}
        if not vision.has_vision(config):  # (its language model alone: a text engine)
            model = vision.language_model(model)
        return model, info, vision.tokenizer_of(source)
    from trtllm.builder.architectures import refuse_before_loading  # (it imports this module)

    try:
        refuse_before_loading(config)
    except Unsupported as e:
        raise CheckpointError(f"--model {model_arg!r}: {e}") from e
    with quiet_loading(packing is not None):  # (its report would call the packed projections missing)
        model, info = held.loaded(lambda dtype: AutoModelForCausalLM.from_pretrained(
            source, config=config, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True), source, hold)
    if packing is not None:
        info = unpacked_into(model, info, packing, loaded_weight_files(Path(source)), model_arg)
    elif any(str(k).endswith(".qweight") for k in info.get("unexpected_keys") or []):
        where = ("its config.json has no quantization_config, and no quantize_config.json or quant_config.json "
                 "is beside it" if Path(str(source)).is_dir() else
                 "download it (hf download) and pass its directory: its quantization config may be in a "
                 "quantize_config.json or quant_config.json, read from a directory")
        raise CheckpointError(f"--model {model_arg!r} holds GPTQ/AWQ packed weights (qweight, qzeros, scales) "
                              f"without a quantization config to read them by: {where}")
    check_loaded(info, model_arg)
    return model, info, AutoTokenizer.from_pretrained(source)


@contextlib.contextmanager
def quiet_loading(quiet: bool):
    """transformers' loading report silenced (errors only) while `quiet`."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def unpacked_into(model, info: dict, packing, files: list[Path], model_arg: str) -> dict:
    """A GPTQ/AWQ checkpoint's projections, which transformers' float model lacks (it loads their
    packed tensors as unexpected ones), set from the packed ones; the loading info without them, and
    with the grids and packing the build reads (none where it holds no packed tensors: a float model
    whose config kept its quantization_config)."""
    try:
        grids = prequantized.read_grids(files, packing)
    except CheckpointError as e:
        raise CheckpointError(f"--model {model_arg!r}: {e}") from e
    if not grids:
        return info
    names, raw = set(dict(model.named_parameters())), grids
    grids = prequantized.renamed(grids, names)  # (a vision-language checkpoint's older names: model.layers...)
    for name, grid in grids.items():
        if name not in names:  # (a packed module the model has no place for stays an unused tensor)
            continue
        param = model.get_parameter(name)
        weight = torch.from_numpy(np.ascontiguousarray(grid.weight_t().T))
        if tuple(param.shape) != tuple(weight.shape):
            raise CheckpointError(f"{name} unpacks to {list(weight.shape)}, and the model's is {list(param.shape)}")
        with torch.no_grad():
            param.copy_(weight)
    filled = prequantized.experts_into(model, grids, model_arg)  # (a mixture of experts' stacked parameters)
    # (transformers reports the packed tensors under the file's names or its own: both are read here)
    unexpected = prequantized.consumed(list(info.get("unexpected_keys") or []), {**raw, **grids})
    grids = {k: v for k, v in grids.items() if k in names}
    done = set(grids) | filled
    missing = [k for k in info.get("missing_keys") or [] if (k if isinstance(k, str) else k[0]) not in done]
    mismatched = [k for k in info.get("mismatched_keys") or [] if (k if isinstance(k, str) else k[0]) not in done]
    return {**info, "missing_keys": missing, "mismatched_keys": mismatched, "grids": grids, "packing": packing,
            "unexpected_keys": unexpected, "experts": sorted(filled)}


def load_hub(hub_id: str) -> Checkpoint:
    try:
        with unreadable(hub_id):
            model, info, tok = load_model(hub_id, hub_id)
    except CheckpointError as e:
        if not unreachable(e.__cause__):  # (the files came, and are what is wrong)
            raise
        raise CheckpointError(
            f"--model {hub_id!r} is not a local directory or .gguf file, and downloading it from the "
            f"Hugging Face hub failed (offline?): {gist(e.__cause__).rstrip('.')}. "
            "Pass a local checkpoint directory or .gguf file instead.") from e.__cause__
    model, whole = split_vision(model)
    return check_vocab(Checkpoint(model.eval(), tok, {"model": hub_id, "kind": "hub", "sha256": None}, vision=whole),
                       hub_id)


def read_as_pad(model, placeholder_ids: tuple[int, ...], placeholder_pad_id: int) -> None:
    """The language model fed placeholder_ids as the pad token, as the whole model's forward feeds it
    (Gemma4Model: its image, video and audio tokens), so that the build's checks, which run the language
    model, compare the engine with what the whole model computes (a forward pre-hook on input_ids)."""
    placeholders = torch.tensor(placeholder_ids, dtype=torch.int64)

    def mapped(ids):
        return torch.where(torch.isin(ids, placeholders.to(ids.device)), torch.full_like(ids, placeholder_pad_id), ids)

    def hook(module, args, kwargs):
        if args and torch.is_tensor(args[0]):
            args = (mapped(args[0]), *args[1:])
        if torch.is_tensor(kwargs.get("input_ids")):
            kwargs = {**kwargs, "input_ids": mapped(kwargs["input_ids"])}
        return args, kwargs

    model.register_forward_pre_hook(hook, with_kwargs=True)


def split_vision(model) -> tuple:
    """(the language model, the whole model) of a vision-language model; (model, None) of another."""
    if not vision.is_vision_language(model):
        return model, None
    return vision.language_model(model), model.eval()


def unreachable(e: BaseException | None) -> bool:
    """Whether an error (or one it was raised from) is the hub's files not coming: no network, no
    such repository or file, offline mode with nothing cached."""
    import huggingface_hub.errors as hub_errors

    while e is not None:
        if isinstance(e, (hub_errors.HfHubHTTPError, hub_errors.LocalEntryNotFoundError, hub_errors.OfflineModeIsEnabled,
                          hub_errors.EntryNotFoundError, ConnectionError, TimeoutError)) \
                or type(e).__module__.split(".")[0] in ("requests", "httpx", "urllib3"):
            return True
        e = e.__cause__ or e.__context__
    return False


def eos_ids(ck: Checkpoint) -> list[int]:
    """generation_config's eos ids (what HF generate stops on), else the tokenizer's eos."""
    eos = getattr(ck.model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = ck.tokenizer.eos_token_id
    ids = eos if isinstance(eos, (list, tuple)) else [eos]
    return [int(i) for i in ids if i is not None]


def check_vocab(ck: Checkpoint, model_arg: str) -> Checkpoint:
    """A tokenizer with ids past the embedding table would fail at run time, on the first such token;
    so would an EOS id past it (trtllm-run refuses such an engine)."""
    rows = ck.model.get_input_embeddings().weight.shape[0]
    if len(ck.tokenizer) > rows:
        raise CheckpointError(f"--model {model_arg!r}: its tokenizer has {len(ck.tokenizer)} tokens, more than the "
                              f"{rows} rows of its embedding table (config.vocab_size)")
    bad = [i for i in eos_ids(ck) if not 0 <= i < rows]
    if bad:
        where = ("generation_config.json's eos_token_id" if getattr(ck.model.generation_config, "eos_token_id", None)
                 is not None else "its tokenizer's eos token")
        raise CheckpointError(f"--model {model_arg!r}: {where} has {bad}, not a token id (0 to the vocabulary "
                              f"size {rows} - 1, config.vocab_size)")
    return ck


def check_loaded(info: dict, model_arg: str) -> None:
    """transformers fills weights the checkpoint lacks (or has in another shape) with random values
    and only warns; an engine of those would pass its own check against the same random model."""
    for kind, what in (("missing_keys", "lacks"), ("mismatched_keys", "has other shapes for")):
        names = sorted(k if isinstance(k, str) else k[0] for k in info.get(kind) or [])
        if names:
            raise CheckpointError(f"--model {model_arg!r} {what} weights the model needs: {listed(names)}")


def state_dict_numpy(model) -> "Weights":
    """Weights as float32 numpy arrays under their HF names (lm_head kept even when tied): a float32
    model's as it holds them, a held one's (builder/held.py) widened each time one is read."""
    return Weights({k: v.detach().numpy() if v.dtype == torch.float32 else Widened(v)
                    for k, v in model.state_dict().items()})


class Widened:
    """A tensor of another type, as the float32 array it is each time it is called (not kept)."""

    def __init__(self, tensor):
        self.tensor = tensor

    @property
    def shape(self) -> tuple:
        return tuple(self.tensor.shape)

    def __call__(self) -> np.ndarray:
        return self.tensor.detach().to(torch.float32).numpy()

    def __getitem__(self, rows) -> np.ndarray:
        """Some of its rows, widened alone (quantize.in_slices, quantize.quantize_rows)."""
        return self.tensor[rows].detach().to(torch.float32).numpy()


class Weights(EntryMap):
    """name -> float32 array, where an entry is an array or a function that makes it when it is read (and
    not kept: a held model's weights in float32 all at once were what holding it saves). Renames and
    derived entries (a split, reordered rows) stay made on reading: rename, derive."""

    def read(self, entry) -> np.ndarray:
        return entry() if callable(entry) else entry

    def shape(self, name: str) -> tuple:
        """An entry's shape, without making a held weight's array where its entry knows it."""
        entry = self._entries[name]
        return tuple(entry.shape) if hasattr(entry, "shape") else self[name].shape

    def rows(self, name: str):
        """An entry as rows to slice (w[a:b], w.shape): a held weight's Widened, whose slices are widened
        alone (quantize.in_slices and quantize_rows: its whole table in float32 is not made), else its array."""
        entry = self._entries[name]
        return entry if isinstance(entry, Widened) else self[name]

    def rename(self, old: str, new: str) -> None:
        self._entries[new] = self._entries.pop(old)

    def derive(self, name: str, source: str, make) -> None:
        """Entry `name` = make(source's array), made when it is read (source may be name itself)."""
        entry = self._entries[source]
        self._entries[name] = lambda: make(self.read(entry))

    def split(self, name: str, parts: list[str], at) -> None:
        """Entry `name` as `parts`: np.split(its array, at)."""
        for k, part in enumerate(parts):
            self.derive(part, name, lambda a, k=k: np.split(a, at)[k])
        del self[name]

    def renamed(self, new_name) -> "Weights":
        return Weights({new_name(k): v for k, v in self._entries.items()})


def rope_tables(model, num_positions: int, layer_type: str = "full_attention") -> tuple:
    """cos/sin [positions, head_dim/2] from the model's own rotary module, so every RoPE variant
    (scaling types, attention factor) matches transformers by construction. A module with a table
    per layer type (Gemma 3: sliding layers have their own base) gives `layer_type`'s, or its only one."""
    rotary = getattr(model.model, "rotary_emb", None) or getattr(model.model, "pos_emb", None)  # (LFM2-MoE's name)
    if rotary is None:  # no RoPE on any layer (Granite 4's without position_embedding_type "rope"): no turn
        c = model.config
        half = (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads) // 2
        return np.ones((num_positions, half), np.float32), np.zeros((num_positions, half), np.float32)
    return rotary_tables(rotary, num_positions, layer_type)


def rope_position_limit(model) -> int | None:
    """The positions a static RoPE table can hold for this model, if fewer than its own maximum:
    LongRoPE's short factors hold up to original_max_position_embeddings (transformers switches every
    position to the long factors past it, so no one table is right beyond)."""
    limits = [longrope_original(model.config, params) for params in rope_parameter_sets(model.config)
              if params.get("rope_type") == "longrope"]
    return min(limits) if limits else None


def rope_parameter_sets(config) -> list[dict]:
    """The config's RoPE parameters: one set, or one per layer type (Gemma 3, OLMo 3:
    {"full_attention": {...}, "sliding_attention": {...}})."""
    params = getattr(config, "rope_parameters", None) or {}
    if "rope_type" not in params and params and all(isinstance(v, dict) for v in params.values()):
        return list(params.values())
    return [params]


def longrope_original(config, params: dict) -> int:
    """A LongRoPE set's original_max_position_embeddings: its own, else the config's."""
    return int(params.get("original_max_position_embeddings") or config.original_max_position_embeddings)


def rotary_tables(rotary, num_positions: int, layer_type: str | None = None) -> tuple:
    """cos/sin [positions, rotary_dim/2] of a transformers rotary embedding module."""
    kind, args = getattr(rotary, "rope_type", "default"), ()
    if isinstance(kind, dict):  # one table per layer type (Gemma 3)
        if layer_type not in kind:
            layer_type = next(iter(kind))
        kind, args = kind[layer_type], (layer_type,)
    if kind == "dynamic" and num_positions > rotary.config.max_position_embeddings:
        # (up to max_position_embeddings its table is the default one; the KV capacity stops there)
        raise CheckpointError(f"rope_type 'dynamic' changes its frequencies past max_position_embeddings "
                              f"({rotary.config.max_position_embeddings}), asked for {num_positions} positions")
    params = rotary.config.rope_parameters
    original = longrope_original(rotary.config, params[args[0]] if args else params) if kind == "longrope" else 0
    if kind == "longrope" and num_positions > original:
        raise CheckpointError(f"rope_type 'longrope' holds one table up to original_max_position_embeddings "
                              f"({original}), asked for {num_positions} positions")
    pos = torch.arange(num_positions, dtype=torch.int64)[None, :]
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos, *args)
    half = cos.shape[-1] // 2
    return cos[0, :, :half].numpy(), sin[0, :, :half].numpy()
