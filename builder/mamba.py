"""Mamba-2 layers (GraniteMoeHybridMambaLayer: granite-4.0-h-*), as DecoderWriter writes them in place of
attention, in standard ops:

    z, xBC, dt = Split(in_proj(h))                      [B,S,I], [B,S,I + 2GN], [B,S,H]
    xBC        = silu(depthwise causal conv of xBC over the row's last K - 1 inputs and the step's, + bias)
    x, B, C    = Split(xBC)                             x [B,S,H,P], B and C [B,S,G,N] (a group's heads share them)
    dt         = softplus(dt + dt_bias), 0 past last_index (a pad: the state neither decays nor takes it in)
    a          = dt * A   (A = -exp(A_log)),   c = CumSum(a) over the step's tokens
    y_t        = sum_{s <= t} exp(c_t - c_s) (C_t . B_s) dt_s x_s  +  exp(c_t) C_t . S_0  +  D x_t
    S_new      = exp(c_T) S_0 + sum_s exp(c_T - c_s) dt_s x_s B_s^T        (S [B,G,H/G,P,N]: the SSM state)
    out        = out_proj(RMSNorm per group(y * silu(z)) * norm.weight)

This is the state-space dual form of transformers' chunked scan taken as one chunk (the step's tokens):
exact for a decode step (one token: the recurrence) and for a prompt chunk. A step's tokens cost
H x S x S values, as decomposed attention's scores do; the runtime prefills prompts on such engines in
steps of at most 256 tokens (step_inputs.RECURRENT_CHUNK). The ONNX Runtime form on our kernels
computes the convolution and scan as one trtllm.cpu::MambaScan node instead (mamba_kernel; the
recurrence token by token, plugins/cpu/mamba.cc).

The states are one per sequence, not one per position (the KV cache's): per layer the convolution's
last K - 1 inputs [B,K-1,I+2GN] and the SSM state [B,G,H/G,P,N], float32, graph inputs past_state.{2m} and
past_state.{2m+1} (m: the layer's index among the Mamba layers) written whole to present_state.*, which
the runtime binds to the same buffers. A row starting a sequence (write_index 0) takes zeros, not its
slot's old state; a row with last_index -1 (a parked prompt's pad in a decode step) keeps its state.

A 16-bit graph keeps its states, and computes its scan, gate and norm, in float32 (as transformers' does),
the projections and the convolution in its type.

A mixin of DecoderWriter (builder/decoder.py), whose __init__ sets what this reads: g, spec, w, io, fw,
linear, lora (its sites mamba_in and mamba_out: lora_sites.py), rms_norm.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from trtllm.plugins import cpu as cpu_kernels


@dataclass(frozen=True)
class Mamba:
    """A Mamba-2 layer's shape (config.mamba_*)."""

    heads: int
    head_dim: int
    state_size: int
    groups: int
    conv_kernel: int
    conv_bias: bool = True
    proj_bias: bool = False

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state_size

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The convolution's and the SSM's state of one sequence (manifest model.state_shapes)."""
        return (self.conv_kernel - 1, self.conv_dim), (self.groups, self.heads // self.groups, self.head_dim,
                                                        self.state_size)


class MambaWriter:
    """The Mamba-2 part of DecoderWriter (see the module docstring)."""

    def state_io(self, i: int) -> tuple[list[str], list[str]]:
        """Layer i's state inputs and outputs (past_state / present_state: its convolution's, its SSM's)."""
        g, m, first = self.g, self.spec.mamba, 2 * self.spec.mamba_layers.index(i)
        past, present = [], []
        for k, shape in enumerate(m.state_shapes()):
            past.append(g.input(self.io.past_state.format(i=first + k), TensorProto.FLOAT, ["batch", *shape]))
            present.append(self.io.present_state.format(i=first + k))
            g.output(present[-1], TensorProto.FLOAT, ["batch", *shape])
        return past, present

    def mamba_mixer(self, i: int, x: str, write_index: str, last_index: str) -> str:
        g, m = self.g, self.spec.mamba
        p, name, inner, groups = f"model.layers.{i}.mamba", f"/model/layers.{i}/mamba", m.inner, m.groups
        zxbcdt = self.lora(f"{name}/in_proj", x, self.linear(f"{name}/in_proj", x, f"{p}.in_proj", m.proj_bias), i,
                           "mamba_in")
        z, xbc, dt = g.op("Split", f"{name}/Split", [zxbcdt, g.const([inner, m.conv_dim, m.heads])], num_outputs=3,
                          axis=-1)
        scan = self.mamba_kernel if self.native_mamba else self.mamba_ops
        y = scan(i, x, xbc, dt, write_index, last_index)                                           # [B,S,I] float32
        if self.ftype != TensorProto.FLOAT:  # (the gate and the norm in float32 too, as transformers' RMSNormGated;
            z = g.op("Cast", f"{name}/z/Cast", [z], to=TensorProto.FLOAT)  # rms_norm casts back)
        y = g.op("Mul", f"{name}/gate", [y, g.op("Mul", f"{name}/gate/silu", [
            z, g.op("Sigmoid", f"{name}/gate/Sigmoid", [z])])])
        y = g.op("Reshape", f"{name}/norm/groups", [y, g.const([0, 0, groups, inner // groups])])
        y = self.rms_norm(f"{name}/norm", y, None, width=inner // groups)
        y = g.op("Mul", f"{name}/norm/weight", [g.op("Reshape", f"{name}/norm/back", [y, g.const([0, 0, inner])]),
                                                self.fw(f"{p}.norm.weight", self.w[f"{p}.norm.weight"])])
        return self.lora(f"{name}/out_proj", y, self.linear(f"{name}/out_proj", y, f"{p}.out_proj", m.proj_bias), i,
                         "mamba_out")

    def scan_weights(self, p: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A layer's convolution taps [K, C] and its A = -exp(A_log), dt_bias and D [H] (float32), as both
        forms of the scan read them."""
        return (self.w[f"{p}.conv1d.weight"][:, 0, :].T, -np.exp(self.w[f"{p}.A_log"].astype(np.float32)),
                self.w[f"{p}.dt_bias"].astype(np.float32), self.w[f"{p}.D"].astype(np.float32))

    def mamba_kernel(self, i: int, x: str, xbc: str, dt: str, write_index: str, last_index: str) -> str:
        """The convolution and scan as one trtllm.cpu::MambaScan node (plugins/cpu/mamba.cc: the states
        updated in place; a float32 graph, as the ONNX Runtime form on our kernels computes)."""
        g, m, p, name = self.g, self.spec.mamba, f"model.layers.{i}.mamba", f"/model/layers.{i}/mamba"
        (conv_past, ssm_past), (conv_out, ssm_out) = self.state_io(i)
        taps, a, dt_bias, d = self.scan_weights(p)
        ins = [xbc, dt, conv_past, ssm_past, write_index, last_index, self.fw(f"{p}.conv1d.weight", taps),
               self.fw(f"{p}.conv1d.bias", self.w[f"{p}.conv1d.bias"]) if m.conv_bias else "",
               g.weight(f"{p}.A", a), g.weight(f"{p}.dt_bias", dt_bias), g.weight(f"{p}.D", d)]
        return g.op(cpu_kernels.MAMBA, f"{name}/MambaScan", ins, outputs=[f"{name}/MambaScan/y", conv_out, ssm_out],
                    domain=cpu_kernels.DOMAIN, heads=m.heads, head_dim=m.head_dim, state_size=m.state_size,
                    groups=m.groups)[0]

    def mamba_ops(self, i: int, x: str, xbc: str, dt: str, write_index: str, last_index: str) -> str:
        """The convolution and scan in standard ops (the module docstring): y [B,S,I] in float32."""
        g, m = self.g, self.spec.mamba
        p, name = f"model.layers.{i}.mamba", f"/model/layers.{i}/mamba"
        inner, heads, dim, n, groups, taps = m.inner, m.heads, m.head_dim, m.state_size, m.groups, m.conv_kernel
        per_group = heads // groups
        (conv_past, ssm_past), (conv_out, ssm_out) = self.state_io(i)
        weight, a_heads, dt_bias, d_heads = self.scan_weights(p)
        narrow = self.ftype != TensorProto.FLOAT  # a 16-bit graph: its states and scan in float32 still
        # which of the step's tokens are the row's (t <= last_index), and whether it starts a sequence
        seq = g.op("Gather", f"{name}/seq", [g.op("Shape", f"{name}/shape", [x]), g.const(1)], axis=0)
        t = g.op("Range", f"{name}/t", [g.const(0), seq, g.const(1)])                                   # [S]
        valid = g.op("Cast", f"{name}/valid", [g.op("LessOrEqual", f"{name}/mine", [
            g.op("Unsqueeze", f"{name}/t1", [t, g.const([0])]),
            g.op("Unsqueeze", f"{name}/last1", [last_index, g.const([1])])])], to=TensorProto.FLOAT)  # [B,S]
        going_on = g.op("Greater", f"{name}/going_on", [write_index, g.const(0)])
        keep = g.op("Cast", f"{name}/keep", [going_on], to=TensorProto.FLOAT)                          # [B]

        # the convolution: the row's last K - 1 inputs, then the step's
        conv_state = g.op("Mul", f"{name}/conv/keep", [conv_past, g.op("Reshape", f"{name}/keep3",
                                                                         [keep, g.const([-1, 1, 1])])])
        if narrow:
            conv_state = g.op("Cast", f"{name}/conv/Cast", [conv_state], to=self.ftype)
        full = g.op("Concat", f"{name}/conv/full", [conv_state, xbc], axis=1)                       # [B,K-1+S,C]
        index = g.op("Unsqueeze", f"{name}/conv/index", [g.op("Add", f"{name}/conv/tail", [
            g.op("Unsqueeze", f"{name}/last2", [last_index, g.const([1])]), g.const(np.arange(1, taps))]),
            g.const([2])])                                                                           # [B,K-1,1]
        tail = g.op("GatherND", f"{name}/conv/GatherND", [full, index], batch_dims=1,
                    outputs=[f"{name}/conv/tail" if narrow else conv_out])
        if narrow:
            g.op("Cast", f"{name}/conv/state", [tail], outputs=[conv_out], to=TensorProto.FLOAT)
        # token t: sum over k of full[t + k] * w[k] (taps as shifted slices: ONNX Runtime's grouped Conv
        # took 250 us a layer for a one-token step, a hundred times these)
        xbc = None
        for k in range(taps):
            rows = g.op("Slice", f"{name}/conv/tap{k}", [full, g.const([k]), g.const(
                [k - taps + 1 if k < taps - 1 else np.iinfo(np.int64).max]), g.const([1])])          # [B,S,C]
            tap = g.op("Mul", f"{name}/conv/tap{k}/Mul", [rows, self.fw(f"{p}.conv1d.weight.{k}", weight[k])])
            xbc = tap if xbc is None else g.op("Add", f"{name}/conv/tap{k}/Add", [xbc, tap])
        if m.conv_bias:
            xbc = g.op("Add", f"{name}/conv/bias", [xbc, self.fw(f"{p}.conv1d.bias", self.w[f"{p}.conv1d.bias"])])
        xbc = g.op("Mul", f"{name}/conv/silu", [xbc, g.op("Sigmoid", f"{name}/conv/Sigmoid", [xbc])])   # [B,S,C]
        xs, b, cc = g.op("Split", f"{name}/xBC", [xbc, g.const([inner, groups * n, groups * n])], num_outputs=3,
                         axis=-1)
        if narrow:
            xs, b, cc, dt = (g.op("Cast", f"{name}/{k}/Cast", [v], to=TensorProto.FLOAT)
                             for k, v in (("x", xs), ("B", b), ("C", cc), ("dt", dt)))

        # dt [B,S,H] -> [B,G,r,S]; x [B,G,r,S,P]; B, C [B,G,1,S,N]
        dt = g.op("Softplus", f"{name}/dt/Softplus", [g.op("Add", f"{name}/dt/bias", [
            dt, g.weight(f"{p}.dt_bias", dt_bias)])])
        dt = g.op("Mul", f"{name}/dt/valid", [dt, g.op("Unsqueeze", f"{name}/valid3", [valid, g.const([2])])])
        dt = g.op("Reshape", f"{name}/dt/heads", [g.op("Transpose", f"{name}/dt/Transpose", [dt], perm=[0, 2, 1]),
                                                  g.const([0, groups, per_group, -1])])
        a = g.op("Mul", f"{name}/a", [dt, g.weight(f"{p}.A", a_heads.reshape(groups, per_group, 1))])
        cum = g.op("CumSum", f"{name}/cum", [a, g.const(-1)])                                          # [B,G,r,S]
        xh = g.op("Reshape", f"{name}/x/heads", [g.op("Transpose", f"{name}/x/Transpose", [
            g.op("Reshape", f"{name}/x/Reshape", [xs, g.const([0, 0, heads, dim])])], perm=[0, 2, 1, 3]),
            g.const([0, groups, per_group, -1, dim])])
        xdt = g.op("Mul", f"{name}/xdt", [xh, g.op("Unsqueeze", f"{name}/dt4", [dt, g.const([-1])])])

        def grouped(kind: str, v: str) -> str:
            v = g.op("Reshape", f"{name}/{kind}/Reshape", [v, g.const([0, 0, groups, n])])
            return g.op("Unsqueeze", f"{name}/{kind}/Unsqueeze", [
                g.op("Transpose", f"{name}/{kind}/Transpose", [v], perm=[0, 2, 1, 3]), g.const([2])])
        b, cc = grouped("B", b), grouped("C", cc)
        bt = g.op("Transpose", f"{name}/B/T", [b], perm=[0, 1, 2, 4, 3])                              # [B,G,1,N,S]

        # within the step: (C_t . B_s) exp(c_t - c_s) for s <= t, applied to dt x
        causal = g.op("GreaterOrEqual", f"{name}/causal", [g.op("Unsqueeze", f"{name}/ti", [t, g.const([1])]),
                                                           g.op("Unsqueeze", f"{name}/tj", [t, g.const([0])])])
        gaps = g.op("Sub", f"{name}/gaps", [g.op("Unsqueeze", f"{name}/cum_t", [cum, g.const([-1])]),
                                            g.op("Unsqueeze", f"{name}/cum_s", [cum, g.const([-2])])])
        decay = g.op("Exp", f"{name}/decay", [g.op("Where", f"{name}/decay/mask", [
            causal, gaps, g.const(-np.inf, np.float32)])])                                          # [B,G,r,S,S]
        scores = g.op("Mul", f"{name}/scores", [g.op("MatMul", f"{name}/CB", [cc, bt]), decay])
        y = g.op("MatMul", f"{name}/y_within", [scores, xdt])                                       # [B,G,r,S,P]
        # from the state before the step [B,G,r,P,N], zeros where the row starts. `start` is past_state's one
        # reader: present_state is the same buffer, written by the last node, which must come after every
        # read (another reader, not its ancestor, could run after the write)
        start = g.op("Mul", f"{name}/state/keep", [ssm_past, g.op("Reshape", f"{name}/keep5", [
            keep, g.const([-1, 1, 1, 1, 1])])])
        from_state = g.op("MatMul", f"{name}/y_state", [cc, g.op("Transpose", f"{name}/state/T", [start],
                                                                  perm=[0, 1, 2, 4, 3])])         # [B,G,r,S,P]
        from_state = g.op("Mul", f"{name}/y_state/decay", [from_state, g.op("Exp", f"{name}/cum/Exp", [
            g.op("Unsqueeze", f"{name}/cum5", [cum, g.const([-1])])])])
        y = g.op("Add", f"{name}/y", [y, from_state])
        y = g.op("Add", f"{name}/y/D", [y, g.op("Mul", f"{name}/Dx", [xh, g.weight(
            f"{p}.D", d_heads.reshape(groups, per_group, 1, 1))])])
        # the state after the step's last token (a pad's a is 0: c_T is the row's last token's)
        last = g.op("Slice", f"{name}/cum/last", [cum, g.const([-1]), g.const([np.iinfo(np.int64).max]),
                                                  g.const([-1])])                                   # [B,G,r,1]
        weights = g.op("Exp", f"{name}/state/weights", [g.op("Sub", f"{name}/state/gaps", [last, cum])])
        taken = g.op("MatMul", f"{name}/state/taken", [
            g.op("Transpose", f"{name}/state/xT", [g.op("Mul", f"{name}/state/xw", [
                xdt, g.op("Unsqueeze", f"{name}/weights5", [weights, g.const([-1])])])], perm=[0, 1, 2, 4, 3]), b])
        kept = g.op("Mul", f"{name}/state/kept", [start, g.op("Exp", f"{name}/state/decay", [
            g.op("Unsqueeze", f"{name}/last5", [last, g.const([-1])])])])
        g.op("Add", f"{name}/state/new", [kept, taken], outputs=[ssm_out])
        # [B,G,r,S,P] -> [B,S,I]
        return g.op("Reshape", f"{name}/y/Reshape", [g.op("Transpose", f"{name}/y/Transpose", [
            g.op("Reshape", f"{name}/y/heads", [y, g.const([0, heads, -1, dim])])], perm=[0, 2, 1, 3]),
            g.const([0, 0, inner])])
