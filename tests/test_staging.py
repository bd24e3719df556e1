"""export/staging.py: a directory is built beside its target and swapped in so that the target never disappears,
the old one is deleted only after the new one is in place, and a failure leaves the old one and no temp dir."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from export import staging
from export.staging import staged_directory


class Refused(Exception):
    pass


def _model_dir(path: Path, text: str) -> None:
    (path / "1").mkdir(parents=True, exist_ok=True)
    (path / "config.pbtxt").write_text(text)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _exchange_works(directory: Path) -> bool:
    a, b = directory / "probe-a", directory / "probe-b"
    a.mkdir()
    b.mkdir()
    try:
        return staging.exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()


def test_publish_into_a_new_target(tmp_path) -> None:
    target = tmp_path / "model"
    with staged_directory(target, overwrite=False) as stage:
        assert stage.path.parent == tmp_path and stage.path.name.startswith(".model.tmp-")
        _model_dir(stage.path, "new")
        stage.publish()
    assert (target / "config.pbtxt").read_text() == "new"
    assert _names(tmp_path) == ["model"]


def test_replacing_needs_overwrite_and_a_refusal_leaves_everything_as_it_was(tmp_path) -> None:
    target = tmp_path / "model"
    _model_dir(target, "old")
    with pytest.raises(Refused, match="model"):
        with staged_directory(target, overwrite=False, exists_error=lambda p: Refused(str(p))) as stage:
            _model_dir(stage.path, "new")
            stage.publish()
    assert (target / "config.pbtxt").read_text() == "old"
    assert _names(tmp_path) == ["model"]


def test_a_failure_while_building_leaves_the_old_directory_and_no_temp_dir(tmp_path) -> None:
    target = tmp_path / "model"
    _model_dir(target, "old")
    with pytest.raises(RuntimeError, match="verification failed"):
        with staged_directory(target, overwrite=True) as stage:
            _model_dir(stage.path, "half")
            raise RuntimeError("verification failed")
    assert (target / "config.pbtxt").read_text() == "old"
    assert _names(tmp_path) == ["model"]
    with staged_directory(target, overwrite=True) as stage:  # leaving without publish() discards too
        _model_dir(stage.path, "unpublished")
    assert (target / "config.pbtxt").read_text() == "old"
    assert _names(tmp_path) == ["model"]


def test_staging_elsewhere_and_the_directory_mode(tmp_path) -> None:
    repo, target = tmp_path / "repo", tmp_path / "repo" / "model"
    repo.mkdir()
    _model_dir(target, "old")
    with staged_directory(target, overwrite=True, staging_dir=tmp_path, mode=0o755) as stage:
        assert stage.path.parent == tmp_path  # a server polling `repo` never sees the temp dir
        _model_dir(stage.path, "new")
        stage.publish()
    assert (target / "config.pbtxt").read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o755
    assert _names(repo) == ["model"] and _names(tmp_path) == ["repo"]  # the old one deleted, not left aside


def test_a_non_directory_target_is_never_replaced(tmp_path) -> None:
    target = tmp_path / "model"
    target.write_text("a file")
    with pytest.raises(NotADirectoryError):
        with staged_directory(target, overwrite=True) as stage:
            stage.publish()
    assert target.read_text() == "a file"
    assert _names(tmp_path) == ["model"]


def test_a_symlinked_target_is_replaced_without_deleting_what_it_pointed_to(tmp_path) -> None:
    real, target = tmp_path / "real", tmp_path / "model"
    _model_dir(real, "linked")
    target.symlink_to(real)
    with staged_directory(target, overwrite=True) as stage:
        _model_dir(stage.path, "new")
        stage.publish()
    assert not target.is_symlink() and (target / "config.pbtxt").read_text() == "new"
    assert (real / "config.pbtxt").read_text() == "linked"
    assert _names(tmp_path) == ["model", "real"]


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "rename-aside"])
def test_the_old_directory_is_deleted_only_after_the_new_one_is_in_place(tmp_path, monkeypatch, exchange) -> None:
    if exchange and not _exchange_works(tmp_path):
        pytest.skip("this system or filesystem has no atomic exchange (renameat2 RENAME_EXCHANGE)")
    if not exchange:
        monkeypatch.setattr(staging, "exchange", lambda a, b: False)
    target = tmp_path / "model"
    _model_dir(target, "old")
    (target / "old-only").write_text("x")
    seen = []
    remove = staging._remove

    def checked_remove(path: Path) -> None:
        seen.append(((target / "config.pbtxt").read_text(), (path / "config.pbtxt").read_text()))
        remove(path)

    monkeypatch.setattr(staging, "_remove", checked_remove)
    with staged_directory(target, overwrite=True) as stage:
        _model_dir(stage.path, "new")
        stage.publish()
    assert seen == [("new", "old")]  # when the old directory is deleted, the new one already is the target
    assert (target / "config.pbtxt").read_text() == "new" and not (target / "old-only").exists()
    assert _names(tmp_path) == ["model"]


def test_rename_aside_puts_the_old_directory_back_when_renaming_in_fails(tmp_path, monkeypatch) -> None:
    """The fallback's steps are old → aside, new → in, delete old; a failure injected between the first two
    (renaming the new one in fails) restores the old directory and removes the staged one."""
    monkeypatch.setattr(staging, "exchange", lambda a, b: False)
    target = tmp_path / "model"
    _model_dir(target, "old")
    rename = Path.rename
    steps = []

    def failing_rename(self: Path, destination):
        steps.append((self.name.split("-")[0], Path(destination).name.split("-")[0]))
        if self.name.startswith(".model.tmp-"):
            raise OSError("injected: renaming the new directory in failed")
        return rename(self, destination)

    monkeypatch.setattr(Path, "rename", failing_rename)
    with pytest.raises(OSError, match="injected"):
        with staged_directory(target, overwrite=True) as stage:
            _model_dir(stage.path, "new")
            stage.publish()
    assert steps == [("model", ".model.old"), (".model.tmp", "model"), (".model.old", "model")]
    assert (target / "config.pbtxt").read_text() == "old"
    assert _names(tmp_path) == ["model"]


def test_the_target_exists_throughout_repeated_swaps(tmp_path) -> None:
    """A reader polling target/config.pbtxt (as Triton's repository poller would) while the directory is
    replaced again and again always finds one: complete, old or new, never missing."""
    if not _exchange_works(tmp_path):
        pytest.skip("this system or filesystem has no atomic exchange (renameat2 RENAME_EXCHANGE)")
    target = tmp_path / "model"
    _model_dir(target, "0")
    stop = threading.Event()
    polls, missing = [0], []

    def poll() -> None:
        while not stop.is_set():
            try:
                text = (target / "config.pbtxt").read_text()
            except FileNotFoundError:
                missing.append(polls[0])
            else:
                assert text.isdigit()
            polls[0] += 1

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for i in range(1, 301):
            with staged_directory(target, overwrite=True) as stage:
                _model_dir(stage.path, str(i))
                stage.publish()
    finally:
        stop.set()
        reader.join()
    assert not missing, f"target missing in {len(missing)} of {polls[0]} polls"
    assert polls[0] > 0 and (target / "config.pbtxt").read_text() == "300"
    assert _names(tmp_path) == ["model"]
