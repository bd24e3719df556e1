"""Users' own parallel data: fairseq-style text, TSV or JSON Lines, selected by config only.

Every problem raises :class:`DataError` naming the file, the line and the fix, because these
files come from outside and the user must be able to repair them without reading our code.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zoo.data.assemble import assemble
from zoo.data.text import remove_bpe as remove_bpe  # re-exported: remove_bpe is a files option
from zoo.data.types import SPLIT_NAMES, DataError, Example, Splits

log = logging.getLogger("zoo.data")

ORIGIN = "files"
FILES_DEFAULTS: dict[str, Any] = {
    "format": "text",
    "path": None,
    "src_lang": "de",
    "tgt_lang": "en",
    "splits": {"train": "train", "valid": "valid", "test": "test"},
    "src_col": 0,
    "tgt_col": 1,
    "header": None,
    "src_key": "src",
    "tgt_key": "tgt",
    "dedup": "none",
}


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file (BOM and ``\\r`` stripped; no trailing empty line).

    Splits on ``\\n`` only, unlike ``str.splitlines``, so exotic separators such as U+2028
    inside a sentence cannot shift parallel files out of alignment.
    """
    if not path.is_file():
        raise DataError(
            f"{path}: file not found. Create it or point data.path (and data.splits) at the "
            "directory holding your train/valid/test files."
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if raw.startswith(b"\xef\xbb\xbf") else 0)
        line = raw.count(b"\n", 0, start) + 1
        col = start - (raw.rfind(b"\n", 0, start) + 1) + 1
        raise DataError(
            f"{path}:{line}: byte 0x{raw[start]:02x} at column {col} is not valid UTF-8. "
            f"Re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 {path.name} > out`."
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    if not any(ln.strip() for ln in lines):
        raise DataError(f"{path}: file is empty. Put one example per line in it.")
    return lines


def _read_text(root: Path, stem: str, cfg: Mapping[str, Any]) -> list[Example]:
    src_path = root / f"{stem}.{cfg['src_lang']}"
    tgt_path = root / f"{stem}.{cfg['tgt_lang']}"
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)} (from line "
            f"{min(len(src), len(tgt)) + 1} on one file has no counterpart). Line i of each "
            "file must translate line i of the other; fix or regenerate the pair."
        )
    return [Example(s.strip(), t.strip(), ORIGIN) for s, t in zip(src, tgt, strict=True)]


def _column(spec: Any, header: list[str] | None, path: Path) -> int:
    if isinstance(spec, int):
        return spec
    if header is None:
        raise DataError(f"{path}: column {spec!r} given by name but the file has no header row")
    if spec not in header:
        raise DataError(
            f"{path}:1: header has no column named {spec!r} (columns: {header}); "
            "set data.src_col/data.tgt_col to a header name or a 0-based index."
        )
    return header.index(spec)


def _read_tsv(root: Path, stem: str, cfg: Mapping[str, Any]) -> list[Example]:
    path = root / f"{stem}.tsv"
    lines = read_lines(path)
    src_spec, tgt_spec = cfg["src_col"], cfg["tgt_col"]
    has_header = cfg["header"]
    if has_header is None:
        has_header = isinstance(src_spec, str) or isinstance(tgt_spec, str)
    header = lines[0].split("\t") if has_header else None
    src_col, tgt_col = _column(src_spec, header, path), _column(tgt_spec, header, path)
    need = max(src_col, tgt_col) + 1
    examples = []
    for lineno, line in enumerate(lines, start=1):
        if (has_header and lineno == 1) or not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < need:
            raise DataError(
                f"{path}:{lineno}: expected at least {need} tab-separated columns, found "
                f"{len(cols)}. Fix the row (fields must not contain tabs or newlines; no quoting "
                "is applied) or set data.src_col/data.tgt_col."
            )
        examples.append(Example(cols[src_col].strip(), cols[tgt_col].strip(), ORIGIN))
    if not examples:
        raise DataError(f"{path}: no data rows after the header. Add one example per line.")
    return examples


def _lookup(obj: Any, key: str, path: Path, lineno: int) -> str:
    """``obj[key]`` where a dotted key ("translation.de") walks nested objects."""
    value = obj
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            keys = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise DataError(
                f"{path}:{lineno}: key {key!r} missing (found {keys}). Add it to every line or "
                "set data.src_key/data.tgt_key (dotted keys reach nested objects)."
            )
        value = value[part]
    if not isinstance(value, str):
        raise DataError(f"{path}:{lineno}: value of {key!r} is {type(value).__name__}, expected a string")
    return value


def _read_jsonl(root: Path, stem: str, cfg: Mapping[str, Any]) -> list[Example]:
    path = root / f"{stem}.jsonl"
    examples = []
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno}). "
                "Each line must hold exactly one JSON object."
            ) from None
        if not isinstance(obj, dict):
            raise DataError(
                f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}. "
                'Each line must look like {"src": "...", "tgt": "..."}.'
            )
        src = _lookup(obj, cfg["src_key"], path, lineno)
        tgt = _lookup(obj, cfg["tgt_key"], path, lineno)
        examples.append(Example(src.strip(), tgt.strip(), ORIGIN))
    return examples


READERS = {"text": _read_text, "tsv": _read_tsv, "jsonl": _read_jsonl}


def build_files(cfg: Mapping[str, Any]) -> Splits:
    """Read ``{train,valid,test}`` from ``cfg["path"]`` in the configured format.

    A split whose file stem is set to null is left empty (with a warning), for users who have
    no test set yet.
    """
    fmt = cfg["format"]
    if fmt not in READERS:
        raise DataError(f"data.format={fmt!r} is not supported; use one of {sorted(READERS)}")
    if not cfg.get("path"):
        raise DataError(
            "data.path is not set. Point it at the directory with your files, e.g. "
            "data.path=/data/iwslt14 (expects train.de/train.en, valid.*, test.* for format=text)."
        )
    root = Path(str(cfg["path"])).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: data.path is not a directory. Fix data.path.")
    stems = {**FILES_DEFAULTS["splits"], **dict(cfg.get("splits") or {})}
    parts: dict[str, list[Example]] = {}
    for name in SPLIT_NAMES:
        stem = stems.get(name)
        if stem is None:
            log.warning("data.splits.%s is null: the %s split is empty", name, name)
            parts[name] = []
            continue
        parts[name] = READERS[fmt](root, str(stem), cfg)
    return assemble({ORIGIN: parts}, cfg["dedup"], {"path": str(root), "format": fmt})
