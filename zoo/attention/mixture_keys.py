"""Attention whose key at every position is a mixture of M keys (Nguyen et al., "Improving Transformers with
Probabilistic Attention Keys", paper §2.3): the part MGK (`zoo.attention.mgk`) and MLK / linear attention
(`zoo.attention.linear`) share — component keys, the mixture weights π and their per-head slicing. How the
components meet the queries (Gaussian scores or linear features) is each mechanism's own `attend`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from zoo.attention.base import Attention


class MixtureKeyAttention(Attention):
    """Attention whose key at every position is a set of M per-head keys k_j0 … k_j(M−1) mixed by π.

    Shared by MGK and MLK. Key options (paper §2.3): M separate key projections (`shared_key=False`,
    "k_proj", "k_proj1", …; option A) or one projection plus learned per-head shifts b_r
    (`shared_key=True`, option B / sMGK), with b_0 fixed at 0 because it would only duplicate the
    projection bias. π is shared by all positions and kept per head (paper A.1); `prior` says how:
      * "learned": logits [H, M] (π = softmax, so it stays a distribution under SGD), init 1/M;
      * "em": a buffer [H, M] that the owner overwrites with E-step estimates (no gradient);
      * "none": no π at all (hard E-step, or M = 1).
    Every key-side tensor is per head, so removing heads slices projections, shifts and π exactly.
    """

    def __init__(
        self, *base: Any, num_components: int = 2, shared_key: bool = False, prior: str = "learned", **common: Any
    ) -> None:
        """`base` / `common`: the contract's (d_model, num_heads, head_dim, dropout, bias); the rest: the mixture's."""
        if num_components < 1:
            raise ValueError(f"num_components must be >= 1, got {num_components}")
        if prior not in ("learned", "em", "none"):
            raise ValueError(f"prior must be 'learned', 'em' or 'none', got {prior!r}")
        super().__init__(*base, **common)
        bias = self.k_proj.bias is not None
        self.num_components = num_components
        self.shared_key = bool(shared_key)
        self.prior = prior if num_components > 1 else "none"  # one component: π ≡ 1, nothing to learn
        inner = self.num_heads * self.head_dim
        extra: tuple[str, ...] = ()
        if self.shared_key:
            if num_components > 1:
                # shifts b_1 … b_{M−1} per head; b_0 = 0 is implicit
                self.key_shifts = nn.Parameter(torch.empty(self.num_heads, num_components - 1, self.head_dim))
        else:
            extra = tuple(f"k_proj{r}" for r in range(1, num_components))
            for name in extra:
                setattr(self, name, nn.Linear(self.d_model, inner, bias=bias))
        # names of the projections making component keys (k_proj is component 0), then values
        self.component_projections: tuple[str, ...] = ("k_proj", *extra)
        self.key_projections = (*self.component_projections, "v_proj")
        if self.prior == "learned":
            self.pi_logits = nn.Parameter(torch.zeros(self.num_heads, num_components))
        elif self.prior == "em":
            self.register_buffer("pi", torch.full((self.num_heads, num_components), 1.0 / num_components))
        # the one full initialisation, now that every tensor exists (the base constructor initialised only its own)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()  # q/k/v/out and, through key_projections, the extra key projections
        if self.shared_key and self.num_components > 1:
            nn.init.normal_(self.key_shifts)  # paper A.1: shifts drawn from a standard normal
        if self.prior == "learned":
            nn.init.zeros_(self.pi_logits)  # π = 1/M (0.5 for M = 2, as in the paper)
        elif self.prior == "em":
            self.pi.fill_(1.0 / self.num_components)

    # ----------------------------------------------------------------- mixture pieces
    def component_keys(self, x: Tensor) -> list[Tensor]:
        """The M keys of every position of x [B, S, D]: a list of M tensors [B, H, S, dh]."""
        if not self.shared_key:
            return [self._split(getattr(self, name)(x)) for name in self.component_projections]
        k = self._split(self.k_proj(x))  # [B, H, S, dh]
        keys = [k]
        for r in range(self.num_components - 1):
            keys.append(k + self.key_shifts[None, :, r, None, :])  # shift [1, H, 1, dh]
        return keys

    def log_prior(self) -> Tensor | None:
        """log π [H, M], or None when the mechanism ignores π (hard E-step, M = 1)."""
        if self.prior == "learned":
            return self.pi_logits.log_softmax(dim=-1)
        if self.prior == "em":
            return self.pi.log()
        return None

    def mixture_weights(self) -> Tensor:
        """π [H, M] as probabilities (uniform where π is not used): for reports and tests."""
        log_pi = self.log_prior()
        if log_pi is None:
            return torch.full((self.num_heads, self.num_components), 1.0 / self.num_components)
        return log_pi.exp()

    def _keep_head_params(self, heads: Tensor) -> None:
        # keep_heads runs under no_grad; new Parameters replace the old ones (an optimizer is rebuilt after pruning)
        if "key_shifts" in self._parameters:
            self.key_shifts = nn.Parameter(self.key_shifts.index_select(0, heads).clone())
        if "pi_logits" in self._parameters:
            self.pi_logits = nn.Parameter(self.pi_logits.index_select(0, heads).clone())
        if "pi" in self._buffers:
            self.pi = self.pi.index_select(0, heads).clone()
