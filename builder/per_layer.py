"""Gemma 4's per-layer embeddings (PLE), as DecoderWriter writes them: a second token table gives each
token a small vector per layer, which with a projection of its embedding joins each layer's output
through a gate; and each layer's output times its layer_scalar.

A mixin of DecoderWriter (builder/decoder.py), whose __init__ and prologue set what these methods read:
g, spec, w, dtype, quant, and the per-layer inputs (`per_layer`, made by per_layer_inputs in prologue).
"""
from __future__ import annotations


class PerLayerWriter:
    """The per-layer-embedding part of DecoderWriter (see the module docstring)."""

    def per_layer_inputs(self, input_ids: str, h: str) -> str:
        """Gemma 4's per-layer embeddings [B,S,L,P], as Gemma4TextModel makes them from the token ids and
        their embeddings h: (RMSNorm over each layer's P of (h @ per_layer_model_projection.T) / sqrt(H)
        + embed_tokens_per_layer[ids] * sqrt(P)) / sqrt(2)."""
        g, s, name = self.g, self.spec, "/model/per_layer"
        shape = g.const([0, 0, s.num_layers, s.per_layer_input])
        if self.quant is not None:  # (int8 as the token embedding: gemma-4-E2B's table is 2.3 G values)
            rows = self.quantized_embedding(input_ids, "model.embed_tokens_per_layer")
        else:
            table = self.fw("model.embed_tokens_per_layer.weight", self.w.rows("model.embed_tokens_per_layer.weight"))
            rows = g.op("Gather", f"{name}/Gather", [table, input_ids], axis=0)                # [B,S,L*P]
        rows = g.op("Mul", f"{name}/Scale", [rows, g.const(float(s.per_layer_input) ** 0.5, self.dtype)])
        proj = self.linear(f"{name}/projection", h, "model.per_layer_model_projection")
        proj = g.op("Mul", f"{name}/projection/Scale", [proj, g.const(float(s.hidden_size) ** -0.5, self.dtype)])
        proj = self.rms_norm(f"{name}/norm", g.op("Reshape", f"{name}/projection/Reshape", [proj, shape]),
                             "model.per_layer_projection_norm.weight")
        both = g.op("Add", f"{name}/Add", [proj, g.op("Reshape", f"{name}/Reshape", [rows, shape])])
        return g.op("Mul", f"{name}/Mul", [both, g.const(2.0 ** -0.5, self.dtype)])

    def slices_shared(self) -> bool:
        """Whether the layers past the first KV-sharing one compute each row's last token alone (shared_rows):
        on our attention kernel, or in standard ops (llm.onnx, TensorRT's, modern or legacy: their masks,
        and the legacy graph's RoPE rows, made again for the kept rows; those layers write no KV), where no
        EAGLE head reads their hidden states and no draft tree is verified."""
        return (bool(self.spec.kv_shared_layers) and (self.native_attention or not self.gqa)
                and self.eagle is None and not self.tree)

    def shared_rows(self, h: str, position_ids: str, write_index: str, last_index: str) -> tuple[str, str, str]:
        """Gemma 4's KV-sharing layers write no KV, so past the first of them only the positions whose logits
        are read matter (transformers slices there too, by logits_to_keep): each row's last_index alone, or
        all S positions where the step asks verify_index' logits (prompt_logprobs, prompt lookup). Returns
        h [B,K,H], position_ids and last_index for the kept rows, and sets their write and last indices for
        the attention kernel (step_indices: the kept rows start at write_index + start); the per-layer
        inputs and image look-ahead are kept alike."""
        g, s, name = self.g, self.spec, "/model/shared_rows"
        seq = g.op("Slice", f"{name}/seq", [g.op("Shape", f"{name}/shape", [h]), g.const([1]), g.const([2])])   # [1]
        if self.verify_logits_out:  # (K = S where verify_index names positions, else 1)
            count = g.op("Slice", f"{name}/verify", [g.op("Shape", f"{name}/verify_shape", [self.verify_index_input()]),
                                                    g.const([1]), g.const([2])])
            whole = g.op("Greater", f"{name}/whole", [count, g.const([0])])
            keep = g.op("Where", f"{name}/keep", [whole, seq, g.const([1])])
            start = g.op("Where", f"{name}/start", [whole, g.op("Mul", f"{name}/zero", [last_index, g.const(0)]),
                                                    last_index])
        else:
            keep, start = g.const([1]), last_index
        rows = g.op("Add", f"{name}/rows", [g.op("Unsqueeze", f"{name}/start2", [start, g.const([1])]),
                                            g.op("Range", f"{name}/range", [g.const(0), g.op("Squeeze", f"{name}/k",
                                                                                             [keep, g.const([0])]),
                                                                            g.const(1)])])            # [B,K]

        def kept(t: str, what: str, trailing: list[int]) -> str:
            """t [B,S,*trailing] at the kept rows."""
            at = rows
            if trailing:
                at = g.op("Expand", f"{name}/{what}/index", [
                    g.op("Unsqueeze", f"{name}/{what}/rows", [rows, g.const(list(range(2, 2 + len(trailing))))]),
                    g.op("Concat", f"{name}/{what}/shape", [g.op("Shape", f"{name}/{what}/rows_shape", [rows]),
                                                            g.const(trailing)], axis=0)])
            return g.op("GatherElements", f"{name}/{what}", [t, at], axis=1)

        h = kept(h, "h", [s.hidden_size])
        if s.per_layer_input:
            self.per_layer = kept(self.per_layer, "per_layer", [s.num_layers, s.per_layer_input])
        if self.ahead is not None:
            self.ahead = kept(self.ahead, "ahead", [])
        last = g.op("Sub", f"{name}/last", [last_index, start])
        self.step_indices = (g.op("Add", f"{name}/write", [write_index, start]), last)
        return h, kept(position_ids, "position_ids", []), last

    def per_layer_block(self, i: int, h: str) -> str:
        """Gemma 4: h + RMSNorm((act(h @ per_layer_input_gate.T) * the layer's per-layer input) @
        per_layer_projection.T), then times the layer's layer_scalar."""
        g, s, p, name = self.g, self.spec, f"model.layers.{i}", f"/model/layers.{i}/per_layer"
        if s.per_layer_input:
            gate = self.activation(f"{name}/act", self.linear(f"{name}/gate", h, f"{p}.per_layer_input_gate"))
            mine = g.op("Gather", f"{name}/Gather", [self.per_layer, g.const(i)], axis=2)        # [B,S,P]
            t = self.linear(f"{name}/projection", g.op("Mul", f"{name}/Mul", [gate, mine]), f"{p}.per_layer_projection")
            h = g.op("Add", f"{name}/Add", [h, self.rms_norm(f"{name}/norm", t, f"{p}.post_per_layer_input_norm.weight")])
        if s.layer_scalars:
            h = g.op("Mul", f"/model/layers.{i}/layer_scalar", [h, self.fw(f"{p}.layer_scalar", self.w[f"{p}.layer_scalar"])])
        return h
