"""runtime/lora.py: PEFT adapters into graph inputs (scales, module placement, patterns), every
refusal naming the file and the fix, and the per-step feeds (shared, none, mixed, idle rows)."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from trtllm.runtime import lora
from trtllm.runtime.manifest import Limits, Manifest, ModelShape

save_file = pytest.importorskip("safetensors.numpy").save_file

H, I, Q, KV = 8, 12, 8, 4
SITES = {"qkv": {"in": H, "modules": [["self_attn.q_proj", 0, Q], ["self_attn.k_proj", Q, Q + KV],
                                       ["self_attn.v_proj", Q + KV, Q + 2 * KV]]},
         "o": {"in": Q, "modules": [["self_attn.o_proj", 0, H]]},
         "gate_up": {"in": H, "modules": [["mlp.gate_proj", 0, I], ["mlp.up_proj", I, 2 * I]]},
         "down": {"in": I, "modules": [["mlp.down_proj", 0, H]]}}
MANIFEST = Manifest(architecture="llama", backend="onnxruntime", dtype="float32",
                    limits=Limits(max_batch_size=4, max_input_len=16, max_kv_cache_capacity=32, max_lora_rank=4),
                    model=ModelShape(vocab_size=32, hidden_size=H, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4),
                    eos_token_ids=(0,), max_top_k=8, lora={"sites": SITES, "adapters": {}})
SHAPES = {"self_attn.q_proj": (H, Q), "self_attn.k_proj": (H, KV), "self_attn.v_proj": (H, KV),
          "self_attn.o_proj": (Q, H), "mlp.gate_proj": (H, I), "mlp.up_proj": (H, I), "mlp.down_proj": (I, H)}


def key(layer: int, module: str, ab: str) -> str:
    return f"base_model.model.model.layers.{layer}.{module}.lora_{ab}.weight"


def write_adapter(path, modules: dict, seed: int = 0, **config) -> dict:
    """modules: {(layer, module): rank}; returns the tensors written (lora_A [r, in], lora_B [out, r])."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for (layer, module), r in modules.items():
        n_in, n_out = SHAPES[module]
        tensors[key(layer, module, "A")] = rng.standard_normal((r, n_in)).astype(np.float32)
        tensors[key(layer, module, "B")] = rng.standard_normal((n_out, r)).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / lora.WEIGHTS_NAME))
    # PEFT's form: r for most modules, rank_pattern for the others
    ranks = {f"layers.{layer}.{module}": r for (layer, module), r in modules.items() if r != config.get("r", 4)}
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, **config}
    config["rank_pattern"] = {**ranks, **config.get("rank_pattern", {})}
    (path / lora.CONFIG_NAME).write_text(json.dumps(config))
    return tensors


def delta(adapter: lora.Adapter, layer: int, site: str, x: np.ndarray) -> np.ndarray:
    """What the graph adds to a site's fused projection: its modules' deltas side by side."""
    io, arrays = MANIFEST.io, adapter.arrays
    return np.concatenate([x @ arrays[io.lora_a.format(i=layer, module=m)][0] @ arrays[io.lora_b.format(i=layer, module=m)][0]
                           for m, _, _ in SITES[site]["modules"]], axis=-1)


def test_modules_land_in_their_columns_with_their_scales(tmp_path):
    t = write_adapter(tmp_path, {(0, "self_attn.q_proj"): 2, (0, "self_attn.v_proj"): 4, (1, "mlp.down_proj"): 3},
                      alpha_pattern={"v_proj": 2})
    adapter = lora.load_adapter("a", tmp_path, MANIFEST)
    x = np.random.default_rng(1).standard_normal((3, H)).astype(np.float32)
    got = delta(adapter, 0, "qkv", x)

    def module(x, layer, name, scale):  # PEFT: scale * x @ A.T @ B.T, scale = alpha / r
        return scale * x @ t[key(layer, name, "A")].T @ t[key(layer, name, "B")].T

    np.testing.assert_allclose(got[:, :Q], module(x, 0, "self_attn.q_proj", 8 / 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[:, Q:Q + KV], 0)   # k_proj is not adapted
    np.testing.assert_allclose(got[:, Q + KV:], module(x, 0, "self_attn.v_proj", 2 / 4), rtol=1e-5, atol=1e-5)
    xi = np.random.default_rng(2).standard_normal((3, I)).astype(np.float32)
    np.testing.assert_allclose(delta(adapter, 1, "down", xi), module(xi, 1, "mlp.down_proj", 8 / 3), rtol=1e-5, atol=1e-5)
    assert adapter.arrays[MANIFEST.io.lora_a.format(i=1, module="self_attn.q_proj")].shape == (1, H, 0)  # not adapted
    assert adapter.rank == 4


def test_a_negative_or_zero_alpha_scales_as_in_peft(tmp_path):
    """PEFT takes any lora_alpha (its scale is alpha / r): a negative one subtracts the delta."""
    for alpha in (-8, 0):
        write_adapter(tmp_path / str(alpha), {(0, "self_attn.o_proj"): 4}, lora_alpha=alpha)
        cfg = json.loads((tmp_path / str(alpha) / lora.CONFIG_NAME).read_text())
        assert lora.module_scale(cfg, 0, "self_attn.o_proj", 4) == alpha / 4
        lora.load_adapter("a", tmp_path / str(alpha), MANIFEST)


def test_rslora_scale(tmp_path):
    write_adapter(tmp_path, {(0, "self_attn.o_proj"): 4}, use_rslora=True, lora_alpha=6)
    assert lora.module_scale(json.loads((tmp_path / lora.CONFIG_NAME).read_text()), 0, "self_attn.o_proj", 4) == 6 / math.sqrt(4)


def test_patterns_match_the_end_of_a_module_name():
    assert lora.pattern_value({"q_proj": 1, "layers.1.self_attn.o_proj": 2}, "model.layers.0.self_attn.q_proj", 9) == 1
    assert lora.pattern_value({"layers.1.self_attn.o_proj": 2}, "model.layers.1.self_attn.o_proj", 9) == 2
    assert lora.pattern_value({"layers.1.self_attn.o_proj": 2}, "model.layers.11.self_attn.o_proj", 9) == 9
    # keys are regular expressions, as PEFT's get_pattern_key reads them
    regex = {r"layers\.[01]\.self_attn\.q_proj": 3}
    assert lora.pattern_value(regex, "model.layers.1.self_attn.q_proj", 9) == 3
    assert lora.pattern_value(regex, "model.layers.2.self_attn.q_proj", 9) == 9


def _rank(path):
    write_adapter(path, {(0, "self_attn.q_proj"): 8})


def _shape(path):
    t = write_adapter(path, {(0, "self_attn.q_proj"): 2})
    t[key(0, "self_attn.q_proj", "A")] = np.ones((2, H + 1), np.float32)
    save_file(t, str(path / lora.WEIGHTS_NAME))


def _extra_key(name):
    def make(path):
        t = write_adapter(path, {(0, "self_attn.q_proj"): 2})
        t[name] = np.ones((2, H), np.float32)
        save_file(t, str(path / lora.WEIGHTS_NAME))
    return make


def _declared_rank(path):
    write_adapter(path, {(0, "self_attn.q_proj"): 2})
    cfg = json.loads((path / lora.CONFIG_NAME).read_text())
    (path / lora.CONFIG_NAME).write_text(json.dumps({**cfg, "rank_pattern": {}}))  # says r = 4 for every module


def _half_pair(path):
    t = write_adapter(path, {(0, "self_attn.q_proj"): 2})
    del t[key(0, "self_attn.q_proj", "B")]
    save_file(t, str(path / lora.WEIGHTS_NAME))


def _nan(path):
    t = write_adapter(path, {(0, "self_attn.q_proj"): 2})
    t[key(0, "self_attn.q_proj", "A")][0, 0] = np.nan
    save_file(t, str(path / lora.WEIGHTS_NAME))


def _config(**cfg):
    return lambda path: write_adapter(path, {(0, "self_attn.q_proj"): 2}, **cfg)


def _tensor(name, value):
    def make(path):
        t = write_adapter(path, {(0, "self_attn.q_proj"): 2})
        t[key(0, "self_attn.q_proj", name)] = value
        save_file(t, str(path / lora.WEIGHTS_NAME))
    return make


def _header(path):
    write_adapter(path, {(0, "self_attn.q_proj"): 2})
    (path / lora.WEIGHTS_NAME).write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00[]")


def _header_past_the_end(path):
    write_adapter(path, {(0, "self_attn.q_proj"): 2})
    (path / lora.WEIGHTS_NAME).write_bytes((10**15).to_bytes(8, "little") + b"{}")  # (a slice reads "{}")


def _no_matrices(path):
    write_adapter(path, {(0, "self_attn.q_proj"): 2})
    save_file({}, str(path / lora.WEIGHTS_NAME))


def _no_config(path):
    write_adapter(path, {(0, "self_attn.q_proj"): 2})
    (path / lora.CONFIG_NAME).unlink()


def _bin_only(path):
    path.mkdir()
    (path / "adapter_model.bin").write_bytes(b"x")


def _bin_named(path):
    write_adapter(path.parent / "dir", {(0, "self_attn.q_proj"): 2})
    (path.parent / "dir" / "adapter_model.bin").write_bytes(b"PK\x03\x04 torch.save's zip")
    path.symlink_to(path.parent / "dir" / "adapter_model.bin")  # the .bin named itself (under another name)


def _not_safetensors(path):
    write_adapter(path, {(0, "self_attn.q_proj"): 2})
    (path / lora.WEIGHTS_NAME).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")


@pytest.mark.parametrize("make, message", [
    (_rank, "rank 8, above the engine's max_lora_rank 4; rebuild with --max-lora-rank 8"),
    (_shape, "do not fit this model"),
    (_extra_key("base_model.model.lm_head.lora_A.weight"), "lm_head.lora_A.weight is not a LoRA matrix"),
    (_extra_key(key(2, "self_attn.q_proj", "A")), "is for layer 2; the model has 2"),
    (_half_pair, "has lora_A without lora_B"),
    (_declared_rank, "layer 0 self_attn.q_proj has rank 2, but"),
    (_nan, "NaN or infinite"),
    (_config(use_dora=True), "use_dora = True is not supported"),
    (_config(modules_to_save=["lm_head"]), "modules_to_save"),
    (_config(lora_alpha="8"), "lora_alpha must be a finite number"),
    (_config(kasa_config={"r": 2}), "KaSA truncates the base weights"),
    (_config(alora_invocation_tokens=[42, 99]), "activated LoRA applies from its invocation tokens on"),
    (_config(layer_replication=[[0, 1], [0, 1]]), "layer_replication"),
    (_config(init_lora_weights="pissa_niter_4"), "path_initial_model_for_weight_conversion"),
    (_config(init_lora_weights="olora"), "also rewrites the base weights"),
    (_config(lora_bias=True), "no trained biases"),
    (_config(use_bdlora={"nblocks": 2}), "block-diagonal"),
    (_config(arrow_config={"top_k": 2}), "arrow_config = {'top_k': 2} is not supported (Arrow routes"),
    (_config(monteclora_config={"n_samples": 4}), "MonteCLoRA samples its weights"),
    (_config(use_qalora=True, qalora_group_size=16), "QALoRA pools its inputs"),
    (_config(trainable_token_indices=[5]), "retrains embedding rows"),
    (_config(target_parameters=["model.embed_tokens.weight"]), "only a mixture of experts' are adapted here: its "
                                                                "experts' gate_up_proj and down_proj, its router's"),
    (_config(alpha_pattern=["q_proj"]), "alpha_pattern must be an object"),
    (_config(alpha_pattern={"q_proj(": 2}), "is not a valid regular expression"),
    (_config(alpha_pattern={"q_proj": "3"}), "alpha_pattern['q_proj'] must be a finite number"),
    (_config(rank_pattern={"q_proj": -1}), "rank_pattern['q_proj'] must be a positive number"),
    (_tensor("A", np.zeros((0, H), np.float32)), "do not fit this model"),
    (_tensor("A", np.array(1.0, np.float32)), "do not fit this model"),
    (_header, "is not a readable safetensors file"),
    (_header_past_the_end, "header length 1000000000000000 runs past the end of its 10 bytes"),
    (_no_matrices, "holds no LoRA matrices"),
    (_no_config, "adapter_config.json is missing"),
    (_bin_only, "save it with safe_serialization=True"),
    (_bin_named, "is a PyTorch .bin: save the adapter with safe_serialization=True"),
    (_not_safetensors, "is not a readable safetensors file"),
    # tensors for modules the config does not target: PEFT leaves them out
    (_config(target_modules=["v_proj"]), "is for a module that"),
    (_config(target_modules=r".*\.v_proj"), "is for a module that"),
    (_config(target_modules=["q_proj"], layers_to_transform=[1]), "is for a module that"),
    (_config(target_modules=["q_proj"], layers_to_transform="0"), "layers_to_transform must be a layer index"),
    (_config(target_modules=["q_proj"], exclude_modules=["model.layers.0.self_attn.q_proj"]), "is for a module that"),
    (_config(target_modules=["q_proj"], layers_to_transform=[0], layers_pattern="blocks"), "is for a module that"),
    (_config(target_modules=7), "target_modules must be a module name pattern"),
])
def test_refusals_name_the_file_and_the_fix(make, message, tmp_path):
    path = tmp_path / "adapter"
    make(path)
    with pytest.raises(lora.AdapterError) as e:
        lora.load_adapter("a", path, MANIFEST)
    assert message in str(e.value) and str(path) in str(e.value)


def _offsets_backwards(path):
    write_adapter(path, {(0, "self_attn.q_proj"): 2})
    data = (path / lora.WEIGHTS_NAME).read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    name = max((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    start = header[name]["data_offsets"][0]  # the last tensor: "to the end" is its bytes, and fits its shape
    header[name]["data_offsets"] = [start, start - 1]  # numpy reads count (-1) // 4 = -1 as: to the end
    text = json.dumps(header).encode().ljust(size)
    (path / lora.WEIGHTS_NAME).write_bytes(data[:8] + text + data[8 + size:])


@pytest.mark.parametrize("targets, layers, extra", [
    (["q_proj"], None, {}), (["self_attn.q_proj"], 0, {}), ("all-linear", [0, 1], {}), ("ALL-LINEAR", None, {}),
    (r"model\.layers\.0\.self_attn\.(q|v)_proj", None, {}), (None, None, {}),
    (["q_proj"], [], {}),  # [] is every layer, as in PEFT
    (["model.layers.0.self_attn.q_proj"], [1], {}),  # the whole name: layers_to_transform does not apply
    (["q_proj"], [0], {"layers_pattern": "layers", "exclude_modules": ["v_proj"]})])
def test_targeted_modules_load(targets, layers, extra, tmp_path):
    """The other side of the refusals above: PEFT's ways to name the module (a name its name ends
    with, a regular expression over the whole name, all-linear, none: the tensors say), per layer."""
    cfg = {k: v for k, v in (("target_modules", targets), ("layers_to_transform", layers)) if v is not None}
    cfg.update(extra)
    write_adapter(tmp_path, {(0, "self_attn.q_proj"): 2}, **cfg)
    assert lora.load_adapter("a", tmp_path, MANIFEST).rank == 2


def test_r_and_lora_alpha_default_as_in_peft(tmp_path):
    """adapter_config.json without them reads as PEFT's LoraConfig does: r 8, lora_alpha 8."""
    t = write_adapter(tmp_path, {(0, "self_attn.o_proj"): 8}, r=8)
    config = json.loads((tmp_path / lora.CONFIG_NAME).read_text())
    del config["r"], config["lora_alpha"]
    (tmp_path / lora.CONFIG_NAME).write_text(json.dumps(config))
    rank_8 = dataclasses.replace(MANIFEST, limits=dataclasses.replace(MANIFEST.limits, max_lora_rank=8))
    adapter = lora.load_adapter("a", tmp_path, rank_8)
    x = np.random.default_rng(1).standard_normal((3, Q)).astype(np.float32)
    want = 1.0 * x @ t[key(0, "self_attn.o_proj", "A")].T @ t[key(0, "self_attn.o_proj", "B")].T
    np.testing.assert_allclose(delta(adapter, 0, "o", x), want, rtol=1e-5, atol=1e-5)


def test_backwards_data_offsets_are_refused(tmp_path):
    _offsets_backwards(tmp_path / "adapter")
    with pytest.raises(lora.AdapterError, match="data_offsets"):
        lora.load_adapter("a", tmp_path / "adapter", MANIFEST)


def test_eva_is_read_as_the_plain_lora_it_saves(tmp_path):
    """EVA sets lora_A and per-module ranks (saved in rank_pattern/alpha_pattern) and leaves the base
    weights alone: the adapter computes what the same tensors with plain init do."""
    modules = {(0, "self_attn.q_proj"): 2, (1, "mlp.down_proj"): 3}
    write_adapter(tmp_path / "plain", modules, alpha_pattern={"model.layers.1.mlp.down_proj": 6})
    write_adapter(tmp_path / "eva", modules, alpha_pattern={"model.layers.1.mlp.down_proj": 6},
                  init_lora_weights="eva", eva_config={"rho": 2.0})
    plain, eva = (lora.load_adapter("a", tmp_path / n, MANIFEST) for n in ("plain", "eva"))
    assert plain.arrays.keys() == eva.arrays.keys()
    assert all(np.array_equal(plain.arrays[k], eva.arrays[k]) for k in plain.arrays)
    assert plain.digest == eva.digest  # the engine computes the same: their saved KV is one


def test_an_engine_without_lora_inputs_says_how_to_rebuild(tmp_path):
    write_adapter(tmp_path, {(0, "self_attn.q_proj"): 2})
    plain = dataclasses.replace(MANIFEST, lora={})
    with pytest.raises(lora.AdapterError, match="built without LoRA inputs; rebuild it with --max-lora-rank"):
        lora.load_adapter("a", tmp_path, plain)


def test_a_safetensors_file_with_its_config_beside_it(tmp_path):
    write_adapter(tmp_path, {(1, "mlp.up_proj"): 3})
    by_file = lora.load_adapter("a", tmp_path / lora.WEIGHTS_NAME, MANIFEST)
    by_dir = lora.load_adapter("a", tmp_path, MANIFEST)
    assert by_file.digest == by_dir.digest and by_file.rank == 3


def test_the_digest_is_of_the_bytes_converted(tmp_path, monkeypatch):
    """An adapter rewritten while it loads (a trainer saving a checkpoint): each file is read once,
    so the digest, which keys its saved system-prompt KV, is that of the weights the engine uses.
    The wrong variant, a second read for the digest, would key the old weights' KV by the new file."""
    from pathlib import Path

    write_adapter(tmp_path / "old", {(0, "self_attn.q_proj"): 2}, seed=1)
    write_adapter(tmp_path / "new", {(0, "self_attn.q_proj"): 2}, seed=2)
    old, new = (lora.load_adapter("a", tmp_path / n, MANIFEST) for n in ("old", "new"))
    read, reads = Path.read_bytes, []

    def rewritten_after_first_read(self):
        data = read(self)
        if self.parent.name == "old":
            reads.append(self.name)
            (self.parent / self.name).write_bytes(read(tmp_path / "new" / self.name))
        return data

    monkeypatch.setattr(Path, "read_bytes", rewritten_after_first_read)
    got = lora.load_adapter("a", tmp_path / "old", MANIFEST)
    assert sorted(reads) == sorted([lora.CONFIG_NAME, lora.WEIGHTS_NAME])  # once each
    assert got.digest == old.digest != new.digest
    assert all(np.array_equal(got.arrays[k], old.arrays[k]) for k in old.arrays)


def test_the_digest_follows_the_conversion(tmp_path, monkeypatch):
    """Saved system-prompt KV is keyed by the digest: the same files converted another way (a later
    trtllm-edge's scaling rule) must be another key, or an upgrade would restore KV the adapter no
    longer computes. The wrong variant, a digest of the files' bytes, stays the same."""
    write_adapter(tmp_path, {(0, "self_attn.q_proj"): 2})
    before = lora.load_adapter("a", tmp_path, MANIFEST)
    assert lora.load_adapter("a", tmp_path, MANIFEST).digest == before.digest
    scale = lora.module_scale
    monkeypatch.setattr(lora, "module_scale", lambda *args: 2 * scale(*args))
    after = lora.load_adapter("a", tmp_path, MANIFEST)
    assert after.digest != before.digest


def test_step_feeds_shared_none_and_mixed(tmp_path):
    a = lora.load_adapter("a", write_dir(tmp_path / "a", {(0, "self_attn.q_proj"): 2, (1, "mlp.gate_proj"): 4}), MANIFEST)
    b = lora.load_adapter("b", write_dir(tmp_path / "b", {(0, "self_attn.q_proj"): 4}, seed=3), MANIFEST)
    steps = lora.StepAdapters(MANIFEST, num_slots=4)
    idle = lora.StepAdapters.IDLE
    native = lora.StepAdapters(dataclasses.replace(MANIFEST, lowerings=("trtllm.cpu::LoraAdd",)), num_slots=4)
    assert native.feeds(0, [a, a, idle]) is a.arrays           # one adapter on LoraAdd: its own [1, ...] arrays
    assert steps.feeds(0, [a]) is a.arrays                     # one row: the same
    # several rows on the standard-op form: per row (a [1, ...] adapter's MatMul rounds by batch size)
    check_rows(steps.feeds(0, [a, a, idle]), [a, a, None], (3, H, 2), (3, 2, Q))
    assert steps.feeds(0, [None, idle]) is steps.base.arrays   # none: rank 0
    mixed = steps.feeds(0, [a, None, b, idle])
    assert steps.feeds(0, [a, None, b, idle]) is mixed         # the same views again: nothing to rebind
    check_rows(mixed, [a, None, b, None], (4, H, 4), (4, 4, Q))  # q_proj: ranks 2 and 4, padded to 4


def check_rows(feeds: dict, adapters: list, a_shape, b_shape) -> None:
    """What the graph computes from q_proj's feeds, row by row, against each row's adapter alone."""
    io = MANIFEST.io
    name_a, name_b = io.lora_a.format(i=0, module="self_attn.q_proj"), io.lora_b.format(i=0, module="self_attn.q_proj")
    assert feeds[name_a].shape == a_shape and feeds[name_b].shape == b_shape
    x = np.random.default_rng(0).standard_normal((len(adapters), 3, H)).astype(np.float32)
    got = x @ feeds[name_a] @ feeds[name_b]
    for row, adapter in enumerate(adapters):
        want = 0 if adapter is None else delta(adapter, 0, "qkv", x[row])[..., :Q]
        np.testing.assert_allclose(got[row], want, rtol=1e-5, atol=1e-5)


def test_slots_are_rewritten_only_when_their_adapter_changes(tmp_path):
    """In flight: a slot takes a new adapter (its rows rewritten, the others kept); a wider adapter
    grows the buffers and keeps what they hold; a sub-range of slots (a prefill) is a view."""
    a = lora.load_adapter("a", write_dir(tmp_path / "a", {(0, "self_attn.q_proj"): 2}), MANIFEST)
    b = lora.load_adapter("b", write_dir(tmp_path / "b", {(0, "self_attn.q_proj"): 3}, seed=3), MANIFEST)
    c = lora.load_adapter("c", write_dir(tmp_path / "c", {(0, "self_attn.q_proj"): 4, (1, "mlp.up_proj"): 4}, seed=5),
                          MANIFEST)
    steps = lora.StepAdapters(MANIFEST, num_slots=3)
    check_rows(steps.feeds(0, [a, b, None]), [a, b, None], (3, H, 3), (3, 3, Q))
    written = []
    steps.write = lambda slot, adapter, write=steps.write: (written.append(slot), write(slot, adapter))[1]
    check_rows(steps.feeds(0, [a, a, None]), [a, a, None], (3, H, 3), (3, 3, Q))
    assert written == [1]                                     # only the slot whose adapter changed
    check_rows(steps.feeds(1, [c, None]), [c, None], (2, H, 4), (2, 4, Q))  # a prefill of slots 1, 2; rank grows
    check_rows(steps.feeds(0, [a, c, None]), [a, c, None], (3, H, 4), (3, 4, Q))  # slot 0 kept through the growth
    assert written == [1, 1]


def write_dir(path, modules, seed=0):
    write_adapter(path, modules, seed)
    return path


def test_adapter_set_resolves_paths_and_remembers_failures(tmp_path):
    class Engine:
        manifest, engine_dir = MANIFEST, tmp_path / "engine"
    write_adapter(tmp_path / "inputs" / "adapters" / "a", {(0, "self_attn.q_proj"): 2})
    write_adapter(tmp_path / "big", {(0, "self_attn.q_proj"): 8})
    adapters = lora.AdapterSet.for_run(Engine(), {"a": "adapters/a", "big": str(tmp_path / "big")}, tmp_path / "inputs")
    assert adapters.get("a").rank == 2
    for _ in range(2):  # the same message every time, loaded once
        with pytest.raises(lora.AdapterError, match="max_lora_rank"):
            adapters.get("big")
    assert isinstance(adapters.loaded["big"], lora.AdapterError)


def processed(peft_dir, out):
    """What Edge-LLM's process-lora writes from a PEFT adapter (tensorrt_edgellm/lora/lora.py's
    process_lora_weights_and_save, in numpy): B times alpha / r, A as [in, r], B as [r, out],
    float16, keys without base_model.model., the config copied as config.json."""
    from safetensors.numpy import load_file

    cfg = json.loads((peft_dir / lora.CONFIG_NAME).read_text())
    tensors = {}
    for name, t in load_file(str(peft_dir / lora.WEIGHTS_NAME)).items():
        if "lora_B" in name:
            t = t * (cfg["lora_alpha"] / cfg["r"])
        t = t.T if ("lora_A" in name and t.shape[-1] != cfg["r"]) or ("lora_B" in name and t.shape[0] != cfg["r"]) else t
        tensors[name.removeprefix("base_model.model.")] = np.ascontiguousarray(t, np.float16)
    out.mkdir(parents=True)
    save_file(tensors, str(out / lora.PROCESSED_NAME))
    (out / lora.PROCESSED_CONFIG_NAME).write_text(json.dumps(cfg))


@pytest.mark.parametrize("by_file", ["", lora.PROCESSED_NAME, "french_adapter.safetensors"])
def test_an_edge_llm_processed_adapter_computes_what_its_peft_adapter_does(tmp_path, by_file):
    """Edge-LLM's available_lora_weights point at process-lora's output (its directory, its file, or
    the file renamed, as Edge-LLM's INPUT_FORMAT.md names it: config.json beside it says what it is):
    read as it is meant (A and B transposed back, B's scale already in it), it gives the PEFT
    adapter's deltas to float16 rounding. v_proj's B is square (out = r = 4), which process-lora
    leaves as it was. The wrong variants, scaling B again or transposing every matrix, are off (by
    alpha / r = 2; in v_proj)."""
    modules = {(0, "self_attn.q_proj"): 4, (1, "mlp.down_proj"): 4, (1, "self_attn.v_proj"): 4}
    write_adapter(tmp_path / "peft", modules)
    processed(tmp_path / "peft", tmp_path / "processed")
    if by_file not in ("", lora.PROCESSED_NAME):
        (tmp_path / "processed" / lora.PROCESSED_NAME).rename(tmp_path / "processed" / by_file)
    want = lora.load_adapter("a", tmp_path / "peft", MANIFEST)
    got = lora.load_adapter("a", tmp_path / "processed" / by_file, MANIFEST)
    assert got.arrays.keys() == want.arrays.keys() and got.rank == want.rank == 4
    x = np.random.default_rng(1).standard_normal((3, H)).astype(np.float32)
    for layer in (0, 1):
        for site in ("qkv", "down"):
            xs = x if site == "qkv" else np.random.default_rng(2).standard_normal((3, I)).astype(np.float32)
            np.testing.assert_allclose(delta(got, layer, site, xs), delta(want, layer, site, xs), rtol=2e-3, atol=2e-3)
    assert np.abs(delta(want, 1, "down", np.ones((1, I), np.float32))).max() > 1  # (not vacuous)


def test_the_build_bundles_peft_adapters_only(tmp_path):
    """trtllm-build --lora checks a bundled adapter against PEFT, which cannot read the processed
    form: it says which adapter to give instead."""
    from trtllm.builder import lora as build_lora

    write_adapter(tmp_path / "peft", {(0, "self_attn.q_proj"): 4})
    processed(tmp_path / "peft", tmp_path / "processed")
    assert build_lora.adapter_rank(str(tmp_path / "peft")) == 4
    with pytest.raises(lora.AdapterError, match="processed adapter: bundle the PEFT adapter it was made from"):
        build_lora.adapter_rank(str(tmp_path / "processed"))
