"""One-off measurement scripts, kept because stored numbers were made with them (`results/h200/README.md` names
which script wrote which file). Each runs as `python -m zoo.devtools.<name> …` on a machine that has the
repository; they are not part of the library: nothing imports them, and they may import anything (`zoo`,
`export`), so they sit above every layer of `zoo/__init__.py`'s layering.
"""
