"""The encoder-decoder transformer, built from a `ModelConfig` alone (a pruned model too).

Attention modules are looked up by key in the attention registry and addressed by stable names
("encoder.layers.0.self_attn", "decoder.layers.2.cross_attn", …) — the same names the head plan,
GHT grouping, export and reports use.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention import Attention, Cache, build_attention, reorder_cache

# A decoder's incremental state: per layer, {"self": Cache, "cross": Cache}.
DecoderState = list[dict[str, Cache]]


@dataclass
class ModelConfig:
    """Everything needed to rebuild a model (saved in every checkpoint and export manifest).

    `head_plan` maps attention-module names to the original head indices that stay. With
    `heads_removed=False` the model keeps all heads and gates the others off (GHT-PS fine-tuning);
    with `heads_removed=True` each planned module is built with only its kept heads (export).

    The fields from `activation` on exist so pretrained models convert exactly (zoo.convert); their defaults are
    the zoo's own architecture, which checkpoints written before them get. `bos_id` is the decoder's start token:
    Marian starts with pad (`bos_id == pad_id`), FSMT with eos, which every search and the export take as they are.
    `vocab_size` is the decoder's (output) vocabulary; `source_vocab_size` the encoder's where the two differ.
    """

    vocab_size: int
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    num_heads: int = 8
    head_dim: int | None = None
    ffn_dim: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    pre_norm: bool = False
    share_decoder_embeddings: bool = True
    share_all_embeddings: bool = False
    max_positions: int = 1024
    attention: str = "mha"
    attention_options: dict[str, Any] = field(default_factory=dict)
    head_plan: dict[str, list[int]] = field(default_factory=dict)
    heads_removed: bool = False
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3
    activation: str = "relu"  # FFN activation: relu | swish (x·sigmoid(x), Marian) | gelu (erf form)
    scale_embedding: bool = True  # token embeddings × √d_model (Marian's scale_embedding=False: × 1)
    positions: str = "fairseq"  # sinusoidal table: fairseq (frequency step ln 10⁴/(d/2 − 1)) | marian (ln 10⁴/(d/2))
    final_logits_bias: bool = False  # a fixed [V] bias added to the logits (Marian's final_logits_bias buffer)
    position_offset: int = 0  # the table row of the first position (fairseq's models count from pad_id + 1)
    source_vocab_size: int | None = None  # the encoder's vocabulary where it is not vocab_size (FSMT's ru-en)

    def __post_init__(self) -> None:
        for name, allowed in (("activation", tuple(ACTIVATIONS)), ("positions", POSITION_TABLES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported; use one of {', '.join(allowed)}")
        if self.position_offset < 0:
            raise ValueError(f"position_offset={self.position_offset} must be >= 0")
        if self.share_all_embeddings and self.source_vocab != self.vocab_size:
            raise ValueError(
                f"share_all_embeddings=True needs one vocabulary, but source_vocab_size={self.source_vocab_size} "
                f"differs from vocab_size={self.vocab_size}; set share_all_embeddings=False"
            )

    @property
    def source_vocab(self) -> int:
        """The encoder's vocabulary size (the decoder's unless `source_vocab_size` says otherwise)."""
        return self.vocab_size if self.source_vocab_size is None else self.source_vocab_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def heads_of(self, module: str) -> int:
        """Number of heads module `module` is built with."""
        if self.heads_removed and module in self.head_plan:
            return len(self.head_plan[module])
        return self.num_heads


ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}
POSITION_TABLES = ("fairseq", "marian")


def sinusoidal_positions(num_positions: int, dim: int) -> Tensor:
    """[P, dim] fixed sinusoidal table (sin on the first half, cos on the second, as fairseq)."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(num_positions, dtype=torch.float)[:, None] * freq[None, :]  # [P, half]
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    if dim % 2:
        table = F.pad(table, (0, 1))
    return table


def marian_positions(num_positions: int, dim: int) -> Tensor:
    """[P, dim] Marian's sinusoidal table: angle pos / 10000^(2i/dim) for i < ⌈dim/2⌉, sin of them on the first
    ⌈dim/2⌉ columns and cos of the first ⌊dim/2⌋ on the rest. Computed in float64 and rounded once, as
    transformers builds it, so converted models see the table they were trained with bit for bit."""
    sines, cosines = (dim + 1) // 2, dim // 2
    exponent = 2 * torch.arange(sines, dtype=torch.float64) / dim  # [⌈dim/2⌉]
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] / torch.pow(10000.0, exponent)[None, :]
    return torch.cat([angles.sin(), angles[:, :cosines].cos()], dim=1).float()  # [P, dim]


def position_table(cfg: ModelConfig) -> Tensor:
    """[max_positions + 1, d_model] the table `cfg.positions` names, from row `cfg.position_offset` on."""
    build = marian_positions if cfg.positions == "marian" else sinusoidal_positions
    return build(cfg.position_offset + cfg.max_positions + 1, cfg.d_model)[cfg.position_offset :]


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ffn_dim: int, activation_dropout: float, activation: str = "relu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.activation_dropout = activation_dropout
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        h = F.dropout(self.activation(self.fc1(x)), self.activation_dropout, self.training)  # [..., ffn_dim]
        return self.fc2(h)


class _Sublayer(nn.Module):
    """Residual + dropout + LayerNorm around one sublayer, pre- or post-norm."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = dropout
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, fn) -> Tensor:
        if self.pre_norm:
            return x + F.dropout(fn(self.norm(x)), self.dropout, self.training)
        return self.norm(x + F.dropout(fn(x), self.dropout, self.training))


def _attention(cfg: ModelConfig, name: str) -> Attention:
    attn = build_attention(
        cfg.attention,
        cfg.d_model,
        cfg.heads_of(name),
        head_dim=_head_dim(cfg),
        dropout=cfg.attention_dropout,
        **cfg.attention_options,
    )
    if not cfg.heads_removed and name in cfg.head_plan:
        gate = torch.zeros(cfg.num_heads)
        gate[cfg.head_plan[name]] = 1.0
        attn.head_gate.copy_(gate)
    return attn


def _head_dim(cfg: ModelConfig) -> int:
    if cfg.head_dim is not None:
        return cfg.head_dim
    if cfg.d_model % cfg.num_heads:
        raise ValueError(f"d_model={cfg.d_model} not divisible by num_heads={cfg.num_heads}; set head_dim")
    return cfg.d_model // cfg.num_heads


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.self_attn = _attention(cfg, f"encoder.layers.{index}.self_attn")
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout, cfg.activation)
        self.attn_block = _Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.ffn_block = _Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)

    def forward(self, x: Tensor, pad_mask: Tensor) -> Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, key_padding_mask=pad_mask))
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.self_attn = _attention(cfg, f"decoder.layers.{index}.self_attn")
        self.cross_attn = _attention(cfg, f"decoder.layers.{index}.cross_attn")
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout, cfg.activation)
        self.self_block = _Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.cross_block = _Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.ffn_block = _Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)

    def forward(
        self, x: Tensor, memory: Tensor, memory_pad_mask: Tensor, state: dict[str, Cache] | None = None
    ) -> Tensor:
        self_cache = state["self"] if state is not None else None
        cross_cache = state["cross"] if state is not None else None
        x = self.self_block(x, lambda h: self.self_attn(h, causal=True, cache=self_cache))
        x = self.cross_block(
            x, lambda h: self.cross_attn(h, memory, key_padding_mask=memory_pad_mask, cache=cross_cache)
        )
        return self.ffn_block(x, self.ffn)


class _Stack(nn.Module):
    def __init__(self, layers: list[nn.Module], d_model: int, pre_norm: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()


class Transformer(nn.Module):
    """Encoder-decoder transformer (post-LN by default, as the GHT paper's fairseq baseline)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.src_embed = nn.Embedding(cfg.source_vocab, cfg.d_model, padding_idx=cfg.pad_id)
        if cfg.share_all_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.register_buffer("positions", position_table(cfg), persistent=False)
        self.encoder = _Stack([EncoderLayer(cfg, i) for i in range(cfg.encoder_layers)], cfg.d_model, cfg.pre_norm)
        self.decoder = _Stack([DecoderLayer(cfg, i) for i in range(cfg.decoder_layers)], cfg.d_model, cfg.pre_norm)
        if cfg.share_decoder_embeddings or cfg.share_all_embeddings:
            self.output_proj = None
        else:
            self.output_proj = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            nn.init.normal_(self.output_proj.weight, 0, cfg.d_model**-0.5)
        if cfg.final_logits_bias:  # a buffer, as in Marian: saved with the weights, never trained
            self.register_buffer("final_logits_bias", torch.zeros(cfg.vocab_size))
        else:
            self.final_logits_bias = None
        # a list, not a set: set order follows object ids, which would make initialisation vary between runs
        for emb in dict.fromkeys([self.src_embed, self.tgt_embed]):
            nn.init.normal_(emb.weight, 0, cfg.d_model**-0.5)
            nn.init.zeros_(emb.weight[cfg.pad_id])

    # ------------------------------------------------------------------ pieces
    def _embed(self, emb: nn.Embedding, tokens: Tensor, offset: int = 0) -> Tensor:
        # tokens [B, T] -> [B, T, D]; positions offset+0 … offset+T-1
        t = tokens.shape[1]
        if offset + t > self.cfg.max_positions:
            raise ValueError(f"sequence of {offset + t} tokens exceeds max_positions={self.cfg.max_positions}")
        x = emb(tokens) * self.embed_scale + self.positions[offset : offset + t]
        return F.dropout(x, self.cfg.dropout, self.training)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src [B, S] -> (memory [B, S, D], src_pad_mask [B, S] True at padding)."""
        pad_mask = src.eq(self.cfg.pad_id)
        x = self._embed(self.src_embed, src)
        for layer in self.encoder.layers:
            x = layer(x, pad_mask)
        return self.encoder.final_norm(x), pad_mask

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        memory_pad_mask: Tensor,
        state: DecoderState | None = None,
        offset: int = 0,
    ) -> Tensor:
        """tgt_in [B, T] -> logits [B, T, V]. With `state`, only the new tokens are fed and
        `offset` is the number of tokens already cached."""
        x = self._embed(self.tgt_embed, tgt_in, offset)
        for i, layer in enumerate(self.decoder.layers):
            x = layer(x, memory, memory_pad_mask, state[i] if state is not None else None)
        return self.logits(self.decoder.final_norm(x))

    def logits(self, x: Tensor) -> Tensor:
        """Decoder states [..., D] -> logits [..., V]: the output projection (tied or not) and the final bias."""
        weight = self.output_proj.weight if self.output_proj is not None else self.tgt_embed.weight  # [V, D]
        logits = x @ weight.t()  # [..., V]
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias

    def shortlist_logits(self, x: Tensor, rows: Tensor) -> Tensor:
        """Decoder states [..., D] -> the logits [..., C] of target tokens `rows` [C] alone: the output projection's
        rows gathered (a vocabulary shortlist computes C of V dot products per state), the final bias likewise."""
        weight = self.output_proj.weight if self.output_proj is not None else self.tgt_embed.weight  # [V, D]
        logits = x @ weight.index_select(0, rows).t()  # [..., C]
        if self.final_logits_bias is None:
            return logits
        return logits + self.final_logits_bias.index_select(0, rows)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, pad_mask = self.encode(src)
        return self.decode(tgt_in, memory, pad_mask)

    # ------------------------------------------------------------------ incremental decoding
    def init_state(self) -> DecoderState:
        return [{"self": {}, "cross": {}} for _ in self.decoder.layers]

    @staticmethod
    def reorder_state(state: DecoderState, order: Tensor) -> None:
        """Beam reordering: keep batch rows `order` of every cached tensor."""
        for layer in state:
            for cache in layer.values():
                reorder_cache(cache, order)

    # ------------------------------------------------------------------ heads
    def attention_modules(self) -> dict[str, Attention]:
        return {name: m for name, m in self.named_modules() if isinstance(m, Attention)}

    def extra_loss(self) -> Tensor | None:
        losses = [loss for m in self.attention_modules().values() if (loss := m.extra_loss()) is not None]
        return torch.stack(losses).sum() if losses else None

    def apply_head_plan(self, plan: dict[str, list[int]], remove: bool) -> None:
        """Gate (remove=False) or physically remove (remove=True) every head not in `plan`."""
        modules = self.attention_modules()
        unknown = set(plan) - set(modules)
        if unknown:
            raise ValueError(f"head plan names unknown attention modules: {sorted(unknown)}")
        for name in plan:
            # a head plan (gated too) promises that export can remove the other heads exactly: refuse it
            # up front, before any module changes, for mechanisms that cannot (Mixhead)
            modules[name].check_head_removal()
        for name, heads in plan.items():
            module = modules[name]
            if remove:
                module.keep_heads(heads)
            else:
                gate = torch.zeros_like(module.head_gate)
                gate[list(heads)] = 1.0
                module.head_gate.copy_(gate)
        self.cfg.head_plan = {k: list(v) for k, v in plan.items()}
        self.cfg.heads_removed = remove


def build_model(cfg: ModelConfig) -> Transformer:
    return Transformer(cfg)


def count_parameters(model: nn.Module, include_embeddings: bool = True) -> int:
    """Trainable-parameter count; shared tensors counted once. Excluding embeddings drops the
    token embedding tables (and an untied output projection), as the papers report."""
    seen: set[int] = set()
    total = 0
    skip: set[int] = set()
    if not include_embeddings and isinstance(model, Transformer):
        skip = {id(model.src_embed.weight), id(model.tgt_embed.weight)}
        if model.output_proj is not None:
            skip.add(id(model.output_proj.weight))
    for p in model.parameters():
        if id(p) in seen or id(p) in skip:
            continue
        seen.add(id(p))
        total += p.numel()
    return total
