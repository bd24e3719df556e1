"""Shared helpers of the tests of converted pretrained models: a tiny parallel text, source and target
sentencepiece models trained on it in memory, a Marian-style vocabulary over both (OPUS-MT's layout: eos 0,
unk 1, every piece of either model, pad last), and edits of a save_pretrained directory."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import sentencepiece as spm
import torch

from export.runtime.tokenizer import SharedVocabTokenizer
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
