"""trtllm::Sample as one Triton kernel: one program per row, looping over the vocabulary in blocks.

It computes reference.py's steps 1-11 without sorting the vocabulary. The only selections are
exact k-th-largest searches, done as a radix select on the order-preserving uint32 image of
float32 (4 passes of 8 bits, each a masked 256-bin histogram of the next byte over the row):

    S1   x = logits + logit_bias, y = penalised x (step 3)  -> workspace; max x, max y, greedy (4)
    S2   lse = log(sum(exp(x - max x))); sum_all = sum(exp(d))                        (2, 8)
    LP   T = the K-th largest logprob (radix select, 4 passes); compact the K winners in id
         order (all > T, then the lowest ids == T) into the outputs; rank them in place by
         (logprob desc, id asc): the order of a stable descending sort                  (2)
    TOP  T_M = the M-th largest y (4 passes); compact the values > T_M, pad with T_M: the
         multiset sy of the top M; sort it in registers (bitonic, M <= 4096)            (6)
         steps 5-9 literally on sy: sd, e, min-p count, k', D, prob, cumsum, n, thr
    DRAW total = sum of the kept weights; first index with w > 0 and carry + cumsum(w) > u * total,
         else the last weighted token                                                   (10)

Greedy rows (temperature 0) skip TOP and DRAW (step 11). About 14 passes over the row in all,
each reading 4 bytes per token from the workspace (S1 reads the 13 input bytes).

Why the top-M multiset is enough: every cut of steps 7-9 is an index into sy = the M largest y
in descending order, and equal values are interchangeable in it (same sd, same e), so sorting the
multiset {y > T_M} + (M - count) copies of T_M reproduces the reference's sy exactly, whatever
the order of ties. The threshold is then a value, and keep = y >= thr is a comparison.

Exactness against the reference:
  * y, d, sd, prob use IEEE division (tl.math.div_rn; `/` is approximate on NVIDIA GPUs) and the
    launch disables FMA contraction, so y is bit-exact and greedy, ties and thresholds match.
  * Selections compare the kernel's own values (the sy it returns are elements of its y), so a
    threshold keeps exactly the tokens whose y is >= it, ties included.
  * Sums (lse, sum_all, D, the top-p cumsum, the CDF) are blocked/tree sums where numpy sums
    pairwise or sequentially: results differ only in the last bits, so a token can differ only
    when the uniform or a top-p/min-p cut sits within float rounding of a boundary (DESIGN.md's
    allowed difference). On NVIDIA GPUs tl.exp is the approximate ex2 (~1e-6 relative at |d| ~ 20).
    The CDF is summed in float64, as the reference's: on an H200, 2 of 257 random rows drew the
    exact CDF's token where the reference's sequential float32 sum then, 2e-4 off over 46,000 kept
    tokens, did not (docs/tensorrt.md; measured before both went to float64).
  * The draw takes only tokens with weight: tl.cumsum rounds apart from tl.sum, so the running sum
    could pass the target first at an unkept token after the last kept one (seen on an H200).

V and M are compile-time constants (one engine = one vocabulary; Triton compiles once per (V, M)),
which also keeps loop bounds out of Triton's interpreter, where a runtime bound fails under
numpy >= 2.4. Workspace per row: x [V], y [V], the top-M scratch [MP], float32, from the launcher.
Usable from the tensorrt.plugin impl (launch on preallocated outputs and a given stream) and,
with TRITON_INTERPRET=1 set before triton is imported, on CPU torch tensors (the tests do that).
"""
from __future__ import annotations

import triton
import triton.language as tl

from trtllm.plugins.sample import schema

BLOCK = 8192               # vocabulary elements per loop step (with NUM_WARPS, the fastest tried on an H200)
KP = 64                    # K padded: K <= MAX_NUM_LOGPROBS = 50
NUM_WARPS = 16


@triton.jit
def _key(v):
    """The uint32 whose unsigned order is float32 v's order (-0.0 mapped to +0.0; no NaN)."""
    bits = tl.where(v == 0.0, 0.0, v).to(tl.uint32, bitcast=True)
    # negative floats: flip all bits (larger magnitude = smaller); non-negative: set the sign bit
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _float_of(key):
    """The inverse of _key."""
    bits = tl.where((key >> 31) != 0, key & 0x7FFFFFFF, key ^ 0xFFFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _select(src, V: tl.constexpr, k, xmax, lse, IS_LOGPROB: tl.constexpr, BLOCK: tl.constexpr):
    """(the k-th largest value of the row (1-based, with multiplicity), how many are strictly larger).

    The row is src[:V] (y), or the logprobs (x - xmax) - lse with src = x when IS_LOGPROB.

    Radix select, most significant byte first: a pass histograms byte p of the keys that match
    the bytes chosen so far; the chosen byte is the largest d with count(byte >= d) >= remaining,
    and the keys with a larger byte (all larger than the answer) leave `remaining`. After 4
    passes the prefix is the whole key, and `remaining` (>= 1) counts the copies of it needed.
    Masked-out lanes (past V) are left out of every histogram, so -inf values count as values.
    """
    prefix = tl.cast(0, tl.uint32)
    remaining = k
    bins = tl.arange(0, 256)
    for p in tl.static_range(4):
        shift = 24 - 8 * p                     # a compile-time constant
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ok = offs < V
            v = tl.load(src + offs, mask=ok, other=float("-inf"))
            if IS_LOGPROB:                     # the logprob, recomputed from x: the same bits each pass
                v = (v - xmax) - lse
            key = _key(v)
            if p > 0:
                ok = ok & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
            hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=ok)
        at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist          # [256] count(byte >= d)
        d = tl.max(tl.where(at_least >= remaining, bins, 0), 0)
        remaining -= tl.sum(tl.where(bins > d, hist, 0), 0)
        prefix = prefix | (d.to(tl.uint32) << shift)
    return _float_of(prefix), k - remaining


@triton.jit
def _top_logprobs(ws_x, V: tl.constexpr, K, xmax, lse, out_lp, out_ids, BLOCK: tl.constexpr, KP: tl.constexpr,
                  TIES_LAST: tl.constexpr):
    """Step 2: the K largest logprobs and their ids, descending, ties lower id first."""
    thr, num_gt = _select(ws_x, V, K, xmax, lse, True, BLOCK)
    need_eq = K - num_gt                       # how many ties with thr to take, lowest ids first
    base = 0
    eq_base = 0
    for start in range(0, V, BLOCK):           # compact the winners in id order
        offs = start + tl.arange(0, BLOCK)
        ok = offs < V
        lp = (tl.load(ws_x + offs, mask=ok, other=float("-inf")) - xmax) - lse
        eq = ok & (lp == thr)
        eq_rank = eq_base + tl.cumsum(eq.to(tl.int32), 0) - 1
        sel = (ok & (lp > thr)) | (eq & (eq_rank < need_eq))
        pos = base + tl.cumsum(sel.to(tl.int32), 0) - 1
        tl.store(out_lp + pos, lp, mask=sel)
        tl.store(out_ids + pos, offs.to(tl.int64), mask=sel)
        base += tl.sum(sel.to(tl.int32), 0)
        eq_base += tl.sum(eq.to(tl.int32), 0)
    tl.debug_barrier()                         # the stores above are read by other threads
    kk = tl.arange(0, KP)
    valid = kk < K
    v = tl.load(out_lp + kk, mask=valid, other=float("-inf"))
    ids = tl.load(out_ids + kk, mask=valid, other=0)
    # rank_i = #{j: v_j > v_i or (v_j == v_i and id_j < id_i)}: the stable descending position
    if TIES_LAST:
        before = (v[None, :] > v[:, None]) | ((v[None, :] == v[:, None]) & (ids[None, :] > ids[:, None]))
    else:
        before = (v[None, :] > v[:, None]) | ((v[None, :] == v[:, None]) & (ids[None, :] < ids[:, None]))
    rank = tl.sum((before & valid[None, :]).to(tl.int32), 1)           # [KP]
    tl.debug_barrier()                         # every thread has loaded before any overwrites
    tl.store(out_lp + rank, v, mask=valid)
    tl.store(out_ids + rank, ids, mask=valid)


@triton.jit
def _threshold(ws_y, ws_top, V: tl.constexpr, ymax, t_div, min_p, top_k, top_p, sum_all, sum_min_p,
               M: tl.constexpr, MP: tl.constexpr, BLOCK: tl.constexpr):
    """Steps 5-9: thr, the smallest kept y (-inf when nothing is restricted)."""
    thr_m, num_gt = _select(ws_y, V, M, 0.0, 0.0, False, BLOCK)
    base = 0
    for start in range(0, V, BLOCK):           # the values > T_M, in any order
        offs = start + tl.arange(0, BLOCK)
        ok = offs < V
        y = tl.load(ws_y + offs, mask=ok, other=float("-inf"))
        sel = ok & (y > thr_m)
        pos = base + tl.cumsum(sel.to(tl.int32), 0) - 1
        tl.store(ws_top + pos, y, mask=sel)
        base += tl.sum(sel.to(tl.int32), 0)
    tl.debug_barrier()
    mm = tl.arange(0, MP)
    valid = mm < M
    sy = tl.load(ws_top + mm, mask=mm < num_gt, other=0.0)
    sy = tl.where(mm < num_gt, sy, thr_m)      # ties with T_M fill the rest of the top M
    sy = tl.sort(tl.where(valid, sy, float("-inf")), descending=True)   # [MP] step 6
    sd = tl.math.div_rn(sy - ymax, t_div)
    e = tl.exp(sd)
    # step 7: min-p then top-k; both shorten the sorted prefix
    m_on = min_p > 0
    log_min_p = tl.where(m_on, tl.log(tl.where(m_on, min_p, 1.0)), float("-inf"))
    num_min_p = tl.sum((valid & (sd >= log_min_p)).to(tl.int32), 0)     # >= 1
    k_on = top_k > 0
    k_eff = tl.minimum(tl.where(k_on, tl.minimum(top_k, M), M).to(tl.int32), num_min_p)
    restricted = k_on | m_on
    e_k = tl.where(mm < k_eff, e, 0.0)
    # step 8: top-p over the renormalised survivors; excl[j] = incl[j-1], excl[0] = 0 < top_p
    # min-p alone: its survivors' mass over the whole vocabulary (they may be more than M)
    denom = tl.where(k_on, tl.sum(e_k, 0), tl.where(m_on, sum_min_p, sum_all))
    incl = tl.cumsum(tl.math.div_rn(e_k, denom), 0)
    n = 1 + tl.sum(((mm < M - 1) & (incl < top_p)).to(tl.int32), 0)
    p_on = top_p < 1.0
    n_eff = tl.where(p_on, n, M)
    idx = tl.minimum(k_eff, n_eff) - 1         # step 9
    thr = tl.max(tl.where(mm == idx, sy, float("-inf")), 0)
    return tl.where(restricted | p_on, thr, float("-inf"))


@triton.jit
def _kept_weights(ws_y, offs, ok, ymax, t_div, thr):
    """Step 10: w = where(y >= thr, exp(d), 0), d = (y - max y) / t."""
    y = tl.load(ws_y + offs, mask=ok, other=float("-inf"))
    return tl.where(ok & (y >= thr), tl.exp(tl.math.div_rn(y - ymax, t_div)), 0.0)


@triton.jit
def _draw(ws_y, V: tl.constexpr, ymax, t_div, thr, u, BLOCK: tl.constexpr):
    """Step 10: the first token whose CDF exceeds u * total (else the last token with weight); the
    sums in float64, as the reference's (in float32 the least likely tokens are never drawn)."""
    total = tl.zeros([], tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        total += tl.sum(_kept_weights(ws_y, offs, offs < V, ymax, t_div, thr).to(tl.float64), 0)
    target = u.to(tl.float64) * total
    carry = tl.zeros([], tl.float64)
    token = -1
    last = 0
    start = 0
    while (start < V) & (token < 0):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < V
        w = _kept_weights(ws_y, offs, ok, ymax, t_div, thr).to(tl.float64)
        c = carry + tl.cumsum(w, 0)
        # w > 0: a scan's rounding differs from tl.sum's, so c can first pass the target at unkept tokens
        # after the last kept one (the carry rounded up); the reference never draws those
        first = tl.min(tl.where(ok & (w > 0) & (c > target), offs, V), 0)
        token = tl.where(first < V, first, token)
        last = tl.maximum(last, tl.max(tl.where(w > 0, offs, -1), 0))
        carry += tl.sum(w, 0)
        start += BLOCK
    # rounding can leave the last CDF value <= target (reference: the first c >= total)
    return tl.where(token < 0, last, token)


@triton.jit(do_not_specialize=["K"])         # K = 1 would otherwise compile a second kernel
def sample_kernel(logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k,
                  top_p, uniform, token_ids, top_logprobs, top_logprob_ids, workspace, K,
                  V: tl.constexpr, M: tl.constexpr, MP: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                  TIES_LAST: tl.constexpr):
    """One program per row b; inputs [B, V] contiguous, workspace [B, 2V + MP], outputs [B], [B, K]."""
    b = tl.program_id(0)
    row = b.to(tl.int64) * V
    ws_x = workspace + b.to(tl.int64) * (2 * V + MP)
    ws_y = ws_x + V
    ws_top = ws_y + V
    r = tl.load(repetition_penalty + b)
    t = tl.load(temperature + b)
    t_div = tl.where(t == 0, 1.0, t)           # step 5: the sampling branch uses t = 1 for greedy rows
    xmax = float("-inf")
    ymax = float("-inf")
    greedy = 0
    for start in range(0, V, BLOCK):           # S1: steps 1, 3, 4
        offs = start + tl.arange(0, BLOCK)
        ok = offs < V
        x = tl.load(logits + row + offs, mask=ok, other=float("-inf")) \
            + tl.load(logit_bias + row + offs, mask=ok, other=0.0)
        hit = tl.load(seen + row + offs, mask=ok, other=0) != 0
        # x / r and x * r as two IEEE ops, then + penalty_bias (no FMA: launched without fusion)
        y = tl.where(hit, tl.where(x > 0, tl.math.div_rn(x, r), x * r), x) \
            + tl.load(penalty_bias + row + offs, mask=ok, other=0.0)
        tl.store(ws_x + offs, x, mask=ok)
        tl.store(ws_y + offs, y, mask=ok)
        xmax = tl.maximum(xmax, tl.max(x, 0))
        block_max = tl.max(y, 0)
        if TIES_LAST:                          # the deliberately wrong variant the tests must catch
            greedy = tl.where(block_max >= ymax, tl.max(tl.where(y == block_max, offs, -1), 0), greedy)
        else:
            block_first = tl.min(tl.where(y == block_max, offs, V), 0)
            greedy = tl.where(block_max > ymax, block_first, greedy)   # strict: earlier blocks win ties
        ymax = tl.maximum(ymax, block_max)
    tl.debug_barrier()                         # the workspace is read back by other threads
    sum_x = 0.0
    sum_all = 0.0
    sum_min_p = 0.0
    min_p_b = tl.load(min_p + b)
    log_min_p = tl.where(min_p_b > 0, tl.log(tl.where(min_p_b > 0, min_p_b, 1.0)), float("-inf"))
    for start in range(0, V, BLOCK):           # S2
        offs = start + tl.arange(0, BLOCK)
        ok = offs < V
        sum_x += tl.sum(tl.exp(tl.load(ws_x + offs, mask=ok, other=float("-inf")) - xmax), 0)
        y = tl.load(ws_y + offs, mask=ok, other=float("-inf"))
        d = tl.math.div_rn(y - ymax, t_div)
        sum_all += tl.sum(tl.exp(d), 0)
        sum_min_p += tl.sum(tl.where(d >= log_min_p, tl.exp(d), 0.0), 0)
    lse = tl.log(sum_x)
    _top_logprobs(ws_x, V, K, xmax, lse, top_logprobs + b.to(tl.int64) * K,
                  top_logprob_ids + b.to(tl.int64) * K, BLOCK, KP, TIES_LAST)
    token = greedy
    if t != 0:                                 # step 11: greedy rows skip the draw
        thr = _threshold(ws_y, ws_top, V, ymax, t_div, min_p_b, tl.load(top_k + b),
                         tl.load(top_p + b), sum_all, sum_min_p, M, MP, BLOCK)
        token = _draw(ws_y, V, ymax, t_div, thr, tl.load(uniform + b), BLOCK)
    tl.store(token_ids + b, token.to(tl.int64))


def launch(logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k, top_p,
           uniform, max_top_k: int, outputs, stream: int | None = None, workspace=None,
           ties_last: bool = False) -> None:
    """Run the kernel into preallocated outputs (token_ids [B] i64, top_logprobs [B,K] f32, ids [B,K] i64).

    Inputs are contiguous torch tensors on one device with the schema's dtypes (seen bool, or int32
    0/1 as the TensorRT plugin gets it: schema.PLUGIN_SEEN);
    K is the outputs' width (the op's min(50, max_top_k); fewer columns also work). `stream` is a raw cudaStream_t (the
    tensorrt.plugin impl passes its own); None launches on torch's current stream. `workspace`
    (f32, >= B * (2V + MP) elements, MP = next power of 2 >= max_top_k) is allocated on that
    stream when not given. Only shapes and devices are checked: values would need a synchronise.
    `ties_last` is the deliberately wrong variant for the tests (greedy takes the last maximum,
    tied logprobs go higher id first); never use it.
    """
    import contextlib

    import torch

    inputs = (logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k, top_p, uniform)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    num_logprobs = outputs[1].shape[1] if outputs[1].dim() == 2 else -1
    _check_shapes(inputs, outputs, num_rows, vocab_size, num_logprobs, max_top_k)
    if num_rows == 0:  # (EAGLE verification's sampler in a step that verifies nothing: no grid to launch)
        return
    mp = triton.next_power_of_2(max_top_k)
    on_stream = contextlib.nullcontext()
    if stream is not None and logits.device.type == "cuda":
        on_stream = torch.cuda.stream(torch.cuda.ExternalStream(stream, device=logits.device))
    with on_stream:                            # a workspace allocated here is reused only in stream order
        if workspace is None:
            workspace = torch.empty(num_rows * (2 * vocab_size + mp), dtype=torch.float32, device=logits.device)
        elif workspace.numel() < num_rows * (2 * vocab_size + mp) or workspace.device != logits.device:
            raise ValueError(f"workspace must hold {num_rows * (2 * vocab_size + mp)} float32 on {logits.device}, "
                             f"got {workspace.numel()} on {workspace.device}")
        flags = seen.view(torch.uint8) if seen.dtype == torch.bool else seen  # (int32: schema.PLUGIN_SEEN)
        sample_kernel[(num_rows,)](*inputs[:3], flags, *inputs[4:], *outputs, workspace,
                                   num_logprobs, V=vocab_size, M=max_top_k, MP=mp, KP=KP, BLOCK=BLOCK,
                                   TIES_LAST=ties_last, num_warps=NUM_WARPS, enable_fp_fusion=False)


def _check_shapes(inputs, outputs, num_rows, vocab_size, num_logprobs, max_top_k):
    """Raise unless inputs and outputs have the schema's shapes and dtypes, contiguous, on one device."""
    schema.check_max_top_k(max_top_k)
    if max_top_k > vocab_size:
        raise ValueError(f"max_top_k must be <= the vocabulary size {vocab_size}, got {max_top_k}")
    if not 1 <= num_logprobs <= min(schema.MAX_NUM_LOGPROBS, max_top_k):
        raise ValueError(f"top_logprobs must be [B, K] with K in [1, min(50, max_top_k={max_top_k})], "
                         f"got shape {tuple(outputs[1].shape)}")
    sizes = {"B": num_rows, "V": vocab_size, "K": num_logprobs}
    named = [(spec, t) for spec, t in zip(schema.INPUTS, inputs)] + list(zip(schema.OUTPUTS, outputs))
    for (name, dtype, shape), t in named:
        want = tuple(sizes[s] for s in shape)
        dtypes = (dtype, schema.PLUGIN_SEEN) if name == "seen" else (dtype,)
        if tuple(t.shape) != want or str(t.dtype) not in [f"torch.{d}" for d in dtypes]:
            raise ValueError(f"{name} must be {dtype} {want}, got {t.dtype} {tuple(t.shape)}")
        if not t.is_contiguous() or t.device != inputs[0].device:
            raise ValueError(f"{name} must be contiguous on {inputs[0].device}, got device {t.device}")


def sample(logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k, top_p,
           uniform, max_top_k: int, *, ties_last: bool = False):
    """reference.sample on torch tensors (CUDA, or CPU under TRITON_INTERPRET=1).

    Returns (token_ids int64 [B], top_logprobs f32 [B,K], top_logprob_ids int64 [B,K]) on the
    inputs' device. Inputs are converted to the schema's dtypes (an int32 seen stays int32, as the
    TensorRT plugin has it); values are not validated (the
    reference's checks need the data on the host).
    """
    import torch

    values = (logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k, top_p,
              uniform)
    device = torch.as_tensor(logits).device
    dtypes = [dtype for _, dtype, _ in schema.INPUTS]
    if torch.as_tensor(seen).dtype == getattr(torch, schema.PLUGIN_SEEN):  # (kept as the plugin has it)
        dtypes[schema.INPUT_NAMES.index("seen")] = schema.PLUGIN_SEEN
    inputs = [torch.as_tensor(v).to(device=device, dtype=getattr(torch, dtype)).contiguous()
              for v, dtype in zip(values, dtypes)]
    num_rows = inputs[0].shape[0] if inputs[0].dim() else 0
    num_logprobs = schema.num_logprob_columns(max_top_k)
    outputs = (torch.empty(num_rows, dtype=torch.int64, device=device),
               torch.empty(num_rows, num_logprobs, dtype=torch.float32, device=device),
               torch.empty(num_rows, num_logprobs, dtype=torch.int64, device=device))
    launch(*inputs, max_top_k, outputs, ties_last=ties_last)
    return outputs
