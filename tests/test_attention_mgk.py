"""MGK / sMGK attention (zoo.attention.mgk) against literal implementations of the paper's formulas.

References are written here from the formulas alone (per-pair loops in float64, the ‖q‖² term
kept), using only the module's weights — never its methods — so a shared mistake cannot hide.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from tests.zoo_testing import compose_train, random_batch, tiny_model
from zoo.attention import build_attention, reorder_cache
from zoo.attention.mgk import MixtureOfGaussianKeys
from zoo.flops import size_summary
from zoo.model import ModelConfig, build_model

D, H, DH = 12, 3, 5  # head_dim 5 ≠ d_model / H = 4: the fixed-head-size option must work
B, T, S = 2, 4, 5


def make(**options) -> MixtureOfGaussianKeys:
    torch.manual_seed(0)
    module = MixtureOfGaussianKeys(D, H, head_dim=DH, **options).double().eval()
    with torch.no_grad():
        for p in module.parameters():  # biases start at 0: make them matter
            if p.dim() == 1:
                p.normal_(0, 0.3)
        if "pi_logits" in dict(module.named_parameters()):
            module.pi_logits.normal_()
    return module


def heads(x: Tensor, layer: torch.nn.Linear) -> Tensor:
    # [B, L, D] -> [B, H, L, DH] with the layer's raw weights
    return F.linear(x, layer.weight, layer.bias).view(x.shape[0], x.shape[1], -1, DH).transpose(1, 2)


def reference_keys(module: MixtureOfGaussianKeys, x: Tensor) -> list[Tensor]:
    """k_r = x W_Kr + b_Kr (MGK) or x W_K + b_K + shift_r with shift_0 = 0 (sMGK)."""
    if module.shared_key:
        k = heads(x, module.k_proj)
        shifts = [torch.zeros(H, DH, dtype=x.dtype)]
        shifts += [module.key_shifts[:, r] for r in range(module.num_components - 1)]
        return [k + s[None, :, None, :] for s in shifts]
    names = ["k_proj"] + [f"k_proj{r}" for r in range(1, module.num_components)]
    return [heads(x, getattr(module, n)) for n in names]


def literal_attention(
    q: Tensor, keys: list[Tensor], v: Tensor, pi: Tensor | None, sigma2: float, valid: Tensor
) -> tuple[Tensor, Tensor]:
    """Per-pair loop of score(q_i, k_j) = log Σ_r π_r exp(−‖q_i − k_jr‖² / 2σ²) (pi=None: hard E-step,
    log max_r exp(…)), softmax over the valid keys j. valid [B, T, S]. Returns (heads [B, H, T, DH], A)."""
    b_, h_, t_, _ = q.shape
    s_ = v.shape[2]
    out = torch.zeros_like(q)
    attn = torch.zeros(b_, h_, t_, s_, dtype=q.dtype)
    for b in range(b_):
        for h in range(h_):
            for i in range(t_):
                scores = torch.full((s_,), -math.inf, dtype=q.dtype)
                for j in range(s_):
                    if not valid[b, i, j]:
                        continue
                    kernels = [torch.exp(-((q[b, h, i] - k[b, h, j]) ** 2).sum() / (2 * sigma2)) for k in keys]
                    if pi is None:
                        scores[j] = torch.log(max(kernels))
                    else:
                        scores[j] = torch.log(sum(pi[h, r] * kern for r, kern in enumerate(kernels)))
                a = scores.softmax(0)
                attn[b, h, i] = a
                out[b, h, i] = a @ v[b, h]
    return out, attn


def run_path(module: MixtureOfGaussianKeys, path: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(module output, query input, key/value input, valid [B, T, S]) for one of the three paths."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    if path == "encoder":
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[0, -2:] = True
        valid = (~pad)[:, None, :].expand(B, T, T)
        return module(x, key_padding_mask=pad), x, x, valid
    if path == "causal":
        valid = torch.ones(T, T, dtype=torch.bool).tril()[None].expand(B, T, T)
        return module(x, causal=True), x, x, valid
    memory = torch.randn(B, S, D, generator=g, dtype=torch.float64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, -3:] = True
    valid = (~pad)[:, None, :].expand(B, T, S)
    return module(x, memory, key_padding_mask=pad), x, memory, valid


def reference_output(
    module: MixtureOfGaussianKeys, x: Tensor, source: Tensor, valid: Tensor, pi: Tensor | None
) -> tuple[Tensor, Tensor]:
    q, v = heads(x, module.q_proj), heads(source, module.v_proj)
    out, attn = literal_attention(q, reference_keys(module, source), v, pi, module.sigma2, valid)
    merged = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], H * DH)
    return module.out_proj(merged), attn


# ------------------------------------------------------------------------------------------ formulas
def test_pi_one_zero_equals_single_gaussian_attention() -> None:
    module = make()
    with torch.no_grad():
        module.pi_logits.copy_(torch.tensor([[0.0, -math.inf]] * H))
    assert torch.equal(module.mixture_weights(), torch.tensor([[1.0, 0.0]] * H, dtype=torch.float64))
    assert module.sigma2 == math.sqrt(DH)  # default σ² = √D, D the head size
    with torch.no_grad():
        out, x, _, valid = run_path(module, "encoder")
        q, k, v = heads(x, module.q_proj), heads(x, module.k_proj), heads(x, module.v_proj)
        scores = -(torch.cdist(q, k) ** 2) / (2 * math.sqrt(DH))  # −‖q − k‖² / 2σ², [B, H, T, T]
        attn = scores.masked_fill(~valid[:, None], -math.inf).softmax(-1)
        expected = module.out_proj((attn @ v).transpose(1, 2).reshape(B, T, H * DH))
    assert torch.allclose(out, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("e_step", ["learned", "soft", "hard"])
def test_one_component_is_single_gaussian_attention(e_step: str) -> None:
    module = make(num_components=1, e_step=e_step).train()  # train: the soft E-step has nothing to update
    assert module.key_projections == ("k_proj", "v_proj") and module.log_prior() is None
    with torch.no_grad():
        out, x, source, valid = run_path(module, "cross")
        expected, _ = reference_output(module, x, source, valid, torch.ones(H, 1, dtype=torch.float64))
    assert torch.allclose(out, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("path", ["encoder", "causal", "cross"])
@pytest.mark.parametrize(
    "options",
    [{}, {"num_components": 3, "sigma2": 1.7}, {"shared_key": True}, {"shared_key": True, "num_components": 3}],
)
def test_matches_literal_per_pair_formula(path: str, options: dict) -> None:
    module = make(**options)
    with torch.no_grad():
        out, x, source, valid = run_path(module, path)
        expected, _ = reference_output(module, x, source, valid, module.pi_logits.softmax(-1))
    assert torch.allclose(out, expected, atol=1e-10, rtol=0)


def test_smgk_keys_are_shifted_copies_of_one_projection() -> None:
    module = make(shared_key=True, num_components=3)
    mgk = make(num_components=3)
    assert module.key_projections == ("k_proj", "v_proj") and not hasattr(module, "k_proj1")
    assert mgk.key_projections == ("k_proj", "k_proj1", "k_proj2", "v_proj")
    x = torch.randn(B, T, D, dtype=torch.float64)
    with torch.no_grad():
        kv = module.project_memory(x)
    assert set(kv) == {"k0", "k1", "k2", "v"}  # all key sets are cached (DESIGN §4)
    assert torch.allclose(kv["k0"], heads(x, module.k_proj), atol=1e-12)  # shift_0 = 0
    for r in (1, 2):
        assert torch.allclose(kv[f"k{r}"] - kv["k0"], module.key_shifts[None, :, r - 1, None, :].expand(B, H, T, DH))
    # shifts replace two key projections: 2·(D·H·DH + H·DH) weights become 2·H·DH
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n_params(mgk) - n_params(module) == 2 * (D * H * DH + H * DH) - 2 * H * DH


def test_pi_is_a_distribution_initialised_uniform() -> None:
    torch.manual_seed(0)
    module = MixtureOfGaussianKeys(D, H, num_components=2)
    assert torch.allclose(module.mixture_weights(), torch.full((H, 2), 0.5))  # paper: π init 0.5
    with torch.no_grad():
        module.pi_logits.normal_(0, 3)
    pi = module.mixture_weights()
    assert (pi > 0).all() and torch.allclose(pi.sum(-1), torch.ones(H))
    assert torch.allclose(MixtureOfGaussianKeys(D, H, num_components=4).mixture_weights(), torch.full((H, 4), 0.25))


# ------------------------------------------------------------------------------------------ E-steps
def _mean_responsibility(module: MixtureOfGaussianKeys, x: Tensor, source: Tensor, valid: Tensor, pi: Tensor) -> Tensor:
    """Paper Eqn. 11 by loop: γ_r = π_r N(q_i | k_jr) / Σ_r' π_r' N(q_i | k_jr'), averaged per head over
    the valid (query, key) pairs."""
    q, keys = heads(x, module.q_proj), reference_keys(module, source)
    total = torch.zeros(H, module.num_components, dtype=torch.float64)
    count = 0
    for b in range(B):
        for i in range(q.shape[2]):
            for j in range(source.shape[1]):
                if not valid[b, i, j]:
                    continue
                count += 1
                for h in range(H):
                    w = torch.stack(
                        [
                            pi[h, r] * torch.exp(-((q[b, h, i] - k[b, h, j]) ** 2).sum() / (2 * module.sigma2))
                            for r, k in enumerate(keys)
                        ]
                    )
                    total[h] += w / w.sum()
    return total / count


@pytest.mark.parametrize("path", ["encoder", "causal", "cross"])
def test_soft_e_step_sets_pi_to_mean_responsibility(path: str) -> None:
    module = make(e_step="soft")
    assert "pi" in dict(module.named_buffers()) and not any("pi" in n for n, _ in module.named_parameters())
    old = torch.tensor([[0.3, 0.7], [0.8, 0.2], [0.5, 0.5]], dtype=torch.float64)
    module.pi.copy_(old)
    module.train()  # dropout is 0: the only train/eval difference is the E-step
    with torch.no_grad():
        out, x, source, valid = run_path(module, path)
        if path == "encoder":  # padded queries of a self-attention sequence do not count either
            valid = valid & valid.transpose(1, 2)
        expected_pi = _mean_responsibility(module, x, source, valid, old)
    assert torch.allclose(module.pi, expected_pi, atol=1e-10, rtol=0)
    assert torch.allclose(module.pi.sum(-1), torch.ones(H, dtype=torch.float64))
    # the updated π is the one used by this forward (paper: "updated priors are then used in Eqn. (9)")
    with torch.no_grad():
        full_valid = run_path(module.eval(), path)[3]
        expected_out, _ = reference_output(module, x, source, full_valid, module.pi)
    assert torch.allclose(out, expected_out, atol=1e-10, rtol=0)
    # evaluation never moves π
    before = module.pi.clone()
    with torch.no_grad():
        run_path(module.eval(), path)
    assert torch.equal(module.pi, before)


@pytest.mark.parametrize("path", ["encoder", "causal", "cross"])
def test_hard_e_step_uses_max_over_components(path: str) -> None:
    module = make(e_step="hard", num_components=3)
    assert module.log_prior() is None and not any("pi" in n for n, _ in module.named_parameters())
    with torch.no_grad():
        out, x, source, valid = run_path(module, path)
        expected, _ = reference_output(module, x, source, valid, None)
    assert torch.allclose(out, expected, atol=1e-10, rtol=0)


# ------------------------------------------------------------------------------------------ contract
def test_capture_attention_map() -> None:
    module = make()
    module.capture = ("A", "V", "O")
    with torch.no_grad():
        _, x, source, valid = run_path(module, "cross")
        _, attn = reference_output(module, x, source, valid, module.pi_logits.softmax(-1))
    assert module.captured["A"].shape == (B, H, T, S)
    assert torch.allclose(module.captured["A"], attn, atol=1e-10, rtol=0)
    assert set(module.captured) == {"A", "V", "O"}


@pytest.mark.parametrize("options", [{}, {"shared_key": True}, {"e_step": "hard"}])
def test_incremental_cache_equals_full_pass(options: dict) -> None:
    module = make(**options)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    memory = torch.randn(B, S, D, generator=g, dtype=torch.float64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, -1] = True
    with torch.no_grad():
        full_self = module(x, causal=True)
        full_cross = module(x, memory, key_padding_mask=pad)
        self_cache: dict[str, Tensor] = {}
        cross_cache: dict[str, Tensor] = {}
        steps_self, steps_cross = [], []
        for i in range(T):
            steps_self.append(module(x[:, i : i + 1], causal=True, cache=self_cache))
            assert set(self_cache) == {"k0", "k1", "v"} and self_cache["k1"].shape == (B, H, i + 1, DH)
            cached = dict(cross_cache)
            steps_cross.append(module(x[:, i : i + 1], memory, key_padding_mask=pad, cache=cross_cache))
            if cached:  # memory projections are computed once per source
                assert all(cross_cache[n] is cached[n] for n in cached)
    assert torch.allclose(full_self, torch.cat(steps_self, 1), atol=1e-10, rtol=0)
    assert torch.allclose(full_cross, torch.cat(steps_cross, 1), atol=1e-10, rtol=0)
    order = torch.tensor([1, 1, 0])  # beam reordering: batch rows of every cached tensor
    before = {n: t.clone() for n, t in self_cache.items()}
    reorder_cache(self_cache, order)
    assert all(torch.equal(self_cache[n], before[n][order]) for n in before)


@pytest.mark.parametrize(
    "options",
    [{}, {"shared_key": True}, {"e_step": "soft"}, {"e_step": "hard"}, {"num_components": 3, "shared_key": True}],
)
def test_keep_heads_equals_gated_heads(options: dict) -> None:
    module = make(**options)
    if module.e_step == "soft":
        module.pi.copy_(torch.tensor([[0.3, 0.7], [0.8, 0.2], [0.5, 0.5]]))
    keep = [2, 0]
    pruned = copy.deepcopy(module)
    module.head_gate.copy_(torch.tensor([1.0, 0.0, 1.0]))
    pruned.keep_heads(keep)
    assert pruned.num_heads == 2 and pruned.q_proj.out_features == 2 * DH
    for name in pruned.key_projections:
        assert getattr(pruned, name).out_features == 2 * DH
    if "pi_logits" in dict(module.named_parameters()):
        assert torch.equal(pruned.pi_logits, module.pi_logits[keep])
    if module.shared_key:
        assert torch.equal(pruned.key_shifts, module.key_shifts[keep])
    if module.e_step == "soft":
        assert torch.equal(pruned.pi, module.pi[keep])
    for path in ("encoder", "causal", "cross"):
        with torch.no_grad():
            assert torch.allclose(run_path(module, path)[0], run_path(pruned, path)[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("e_step", ["soft", "hard"])
def test_e_step_variants_in_a_model(e_step: str) -> None:
    """The generic entry tests cover the learned E-step; the others must train and decode too."""
    options = {"num_components": 2, "shared_key": False, "e_step": e_step, "sigma2": None}
    model = tiny_model("mgk_4head", attention_options=options).train()
    src, tgt = random_batch()
    loss = F.cross_entropy(model(src, tgt).reshape(-1, 64), tgt.roll(-1, 1).reshape(-1))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    if e_step == "soft":
        pis = [m.pi for m in model.attention_modules().values()]
        assert any(not torch.allclose(pi, torch.full_like(pi, 0.5)) for pi in pis)  # π moved in training
    model.eval()
    with torch.no_grad():
        full = model(src, tgt)
        memory, pad = model.encode(src)
        state = model.init_state()
        steps = [model.decode(tgt[:, i : i + 1], memory, pad, state, offset=i) for i in range(tgt.shape[1])]
    assert torch.allclose(full, torch.cat(steps, 1), atol=1e-5, rtol=0)


def test_invalid_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="e_step"):
        build_attention("mgk", D, H, e_step="bogus")
    with pytest.raises(ValueError, match="num_components"):
        build_attention("mgk", D, H, num_components=0)
    with pytest.raises(ValueError, match="sigma2"):
        build_attention("mgk", D, H, sigma2=0.0)
    with pytest.raises(TypeError):
        build_attention("mgk", D, H, components=2)


# ------------------------------------------------------------------------------------------ size
@pytest.mark.parametrize("options", [{}, {"shared_key": True}, {"num_components": 3}])
def test_flops_match_torch_counter(options: dict) -> None:
    module = make(**options)
    x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, S, D, dtype=torch.float64)
    for args, (q_len, kv_len) in (((x,), (T, T)), ((x, memory), (T, S))):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(*args)
        assert module.flops(q_len, kv_len) * B == counter.get_total_flops()


def test_mgk_4head_is_smaller_than_the_8head_baseline() -> None:
    def summary(entry: str) -> dict:
        cfg = compose_train([f"+model={entry}", "size=small"]).model
        fields = {k: v for k, v in cfg.items() if k != "name"}
        fields["attention_options"] = dict(fields["attention_options"])
        torch.manual_seed(0)
        return size_summary(build_model(ModelConfig(vocab_size=1000, **fields)))

    base, mgk, smgk, mgk8 = (summary(e) for e in ("transformer", "mgk_4head", "smgk_4head", "mgk_8head"))
    assert mgk["params_excl_emb"] < base["params_excl_emb"] and mgk["flops"] < base["flops"]
    assert smgk["params_excl_emb"] < mgk["params_excl_emb"] and smgk["flops"] < mgk["flops"]
    assert mgk8["params_excl_emb"] > base["params_excl_emb"] and mgk8["flops"] > base["flops"]
