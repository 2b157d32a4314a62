"""Where LoRA deltas enter a decoder's layers (its "sites"): each fused projection with its input width
and, per PEFT module, the columns of its output; what the manifest's lora.sites records and both the
graph (DecoderWriter.lora) and the runtime (runtime/lora.py) read."""
from __future__ import annotations

from trtllm.builder.decoder_spec import DecoderSpec


def lora_sites(spec: DecoderSpec, experts: bool = False) -> dict[str, dict]:
    """Where LoRA deltas enter a layer: each fused projection (site), with its input width and, per
    PEFT module, the columns of its output [name, start, stop]; each module has its own inputs. A site
    on some layers only lists them in "layers": a mixture of experts' dense MLP is on its dense layers,
    its shared expert (and that expert's gate) and its router on the others, and with `experts` its
    routed experts' gate|up and down too ("experts": E, an adapter per expert; not where ONNX Runtime's
    MoE node runs them, which takes none)."""
    if spec.kv_layers() is not None or spec.wide_mlp_layers or spec.attn_gate:
        return layered_sites(spec, experts)
    h, i = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim

    # one PEFT module per fused projection, as the checkpoint has them
    qkv = columns(("self_attn.qkv_proj", q + 2 * kv)) if spec.fused_projections else \
        columns(("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv))
    gate_up = columns(("mlp.gate_up_proj", 2 * i)) if spec.fused_projections or spec.fused_gate_up else \
        columns(("mlp.gate_proj", i), ("mlp.up_proj", i))
    sites = {"qkv": {"in": h, "modules": qkv}, "o": {"in": q, "modules": columns(("self_attn.o_proj", h))}}
    moe, every = spec.moe, list(range(spec.num_layers))
    dense = every if moe is None else list(moe.dense_layers)
    sparse = [n for n in every if n not in dense]  # (a mixture's layers)
    if dense:  # (Arcee's MLP has no gate: up_proj alone)
        sites["gate_up" if spec.gated_mlp else "up"] = {"in": h, "modules": gate_up if spec.gated_mlp else
                                                       columns(("mlp.up_proj", i)), "layers": dense}
        sites["down"] = {"in": i, "modules": columns(("mlp.down_proj", h)), "layers": dense}
    for kind, width_in, modules in shared_kinds(spec):
        sites[kind] = {"in": width_in, "modules": columns(*modules), "layers": sparse}
    if moe is not None:  # (the router's delta joins its logits, before the softmax, in every form)
        for kind, width_in, modules in routed_kinds(spec, experts):
            sites[kind] = {"in": width_in, "modules": columns(*modules),
                           **({"experts": moe.num_experts} if kind.startswith("experts") else {}), "layers": sparse}
    named = dict(spec.module_names)  # (under the checkpoint's names: Granite 4's shared_mlp as its MLP)
    for site in sites.values():
        site["modules"] = [[named.get(m, m), start, stop] for m, start, stop in site["modules"]]
    # ("layers" only where a site is on some layers: a dense model's manifest stays as it was)
    return {name: {k: v for k, v in site.items() if k != "layers" or v != every} for name, site in sites.items()}


def shared_kinds(spec: DecoderSpec) -> tuple[tuple[str, int, list], ...]:
    """A mixture of experts' layer's shared expert sites (gate|up, down, and its gate where it has one) as
    (kind, input width, [(module, width)]): Granite MoE's shared_mlp whole, the others' gate and up."""
    moe, h = spec.moe, spec.hidden_size
    if moe is None or not moe.shared_size:
        return ()
    s = moe.shared_size
    if moe.shared_fused:
        kinds = (("shared_gate_up", h, [("shared_mlp.input_linear", 2 * s)]),
                 ("shared_down", s, [("shared_mlp.output_linear", h)]))
    else:
        kinds = (("shared_gate_up", h, [("mlp.shared_expert.gate_proj", s), ("mlp.shared_expert.up_proj", s)]),
                 ("shared_down", s, [("mlp.shared_expert.down_proj", h)]))
    return kinds + ((("shared_expert_gate", h, [("mlp.shared_expert_gate", 1)]),) if moe.shared_gate else ())


def routed_kinds(spec: DecoderSpec, experts: bool) -> tuple[tuple[str, int, list], ...]:
    """A mixture of experts' layer's router site and, with `experts`, its routed experts' gate|up and down
    (under the engine's names for them: runtime/lora_experts.py), as (kind, input width, [(module, width)])."""
    moe, h = spec.moe, spec.hidden_size
    kinds = (("router", h, [(moe.router_module, moe.num_experts)]),)
    if experts:
        w = moe.expert_size
        kinds += (("experts_gate_up", h, [("mlp.experts.gate_proj", w), ("mlp.experts.up_proj", w)]),
                  ("experts_down", w, [("mlp.experts.down_proj", h)]))
    return kinds


def columns(*modules: tuple[str, int]) -> list[list]:
    """A site's modules [name, start, stop], side by side in its fused output."""
    out, start = [], 0
    for name, width in modules:
        out.append([name, start, start + width])
        start += width
    return out


def layered_sites(spec: DecoderSpec, experts: bool = False) -> dict[str, dict]:
    """lora_sites of a model whose layers differ in shape (Gemma 4: wider heads on the full layers, q
    alone on the layers reading another's KV, v from k's projection, wider MLPs, 26B-A4B's router and
    experts; LFM2: convolution layers, conv_in and conv_out; Granite 4's and Bamba's Mamba layers, mamba_in
    and mamba_out; LFM2-MoE's mixture layers, a router and experts in place of the MLP): a site per kind
    of projection and shape, on its layers; the first keeps the kind's name (qkv, o, gate_up, down), the
    others add their first layer's index (qkv.1: layer 1's shape). Modules under the checkpoint's names (spec.module_names); the experts' under the
    engine's (mlp.experts.*: runtime/lora_experts.py)."""
    h, groups, named = spec.hidden_size, {}, dict(spec.module_names)
    for layer in range(spec.num_layers):
        d, kv, width = spec.head_size(layer), spec.kv_heads(layer), spec.mlp_width(layer)
        qkv = [("self_attn.q_proj", spec.num_heads * d)]
        if spec.kv_source(layer) == layer:
            qkv.append(("self_attn.k_proj", kv * d))
            if not (spec.value_is_key and spec.window(layer) is None):
                qkv.append(("self_attn.v_proj", kv * d))
        routed = spec.moe is not None and layer not in spec.moe.dense_layers
        # (Gemma 4's mixture is beside its dense MLP; LFM2-MoE's in its place)
        gate_up = [("mlp.gate_up_proj", 2 * width)] if spec.fused_gate_up else \
            [("mlp.gate_proj", width), ("mlp.up_proj", width)]  # (Granite 4's shared_mlp.input_linear: module_names)
        mlp = () if routed and not spec.moe.beside_dense else (
            ("gate_up", h, gate_up), ("down", width, [("mlp.down_proj", h)]))
        if routed:
            mlp += shared_kinds(spec) + routed_kinds(spec, experts)
        if layer in spec.conv_layers:  # (LFM2: its convolution's in and out projections, builder/short_conv.py)
            kinds = (("conv_in", h, [("conv.in_proj", 3 * h)]), ("conv_out", h, [("conv.out_proj", h)])) + mlp
        elif layer in spec.mamba_layers:  # (Granite 4's Mamba-2 layers: in_proj, out_proj; builder/mamba.py)
            m = spec.mamba
            kinds = (("mamba_in", h, [("mamba.in_proj", m.inner + m.conv_dim + m.heads)]),
                     ("mamba_out", m.inner, [("mamba.out_proj", h)])) + mlp
        else:  # (LFM3's attention gate: g_proj, a logit a head)
            gate = (("attn_gate", h, [gate_module(spec, d)]),) if spec.attn_gate else ()
            kinds = (("qkv", h, qkv), ("o", spec.num_heads * d, [("self_attn.o_proj", h)])) + gate + mlp
        for kind, width_in, modules in kinds:
            modules = tuple((named.get(m, m), w) for m, w in modules)
            groups.setdefault((kind, width_in, modules), []).append(layer)
    sites = {}
    for (kind, width_in, modules), layers in groups.items():  # (in layer order: layer 0's come first)
        name = kind if kind not in sites else f"{kind}.{layers[0]}"
        sites[name] = {"in": width_in, "modules": columns(*modules),
                       **({"experts": spec.moe.num_experts} if kind.startswith("experts") else {}),
                       **({"layers": layers} if len(layers) < spec.num_layers else {})}
    return sites


def gate_module(spec: DecoderSpec, head_size: int) -> tuple[str, int]:
    """The attention gate's projection and its width: a logit a head (LFM3's g_proj), or one a value (AFMoE's
    gate_proj)."""
    return ("self_attn.g_proj", spec.num_heads) if spec.attn_gate == "head" else \
        ("self_attn.gate_proj", spec.num_heads * head_size)


def site_for(sites: dict[str, dict], layer: int, kind: str) -> str:
    """The name of layer `layer`'s site of a kind (lora_sites; layered_sites' on models whose layers
    differ)."""
    for name, site in sites.items():
        if name.split(".")[0] == kind and ("layers" not in site or layer in site["layers"]):
            return name
    raise KeyError(f"no {kind} site on layer {layer}")
