"""`python -m zoo.convert --from marian`: parity with transformers on an OPUS-MT-like random-init model (swish,
scale_embedding, tied embeddings, a final logits bias, decoding from pad) whose tokenizer is made from
sentencepiece models trained in the test; configs the zoo cannot represent exactly are refused, naming the field,
with nothing written.

transformers is the reference here (the `[hf]` extra, part of `dev`); the converter itself does not import it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

import export
import zoo
from export.exporter import export_checkpoint
from export.exporter import search_settings as export_search
from export.runtime.generation import best_tokens
from export.runtime.search import Search
from tests.convert_testing import (
    PAIRS,
    assert_refused,
    assert_served_equals_runtime,
    edit_config,
    edit_weights,
    generate_like_the_zoo,
    marian_tokenizer,
)
from tests.export_testing import export_config
from tests.zoo_testing import compose_train
from zoo.analyze.run import analyze
from zoo.api import Translator
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.convert.__main__ import main as convert_main
from zoo.convert.hf_files import read_safetensors
from zoo.data import DataError, SharedVocabTokenizer, load_tokenizer
from zoo.decoding.generate import generate as generate_nbest
from zoo.entries import CONF_DIR
from zoo.errors import ZooError
from zoo.evaluate import evaluate
from zoo.train import train
from zoo.translate import main as translate_main

transformers = pytest.importorskip("transformers", reason="the parity tests need the [hf] extra (part of dev)")
# MarianTokenizer's advice to install sacremoses for a punctuation normaliser it never applies when tokenizing
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

EOS_BIAS = 3.7  # the eos entry of the final logits bias: a random model then ends some outputs itself (lengths
# 1 … 19 of 19 at the settings below, greedy and beam), so natural, banned and forced eos are all compared
MAX_NEW = 20


def _opus_mt_like(tok: SharedVocabTokenizer):
    """A random-init MarianMTModel shaped like OPUS-MT's config, tiny: non-zero biases and layer norms and a random
    final logits bias, so every weight the conversion maps changes the output."""
    config = transformers.MarianConfig(
        vocab_size=tok.vocab_size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=tok.pad_id,
        eos_token_id=tok.eos_id,
        decoder_start_token_id=tok.pad_id,
        forced_eos_token_id=tok.eos_id,
        bad_words_ids=[[tok.pad_id]],
        init_std=0.3,  # peaked next-token distributions: no near-ties for the searches to break differently
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        model.final_logits_bias.normal_(0, 1)
        model.final_logits_bias[0, tok.eos_id] = EOS_BIAS
    return model


@pytest.fixture(scope="module")
def marian(tmp_path_factory) -> tuple[Path, object, object]:
    """(save_pretrained directory, the transformers model, its MarianTokenizer)."""
    directory = tmp_path_factory.mktemp("opus-mt-de-en")
    tok = marian_tokenizer()
    (directory / "source.spm").write_bytes(tok.source.serialized_model_proto())
    (directory / "target.spm").write_bytes(tok.target.serialized_model_proto())
    (directory / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(tok.vocab)}, ensure_ascii=False))
    hf_tok = transformers.MarianTokenizer(
        str(directory / "source.spm"), str(directory / "target.spm"), str(directory / "vocab.json")
    )
    hf_tok.save_pretrained(directory)
    model = _opus_mt_like(tok)
    model.generation_config.num_beams, model.generation_config.length_penalty = 4, 0.8  # carried into exports
    model.save_pretrained(directory)
    return directory, model, hf_tok


@pytest.fixture(scope="module")
def converted(marian, tmp_path_factory) -> Path:
    directory, _, _ = marian
    out = tmp_path_factory.mktemp("converted") / "opus.pt"
    heldout = tmp_path_factory.mktemp("heldout")
    (heldout / "src").write_text("\n".join(s for s, _ in PAIRS) + "\n")
    (heldout / "tgt").write_text("\n".join(t for _, t in PAIRS) + "\n")
    assert (
        convert_main(
            [
                "--from",
                "marian",
                str(directory),
                "--out",
                str(out),
                "--heldout",
                *map(str, [heldout / "src", heldout / "tgt"]),
            ]
        )
        == 0
    )
    return out


def test_checkpoint_is_self_contained(converted: Path) -> None:
    payload = load_checkpoint(converted)
    cfg = payload["model_config"]
    assert (cfg["activation"], cfg["positions"], cfg["scale_embedding"], cfg["final_logits_bias"]) == (
        "swish",
        "marian",
        True,
        True,
    )
    assert cfg["bos_id"] == cfg["pad_id"] and payload["entry"].startswith("opus-mt-de-en")
    assert payload["heldout"]["src"][0] == PAIRS[0][0] and payload["converted_from"]["format"] == "marian"
    assert "model.safetensors" in payload["converted_from"]["files"]
    assert isinstance(load_tokenizer(payload["tokenizer"]), SharedVocabTokenizer)
    assert payload["generation"] == {"beam_size": 4, "len_penalty": 0.8}  # generation_config.json's


def test_analyze_takes_the_converted_checkpoint(converted: Path, tmp_path: Path) -> None:
    """zoo.analyze on a converted model: its own tokenizer encodes the held-out pairs, and a decoder self-attention map
    covers every target token and the start position, which is pad here (a count of non-pad ids would drop it)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "analyze",
            [f"checkpoint={converted}", f"out={tmp_path}", "sentences=3", "threads=1", "figure_sentence=0"]
            + ["figure_module=decoder.layers.0.self_attn"],
        )
    analyze(cfg)
    modules = json.loads((tmp_path / "analysis.json").read_text())["modules"]
    targets = load_tokenizer(load_checkpoint(converted)["tokenizer"]).encode_targets([t for _, t in PAIRS[:3]])
    self_attn = modules["decoder.layers.0.self_attn"]
    assert self_attn["sizes"] == [len(t) + 1 for t in targets for _ in range(self_attn["heads"])]
    assert (tmp_path / "attention_maps_s0_decoder.layers.0.self_attn.png").stat().st_size > 1000


def test_export_search_defaults_are_the_command_lines_then_the_checkpoints(converted: Path, tmp_path: Path) -> None:
    """`python -m export`'s search defaults: generation.* given on the command line, else the checkpoint's own (a
    converted model's num_beams and length_penalty), else the zoo's — a checkpoint trained here carries none."""
    payload = load_checkpoint(converted)
    given = export_config(converted, tmp_path / "out", "generation.beam_size=2")
    assert export_search(given, payload) == Search(beam_size=2, len_penalty=0.8)
    plain = export_config(converted, tmp_path / "out")
    assert export_search(plain, payload) == Search(beam_size=4, len_penalty=0.8)
    assert export_search(plain, {}) == Search()


def test_tokenizer_equals_marian_tokenizer(marian, converted: Path) -> None:
    _, _, hf_tok = marian
    tok = load_tokenizer(load_checkpoint(converted)["tokenizer"])
    sources, targets = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    batch = hf_tok(sources, text_target=targets)
    assert tok.encode_sources(sources) == batch["input_ids"]
    assert [[*ids, tok.eos_id] for ids in tok.encode_targets(targets)] == batch["labels"]
    ids = tok.encode_targets(targets)
    assert [tok.decode(i) for i in ids] == hf_tok.batch_decode(ids, skip_special_tokens=True) == targets


def test_logits_equal_transformers(marian, converted: Path) -> None:
    """Teacher-forced logits of a padded batch, every non-padding position, to 1e-4."""
    _, hf_model, hf_tok = marian
    model = model_from_checkpoint(load_checkpoint(converted))
    batch = hf_tok([s for s, _ in PAIRS], text_target=[t for _, t in PAIRS], return_tensors="pt", padding=True)
    labels = batch["labels"]  # [B, T], padded with pad
    start = torch.full_like(labels[:, :1], hf_model.config.decoder_start_token_id)
    decoder_in = torch.cat([start, labels[:, :-1]], dim=1)  # [B, T]
    with torch.no_grad():
        theirs = hf_model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_in
        ).logits
        ours = model(batch["input_ids"], decoder_in)
    keep = labels.ne(hf_model.config.pad_token_id)  # [B, T]
    assert float((theirs - ours)[keep].abs().max()) <= 1e-4


@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_equal_generate(marian, converted: Path, beam: int) -> None:
    """The zoo's search equals generate() with the same settings: pad banned (OPUS-MT's bad_words_ids), eos banned
    before the first token, forced at the limit, length penalty 1 over tokens + eos, a sentence done when `beam`
    hypotheses finished (early_stopping=True); the beam's best hypothesis and its score too. (The n-best lists below
    the best may differ: when more hypotheses finish in one step than slots are left, fairseq's rule, the zoo's, keeps
    the earlier finished ones, transformers the best of old and new.)"""
    _, hf_model, hf_tok = marian
    model = model_from_checkpoint(load_checkpoint(converted))
    enc = hf_tok([s for s, _ in PAIRS], return_tensors="pt", padding=True)
    theirs, out = generate_like_the_zoo(hf_model, enc, beam, MAX_NEW)
    search = Search(beam_size=beam, len_penalty=1.0, max_len_a=0, max_len_b=MAX_NEW, min_len=1)
    best = [hyps[0] for hyps in generate_nbest(model, enc["input_ids"], search)]
    assert [h.tokens for h in best] == theirs == best_tokens(generate_nbest(model, enc["input_ids"], search))
    lengths = {len(h.tokens) for h in best}
    assert min(lengths) < MAX_NEW - 1 and max(lengths) == MAX_NEW - 1  # natural and forced ends both compared
    if beam > 1:
        np.testing.assert_allclose([h.score for h in best], out.sequences_scores.numpy(), atol=1e-4)


REPEAT_OPTIONS = {"no_repeat_ngram_size": 2, "repetition_penalty": 1.3}


def _hf_reference_greedy_score(hf_model, out, start: list[int], forced_last: bool) -> float:
    """generate() reports no score for greedy search: the reference is its own processors (repetition penalty,
    no-repeat n-grams) applied to its raw logits, log-softmaxed at the chosen tokens — the distribution it picked
    from, before its bans — summed and divided by the generated length (eos at the limit counts 0, as forced)."""
    ids = out.sequences[0].tolist()
    processors = transformers.LogitsProcessorList(
        [
            transformers.RepetitionPenaltyLogitsProcessor(REPEAT_OPTIONS["repetition_penalty"]),
            transformers.NoRepeatNGramLogitsProcessor(REPEAT_OPTIONS["no_repeat_ngram_size"]),
        ]
    )
    total, steps = 0.0, len(out.logits)
    for s, raw in enumerate(out.logits):
        so_far = torch.tensor([ids[: len(start) + s]])
        lp = torch.log_softmax(processors(so_far, raw.clone()), dim=-1)[0, ids[len(start) + s]]
        total += 0.0 if (forced_last and s == steps - 1) else float(lp)
    return total / steps


@pytest.mark.parametrize("beam", [1, 4])
def test_prefix_and_repetition_options_equal_generate(marian, converted: Path, beam: int) -> None:
    """A forced target prefix (generate()'s decoder_input_ids) of 1-3 tokens, no_repeat_ngram_size=2 and
    repetition_penalty=1.3: the best hypothesis (prefix included) and its score — over the tokens after the prefix
    — equal generate()'s, sentence by sentence (prefixes of different lengths). min_len and the length limit count
    the prefix (generate()'s min/max_new_tokens do not: set to match)."""
    _, hf_model, hf_tok = marian
    cfg = hf_model.config
    model = model_from_checkpoint(load_checkpoint(converted))
    targets = hf_tok(text_target=[t for _, t in PAIRS])["input_ids"]
    changed = 0
    for i, (source, _) in enumerate(PAIRS):
        prefix = [t for t in targets[i] if t not in (cfg.eos_token_id, cfg.pad_token_id)][: i % 3 + 1]
        enc = hf_tok([source], return_tensors="pt")
        start = [cfg.decoder_start_token_id, *prefix]
        with torch.no_grad():
            out = hf_model.generate(
                **enc,
                decoder_input_ids=torch.tensor([start]),
                num_beams=beam,
                max_new_tokens=MAX_NEW,
                min_new_tokens=1,
                do_sample=False,
                bad_words_ids=[[cfg.pad_token_id]],
                forced_eos_token_id=cfg.eos_token_id,
                early_stopping=True,
                length_penalty=1.0,
                output_scores=True,
                output_logits=True,
                return_dict_in_generate=True,
                **REPEAT_OPTIONS,
            )
        theirs = []
        for t in out.sequences[0].tolist()[1:]:
            if t in (cfg.eos_token_id, cfg.pad_token_id):
                break
            theirs.append(t)
        search = Search(
            beam_size=beam,
            len_penalty=1.0,
            max_len_a=0,
            max_len_b=len(prefix) + MAX_NEW,
            min_len=len(prefix) + 1,
            **REPEAT_OPTIONS,
        )
        ours = generate_nbest(model, enc["input_ids"], search, [prefix])[0][0]
        assert ours.tokens == theirs
        assert ours.tokens[: len(prefix)] == prefix
        if beam > 1:
            expected = float(out.sequences_scores[0])
        else:
            expected = _hf_reference_greedy_score(hf_model, out, start, len(theirs) == len(prefix) + MAX_NEW - 1)
        assert ours.score == pytest.approx(expected, abs=1e-4)
        plain = replace(search, no_repeat_ngram_size=0, repetition_penalty=1.0)
        changed += generate_nbest(model, enc["input_ids"], plain, [prefix])[0][0].tokens != ours.tokens
    assert changed >= 2  # the options changed outputs: the comparison is not the plain search's again


def test_zoo_commands_take_the_converted_checkpoint(converted: Path, tmp_path: Path, capsys) -> None:
    """zoo.translate and zoo.evaluate (on files: a converted model has no corpus of ours, and split=test says so in
    one line) take the checkpoint as they take a trained one."""
    sources = [s for s, _ in PAIRS[:3]]
    assert translate_main(["--checkpoint", str(converted), "--beam", "2", *sources]) == 0
    printed = capsys.readouterr().out.splitlines()
    translator = Translator.from_checkpoint(str(converted))
    assert printed == translator.translate(sources, beam_size=2)
    # the decoding options as flags: a prefix per sentence, the repetition options, sampling with a seed
    prefixes = [t.split()[0] for _, t in PAIRS[:3]]
    flags = ["--beam", "1", "--sampling", "--top-p", "0.9", "--seed", "3", "--no-repeat-ngram-size", "2"]
    assert translate_main(["-c", str(converted), *flags, *[f"--prefix={p}" for p in prefixes], *sources]) == 0
    sampled = capsys.readouterr().out.splitlines()
    options = {"sampling": 1, "top_p": 0.9, "seed": 3, "no_repeat_ngram_size": 2}
    assert sampled == translator.translate(sources, beam_size=1, target_prefix=prefixes, **options)
    assert all(out.startswith(p) for out, p in zip(sampled, prefixes, strict=True))
    (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(t for _, t in PAIRS[:3]) + "\n")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        base = [f"checkpoint={converted}", f"out={tmp_path / 'eval'}", "generation.beam_size=2"]
        on_files = compose("evaluate", [*base, f"src={tmp_path / 'src.txt'}", f"ref={tmp_path / 'ref.txt'}"])
        on_split = compose("evaluate", [*base, "split=test"])
        samples = [f"generation.{k}={v}" for k, v in options.items()]
        sampling = compose(
            "evaluate",
            [
                *base,
                "generation.beam_size=1",
                *samples,
                "nbest=4",
                f"src={tmp_path / 'src.txt'}",
                f"ref={tmp_path / 'ref.txt'}",
            ],
        )
    assert evaluate(on_files)["n"] == 3
    evaluate(sampling)  # back-translation's use: 4 samples per source, in the n-best file
    lines = (tmp_path / "eval" / "src_nbest.txt").read_text().splitlines()
    drawn = translator.translate(sources, beam_size=1, num_hypotheses=4, len_penalty=1.0, **options)  # evaluate's
    assert lines == [f"{i} ||| {h.text} ||| {h.score:.6f}" for i, hyps in enumerate(drawn) for h in hyps]
    with pytest.raises(DataError, match="converted pretrained model with no corpus; pass src=FILE ref=FILE"):
        evaluate(on_split)


def test_pytorch_model_bin_converts_alike(marian, converted: Path, tmp_path: Path) -> None:
    """pytorch_model.bin instead of safetensors: the same checkpoint weights (read with weights_only=True)."""
    directory, hf_model, _ = marian
    copy = tmp_path / "bin"
    shutil.copytree(directory, copy)
    (copy / "model.safetensors").unlink()
    state = hf_model.state_dict()
    assert "model.encoder.embed_positions.weight" in state  # the stored table is checked against Marian's
    torch.save(state, copy / "pytorch_model.bin")
    assert convert_main(["--from", "marian", str(copy), "--out", str(tmp_path / "bin.pt")]) == 0
    ours, ref = load_checkpoint(tmp_path / "bin.pt")["model"], load_checkpoint(converted)["model"]
    assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)


def test_safetensors_reader_equals_the_library(marian, tmp_path: Path) -> None:
    """zoo.convert reads safetensors itself (no transformers, no safetensors package needed): the same tensors as
    the library's reader, for the model's file and for every dtype a checkpoint may hold."""
    library = pytest.importorskip("safetensors.torch")
    directory, _, _ = marian
    mixed = {
        f"t.{dtype}".replace("torch.", ""): torch.arange(6, dtype=torch.float32).reshape(2, 3).to(dtype)
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.bool)
    }
    mixed["empty"] = torch.zeros(0, 4)
    library.save_file(mixed, str(tmp_path / "mixed.safetensors"))
    for path in (directory / "model.safetensors", tmp_path / "mixed.safetensors"):
        ours, theirs = read_safetensors(path), library.load_file(str(path))
        assert ours.keys() == theirs.keys()
        assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in theirs), path


REFUSED = {
    "normalize_before": (lambda d: edit_config(d, normalize_before=True), "normalize_before=True (pre-norm layers)"),
    "layernorm_embedding": (lambda d: edit_config(d, layernorm_embedding=True), "layernorm_embedding=True"),
    "add_final_layer_norm": (lambda d: edit_config(d, add_final_layer_norm=True), "add_final_layer_norm=True"),
    "static_position_embeddings": (
        lambda d: edit_config(d, static_position_embeddings=False),
        "static_position_embeddings=False (learned positions)",
    ),
    "activation": (lambda d: edit_config(d, activation_function="gelu_new"), "activation_function='gelu_new'"),
    "decoder_start": (lambda d: edit_config(d, decoder_start_token_id=0), "decoder_start_token_id=0"),
    "separate_embeddings": (
        lambda d: edit_config(d, share_encoder_decoder_embeddings=False),
        "share_encoder_decoder_embeddings=False",
    ),
    "untied_output": (lambda d: edit_config(d, tie_word_embeddings=False), "tie_word_embeddings=False"),
    "decoder_heads": (lambda d: edit_config(d, decoder_attention_heads=2), "decoder_attention_heads=2"),
    "separate_vocabs": (
        lambda d: (d / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True})),
        "separate_vocabs=True",
    ),
    "num_beams": (
        lambda d: (d / "generation_config.json").write_text(json.dumps({"num_beams": 0})),
        "generation_config.json: num_beams=0 cannot be the zoo's beam_size",
    ),
    "extra_weight": (
        lambda d: edit_weights(d, lambda s: s.update({"model.encoder.layernorm_embedding.weight": torch.ones(32)})),
        "weight 'model.encoder.layernorm_embedding.weight' has no counterpart",
    ),
    "learned_positions": (
        lambda d: edit_weights(d, lambda s: s.update({"model.decoder.embed_positions.weight": torch.randn(64, 32)})),
        "weight 'model.decoder.embed_positions.weight' is not Marian's sinusoidal position table",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unrepresentable_configs_are_refused(marian, tmp_path: Path, capsys, case: str) -> None:
    """One line on stderr naming the field (or weight or file), exit status 2, and no checkpoint written."""
    assert_refused("marian", marian[0], tmp_path, capsys, *REFUSED[case])


GHT_PS_FROM_PRETRAINED = [
    "+model=ght_ps",
    "trainer=smoke",
    "data=files",
    "data.name=smoke",
    "data.max_len=60",
    "trainer.max_updates=16",
    "trainer.validate_every=8",
    "trainer.max_tokens=1024",
    "model.ght.check_every=8",
    "model.ght.vote_batches=3",
    "model.ght.vote_at=8",
    "evaluate_test=false",
]


def test_ght_ps_trains_from_the_converted_model(converted: Path, smoke_corpus: Path, tmp_path: Path) -> None:
    """`init=`: GHT-PS's three stages on the converted model's tokenizer, architecture and weights — group-constrained
    training from update 0 (not voting first, as init_from= does), then voting and fine-tuning."""
    source = load_checkpoint(converted)
    overrides = [*GHT_PS_FROM_PRETRAINED, f"init={converted}", f"data.path={smoke_corpus}", f"runs_root={tmp_path}"]
    summary = train(compose_train(overrides))
    run = Path(summary["run_dir"])
    assert (run / "tokenizer.model").read_bytes() == source["tokenizer"]
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    architecture = {k: v for k, v in last["model_config"].items() if k != "head_plan"}
    assert architecture == {k: v for k, v in source["model_config"].items() if k != "head_plan"}
    # the final logits bias is a buffer no update touches: equal to the converted one only if init= loaded it
    assert torch.equal(last["model"]["final_logits_bias"], source["model"]["final_logits_bias"])
    assert last["initialised_from"]["converted_from"]["format"] == "marian"
    assert last["generation"] == source["generation"] == {"beam_size": 4, "len_penalty": 0.8}  # exports start there
    votes = json.loads((run / "ght" / "votes.json").read_text())
    assert votes["trigger"] == "reached vote_at=8" and votes["voting_batches"] == 3
    plan = summary["head_plan"]
    assert len(plan) == 6 and all(len(kept) == 2 for kept in plan.values())  # 4 heads, C = 2: one per group
    assert last["train_state"]["step"] == 16 and last["procedure"]["stage"] == "finetune"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["+model=mgk_4head"], r"attention='mha' \(entry mgk_4head: 'mgk'\).*pick an entry that has it \(.*ght_ps"),
        (["+model=ght_ps", "init_from=elsewhere.pt"], "init= and init_from= both given"),
    ],
)
def test_init_with_an_entry_that_cannot_take_the_weights_is_refused(
    converted: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    with pytest.raises(ZooError, match=message):
        train(compose_train([*extra, f"init={converted}", f"runs_root={tmp_path}"]))
    assert not list(tmp_path.iterdir())  # refused before a run directory exists


@pytest.fixture(scope="module")
def pruned(converted: Path, tmp_path_factory) -> tuple[Path, dict]:
    """(export directory, manifest) of `python -m export checkpoint=<converted> keep_heads=2`."""
    out = tmp_path_factory.mktemp("pruned") / "export"
    return out, export_checkpoint(export_config(converted, out, "keep_heads=2", "verify.sentences=8"))


def test_export_prunes_heads_by_importance(converted: Path, pruned: tuple[Path, dict]) -> None:
    """`python -m export checkpoint=<converted> keep_heads=2`: Michel et al.'s importance on the converted
    checkpoint's held-out pairs keeps 2 of 4 heads per module, removed physically; the export verifies (ORT = torch
    to 1e-4, identical greedy and beam hypotheses) and its manifest names the pruned heads of every module."""
    out, manifest = pruned
    assert manifest["name"] == f"{load_checkpoint(converted)['entry']}-pretrained"
    assert manifest["verification"]["passed"], json.dumps(manifest["verification"])[:2000]
    assert manifest["head_plan_source"] == "importance:heldout:keep_heads=2" and manifest["heads_removed"]
    assert len(manifest["heads"]) == 2 + 2 * 2  # encoder self; decoder self and cross, 2 layers each
    for module, heads in manifest["heads"].items():
        assert heads["num_heads"] == len(heads["kept"]) == len(heads["pruned"]) == 2, module
        assert sorted(heads["kept"] + heads["pruned"]) == [0, 1, 2, 3], module
        assert heads["kept"] == manifest["head_plan"][module]
    assert manifest["size"]["params_excl_emb_ratio"] < 1
    # the model's own search defaults (generation_config.json) are the export's: no generation.* was given
    assert (manifest["generation"]["beam_size"], manifest["generation"]["len_penalty"]) == (4, 0.8)
    assert isinstance(load_tokenizer((out / manifest["tokenizer"]).read_bytes()), SharedVocabTokenizer)
    translations = export.load(out, threads=1).translate([s for s, _ in PAIRS[:3]], beam_size=2)
    assert len(translations) == 3 and all(isinstance(t, str) for t in translations)


def test_zoo_load_searches_with_the_checkpoint_s_defaults_as_export_load(
    converted: Path, pruned: tuple[Path, dict], capsys
) -> None:
    """Issue 67: zoo.load(converted) translates and scores with the converted model's num_beams and length_penalty
    (4, 0.8) unless told otherwise — the search defaults export.load takes from the manifest — and so does
    zoo.translate without flags."""
    out, _ = pruned
    model = zoo.load(str(converted))
    assert model.search == export.load(out, threads=1).search == Search(beam_size=4, len_penalty=0.8)
    sources, targets = [s for s, _ in PAIRS[:3]], [t for _, t in PAIRS[:3]]
    own = model.translate(sources, return_scores=True)  # scores are normalised with the length penalty used
    assert own == model.translate(sources, beam_size=4, len_penalty=0.8, return_scores=True)
    assert own != model.translate(sources, beam_size=Search().beam_size, len_penalty=1.0, return_scores=True)
    assert model.score(sources, targets) == model.score(sources, targets, len_penalty=0.8)
    assert translate_main(["--checkpoint", str(converted), *sources]) == 0
    assert capsys.readouterr().out.splitlines() == [hyps[0].text for hyps in own]


def test_served_pruned_model_equals_the_runtime(pruned: tuple[Path, dict], tmp_path: Path) -> None:
    """serve.repository + serve.start + the client: the pruned converted model served by Triton (Python backend,
    the runtime's shared-vocabulary tokenizer inside it) returns the in-process runtime's texts, one request at a
    time (so that no dynamic batch mixes requests: tests/test_serve.py)."""
    out, manifest = pruned
    assert_served_equals_runtime(out, manifest, [s for s, _ in PAIRS[:4]], tmp_path)
