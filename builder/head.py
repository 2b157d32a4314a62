"""How DecoderWriter ends a graph: the final norm and lm_head on each row's last position (EAGLE and
ONNX Runtime engines: and on the positions verify_index names, verified or scored), the EAGLE-3
hidden-state output, and the sampler
(trtllm::Sample as its ONNX function body, or as our kernel trtllm.cpu::Sample), once per row and,
on EAGLE engines, once per verified position.

A mixin of DecoderWriter (builder/decoder.py), whose __init__ sets what these methods read: g, spec,
io, eagle, ftype, half, quant, w, gqa, legacy, max_top_k, native_sample and verify_logits_out.
"""
from __future__ import annotations

from onnx import TensorProto

from trtllm.builder import legacy_ops
from trtllm.builder.graph import OPSET
from trtllm.plugins import cpu as cpu_kernels
from trtllm.plugins.sample import body as sample_body
from trtllm.plugins.sample import schema as sample_schema

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


class HeadWriter:
    """The head and sampler half of DecoderWriter (see the module docstring)."""

    def to_float32(self, name: str, x: str, output: str) -> str:
        """The graph's float output `output`: x itself renamed (float32 graphs), else a Cast of it."""
        if self.ftype == F32:
            assert self.g.nodes[-1].output[0] == x, "only the last node's output can be renamed"
            self.g.nodes[-1].output[0] = output
            return output
        return self.g.op("Cast", f"{name}/Cast", [x], outputs=[output], to=F32)

    def eagle_hidden(self, aux: list[str]) -> None:
        """EAGLE-3: the draft head's fc over the three layers' hidden states, every position [B,S,H]."""
        g = self.g
        cat = g.op("Concat", "/eagle/aux/Concat", aux, axis=-1)
        y = self.matmul("/eagle/fc", cat, "eagle.fc", self.eagle[1])
        self.to_float32("/eagle/fc", y, self.io.eagle_hidden)
        g.output(self.io.eagle_hidden, F32, ["batch", "seq", self.spec.hidden_size])

    def head(self, h: str, last_index: str) -> str:
        """norm and lm_head on each row's last_index position: [B,V] in the graph's float type."""
        g, s = self.g, self.spec
        idx = g.op("Reshape", "/model/last/Reshape", [last_index, g.const([-1, 1, 1])])
        idx = g.op("Expand", "/model/last/Expand", [idx, g.const([1, 1, s.hidden_size])])
        h = g.op("GatherElements", "/model/last/GatherElements", [h, idx], axis=1)           # [B,1,H]
        h = g.op("Squeeze", "/model/last/Squeeze", [h, g.const([1])])                         # [B,H]
        return self.lm_matmul(self.rms_norm("/model/norm", h, "model.norm.weight"))

    def lm_matmul(self, h: str) -> str:
        """[N,H] -> [N,V] logits (divided by logits_scale: Granite's logits_scaling, as transformers divides;
        soft-capped by final_softcap: Gemma 2's final_logit_softcapping)."""
        g, s = self.g, self.spec
        if s.tie_word_embeddings and self.half:
            logits = self.half_matmul("/lm_head", h, "model.embed_tokens.weight", s.vocab_size)
        elif s.tie_word_embeddings and self.quant is None:
            # Gemm with transB shares the embedding table instead of storing a transposed copy.
            logits = g.op("Gemm", "/lm_head/Gemm", [h, "model.embed_tokens.weight"], transB=1)
        else:  # quantized: the lm_head gets its own quantized copy; the embedding stays float32
            w = self.w.rows("model.embed_tokens.weight" if s.tie_word_embeddings else "lm_head.weight")
            logits = self.matmul("/lm_head", h, "lm_head", w, rank=2)
        if s.logits_scale != 1.0:
            logits = g.op("Div", "/lm_head/logits_scale", [logits, g.const(s.logits_scale, self.dtype)])
        if s.final_softcap is not None:  # as transformers: divide, tanh, multiply, in the logits' type
            cap = g.const(s.final_softcap, self.dtype)
            logits = g.op("Mul", "/lm_head/softcap", [g.op("Tanh", "/lm_head/softcap/Tanh", [
                g.op("Div", "/lm_head/softcap/Div", [logits, cap])]), cap])
        return logits

    def lm_head(self, h: str, last_index: str) -> str:
        """Gather each row's last_index position first, so norm and lm_head run on [B,H] only.
        EAGLE engines gather the verify_index positions too, and sample them; ONNX Runtime engines
        gather them for their logits (verify_logits: prompt_logprobs), [B,0] in a plain step."""
        g, s = self.g, self.spec
        if self.eagle is not None or self.verify_logits_out:
            return self.verify_head(h, last_index)
        # The sampler's type is float32; a float32 graph names the product itself (a Cast would copy it).
        logits = self.to_float32("/lm_head", self.head(h, last_index), self.io.logits)
        g.output(self.io.logits, F32, ["batch", s.vocab_size])
        return logits

    def verify_index_input(self) -> str:
        """The verify_index input [B,T] (declared once: shared_rows reads it too)."""
        if self._verify_index is None:
            self._verify_index = self.g.input(self.io.verify_index, I64, ["batch", "verify"])
        return self._verify_index

    def verify_head(self, h: str, last_index: str) -> str:
        """[B,1+T] positions (last_index, then verify_index) through norm and lm_head at once: the
        sampler takes the first; the others are sampled too (verify_sampler)."""
        g, s, io = self.g, self.spec, self.io
        verify_index = self.verify_index_input()
        last = g.op("Unsqueeze", "/verify/last", [last_index, g.const([1])])
        idx = g.op("Concat", "/verify/index", [last, verify_index], axis=1)                 # [B,1+T]
        idx3 = g.op("Expand", "/verify/Expand", [g.op("Unsqueeze", "/verify/idx3", [idx, g.const([2])]),
                                                  g.const([1, 1, s.hidden_size])])
        h = g.op("GatherElements", "/verify/GatherElements", [h, idx3], axis=1)              # [B,1+T,H]
        h = g.op("Reshape", "/verify/flat", [h, g.const([-1, s.hidden_size])])
        logits = self.lm_matmul(self.rms_norm("/model/norm", h, "model.norm.weight"))       # [B*(1+T),V]
        if self.ftype != F32:
            logits = g.op("Cast", "/lm_head/Cast", [logits], to=F32)
        shape = g.op("Concat", "/verify/shape", [g.op("Shape", "/verify/idx_shape", [idx]), g.const([s.vocab_size])],
                     axis=0)
        logits = g.op("Reshape", "/verify/logits", [logits, shape])                          # [B,1+T,V]
        first = g.op("Gather", "/verify/first", [logits, g.const([0])], axis=1)              # [B,1,V]
        g.op("Squeeze", "/verify/sampled", [first, g.const([1])], outputs=[io.logits])
        g.output(io.logits, F32, ["batch", s.vocab_size])
        rest = [io.verify_logits] if self.verify_logits_out else None
        self.verify_logits = g.op("Slice", "/verify/rest", [logits, g.const([1]), g.const([2**62]), g.const([1])],
                                  outputs=rest)                                              # [B,T,V]
        if rest:
            g.output(io.verify_logits, F32, ["batch", "verify", s.vocab_size])
        return io.logits

    def verify_sampler(self, ins: list[str]) -> None:
        """Verification (EAGLE, prompt lookup): verify_ids [B,T] are the sampler's tokens at the
        verify_index positions, each drawn with its row's parameters and its own random number
        (`verify_uniform` [B,T]): the tokens plain decoding draws there with the same numbers (a
        greedy row's: the argmax), so sampled requests speculate too. Our kernel takes the B rows of
        parameters as they are; the ONNX body takes a row of them per position (Expand)."""
        g, io, s = self.g, self.io, self.spec
        uniform = g.input(io.verify_uniform, F32, ["batch", "verify"])
        shape = g.op("Shape", "/verify/uniform_shape", [uniform])                            # [B, T]
        logits = g.op("Reshape", "/verify/flat_logits", [self.verify_logits, g.const([-1, s.vocab_size])])
        params = ins[1:-1]
        if not self.native_sample:
            params = [self.per_position(p, shape) for p in params]
        flat = [logits, *params, g.op("Reshape", "/verify/flat_uniform", [uniform, g.const([-1])])]
        tokens = "/verify/tokens"
        if self.native_sample:
            g.op(cpu_kernels.SAMPLE, "/verify/Sample", flat, outputs=[tokens], domain=cpu_kernels.DOMAIN,
                 max_top_k=self.max_top_k)
        else:
            g.nodes.append(sample_body.make_node(flat, [tokens, "/verify/top_logprobs", "/verify/top_logprob_ids"],
                                                 self.max_top_k, name="/verify/Sample"))
        # allowzero: a step that verifies nothing gives [B, 0] (0 in `shape` is a size, not "keep")
        g.op("Reshape", "/verify/ids", [tokens, shape], outputs=[io.verify_ids], allowzero=1)
        g.output(io.verify_ids, I64, ["batch", "verify"])

    def per_position(self, param: str, shape: str) -> str:
        """A sampler input of one row per batch row ([B] or [B,V]) repeated for each of T positions,
        as B*T rows."""
        g, vocab = self.g, self.spec.vocab_size
        dense = param in (self.io.logit_bias, self.io.penalty_bias, self.io.seen)
        x = g.op("Unsqueeze", f"/verify/{param}/Unsqueeze", [param, g.const([1])])          # [B,1(,V)]
        to = g.op("Concat", f"/verify/{param}/shape", [shape, g.const([vocab])], axis=0) if dense else shape
        x = g.op("Expand", f"/verify/{param}/Expand", [x, to])                              # [B,T(,V)]
        return g.op("Reshape", f"/verify/{param}/Reshape", [x, g.const([-1, vocab] if dense else [-1])])

    def sampler(self, logits: str) -> None:
        g, io = self.g, self.io
        vocab = ["batch", self.spec.vocab_size]
        ins = [logits, g.input(io.logit_bias, F32, vocab), g.input(io.penalty_bias, F32, vocab),
               g.input(io.seen, TensorProto.BOOL, vocab), g.input(io.repetition_penalty, F32, ["batch"]),
               g.input(io.temperature, F32, ["batch"]), g.input(io.min_p, F32, ["batch"]),
               g.input(io.top_k, I64, ["batch"]), g.input(io.top_p, F32, ["batch"]),
               g.input(io.uniform, F32, ["batch"])]
        outs = [io.token_ids, io.top_logprobs, io.top_logprob_ids]
        if self.native_sample:  # the same op in C++ (plugins/cpu/sample.cc)
            g.op(cpu_kernels.SAMPLE, "/sampler/Sample", ins, outputs=outs, domain=cpu_kernels.DOMAIN,
                 max_top_k=self.max_top_k)
        else:
            g.nodes.append(sample_body.make_node(ins, outs, self.max_top_k))
            g.functions.append(sample_body.make_function(self.max_top_k,
                                                         opset=legacy_ops.OPSET if self.legacy else OPSET,
                                                         # ArgMax and a float64 CDF only in ONNX Runtime's form
                                                         argmax=self.gqa, float64_draw=self.ort_form))
        g.output(io.token_ids, I64, ["batch"])
        if self.eagle is not None or self.verify_logits_out:
            self.verify_sampler(ins)
        k = sample_schema.num_logprob_columns(self.max_top_k)   # static: the runtime keeps what a request asked
        g.output(io.top_logprobs, F32, ["batch", k])
        g.output(io.top_logprob_ids, I64, ["batch", k])
