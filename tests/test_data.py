"""Tests of the data layer: corpus parsing rules, user files, splits, tokenizer and batching.

Everything runs on small constructed inputs in a few seconds, except the one ``debian``-marked
integration test that builds the real corpora (cached after its first run).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from zoo.data import (
    DataError,
    Example,
    Splits,
    Tokenizer,
    build_splits,
    remove_bpe,
    train_run_tokenizer,
)
from zoo.data import build as build_mod
from zoo.data.batching import Batch, TokenBatchSampler, collate, encode_examples
from zoo.data.corpora import DEEN_DEFAULTS, SUMM_DEFAULTS, build_deen, build_summ
from zoo.data.ddtp import (
    family_key,
    join_translations,
    long_description_paragraphs,
    parse_source_map,
    parse_translation,
)
from zoo.data.ding import clean_side, parse_line, parse_lines
from zoo.data.lohelp import align_pages, element_text, page_paragraphs
from zoo.data.splitting import assign_splits, remove_overlap
from zoo.data.text import normalize_for_dedup

# --------------------------------------------------------------------------------------- Ding


def test_ding_keeps_sentence_subentries_and_cleans_them() -> None:
    line = (
        "Absicht {f} | Das war nicht meine Absicht. | Ich wollte/möchte nicht unhöflich sein [ugs.]. "
        ":: intention | Such was not my intention. | I did not want/mean to be rude [coll.]."
    )
    assert parse_line(line) == [
        ("Das war nicht meine Absicht.", "Such was not my intention."),
        ("Ich wollte nicht unhöflich sein.", "I did not want to be rude."),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "# Version :: devel 2023",  # comment
        "Haus {n} :: house",  # headword, not a sentence
        "Das ist gut. :: That is good.",  # fewer than 4 German words
        "Das ist sehr gut.; Das ist prima. :: That is very good.",  # ';' alternatives
        "Ich gehe jetzt nach Hause. | extra :: I am going home now.",  # sub-entry counts differ
        "Ich gehe jetzt nach Hause :: I am going home now.",  # German side lacks .!?
    ],
)
def test_ding_rejects_non_sentences(line: str) -> None:
    assert parse_line(line) == []


def test_ding_cleaning_rules() -> None:
    assert clean_side("Er hat jdm./etw. geholfen {vt} [adm.].") == "Er hat jdm. geholfen."
    assert clean_side("He / It is late.") == "He is late."
    assert clean_side("Am 17/09 war es.") == "Am 17/09 war es."  # digits are not alternatives


def test_ding_dedups_repeated_pairs() -> None:
    line = "x | Wo ist der Bahnhof bitte? :: x | Where is the station, please?"
    assert list(parse_lines([line, line])) == [("Wo ist der Bahnhof bitte?", "Where is the station, please?")]


# ----------------------------------------------------------------------------- LibreOffice help

FIXTURES = Path(__file__).resolve().parent / "data_fixtures"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_xhp_alignment_by_id() -> None:
    # tables.xhp exists in both languages; only_de.xhp has no English page and is ignored
    dropped: dict[str, int] = {}
    triples = list(align_pages(FIXTURES / "lohelp/de", FIXTURES / "lohelp/en-US", dropped))
    assert dropped == {"untranslated": 1, "repeated": 0, "unpaired": 0}
    assert triples == [
        ("text/swriter/tables.xhp", "Tabellen einfügen", "Inserting Tables"),
        ("text/swriter/tables.xhp", "Wählen Sie Einfügen – Tabelle.", "Choose Insert - Table."),
        # par_id3 is identical in both languages (untranslated) → dropped; par_id4 has no partner
        ("text/swriter/tables.xhp", "Drücken Sie Strg+C & fertig.", "Press Ctrl+C & done."),
    ]


def test_html_help_pages_keep_default_switch_case() -> None:
    markup = (
        '<p id="par_id9" class="paragraph">Choose <span class="switchinline">'
        '<span hidden="true" id="MACtext_1" class="MAC">LibreOffice - Preferences</span>'
        '<span hidden="true" id="defaulttext_1">Tools - Options</span></span> - General.<br></p>'
        '<h2 id="hd_id7">Title</h2><p class="embedded">no id</p>'
    )
    assert page_paragraphs(markup) == {"par_id9": "Choose Tools - Options - General.", "hd_id7": "Title"}
    assert element_text("a<!-- c -->b&lt;c") == "ab<c"


# --------------------------------------------------------------------------------------- DDTP

_TRANS_EN = """Package: foo
Description-md5: aaa
Description-en: fast widget library
 Foo is a library for drawing widgets quickly on many
 different toolkits.
 .
 This package contains the runtime.

Package: foo-doc
Description-md5: bbb
Description-en: documentation for foo
 Foo is a library.
 .
 This package contains the documentation.
 .
 Features:
   * fast
   * small

Package: bar
Description-md5: ccc
Description-en: bar tool
 Bar does things.
"""
_TRANS_DE = """Package: foo
Description-md5: aaa
Description-de: schnelle Widget-Bibliothek
 Foo ist eine Bibliothek zum schnellen Zeichnen von Widgets
 mit vielen Toolkits.
 .
 Dieses Paket enthält die Laufzeitumgebung.

Package: foo-doc
Description-md5: bbb
Description-de: Dokumentation für foo
 Foo ist eine Bibliothek. Dieses Paket enthält die Dokumentation.

Package: baz
Description-md5: zzz
Description-de: nicht im Englischen
 Ohne Partner.
"""


def test_ddtp_description_normalisation() -> None:
    lines = [" First line", " continues here.", " .", "   * verbatim item", "  * another", " ."]
    assert long_description_paragraphs(lines) == ("First line continues here.", "* verbatim item * another")
    en = parse_translation(_TRANS_EN, "en")
    assert en["bbb"].synopsis == "documentation for foo"
    assert en["bbb"].paragraphs[-1] == "Features: * fast * small"
    assert en["aaa"].long_text == (
        "Foo is a library for drawing widgets quickly on many different toolkits. This package contains the runtime."
    )


def test_ddtp_join_on_md5() -> None:
    pairs = join_translations(parse_translation(_TRANS_DE, "de"), parse_translation(_TRANS_EN, "en"))
    assert pairs == [
        ("foo", "schnelle Widget-Bibliothek", "fast widget library"),
        (
            "foo",
            "Foo ist eine Bibliothek zum schnellen Zeichnen von Widgets mit vielen Toolkits.",
            "Foo is a library for drawing widgets quickly on many different toolkits.",
        ),
        ("foo", "Dieses Paket enthält die Laufzeitumgebung.", "This package contains the runtime."),
        # bbb: paragraph counts differ (1 vs 3) → synopsis only; zzz/ccc: no partner
        ("foo-doc", "Dokumentation für foo", "documentation for foo"),
    ]


def test_family_key_groups_related_packages() -> None:
    assert {family_key(n) for n in ("libfoo1", "libfoo-dev", "foo-doc", "python3-foo", "foo")} == {"foo"}
    assert family_key("libgtk-3-0") == family_key("libgtk-3-dev") == "gtk"
    assert family_key("0ad") == "0ad"
    assert parse_source_map("Package: libfoo1\nSource: foo (1.2-1)\n\nPackage: bar\n") == {
        "libfoo1": "foo",
        "bar": "bar",
    }


# ------------------------------------------------------------------- Debian builders (faked apt)


class FakeArchive:
    """Stands in for DebianArchive: constructed index texts and package directories."""

    def __init__(self, root: Path, translations: Mapping[str, str], packages: str = "") -> None:
        self.root, self.translations, self.packages = root, translations, packages

    def translation_texts(self, lang: str) -> list[str]:
        return [self.translations[lang]]

    def packages_texts(self) -> list[str]:
        return [self.packages]

    def package(self, name: str) -> Path:
        return self.root / name


def _name(i: int) -> str:
    """Letters only: digits at the end of a package name are stripped as soname/version tails."""
    return "".join(chr(97 + int(d)) for d in f"{i:02d}")


def _summ_archive(tmp_path: Path, families: int = 60) -> FakeArchive:
    records = []
    words = " ".join(f"word{i}" for i in range(40))
    for f in map(_name, range(families)):
        for member in (f"libfam{f}-1", f"libfam{f}-dev", f"fam{f}-doc"):
            records.append(
                f"Package: {member}\nDescription-md5: {member}-md5\nDescription-en: {member} synopsis\n"
                f" {member} is part of family {f}. {words}\n .\n More text about {member}.\n"
            )
    records.append("Package: tiny\nDescription-md5: t\nDescription-en: too short\n Only a few words.\n")
    return FakeArchive(tmp_path, {"en": "\n".join(records)})


def test_summ_split_keeps_families_together(tmp_path: Path) -> None:
    cfg = {**SUMM_DEFAULTS, "valid_size": 20, "test_size": 30}
    splits = build_summ(cfg, _summ_archive(tmp_path))  # type: ignore[arg-type]
    assert splits.stats["filtered"]["short_description"] == 1
    where: dict[str, set[str]] = {}
    for name in ("train", "valid", "test"):
        for ex in splits.split(name):
            fam = ex.src.split("family ")[1].split(".")[0]
            where.setdefault(fam, set()).add(name)
            assert ex.tgt.endswith("synopsis") and len(ex.src.split()) >= 30
    assert all(len(s) == 1 for s in where.values())
    assert 27 <= len(splits.test) <= 33 and 18 <= len(splits.valid) <= 22
    assert len(splits) == 180


def _deen_archive(tmp_path: Path) -> FakeArchive:
    ding = ["# Version :: test"]
    for i in range(120):
        ding.append(f"Wort{i} {{n}} | Das ist der Satz Nummer {i}. :: word{i} | This is sentence number {i}.")
    _write(tmp_path / "trans-de-en/root/usr/share/trans/de-en", "\n".join(ding) + "\n")
    for lang, text in (("de", "Absatz"), ("en-US", "Paragraph")):
        root = tmp_path / f"libreoffice-help-{'de' if lang == 'de' else 'en-us'}/root/usr/share/libreoffice/help"
        for page in range(40):
            body = "".join(f'<p id="par_id{k}">{text} {k} auf Seite {page}</p>' for k in range(3))
            _write(root / lang / f"text/page{page}.html", f"<html><body>{body}</body></html>")
    de = "\n".join(
        f"Package: pkg{_name(i)}\nDescription-md5: m{i}\nDescription-de: Werkzeug {i}\n Beschreibung {i}.\n"
        for i in range(90)
    )
    en = "\n".join(
        f"Package: pkg{_name(i)}\nDescription-md5: m{i}\nDescription-en: tool {i}\n Description {i}.\n"
        for i in range(90)
    )
    return FakeArchive(tmp_path, {"de": de, "en": en})


def test_deen_build_is_deterministic_and_document_disjoint(tmp_path: Path) -> None:
    cfg = {**DEEN_DEFAULTS, "valid_size": 30, "test_size": 60}
    a = build_deen(cfg, _deen_archive(tmp_path))  # type: ignore[arg-type]
    b = build_deen(cfg, _deen_archive(tmp_path))  # type: ignore[arg-type]
    assert (a.train, a.valid, a.test) == (b.train, b.valid, b.test)
    assert a.stats["parsed"] == {"ding": 120, "libreoffice": 120, "ddtp": 180}
    assert set(a.stats["filtered"]) == {"ding", "libreoffice", "ddtp"}
    json.dumps(a.stats)  # stats must stay JSON-serialisable
    counts = a.stats["counts"]
    assert all(counts[s]["test"] > 0 and counts[s]["valid"] > 0 for s in ("ding", "libreoffice", "ddtp"))
    # every LibreOffice page lives in exactly one split
    pages: dict[str, set[str]] = {}
    for name in ("train", "valid", "test"):
        for ex in a.split(name):
            if ex.origin == "libreoffice":
                pages.setdefault(ex.src.split("Seite ")[1], set()).add(name)
    assert all(len(s) == 1 for s in pages.values())
    reverse = build_deen({**cfg, "src_lang": "en", "tgt_lang": "de"}, _deen_archive(tmp_path))  # type: ignore[arg-type]
    assert reverse.test[0] == Example(a.test[0].tgt, a.test[0].src, a.test[0].origin)


def test_deen_rejects_unknown_source(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data\.sources"):
        build_deen({**DEEN_DEFAULTS, "sources": ["wiki"]}, _deen_archive(tmp_path))  # type: ignore[arg-type]


# ------------------------------------------------------------------------- splitting and dedup


def test_assign_splits_is_deterministic_and_group_disjoint() -> None:
    items = [(f"doc{i // 3}", Example(f"s{i}", f"t{i}", "x")) for i in range(300)]
    a = assign_splits(items, valid_size=20, test_size=30)
    assert a == assign_splits(list(items), valid_size=20, test_size=30)
    assert 30 <= len(a["test"]) <= 33 and 20 <= len(a["valid"]) <= 22
    docs = {name: {int(ex.src[1:]) // 3 for ex in exs} for name, exs in a.items()}
    assert not (docs["train"] & docs["test"]) and not (docs["train"] & docs["valid"])
    assert sum(len(v) for v in a.values()) == 300


def test_dedup_removes_normalised_overlap() -> None:
    train = [Example("Hallo, Welt!", "Hello, world!", "x"), Example("Guten Tag", "Good day", "x")]
    test = [
        Example("hallo welt", "Hi there", "x"),  # source matches after normalisation
        Example("Neu", "GOOD DAY.", "x"),  # target matches
        Example("Ganz neu", "Brand new", "x"),
        Example("Ganz neu", "Brand new", "x"),  # repeat inside test
    ]
    kept, removed = remove_overlap(train, test, "either")
    assert kept == [Example("Ganz neu", "Brand new", "x")] and removed == 3
    kept, removed = remove_overlap(train, test, "pair")
    assert len(kept) == 3 and removed == 1
    assert normalize_for_dedup("  Über-Größe… „ja“ ") == "übergröße ja"


# ---------------------------------------------------------------------- build_splits + caching


def test_build_splits_caches_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_builder(cfg: Mapping[str, Any], archive: object) -> Splits:
        calls.append(cfg)
        if cfg["test_size"] == 13:
            raise RuntimeError("interrupted")
        ex = Example("ä", "b", "ding")
        return Splits([ex], [ex], [ex], {"counts": {}})

    monkeypatch.setitem(build_mod.CACHED_BUILDERS, "deen", (fake_builder, DEEN_DEFAULTS))
    cfg = {"name": "deen", "test_size": 12}
    first = build_splits(cfg, cache_dir=tmp_path)
    second = build_splits(cfg, cache_dir=tmp_path)
    assert len(calls) == 1 and second.train == first.train == [Example("ä", "b", "ding")]
    [cache] = [p for p in (tmp_path / "corpora").iterdir() if not p.name.startswith(".")]
    assert sorted(p.name for p in cache.iterdir()) == [
        "config.json", "stats.json", "test.jsonl", "train.jsonl", "valid.jsonl",
    ]  # fmt: skip
    assert json.loads((cache / "config.json").read_text())["test_size"] == 12
    # a failing build leaves no cache entry that looks complete, so the next run rebuilds
    with pytest.raises(RuntimeError):
        build_splits({"name": "deen", "test_size": 13}, cache_dir=tmp_path)
    assert len([p for p in (tmp_path / "corpora").iterdir() if not p.name.startswith(".")]) == 1
    # vocab_size / max_len do not change the corpus, so they reuse the cache
    build_splits({**cfg, "vocab_size": 123, "max_len": 7}, cache_dir=tmp_path)
    assert len(calls) == 2


def test_missing_apt_suggests_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DataError, match=r"apt-get.*data=files"):
        build_splits({"name": "summ"}, cache_dir=tmp_path)


def test_unknown_kind() -> None:
    with pytest.raises(DataError, match=r"data\.kind"):
        build_splits({"name": "nope"})


# ------------------------------------------------------------------------------ users' files


def _text_corpus(root: Path) -> None:
    for split, n in (("train", 3), ("valid", 2), ("test", 2)):
        _write(root / f"{split}.de", "".join(f"Satz {i} über Größe\n" for i in range(n)))
        _write(root / f"{split}.en", "".join(f"sentence {i} about size\r\n" for i in range(n)))


def test_files_text_format(tmp_path: Path) -> None:
    _text_corpus(tmp_path)
    splits = build_splits({"name": "files", "path": str(tmp_path), "src_lang": "de", "tgt_lang": "en"})
    assert [len(splits.train), len(splits.valid), len(splits.test)] == [3, 2, 2]
    assert splits.train[1] == Example("Satz 1 über Größe", "sentence 1 about size", "files")
    assert splits.stats["counts"]["files"] == {"train": 3, "valid": 2, "test": 2}
    assert splits.stats["overlap_removed"]["test_overlap_kept"] == 2  # dedup=none keeps, but counts


def test_files_tsv_and_jsonl_formats(tmp_path: Path) -> None:
    for split in ("train", "valid", "test"):
        _write(tmp_path / f"{split}.tsv", "id\tde\ten\n1\tHallo\tHello\n\n2\tTschüss\tBye\n")
        _write(
            tmp_path / f"{split}.jsonl",
            '{"translation": {"de": "Hallo", "en": "Hello"}}\n\n{"translation": {"de": "Ja", "en": "Yes"}}\n',
        )
    tsv = build_splits({"name": "files", "format": "tsv", "path": str(tmp_path), "src_col": "de", "tgt_col": "en"})
    assert tsv.train == [Example("Hallo", "Hello", "files"), Example("Tschüss", "Bye", "files")]
    by_index = build_splits(
        {"name": "files", "format": "tsv", "path": str(tmp_path), "src_col": 2, "tgt_col": 1, "header": True}
    )
    assert by_index.valid[0] == Example("Hello", "Hallo", "files")
    jsonl = build_splits(
        {
            "name": "files",
            "format": "jsonl",
            "path": str(tmp_path),
            "src_key": "translation.de",
            "tgt_key": "translation.en",
            "splits": {"test": None},
        }
    )
    assert jsonl.train[1] == Example("Ja", "Yes", "files") and jsonl.test == []


def _files_error(tmp_path: Path, fmt: str = "text", **cfg: Any) -> str:
    with pytest.raises(DataError) as info:
        build_splits({"name": "files", "format": fmt, "path": str(tmp_path), **cfg})
    return str(info.value)


def test_files_errors_name_file_line_and_fix(tmp_path: Path) -> None:
    assert "data.path is not set" in _files_error(tmp_path, path=None)
    _text_corpus(tmp_path)
    (tmp_path / "test.en").unlink()
    msg = _files_error(tmp_path)
    assert "test.en: file not found" in msg and "data.path" in msg

    _text_corpus(tmp_path)
    _write(tmp_path / "valid.de", "\n  \n")
    assert "valid.de: file is empty" in _files_error(tmp_path)

    _text_corpus(tmp_path)
    _write(tmp_path / "train.en", "one\ntwo\n")
    msg = _files_error(tmp_path)
    assert "train.de has 3 lines but" in msg and "train.en has 2" in msg and "line 3" in msg

    _text_corpus(tmp_path)
    (tmp_path / "train.de").write_bytes("gut\nzwei\nGr\xf6\xdfe\n".encode("latin-1"))
    msg = _files_error(tmp_path)
    assert "train.de:3:" in msg and "0xf6" in msg and "iconv" in msg


def test_files_tsv_and_jsonl_errors(tmp_path: Path) -> None:
    for split in ("train", "valid", "test"):
        _write(tmp_path / f"{split}.tsv", "a\tb\nc\td\n")
        _write(tmp_path / f"{split}.jsonl", '{"src": "a", "tgt": "b"}\n')
    _write(tmp_path / "valid.tsv", "a\tb\nonly-one-column\n")
    msg = _files_error(tmp_path, "tsv")
    assert "valid.tsv:2:" in msg and "tab-separated" in msg
    assert "train.tsv:1: header has no column named 'de'" in _files_error(tmp_path, "tsv", src_col="de")

    _write(tmp_path / "test.jsonl", '{"src": "a", "tgt": "b"}\n{"src": "a", tgt: 1}\n')
    msg = _files_error(tmp_path, "jsonl")
    assert "test.jsonl:2: invalid JSON" in msg
    _write(tmp_path / "test.jsonl", '{"src": "a", "tgt": "b"}\n\n{"source": "a", "tgt": "b"}\n')
    msg = _files_error(tmp_path, "jsonl")
    assert "test.jsonl:3: key 'src' missing" in msg and "data.src_key" in msg
    _write(tmp_path / "test.jsonl", '["a", "b"]\n')
    assert "test.jsonl:1: expected a JSON object" in _files_error(tmp_path, "jsonl")
    _write(tmp_path / "test.jsonl", '{"src": 1, "tgt": "b"}\n')
    assert "test.jsonl:1: value of 'src' is int" in _files_error(tmp_path, "jsonl")


def test_remove_bpe() -> None:
    assert remove_bpe("Hal@@ lo Wel@@ t !") == "Hallo Welt !"
    assert remove_bpe("ends with@@") == "ends with"  # fairseq appends " " first, so a final "@@" goes too
    assert remove_bpe("ends wi@@ ") == "ends wi"
    assert remove_bpe("\u2581Hal lo \u2581Welt", "sentencepiece") == "Hallo Welt"
    assert remove_bpe("unchanged@@ text", None) == "unchanged@@ text"


# -------------------------------------------------------------------------------- tokenizer

_CORPUS = [
    "Grüße aus München, sagte die Bäckerin.",
    "Über den Fluss führt eine große Brücke.",
    "The quick brown fox jumps over the lazy dog.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "Please keep the lawn clean and do not litter!",
    "Hello! Ähnlich öde Ölfässer, ÜBERALL ÄÖÜ.",
] * 4


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train(_CORPUS, vocab_size=120, seed=0)


def test_tokenizer_deterministic_and_roundtrips(tokenizer: Tokenizer) -> None:
    again = Tokenizer.train(list(_CORPUS), vocab_size=120, seed=0)
    assert again.model_bytes == tokenizer.model_bytes
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    for text in ("Grüße aus München.", "Über große Brücken!", "Äöü ÄÖÜ ß"):
        ids = tokenizer.encode(text)
        assert tokenizer.unk_id not in ids  # character_coverage=1.0 keeps every seen character
        assert tokenizer.decode(ids) == text
    ids = tokenizer.encode("Zwölf")
    assert tokenizer.decode([tokenizer.bos_id, *ids, tokenizer.eos_id, tokenizer.pad_id]) == "Zwölf"
    assert tokenizer.encode_batch(["Zwölf", "Deich"]) == [ids, tokenizer.encode("Deich")]
    clone = Tokenizer.from_bytes(tokenizer.model_bytes)
    assert clone.encode("Bäckerin") == tokenizer.encode("Bäckerin") and clone.vocab_size == tokenizer.vocab_size


def test_a_run_tokenizer_is_trained_once_per_text_and_seed_and_then_read_from_the_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pairs = [Example(src=a, tgt=b, origin="t") for a, b in zip(_CORPUS[::2], _CORPUS[1::2], strict=True)]
    cfg = {"vocab_size": 120, "tokenizer": "unigram", "cache_dir": str(tmp_path)}
    first = train_run_tokenizer(pairs, cfg, seed=0)
    trained = Tokenizer.train([p.src for p in pairs] + [p.tgt for p in pairs], vocab_size=120, seed=0)
    assert first.model_bytes == trained.model_bytes  # what training on the same texts and seed gives
    [cached] = (tmp_path / "tokenizers").glob("*.model")
    with caplog.at_level(logging.INFO, logger="zoo.data"):
        again = train_run_tokenizer(pairs, cfg, seed=0)
    assert again.model_bytes == first.model_bytes and "read from the cache" in caplog.text
    train_run_tokenizer(pairs, cfg, seed=1)  # another seed is another tokenizer
    assert len(list((tmp_path / "tokenizers").glob("*.model"))) == 2 and cached.is_file()


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_tokenizer_vocab_too_large_for_tiny_corpus(model_type: str) -> None:
    tok = Tokenizer.train(["Hallo Welt.", "Grüße!"], vocab_size=8000, model_type=model_type)
    assert 4 < tok.vocab_size < 8000
    assert tok.decode(tok.encode("Grüße Welt.")) == "Grüße Welt."


def test_tokenizer_errors() -> None:
    with pytest.raises(DataError, match="empty corpus"):
        Tokenizer.train(["", "  "], vocab_size=10)
    with pytest.raises(DataError, match="sentencepiece"):
        Tokenizer.from_bytes(b"not a model")
    with pytest.raises(DataError, match=r"set data\.vocab_size to at least"):
        Tokenizer.train(["abcdefghijklmnopqrstuvwxyz"], vocab_size=8)


# --------------------------------------------------------------------------------- batching


def test_encode_examples_filters_long_and_empty(tokenizer: Tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    examples = [Example("Grüße", "Hello", "x"), Example("", "empty source", "x"), Example(_CORPUS[3], "x", "x")]
    with caplog.at_level(logging.INFO, logger="zoo.data"):
        pairs, dropped = encode_examples(examples, tokenizer, max_len=8)
    assert dropped == 2 and len(pairs) == 1 and "dropped 2 of 3" in caplog.text
    assert pairs[0] == (tokenizer.encode("Grüße"), tokenizer.encode("Hello"))
    cut, dropped = encode_examples(examples, tokenizer, max_len=8, truncate=True)
    assert dropped == 1 and len(cut[1][0]) == 8 and len(cut[1][1]) <= 7


def _lengths(n: int = 500) -> tuple[list[int], list[int]]:
    import random

    rng = random.Random(0)
    return [rng.randint(1, 60) for _ in range(n)], [rng.randint(1, 60) for _ in range(n)]


def test_sampler_deterministic_and_covers_every_index() -> None:
    src, tgt = _lengths()
    a = TokenBatchSampler(src, tgt, max_tokens=400, seed=3)
    b = TokenBatchSampler(src, tgt, max_tokens=400, seed=3)
    assert a.batches(5) == b.batches(5) and a.batches(5) != a.batches(6)
    assert a.batches(5) != TokenBatchSampler(src, tgt, max_tokens=400, seed=4).batches(5)
    for epoch in range(3):
        batches = a.batches(epoch)
        assert sorted(i for batch in batches for i in batch) == list(range(500))
        for batch in batches:
            longest = max(max(src[i], tgt[i] + 1) for i in batch)
            assert len(batch) * longest <= 400
    # resume mid-epoch: regenerating the epoch and skipping k batches gives the same rest
    assert TokenBatchSampler(src, tgt, max_tokens=400, seed=3).batches(2)[7:] == a.batches(2)[7:]
    a.set_epoch(1)
    assert list(a) == a.batches(1) and len(a) == len(a.batches(1))


def test_sampler_max_sentences_and_no_shuffle() -> None:
    src, tgt = _lengths()
    s = TokenBatchSampler(src, tgt, max_tokens=10_000, max_sentences=16, shuffle=False)
    batches = s.batches(0)
    assert all(len(b) <= 16 for b in batches) and s.batches(1) == batches
    tgt_sorted = [tgt[i] for b in batches for i in b]
    assert tgt_sorted == sorted(tgt_sorted)  # no shuffle: batches ordered by length
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBatchSampler([5, 100], [5, 5], max_tokens=50)


def test_sampler_ddp_shards_disjoint_and_equal() -> None:
    src, tgt = _lengths()
    for remainder in ("drop", "pad"):
        s = TokenBatchSampler(src, tgt, max_tokens=300, seed=1, remainder=remainder)
        shards = [s.batches(4, rank=r, world_size=3) for r in range(3)]
        assert len({len(sh) for sh in shards}) == 1
        total = len(s.batches(4))
        expected = total // 3 if remainder == "drop" else -(-total // 3)
        assert len(shards[0]) == expected
        if remainder == "drop":
            seen = [i for sh in shards for b in sh for i in b]
            assert len(seen) == len(set(seen))
    with pytest.raises(ValueError):
        s.batches(0, rank=3, world_size=3)


def test_collate_shapes_and_padding() -> None:
    pairs = [([5, 6, 7], [8]), ([9], [10, 11, 12])]
    batch = collate(pairs, pad_id=0, bos_id=2, eos_id=3)
    assert batch.src.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert batch.tgt_in.tolist() == [[2, 8, 0, 0], [2, 10, 11, 12]]
    assert batch.tgt_out.tolist() == [[8, 3, 0, 0], [10, 11, 12, 3]]
    assert batch.src.dtype == torch.long and batch.ntokens == 6 and batch.nsentences == 2
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.tgt_out, batch.tgt_out)
    with pytest.raises(ValueError):
        collate([], 0, 2, 3)


# ---------------------------------------------------------------- real corpora (Debian apt)


def _norm_sources(examples: list[Example]) -> set[str]:
    return {normalize_for_dedup(ex.src) for ex in examples}


@pytest.mark.debian
def test_real_debian_corpora() -> None:
    """Builds deen and summ from Debian packages into the user cache (slow only the first time)."""
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "conf" / "data"
    deen = build_splits(OmegaConf.load(conf / "deen.yaml"))
    counts = deen.stats["counts"]
    assert 60_000 < counts["total"]["train"] < 120_000
    for source in ("ding", "libreoffice", "ddtp"):
        assert counts[source]["train"] > 10_000
        assert 250 < counts[source]["valid"] and 350 < counts[source]["test"]
    assert 900 < len(deen.valid) <= 1100 and 1300 < len(deen.test) <= 1650
    train_src = _norm_sources(deen.train)
    assert not train_src & _norm_sources(deen.test) and not train_src & _norm_sources(deen.valid)
    assert not _norm_sources(deen.test) & _norm_sources(deen.valid)

    summ = build_splits(OmegaConf.load(conf / "summ.yaml"))
    assert 35_000 < len(summ.train) < 60_000 and 900 < len(summ.valid) and 1300 < len(summ.test)
    assert all(len(ex.src.split()) >= 30 for ex in summ.test)
    assert not _norm_sources(summ.train) & _norm_sources(summ.test)
