"""A .gguf file loaded as a float32 transformers model (transformers' GGUF loader), with what that
loader drops given back or refused: Llama 3's RoPE scaling, Phi-3's window, partial rotary and
LongRoPE, Gemma's softcaps and scaling, llama.cpp's end-of-generation tokens, named chat templates."""
from __future__ import annotations

import math
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

from trtllm.builder import gguf_checks
from trtllm.builder.checkpoint import Checkpoint, check_loaded, unreadable
from trtllm.builder.config import CheckpointError, listed
from trtllm.builder.weight_files import weights_hash


def load_gguf(path: Path) -> Checkpoint:
    """transformers dequantizes the GGUF to float32; the loaded model then behaves as a normal one.
    What its loader drops is refused first: the build would check the engine against the same
    wrong model and pass; Llama 3's RoPE scaling, which it drops too, is given back (llama3_rope)."""
    with unreadable(str(path)), tempfile.TemporaryDirectory() as alone:
        keys = check_gguf(path)
        # From a directory that holds the GGUF alone: transformers prefers a tokenizer.json (and a
        # config.json) it finds beside the file to what the file holds, another model's as readily
        (Path(alone) / path.name).symlink_to(path.resolve())
        tok = AutoTokenizer.from_pretrained(alone, gguf_file=path.name)
        mend_tokenizer(tok, keys)
        config = moe_config(alone, path.name, keys)
        model, info = AutoModelForCausalLM.from_pretrained(alone, gguf_file=path.name, dtype=torch.float32,
                                                           output_loading_info=True, **({"config": config} if config
                                                                                         else {}))
        check_loaded(info, str(path))
        if keys.rope_freqs is not None:
            llama3_rope(model, keys.rope_freqs, str(path))
        if keys.arch == "phi3":
            phi3_keys(model, keys)
        if keys.arch in ("gemma2", "gemma3"):
            gemma_keys(model, keys)
        if keys.eog_ids:  # (a GGUF has no generation_config: the loader's holds its one eos id)
            model.generation_config.eos_token_id = keys.eog_ids
    return Checkpoint(model.eval(), tok, {"model": str(path.resolve()), "kind": "gguf",
                                          "sha256": weights_hash([path]), "tensor_types": keys.tensor_types})


# GGUF types whose values int4 holds (quantize.grid_steps): 4-bit grids per block of 32, ternary ones,
# and floats (quantized as any checkpoint's)
ON_INT4_GRID = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q4_K", "TQ1_0", "TQ2_0")


def gguf_int4_hint(source: dict, quantization: str) -> str:
    """For an int4 build of a GGUF whose layers are partly not on int4's grid (more bits: a small
    model's Q4_K_M is mostly Q5_0, llama.cpp falling back where a row is not a multiple of 256; two
    scales a block of 32: Q2_K, Q3_K; uneven levels: IQ4_NL, IQ4_XS) that failed its check, what to
    build instead. (The embedding and output, int8 under int4 too, are not counted.)"""
    again = sorted(t for t in source.get("tensor_types") or {} if t not in ON_INT4_GRID)
    if quantization != "int4" or not again:
        return ""
    return (f"; the GGUF's {', '.join(again)} layer weights are not on int4's grid (more bits, two scales a "
            "block of 32, or uneven levels), and int4 rounds them again: --quantization int8 keeps them closer")


def mend_tokenizer(tok, keys: "GgufKeys") -> None:
    """What transformers' GGUF loader drops of the file's tokenizer, given back (scripts/
    fetch_demo_model.py's conversion too): llama.cpp's digit split, the named chat templates."""
    if keys.digits_apart:  # llama.cpp's split (and the model's own tokenizer.json's): each digit alone
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    if keys.chat_templates:  # (its loader reads the default one alone: a tool_use one was lost)
        tok.chat_template = {"default": tok.chat_template, **keys.chat_templates} if tok.chat_template \
            else keys.chat_templates


@dataclass
class GgufKeys:
    """What a GGUF holds that transformers' GGUF loader drops and load_gguf gives back."""
    arch: str
    rope_freqs: list[float] | None = None  # a llama GGUF's rope_freqs.weight: Llama 3's RoPE scaling
    sliding_window: int = 0  # a phi3 GGUF's window (0: none, as llama.cpp's converter writes Phi-4's)
    rope_dims: int | None = None  # a phi3 GGUF's rotary dimensions of a head (the head size where it gives none)
    longrope: dict | None = None  # a phi3 GGUF's LongRoPE: rope_parameters' long/short factors, original context
    softcaps: dict = field(default_factory=dict)  # a gemma2 GGUF's: config name -> value
    linear: float | None = None  # a gemma3 GGUF's linear RoPE scaling (its global layers': Gemma 3 4B-27B)
    eog_ids: list[int] = field(default_factory=list)  # the tokens llama.cpp ends generation at (gguf_eog_ids)
    digits_apart: bool = False  # a BPE vocabulary whose pre-tokenizer splits digits first (pre_tokenizer)
    chat_templates: dict = field(default_factory=dict)  # named ones (tokenizer.chat_template.<name>): tool_use
    tensor_types: dict = field(default_factory=dict)  # how many of its layers' weights each GGML type holds ("Q4_K": 16)
    moe: dict = field(default_factory=dict)  # a mixture of experts' config values the loader drops (moe_config)


def moe_keys(value, arch: str, path: str) -> dict:
    """A mixture of experts' config values that transformers' GGUF loader leaves at its defaults (the
    experts' width, the shared expert's; its routing's normalization, which llama.cpp's graph fixes per
    architecture), for moe_config."""
    width = value(f"{arch}.expert_feed_forward_length")
    if width is None:
        raise CheckpointError(f"--model {path!r} is a {arch} GGUF without {arch}.expert_feed_forward_length (the experts' "
                              "width), which transformers' GGUF loader would take as its default: build from the "
                              "Hugging Face checkpoint directory instead")
    out = {"moe_intermediate_size": int(width), "norm_topk_prob": MOE_NORMALIZED[arch],
           "mlp_only_layers": [], "decoder_sparse_step": 1}  # (llama.cpp's: every layer a mixture)
    shared = value(f"{arch}.expert_shared_feed_forward_length")
    if shared is not None:
        out["shared_expert_intermediate_size"] = int(shared)
    return out


def moe_config(directory: str, name: str, keys: GgufKeys):
    """The config transformers' loader makes of a mixture of experts' GGUF, with moe_keys' values (None:
    not a mixture of experts)."""
    if not keys.moe:
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(directory, gguf_file=name)
    for key, value in keys.moe.items():
        setattr(config, key, value)
    return config


def phi3_keys(model, keys: GgufKeys) -> None:
    """What transformers' loader drops of a Phi-3 GGUF, given back: its sliding window (Phi-3-mini-4k's
    2047), a partial rotary (Phi-4-mini rotates 96 of 128 dimensions) and LongRoPE (Phi-3.5-mini,
    Phi-4-mini, the 128k Phi-3s: the factors llama.cpp's converter writes as rope_factors_long/short
    tensors, and the original context). The rotary module is made again from the mended config."""
    config = model.config
    config.sliding_window = keys.sliding_window or None
    head = config.hidden_size // config.num_attention_heads
    params = dict(config.rope_parameters)
    if keys.rope_dims not in (None, head):
        params["partial_rotary_factor"] = keys.rope_dims / head
    if keys.longrope:
        params.update(rope_type="longrope", **keys.longrope)
        config.original_max_position_embeddings = keys.longrope["original_max_position_embeddings"]
    if params != config.rope_parameters:
        config.rope_parameters = params
        model.model.rotary_emb = type(model.model.rotary_emb)(config)


# Gemma's 27B (46 layers for Gemma 2, 62 for Gemma 3) scales its queries by hidden / heads, the
# others by the head size: llama.cpp's rule (llama-model.cpp), as the GGUF holds no
# query_pre_attn_scalar and transformers' default (256) is the head size of some sizes only
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def gemma_keys(model, keys: GgufKeys) -> None:
    """What a Gemma GGUF leaves out, as llama.cpp reads it: the query scale (query_pre_attn_scalar,
    GEMMA_27B_LAYERS), its soft-caps (transformers' loader drops the keys; Gemma 2's defaults are its
    own, Gemma 3 has none unless given), and a gemma3's linear RoPE scaling (its global layers'). With
    its window (check_gguf refuses a GGUF without one), the local RoPE base (10000) and which layers
    slide (every other one for Gemma 2, five of six for Gemma 3) are transformers' defaults and
    llama.cpp's alike."""
    config = model.config
    wide = config.num_hidden_layers == GEMMA_27B_LAYERS[keys.arch]
    config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads if wide else config.head_dim
    for name, value in keys.softcaps.items():
        setattr(config, name, value)
    if keys.linear is not None:  # the global layers' (llama.cpp's sliding ones keep a scale of 1), as Gemma 3's config
        params = dict(config.rope_parameters)
        params["full_attention"] = {**params["full_attention"], "rope_type": "linear", "factor": keys.linear}
        config.rope_parameters = params
        model.model.rotary_emb = type(model.model.rotary_emb)(config)
    for layer in model.model.layers:  # (set when the model was made)
        layer.self_attn.scaling = config.query_pre_attn_scalar ** -0.5
        if "attn_logit_softcapping" in keys.softcaps:
            layer.self_attn.attn_logit_softcapping = config.attn_logit_softcapping


# Llama 3's RoPE scaling as llama.cpp's converter writes it (rope_freqs.weight) is recognised by its
# factors: these are the (low_freq_factor, high_freq_factor, original_max_position_embeddings) tried
# (Llama 3.1's and 3.2's are the first), with the largest factor as `factor`.
LLAMA3_ROPE = [(1.0, 4.0, 8192), (1.0, 4.0, 4096), (1.0, 4.0, 16384), (1.0, 4.0, 32768), (1.0, 2.0, 8192)]


def llama3_factors(dim: int, theta: float, factor: float, low: float, high: float, original: int) -> list[float]:
    """The frequency factors (dividing each RoPE frequency) llama.cpp's converter writes for Llama 3's
    scaling (convert_hf_to_gguf.py; it computes them in float32, here in float64: the last bits may
    differ)."""
    out = []
    for freq in (1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))).tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).tolist()


def llama3_rope(model, factors: list[float], model_arg: str) -> None:
    """The model's RoPE made Llama 3's scaling whose factors the GGUF holds, computed by transformers
    itself (rope_type llama3), as the HF checkpoint's; factors of another shape are refused."""
    config = model.config
    params = dict(config.rope_parameters)
    theta = params["rope_theta"]
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for low, high, original in LLAMA3_ROPE:
        want = llama3_factors(dim, theta, max(factors), low, high, original)
        if len(factors) == len(want) and all(abs(a - b) <= 1e-5 * b for a, b in zip(factors, want)):
            config.rope_parameters = {**params, "rope_type": "llama3", "factor": max(factors), "low_freq_factor": low,
                                      "high_freq_factor": high, "original_max_position_embeddings": original}
            model.model.rotary_emb = type(model.model.rotary_emb)(config)
            return
    raise CheckpointError(f"--model {model_arg!r} has a rope_freqs.weight tensor whose {len(factors)} factors are not "
                          f"Llama 3's RoPE scaling (of head size {dim}, factor {max(factors):g} and low/high "
                          "frequency factors and original context among "
                          f"{', '.join(f'{lo:g}/{hi:g}/{n}' for lo, hi, n in LLAMA3_ROPE)}), and transformers' GGUF "
                          "loader would drop them. Build from the Hugging Face checkpoint directory instead")


# The tensors transformers' GGUF loader maps, per layer and per architecture; it drops any other
# (attention biases in a llama GGUF, say) without a word, and llama.cpp would use them.
GGUF_TENSORS = re.compile(r"token_embd\.weight|output_norm\.weight|output\.weight|blk\.\d+\.(attn_norm|attn_q|attn_k|"
                          r"attn_v|attn_output|ffn_norm|ffn_gate|ffn_up|ffn_down)\.weight")
EXPERTS = r"ffn_gate_inp|ffn_(?:gate|up|down)_exps"
GGUF_EXTRA = {"qwen2": re.compile(r"blk\.\d+\.attn_[qkv]\.bias"),
              "qwen3moe": re.compile(rf"blk\.\d+\.(?:attn_[qk]_norm|{EXPERTS})\.weight"),
              "qwen2moe": re.compile(rf"blk\.\d+\.(?:attn_[qkv]\.bias|(?:{EXPERTS}|ffn_(?:gate|up|down)_shexp|"
                                     r"ffn_gate_inp_shexp)\.weight)"),
              "qwen3": re.compile(r"blk\.\d+\.attn_[qk]_norm\.weight"),
              # (its gate|up is ffn_up; the LongRoPE factors: phi3_longrope)
              "phi3": re.compile(r"blk\.\d+\.attn_qkv\.weight|rope_factors_(long|short)\.weight"),
              "gemma2": re.compile(r"blk\.\d+\.(post_attention_norm|post_ffw_norm)\.weight"),
              "gemma3": re.compile(r"blk\.\d+\.(post_attention_norm|post_ffw_norm|attn_[qk]_norm)\.weight")}
# what llama.cpp labels them (a Mistral GGUF is "llama")
GGUF_ARCHS = {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen2moe", "qwen3moe"}
# Mixtures of experts: whether llama.cpp's graph divides the chosen experts' weights by their sum
# (its build_moe_ffn's norm_w: Qwen3-MoE's does, Qwen2-MoE's does not), which the file does not say
MOE_NORMALIZED = {"qwen3moe": True, "qwen2moe": False}


def check_gguf(path: Path) -> GgufKeys:
    """What transformers' GGUF loader (5.x) drops, refused: RoPE scaling (llama.cpp's
    `<arch>.rope.scaling.*` keys, the older `<arch>.rope.scale_linear`, which llama.cpp reads as
    linear scaling when no type is given), tensors it does not map, and a split GGUF's other parts.
    Returns what load_gguf gives back to the model: a llama GGUF's `rope_freqs.weight` (Llama 3's
    scaling, as frequency factors), a phi3 GGUF's sliding window, rotary dimensions and LongRoPE
    (its rope_factors_long/short tensors), a Gemma's soft-caps and linear scaling."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError) as e:  # (numpy's words for a file cut short: say so)
        if any(word in str(e).lower() for word in ("magic", "version")):  # (the reader's own, clear)
            raise
        raise CheckpointError(f"--model {str(path)!r} is not a readable GGUF: truncated or corrupt "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:160]})") from e

    def value(name, default=None):
        """A key's value (a string or a number), or `default` where the GGUF lacks it."""
        if name not in reader.fields:
            return default
        part = reader.fields[name].parts[-1]
        return bytes(part).decode() if reader.fields[name].types[-1] == gguf.GGUFValueType.STRING else float(part[0])

    def refuse(what: str, consequence: str = "the engine would compute plain RoPE"):
        raise CheckpointError(f"--model {str(path)!r} has {what}, which transformers' GGUF loader drops: "
                              f"{consequence}. Build from the Hugging Face checkpoint directory instead")

    if value("split.count", 1) > 1:
        raise CheckpointError(f"--model {str(path)!r} is part of a split GGUF ({int(value('split.count'))} files): "
                              "merge it first (llama-gguf-split --merge FIRST.gguf OUT.gguf)")
    kind = next((value(n) for n in reader.fields if n.endswith(".rope.scaling.type")), None)
    factors = [n for n in reader.fields if n.endswith((".rope.scaling.factor", ".rope.scale_linear"))
               and value(n) not in (0.0, 1.0)]
    if kind == "linear" and not factors:  # (a linear scaling by 1: plain RoPE)
        kind = None
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    arch = value("general.architecture", "")
    linear = arch == "gemma3" and kind in (None, "linear") and len(factors) == 1  # (given back: gemma_keys)
    if not linear and (kind not in (None, "none") or (kind is None and factors)):
        what = f"RoPE scaling {kind!r}" if kind else f"RoPE scaling ({factors[0]} = {value(factors[0])})"
        refuse(what)
    if arch not in GGUF_ARCHS:  # e.g. gemma (1), whose GGUF transformers does not load
        raise CheckpointError(f"--model {str(path)!r} is a {arch or 'unlabelled'} GGUF, which is not supported (GGUF "
                              f"input is checked for {', '.join(sorted(GGUF_ARCHS))} only): build from the model's "
                              "Hugging Face checkpoint directory")
    if freqs is not None and arch != "llama":
        refuse(f"a rope_freqs.weight tensor in a {arch} GGUF (Llama 3's RoPE scaling is read from llama ones)")
    gguf_checks.layout(reader, value, arch, str(path))
    if arch == "gemma2" and any(t.name == "output.weight" for t in reader.tensors):  # (transformers' names it lm_head)
        raise CheckpointError(f"--model {str(path)!r} is a gemma2 GGUF with an output.weight tensor, which Gemma 2 "
                              "does not take (its head is its token embedding, as llama.cpp's converter writes it)")
    extra = GGUF_EXTRA.get(arch)
    dropped = [t.name for t in reader.tensors if t is not freqs
               and not GGUF_TENSORS.fullmatch(t.name) and not (extra and extra.fullmatch(t.name))]
    if dropped:
        refuse(f"tensors {listed(dropped, 4)}", "the engine would compute without them")
    keys = GgufKeys(arch, None if freqs is None else tensor_values(freqs))
    if arch == "phi3":
        keys.sliding_window = int(value("phi3.attention.sliding_window", 0))
        dims = value("phi3.rope.dimension_count")  # (else the head size: the embedding over the heads)
        keys.rope_dims = int(dims) if dims is not None else \
            int(value("phi3.embedding_length")) // int(value("phi3.attention.head_count"))
        keys.longrope = phi3_longrope(reader, value, keys.rope_dims, str(path))
    if arch in MOE_NORMALIZED:
        keys.moe = moe_keys(value, arch, str(path))
    keys.linear = value(factors[0]) if linear else None
    keys.eog_ids = gguf_eog_ids(reader, value)
    keys.tensor_types = dict(sorted(Counter(t.tensor_type.name for t in reader.tensors
                                            if t.name.startswith("blk.") and len(t.shape) == 2).items()))
    keys.digits_apart = pre_tokenizer(value("tokenizer.ggml.model"), value("tokenizer.ggml.pre"), str(path))
    keys.chat_templates = {name.removeprefix("tokenizer.chat_template."): value(name) for name in reader.fields
                           if name.startswith("tokenizer.chat_template.")}
    if arch in ("gemma2", "gemma3"):
        # llama.cpp's Gemma 3 without a window (sliding_window_pattern 1: every layer global, one RoPE
        # base) is no model transformers' GGUF loader makes: it would slide five of six layers
        window = f"{arch}.attention.sliding_window"
        if not value(window):
            raise CheckpointError(f"--model {str(path)!r} is a {arch} GGUF without a sliding window (every layer global), "
                                  "which transformers' GGUF loader would read as its default windows. Build from "
                                  "the Hugging Face checkpoint directory instead")
        keys.softcaps = {name: value(f"{arch}.{name}") for name in ("attn_logit_softcapping", "final_logit_softcapping")
                         if value(f"{arch}.{name}") is not None}
    return keys


# A BPE vocabulary's `tokenizer.ggml.pre`, how llama.cpp splits text before merging
# (llama-vocab.cpp's names and regex_exprs): those transformers' GGUF loader knows
# (GGUF_PRE_TOKENIZER_SPLITS), those of GPT-2's split (the loader's ByteLevel default), and those
# that split each digit off first and then as GPT-2 (the loader had no entry: SmolLM's "\n\n1" came
# as three tokens, not two). "default", and no key, are llama.cpp's own split (punctuation and
# digit runs first), which is not GPT-2's: refused with the rest
GPT2_SPLIT_PRE = frozenset({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                            "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling"})
DIGITS_APART_PRE = frozenset({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"})


def pre_tokenizer(model: str | None, pre: str | None, path: str) -> bool:
    """Whether a GGUF's BPE vocabulary splits digits apart first; refused where transformers' loader
    would split text otherwise than llama.cpp (the build's check, on the same tokenizer, passes)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    if model != "gpt2" or pre in GPT2_SPLIT_PRE or pre in GGUF_PRE_TOKENIZER_SPLITS:
        return False
    if pre in DIGITS_APART_PRE:
        return True
    said = "no tokenizer.ggml.pre (llama.cpp's default split)" if pre is None else f"tokenizer.ggml.pre {pre!r}"
    raise CheckpointError(f"--model {path!r} has {said}, a text split transformers' GGUF loader does not make (it "
                          "would split as GPT-2 and tokenize otherwise than llama.cpp): build from the Hugging Face "
                          "checkpoint directory instead")


# The tokens llama.cpp ends generation at besides the GGUF's eos/eot/eom ids (llama-vocab.cpp, which
# knows them by their text): turn ends, every one found; and one each of the FIM pad, repository and
# file-separator tokens, the GGUF's key's or else the first found by its text
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["})
FIM_TEXTS = {"fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
             "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
             "fim_sep": ("<|file_sep|>",)}


def gguf_eog_ids(reader, value) -> list[int]:
    """The ids llama.cpp stops generating at: the GGUF's eos (first), eot and eom, its FIM tokens and
    the turn ends it knows by their text (EOG_TEXTS). A key's id outside the vocabulary is ignored,
    as llama.cpp ignores it. transformers' GGUF loader keeps the eos alone, so a Phi-3.5 answer would
    run on past its `<|end|>`, a Llama 3.1 one past `<|eom_id|>`."""
    import gguf

    field_ = reader.fields.get(gguf.Keys.Tokenizer.LIST)
    tokens = [] if field_ is None else [bytes(field_.parts[i]).decode("utf-8", errors="replace") for i in field_.data]

    def key_id(name: str) -> int | None:
        found = int(value(f"tokenizer.ggml.{name}_token_id", -1))
        return found if 0 <= found < len(tokens) else None

    ids = [key_id(name) for name in ("eos", "eot", "eom")]
    for name, texts in FIM_TEXTS.items():
        ids.append(found if (found := key_id(name)) is not None else next(
            (i for i, token in enumerate(tokens) if token in texts), None))
    ids += [i for i, token in enumerate(tokens) if token in EOG_TEXTS]
    return list(dict.fromkeys(i for i in ids if i is not None))


def tensor_values(tensor) -> list[float]:
    """A small GGUF tensor's values, read as float32 whatever its type (a BF16 one's data are its raw bytes)."""
    import gguf

    return [float(x) for x in gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype("float32").reshape(-1)]


def phi3_longrope(reader, value, rope_dims: int, model_arg: str) -> dict | None:
    """A phi3 GGUF's LongRoPE as rope_parameters has it (None: plain RoPE), from what llama.cpp's
    converter writes: one factor per rotary frequency in rope_factors_long/short.weight, the context
    the short ones hold (rope.scaling.original_context_length) and the attention factor it computed
    (rope.scaling.attn_factor: transformers' own rule; taken as the file has it, and 1 without the
    key, as llama.cpp takes them: the converter always writes it)."""
    tensors = {t.name: t for t in reader.tensors if t.name in ("rope_factors_long.weight", "rope_factors_short.weight")}
    if not tensors:
        return None
    if len(tensors) == 1:
        raise CheckpointError(f"--model {model_arg!r} has {next(iter(tensors))} without its pair (LongRoPE takes "
                              "rope_factors_long.weight and rope_factors_short.weight)")
    original = "phi3.rope.scaling.original_context_length"
    if value(original) is None:
        raise CheckpointError(f"--model {model_arg!r} has LongRoPE factors without {original}, the context its "
                              "short factors hold")
    factors = {}
    for kind in ("long", "short"):
        data = tensor_values(tensors[f"rope_factors_{kind}.weight"])
        if len(data) != rope_dims // 2:
            raise CheckpointError(f"--model {model_arg!r} has {len(data)} LongRoPE {kind} factors, not one per "
                                  f"rotary frequency ({rope_dims // 2})")
        factors[f"{kind}_factor"] = data
    return {**factors, "original_max_position_embeddings": int(value(original)),
            "attention_factor": value("phi3.rope.scaling.attn_factor", 1.0)}
