"""Shared helpers of the tests of converted pretrained models (Marian, FSMT): a tiny parallel text, source and
target sentencepiece models trained on it in memory, a Marian-style vocabulary over both (OPUS-MT's layout: eos 0,
unk 1, every piece of either model, pad last), edits of a save_pretrained directory, and the checks both families
pass alike — generate() with the zoo's search rules, a refused conversion, a served export."""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

import export
from export.runtime.tokenizer import SharedVocabTokenizer
from serve.client import Client
from serve.model_config import ModelSettings
from serve.repository import write_repository
from serve.server import Server
from zoo.convert.__main__ import main as convert_main
from zoo.convert.hf_files import read_safetensors
from zoo.convert.marian import marian_vocabulary

_DE = (
    "Das Haus ist klein .|Der Hund schläft im Garten .|Ich trinke gern Kaffee am Morgen .|Wir fahren morgen nach "
    "Berlin .|Die Katze sitzt auf dem Dach .|Heute ist das Wetter schön .|Er liest ein altes Buch .|Sie kauft "
    "frisches Brot beim Bäcker .|Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich .|Öffnen Sie "
    "bitte das Fenster .|Das Konzert beginnt um acht Uhr .|Meine Schwester wohnt in Hamburg ."
).split("|")
_EN = (
    "The house is small .|The dog sleeps in the garden .|I like to drink coffee in the morning .|We are going to "
    "Berlin tomorrow .|The cat sits on the roof .|The weather is nice today .|He reads an old book .|She buys fresh "
    "bread at the baker .|Twelve boxers chase Viktor across the great Sylt dike .|Please open the window .|The "
    "concert starts at eight o'clock .|My sister lives in Hamburg ."
).split("|")
PAIRS: list[tuple[str, str]] = list(zip(_DE, _EN, strict=True))


def train_sentencepiece(texts: list[str], vocab_size: int, seed: int = 0) -> bytes:
    """A unigram model trained in memory (as OPUS-MT's: <unk> 0, <s> 1, </s> 2, no pad)."""
    spm.set_random_generator_seed(seed)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts * 4),
        model_writer=buf,
        vocab_size=vocab_size,
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return buf.getvalue()


def marian_tokenizer(source_vocab: int = 60, target_vocab: int = 60) -> SharedVocabTokenizer:
    """The test pairs' source and target models sharing one vocabulary."""
    source = train_sentencepiece([s for s, _ in PAIRS], source_vocab)
    target = train_sentencepiece([t for _, t in PAIRS], target_vocab, seed=1)
    return SharedVocabTokenizer(source, target, marian_vocabulary(source, target))


def shuffled_pairs(seed: int = 0) -> list[tuple[str, str]]:
    pairs = list(PAIRS)
    random.Random(seed).shuffle(pairs)
    return pairs


def edit_config(directory: Path, **fields) -> None:
    """Change fields of a save_pretrained directory's config.json."""
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **fields}))


def edit_weights(directory: Path, edit) -> None:
    """Apply `edit` to a save_pretrained directory's weights, rewritten as pytorch_model.bin."""
    state = read_safetensors(directory / "model.safetensors")
    edit(state)
    (directory / "model.safetensors").unlink()
    torch.save(state, directory / "pytorch_model.bin")


def generate_like_the_zoo(hf_model, enc, beam: int, max_new: int) -> tuple[list[list[int]], object]:
    """transformers' generate() under the zoo's search rules — pad banned, eos banned before the first token and
    forced at the limit, length penalty 1, a sentence done when `beam` hypotheses finished — as token lists after
    the decoder start up to eos, and the raw output (its sequences_scores)."""
    cfg = hf_model.config
    with torch.no_grad():
        out = hf_model.generate(
            **enc,
            num_beams=beam,
            max_new_tokens=max_new,
            min_new_tokens=1,
            do_sample=False,
            bad_words_ids=[[cfg.pad_token_id]],
            forced_eos_token_id=cfg.eos_token_id,
            early_stopping=True,
            length_penalty=1.0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    rows = []
    for row in out.sequences.tolist():
        tokens = []
        for t in row[1:]:  # after the decoder start
            if t in (cfg.eos_token_id, cfg.pad_token_id):
                break
            tokens.append(t)
        rows.append(tokens)
    return rows, out


def assert_refused(family: str, directory: Path, tmp_path: Path, capsys, edit, named: str) -> None:
    """`zoo.convert --from family` on a copy of `directory` changed by `edit`: one line on stderr naming the field
    (or weight, or file), exit status 2, and no checkpoint written."""
    copy = tmp_path / "model"
    shutil.copytree(directory, copy)
    edit(copy)
    out = tmp_path / "out.pt"
    with pytest.raises(SystemExit) as exit_info:
        convert_main(["--from", family, str(copy), "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err and err.count("\n") == 1, err
    assert not out.exists() and list(tmp_path.glob("*.pt*")) == []


def assert_served_equals_runtime(out: Path, manifest: dict, sources: list[str], tmp_path: Path) -> None:
    """serve.repository + serve.start + the client on export `out`: the served texts equal the in-process runtime's,
    greedy and beam 2, one request at a time (so that no dynamic batch mixes requests: tests/test_serve.py)."""
    repo = tmp_path / "repo"
    assert write_repository([out], repo, ModelSettings(instance_count=1, threads=1)) == [manifest["name"]]
    local = export.load(out, threads=1)
    server = Server.start(repo, http_port=0, grpc_port=0, metrics_port=0)
    try:
        client = Client(server.info.http_url, model=manifest["name"])
        for beam in (1, 2):
            assert [client.translate([s], beam_size=beam)[0] for s in sources] == local.translate(
                sources, beam_size=beam
            )
    finally:
        server.stop()
