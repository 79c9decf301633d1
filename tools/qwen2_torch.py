"""A plain PyTorch implementation of the Qwen2 decoder architecture.

Written to be read: it is the oracle the Sextant C++ runtime is checked against, so every step
is spelled out rather than fused. Parameter names follow llama.cpp's `qwen2` GGUF tensor names
(see gguf_state_dict / load_gguf_state_dict).

Per layer:
    h = x + o_proj(attention(rope(q_proj(rmsnorm(x))), rope(k_proj(..)), v_proj(..)))
    out = h + down(silu(gate(rmsnorm(h))) * up(rmsnorm(h)))
with Q/K/V biases, no O/MLP biases, NeoX RoPE (rotate halves), grouped-query causal attention,
final RMSNorm and an LM head tied to the token embedding.
"""

import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------------------------
# Matrix products
# --------------------------------------------------------------------------------------------
# Every matrix product of the model goes through `matmul`. By default it is torch.matmul, the
# plain reference. Debian's python3-torch links the reference (netlib) BLAS, which makes
# torch.matmul very slow on CPU, so training switches to `onednn_matmul` (set_fast_matmul):
# the same products computed as 1x1 convolutions, which torch runs with its bundled oneDNN.

def _onednn_mm(a, b):
    """a [M, K] @ b [K, N] as a 1x1 convolution over M 'images' of K channels; 3-D: batched."""
    if a.dim() == 3:
        return torch.stack([_onednn_mm(a[i], b[i]) for i in range(a.shape[0])])
    return F.conv2d(a.contiguous()[:, :, None, None], b.t().contiguous()[:, :, None, None]).flatten(1)


class _OneDNNMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _onednn_mm(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return _onednn_mm(grad, b.transpose(-1, -2)), _onednn_mm(a.transpose(-1, -2), grad)


def onednn_matmul(a, b):
    """torch.matmul for 2-D @ 2-D and 3-D @ 3-D (batched over the first dimension)."""
    assert a.dim() == b.dim() and a.dim() in (2, 3)
    return _OneDNNMatmul.apply(a, b)


matmul = torch.matmul


def set_fast_matmul(enabled):
    global matmul
    matmul = onednn_matmul if enabled else torch.matmul


def linear(x, weight, bias=None):
    """x @ weight.T + bias (weight is [out, in] like torch.nn.Linear)."""
    y = matmul(x, weight.t())
    return y if bias is None else y + bias


class Linear(nn.Module):
    def __init__(self, n_in, n_out, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x):
        return linear(x, self.weight, self.bias)


@dataclass
class Qwen2Config:
    vocab_size: int
    n_layers: int = 2
    hidden: int = 224
    n_heads: int = 14
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 608
    rope_theta: float = 1000000.0
    rms_eps: float = 1e-6
    context_length: int = 2048

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_cos_sin(positions, head_dim, theta):
    """cos/sin tables of shape [len(positions), head_dim/2]: angle = pos * theta^(-2i/head_dim)."""
    i = torch.arange(0, head_dim // 2, dtype=torch.float32)
    inv_freq = 1.0 / (theta ** (2.0 * i / head_dim))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.cos(angles), torch.sin(angles)


def apply_rope_neox(x, cos, sin):
    """NeoX-style RoPE on x [..., seq, head_dim]: element i is paired with i + head_dim/2."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


QUERY_CHUNK = 128  # query rows per attention chunk


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.q = Linear(cfg.hidden, cfg.n_heads * cfg.head_dim, bias=True)
        self.k = Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=True)
        self.v = Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=True)
        self.o = Linear(cfg.n_heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x, positions, cache=None):
        """x: [seq, hidden] (one sequence). cache: dict with 'k','v' [n_kv_heads, past, head_dim]."""
        cfg = self.cfg
        seq = x.shape[0]
        q = self.q(x).view(seq, cfg.n_heads, cfg.head_dim).transpose(0, 1)     # [H, seq, d]
        k = self.k(x).view(seq, cfg.n_kv_heads, cfg.head_dim).transpose(0, 1)  # [KV, seq, d]
        v = self.v(x).view(seq, cfg.n_kv_heads, cfg.head_dim).transpose(0, 1)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        q = apply_rope_neox(q, cos, sin)
        k = apply_rope_neox(k, cos, sin)
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=1)
                v = torch.cat([cache["v"], v], dim=1)
            cache["k"], cache["v"] = k, v
        # Grouped-query attention: query head h reads KV head h // group.
        group = cfg.n_heads // cfg.n_kv_heads
        k = k.repeat_interleave(group, dim=0)                                   # [H, total, d]
        v = v.repeat_interleave(group, dim=0)
        # Causal attention, query rows in chunks: the chunk [s, e) only needs the keys up to
        # its last position (a chunked prefill; it skips most of the fully masked scores).
        outs = []
        for s in range(0, seq, QUERY_CHUNK):
            e = min(seq, s + QUERY_CHUNK)
            n_keys = int(positions[e - 1]) + 1
            scores = matmul(q[:, s:e], k[:, :n_keys].transpose(1, 2)) / math.sqrt(cfg.head_dim)
            mask = torch.arange(n_keys)[None, :] > positions[s:e, None]          # key after query
            scores = scores.masked_fill(mask[None], float("-inf"))             # [H, e-s, n_keys]
            attn = torch.softmax(scores, dim=-1)
            outs.append(matmul(attn, v[:, :n_keys]))                          # [H, e-s, d]
        out = torch.cat(outs, dim=1).transpose(0, 1).reshape(seq, cfg.n_heads * cfg.head_dim)
        return self.o(out)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate = Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up = Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down = Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, positions, cache=None):
        x = x + self.attn(self.attn_norm(x), positions, cache)
        return x + self.mlp(self.ffn_norm(x))


class Qwen2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def init_weights(self, std=0.02):
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, ids, start_pos=0, caches=None):
        """ids: LongTensor [seq]. Returns logits [seq, vocab]. caches: list (one dict per layer)."""
        positions = torch.arange(start_pos, start_pos + ids.shape[0])
        x = self.embed(ids)
        for i, block in enumerate(self.blocks):
            x = block(x, positions, None if caches is None else caches[i])
        x = self.norm(x)
        return matmul(x, self.embed.weight.t())  # LM head tied to the embedding

    @torch.no_grad()
    def greedy(self, prompt_ids, max_new, stop_id=None):
        """Greedy decoding with a KV cache. Returns the generated ids (excluding the prompt)."""
        caches = [dict() for _ in self.blocks]
        logits = self.forward(torch.tensor(prompt_ids), 0, caches)
        pos = len(prompt_ids)
        out = []
        for _ in range(max_new):
            nxt = int(torch.argmax(logits[-1]))
            out.append(nxt)
            if nxt == stop_id:
                break
            logits = self.forward(torch.tensor([nxt]), pos, caches)
            pos += 1
        return out


# --------------------------------------------------------------------------------------------
# Mapping to/from llama.cpp qwen2 GGUF tensor names
# --------------------------------------------------------------------------------------------

def gguf_tensor_map(cfg):
    """GGUF tensor name -> torch parameter name (torch Linear weights are [out, in])."""
    m = {"token_embd.weight": "embed.weight"}
    for i in range(cfg.n_layers):
        p, b = f"blocks.{i}.", f"blk.{i}."
        m.update({
            b + "attn_norm.weight": p + "attn_norm.weight",
            b + "attn_q.weight": p + "attn.q.weight",
            b + "attn_q.bias": p + "attn.q.bias",
            b + "attn_k.weight": p + "attn.k.weight",
            b + "attn_k.bias": p + "attn.k.bias",
            b + "attn_v.weight": p + "attn.v.weight",
            b + "attn_v.bias": p + "attn.v.bias",
            b + "attn_output.weight": p + "attn.o.weight",
            b + "ffn_norm.weight": p + "ffn_norm.weight",
            b + "ffn_gate.weight": p + "mlp.gate.weight",
            b + "ffn_up.weight": p + "mlp.up.weight",
            b + "ffn_down.weight": p + "mlp.down.weight",
        })
    m["output_norm.weight"] = "norm.weight"
    return m


def gguf_state_dict(model):
    """Ordered list of (gguf name, float32 numpy array in torch/row-major order)."""
    params = dict(model.named_parameters())
    return [(g, params[t].detach().cpu().float().numpy().copy()) for g, t in gguf_tensor_map(model.cfg).items()]


def load_gguf_state_dict(model, arrays):
    """Load {gguf name: numpy array} (dequantised) into the model's parameters."""
    params = dict(model.named_parameters())
    mapping = gguf_tensor_map(model.cfg)
    assert set(arrays) == set(mapping), set(arrays) ^ set(mapping)
    with torch.no_grad():
        for g, t in mapping.items():
            src = torch.from_numpy(arrays[g].astype("float32"))
            assert params[t].shape == src.shape, (g, params[t].shape, src.shape)
            params[t].copy_(src)
