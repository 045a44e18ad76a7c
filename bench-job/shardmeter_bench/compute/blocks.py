"""The profiled model: a Llama-style block (RMSNorm, grouped-query attention through
``scaled_dot_product_attention(..., enable_gqa=True)`` with rotary embeddings, SwiGLU MLP),
the token embedding, and the head (final norm + LM head + cross-entropy loss) as FSDP
units of their own, exactly the units `shardmeter.cost.features.Target` names.

On CUDA the attention runs in torchtitan 0.3.0's SDPA backend order (cuDNN first, then
FlashAttention, then the math kernel, ``set_priority=True``: its
``models/common/attention.py``), so the measured attention rate is the one a launched
island runs; the coefficients document records it (``attentionKernel: cudnn``). On the CPU
SDPA picks its own kernel and the document records none."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import cross_entropy, scaled_dot_product_attention, silu

from shardmeter.spec.model import TransformerSpec

TORCHTITAN_SDPA_ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
"""torchtitan 0.3.0's ``ScaledDotProductAttention.sdpa_backends`` (its order of preference)."""


def _sdpa_backends(device: torch.device) -> contextlib.AbstractContextManager[None]:
    if device.type == "cuda":
        return sdpa_kernel(TORCHTITAN_SDPA_ORDER, set_priority=True)
    return contextlib.nullcontext()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class Rotary:
    """cos/sin tables shared by every block of a model (computed once per sequence length,
    as Hugging Face models compute them once per forward)."""

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        self.head_dim = head_dim
        self.base = base
        self._cache: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, ...]] = {}

    def tables(
        self, seq_len: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = (seq_len, device, dtype)
        if key not in self._cache:
            half = self.head_dim // 2
            inv = 1.0 / (self.base ** (torch.arange(half, device=device).float() / half))
            angles = torch.outer(torch.arange(seq_len, device=device).float(), inv)
            emb = torch.cat([angles, angles], dim=-1)
            self._cache[key] = (emb.cos().to(dtype), emb.sin().to(dtype))
        cos, sin = self._cache[key]
        return cos, sin


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, spec: TransformerSpec, rotary: Rotary) -> None:
        super().__init__()
        h = spec.hidden_size
        self.heads, self.kv_heads, self.head_dim = (
            spec.num_attention_heads,
            spec.kv_heads,
            (spec.head_width),
        )
        self.q_proj = nn.Linear(h, spec.q_dim, bias=False)
        self.k_proj = nn.Linear(h, spec.kv_dim, bias=False)
        self.v_proj = nn.Linear(h, spec.kv_dim, bias=False)
        self.o_proj = nn.Linear(spec.q_dim, h, bias=False)
        self.rotary = rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary.tables(s, x.device, x.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        with _sdpa_backends(q.device):
            out = scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads
            )
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        return projected


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class Block(nn.Module):
    """One pre-norm Llama block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, spec: TransformerSpec, rotary: Rotary) -> None:
        super().__init__()
        self.input_norm = RMSNorm(spec.hidden_size)
        self.attn = Attention(spec, rotary)
        self.post_attn_norm = RMSNorm(spec.hidden_size)
        self.mlp = SwiGLU(spec.hidden_size, spec.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x))
        out: torch.Tensor = x + self.mlp(self.post_attn_norm(x))
        return out


class Head(nn.Module):
    """Final norm + LM head + next-token cross-entropy: one unit (``head.*`` targets)."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.norm = RMSNorm(spec.hidden_size)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(x)).float()
        return cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))


class UnitModel(nn.Module):
    """Embedding → ``blocks`` blocks (the reference `Block`, or ``block_factory``'s, e.g.
    torchtitan's: `titan_block`) → head; the LM head shares the embedding's matrix when
    the spec ties them (autograd then sums the two gradients inside the embedding's backward,
    as in a Hugging Face model with ``tie_word_embeddings``). ``freeze_embedding`` exists to
    demonstrate (and test) the block-0 pitfall; `forward` guards against it either way."""

    def __init__(
        self,
        spec: TransformerSpec,
        blocks: int,
        freeze_embedding: bool = False,
        block_factory: Callable[[TransformerSpec], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        rotary = Rotary(spec.head_width)
        self.embedding = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.embedding.weight.requires_grad_(not freeze_embedding)
        make = block_factory or (lambda s: Block(s, rotary))
        self.blocks = nn.ModuleList(make(spec) for _ in range(blocks))
        self.head = Head(spec)
        if spec.tie_embeddings:
            self.head.lm_head.weight = self.embedding.weight
        self.guard_block0 = True

    def to_floating(self, dtype: torch.dtype) -> UnitModel:
        """Parameters and real floating-point buffers in ``dtype``; complex buffers (a RoPE
        table) keep theirs (``Module.to(dtype)`` would drop their imaginary part)."""
        with torch.no_grad():
            for p in self.parameters():
                p.data = p.data.to(dtype)
            for module in self.modules():
                for name, buf in module.named_buffers(recurse=False):
                    if buf.is_floating_point():
                        setattr(module, name, buf.to(dtype))
        return self

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)
        if self.guard_block0 and not x.requires_grad:
            # Pitfall: if block 0's input does not require grad, its *full* backward hook
            # fires as soon as the gradient w.r.t. its *outputs* exists, i.e. before block
            # 0's backward ran, and block 0's backward time reads ~0.
            x = x.detach().requires_grad_(True)
        for block in self.blocks:
            x = block(x)
        loss: torch.Tensor = self.head(x, labels)
        return loss


def init_weights(model: nn.Module, seed: int) -> None:
    """Deterministic small random weights (norms stay at one)."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            if p.device not in generators:
                generators[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            p.normal_(0.0, 0.02, generator=generators[p.device])
