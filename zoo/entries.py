"""The zoo's model entries are the files of conf/model/ (DESIGN.md §3, R4–R5)."""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def list_entries() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def missing_model_message(command: str = "zoo.train") -> str:
    entries = "\n".join(f"  {e}" for e in list_entries())
    return (
        f"no model entry chosen. Run `python -m {command} +model=<entry>` with one of:\n{entries}\n"
        f"(e.g. python -m {command} +model=transformer)"
    )
