"""The torch-free runtime's loading and memory: self-contained imports, the host-owned self-attention store and
its pool, shared weights, providers, and exports it refuses.

Every export here runs with one thread (`runtime.threads=1`): the two cores are shared.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import export
from export import graph as export_graph
from export import runtime as rt
from export.bench import threads as bench_threads
from export.graph import CacheSpec
from export.onnx_files import APART_MIN_BYTES
from export.runtime.generation import padded, search_batch
from tests.zoo_testing import REPO


def test_runtime_imports_no_torch_and_stays_self_contained(exported) -> None:
    out, _ = exported("transformer")
    code = (
        "import sys, export, export.runtime as r\n"
        f"m = r.load({str(out)!r}, threads=1)\n"
        "assert all(isinstance(t, str) for t in m.translate(['Guten Morgen.', 'Das Haus ist klein.']))\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'zoo', 'hydra', 'omegaconf', 'onnx'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # one package, standard library + numpy + onnxruntime + sentencepiece (+ sacremoses, FSMT only), its modules
    # importing each other relatively: copied as is into a Triton model, under its own import path
    trees = [ast.parse(f.read_text()) for f in sorted((REPO / "export" / "runtime").glob("*.py"))]
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for tree in trees
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom) and not (isinstance(n, ast.ImportFrom) and n.level)
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert imported <= {
        "__future__",
        "ctypes",  # glibc's malloc_trim after loading (a no-op elsewhere)
        "hashlib",
        "json",
        "math",
        "mmap",  # the self-attention stores' own mappings
        "os",
        "threading",  # the store pool's lock
        "weakref",  # a freed SelfCache gives its buffers back
        "collections",
        "dataclasses",
        "pathlib",
        "typing",
        "numpy",
        "onnxruntime",
        "sentencepiece",
        "base64",  # a shared-vocabulary tokenizer document holds its two sentencepiece models (tokenizer.py)
        "concurrent",  # throughput mode's worker threads (replicas.py)
        "queue",  # and its free copies
        "zipfile",  # a shortlist file is an .npz (a zip of .npy arrays); a damaged one raises BadZipFile
        "itertools",  # BPE's adjacent pairs (moses_bpe.py)
        "sacremoses",  # a converted FSMT model's Moses tokenizer, imported only when one is loaded (moses_bpe.py)
    }, imported


def test_self_cache_store_and_history_are_concatenation_then_index_select() -> None:
    """The host-owned self cache against its definition: each step appends the graph's new position and
    `select` picks rows (beam reordering, finished sentences leaving). What the decoder graph gathers from
    `feeds()` (export.graph.past, the graph's own code) must be that cache, over 40 steps with duplicate rows,
    shrinking and growing batches (wider than the store: renumbered cells) and store growth from 2 positions;
    running sums (no position axis) are replaced, then reordered."""
    rng = np.random.default_rng(0)
    dicts = [
        {"name": "k", "kind": "self", "layer": 0, "key": "k", "shape": ["batch", 2, "steps", 3], "dtype": "float32"},
        {"name": "s", "kind": "self", "layer": 0, "key": "s", "shape": ["batch", 2, 3], "dtype": "float32"},
    ]
    specs = [CacheSpec(**{**d, "shape": tuple(d["shape"])}) for d in dicts]
    rows = 6
    cache = rt.SelfCache(dicts, rows, steps=2)
    ref_k, ref_sums = np.zeros((rows, 2, 0, 3), np.float32), np.zeros((rows, 2, 3), np.float32)
    for t in range(40):
        feeds = cache.feeds()
        assert all(v.flags.c_contiguous for v in feeds.values())  # fed to onnxruntime without a copy
        history = torch.from_numpy(feeds["history"])
        got = export_graph.past(specs[0], torch.from_numpy(feeds["k"]), history).numpy()
        assert np.array_equal(got, ref_k) and np.array_equal(feeds["s"], ref_sums), t
        n = len(ref_k)
        new_k = rng.standard_normal((n, 2, 1, 3)).astype(np.float32)
        sums = rng.standard_normal((n, 2, 3)).astype(np.float32)
        cache.update([new_k, sums])
        ref_k, ref_sums = np.concatenate([ref_k, new_k], axis=2), sums
        for _ in range(t % 3):  # none, one or two selections between steps
            size = rows + 3 if t == 20 else max(1, len(ref_k) - (t % 7 == 3))  # step 20: more rows than ever
            keep = rng.integers(0, len(ref_k), size=size)
            cache.select(keep)
            ref_k, ref_sums = ref_k[keep], ref_sums[keep]
    assert cache.width > rows and cache.capacity >= 40


def test_decoder_gathers_the_past_and_returns_only_new_positions(exported, tmp_path) -> None:
    """The decoder graph reads the growing self caches from the host's store through `history` (no
    beam_order), returns only what a step adds — each new position straight from where it is computed, so
    no grown cache is built (MHA attends to the past and the new position apart) — and the runtime refuses an
    export made for the old format with a one-line message naming the fix."""
    out, manifest = exported("transformer")
    graph = onnx.load(str(out / manifest["graphs"]["decoder"]["file"])).graph
    inputs = {i.name for i in graph.input}
    assert "history" in inputs and "beam_order" not in inputs and "vocab_rows" not in inputs
    assert manifest["runtime_format"] == rt.RUNTIME_FORMAT  # format 4: each graph's weights in a file of its own
    producer = {o: n for n in graph.node for o in n.output}
    for spec in (c for c in manifest["caches"] if c["kind"] == "self"):
        node = producer[rt.NEXT_PREFIX + spec["name"]]  # the new position as computed, never cut off a grown cache
        assert node.op_type not in ("Concat", "Slice", "Identity"), (spec["name"], node.op_type)
    assert not [n for n in graph.node if n.op_type == "Concat" and any(".self." in i for i in n.input)]
    runtime = export.load(out, threads=1)
    src = padded(runtime.encode_texts(["Guten Morgen.", "Das Haus ist klein."]), runtime.pad_id)
    step = runtime.stepper(runtime.encode(src), np.repeat(np.arange(2), 3), steps=4)
    step(np.full(6, runtime.bos_id), 0, 4)
    step.select(np.array([2, 2, 0, 5, 4, 3]))
    step(np.full(6, 5), 1, 4)
    assert step.state.cache.history.shape == (6, 2) and step.state.cache.width == 6
    old = _tampered(out, tmp_path, lambda m: m.update(runtime_format=1))
    with pytest.raises(rt.ExportedModelError, match=r"re-export it with `python -m export") as err:
        export.load(old)
    assert "\n" not in str(err.value)


def test_mapped_zeros_are_writable_zeros_that_the_store_uses() -> None:
    zeros = rt.mapped_zeros((3, 5), np.float32)
    assert zeros.shape == (3, 5) and zeros.dtype == np.float32 and not zeros.any() and zeros.flags.writeable
    zeros[1, 2] = 7.0
    assert zeros.sum() == 7.0
    spec = {"name": "k", "kind": "self", "layer": 0, "key": "k", "shape": ["batch", 2, "steps", 3], "dtype": "float32"}
    cache = rt.SelfCache([spec], rows=2, steps=4, slots=5)
    assert cache.width == 5 and cache.stores[0].shape == (4 * 5 * 2, 3) and not cache.stores[0].any()


def test_store_pool_hands_a_finished_search_buffers_to_the_next() -> None:
    """A freed SelfCache gives its store buffers back to the model's pool; the next search of the same size takes
    those very buffers (no new memory), a larger one makes new ones and drops the smaller free ones instead of
    piling them up, and a store grown or widened mid-search gives its old buffer back at once."""
    spec = {"name": "k", "kind": "self", "layer": 0, "key": "k", "shape": ["batch", 2, "steps", 3], "dtype": "float32"}
    pool = rt.StorePool()
    cache = rt.SelfCache([spec, {**spec, "name": "v"}], rows=4, steps=5, pool=pool)
    first = [id(b) for b in cache.buffers]
    del cache
    assert pool.free_bytes == 2 * 5 * 4 * 2 * 3 * 4
    cache = rt.SelfCache([spec, {**spec, "name": "v"}], rows=4, steps=5, pool=pool)
    assert sorted(id(b) for b in cache.buffers) == sorted(first) and pool.free_bytes == 0
    del cache
    big = rt.SelfCache([spec, {**spec, "name": "v"}], rows=8, steps=5, pool=pool)
    assert pool.free_bytes == 0 and all(b.nbytes == 5 * 8 * 2 * 3 * 4 for b in big.buffers)
    before = id(big.buffers[0])
    for _ in range(6):  # a sixth position: the stores grow, their old buffers go back
        big.update([np.ones((8, 2, 1, 3), np.float32)] * 2)
    assert id(big.buffers[0]) != before and pool.free_bytes > 0
    np.testing.assert_array_equal(big.feeds()["k"], 1.0)


def test_runtime_refuses_a_corrupt_export(exported, tmp_path) -> None:
    out, _ = exported("transformer")
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for name in ("decoder.onnx", "decoder.onnx.data"):
        with open(copy / name, "r+b") as fh:
            fh.seek(1000)
            original = fh.read(4)
            fh.seek(1000)
            fh.write(bytes(255 - b for b in original))
        with pytest.raises(rt.ExportedModelError, match=f"{name} does not match its sha256"):
            export.load(copy)
        shutil.copy(out / name, copy / name)
    with pytest.raises(rt.ExportedModelError, match=r"no manifest\.json"):
        export.load(tmp_path)


def test_shared_weights_are_read_once_for_both_sessions(exported, tmp_path) -> None:
    """The weights both graphs hold (tied embedding, positions) are located in the encoder file and given to both
    sessions from one array; decoding is bit-identical to each session keeping its own copy."""
    out, manifest = exported("transformer")
    shared = {w["name"]: w for w in manifest["shared_weights"]}
    assert "positions" in shared
    graphs = [{i.name: i for i in onnx.load(str(out / f"{g}.onnx")).graph.initializer} for g in ("encoder", "decoder")]
    for name, w in shared.items():
        in_file = np.fromfile(out / w["file"], np.dtype(w["dtype"]), math.prod(w["shape"]), offset=w["offset"])
        for g in graphs:
            np.testing.assert_array_equal(in_file.reshape(w["shape"]), numpy_helper.to_array(g[name]))
    # the tied output projection reads the table as it is (Gemm transB=1), not a transposed copy made at load
    decoder = onnx.load(str(out / "decoder.onnx")).graph
    readers = sorted(n.op_type for n in decoder.node if "tgt_embed.weight" in n.input)
    assert "tgt_embed.weight" in shared and readers == ["Gather", "Gemm"]
    model = export.load(out)
    assert model.backend.shared.keys() == shared.keys()
    own = _tampered(out, tmp_path, lambda m: m.pop("shared_weights"))
    alone = export.load(own)
    assert alone.backend.shared == {}
    src = padded(model.encode_texts(["ein kleiner Test .", "noch ein Satz"]), model.pad_id)
    one, two = model.encode(src, with_memory=True), alone.encode(src, with_memory=True)
    for name in one:
        np.testing.assert_array_equal(one[name], two[name])
    assert search_batch(model, src, model.search) == search_batch(alone, src, alone.search)


@pytest.mark.parametrize("location", ["../outside.bin", "/tmp/outside.bin", "link.bin"])
def test_a_graph_naming_weights_outside_its_directory_is_refused(exported, tmp_path, location) -> None:
    """Each graph's weights lie apart in its data file (format 4), which the graph names inside itself, where the
    runtime does not parse. What keeps a crafted graph from reading other files as weights is onnxruntime's rule,
    relied on by the runtime and so checked here on the pinned version: a location outside the graph's directory —
    through '..', an absolute path or a symbolic link — fails the load, as one line naming the file and the fix."""
    out, manifest = exported("transformer")
    assert manifest["graphs"]["decoder"]["data"] == "decoder.onnx.data"
    inline = onnx.load(str(out / "decoder.onnx"), load_external_data=False).graph.initializer
    assert max(len(i.raw_data) for i in inline) <= APART_MIN_BYTES < (out / "decoder.onnx.data").stat().st_size
    assert (out / "decoder.onnx.data").stat().st_mode == (out / "decoder.onnx").stat().st_mode  # readable alike
    copy = tmp_path / "export"
    shutil.copytree(out, copy)
    outside = tmp_path / "outside.bin"
    shutil.copy(out / "decoder.onnx.data", outside)
    (copy / "link.bin").symlink_to(outside)
    model = onnx.load(str(copy / "decoder.onnx"), load_external_data=False)
    weight = next(i for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL)
    next(e for e in weight.external_data if e.key == "location").value = location.replace("/tmp", str(tmp_path))
    onnx.save(model, str(copy / "decoder.onnx"))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["decoder.onnx"] = hashlib.sha256((copy / "decoder.onnx").read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(rt.ExportedModelError, match=r"decoder\.onnx: onnxruntime cannot load it .*re-export") as err:
        export.load(copy, threads=1)
    assert "\n" not in str(err.value)


def test_an_export_whose_graphs_hold_their_weights_still_loads(exported, tmp_path) -> None:
    """Exports made before format 4 hold their weights inside the graphs: they load and decode as before."""
    out, _ = exported("transformer")
    old = tmp_path / "format3"
    shutil.copytree(out, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for graph in manifest["graphs"].values():
        onnx.save(onnx.load(str(old / graph["file"])), str(old / graph["file"]))  # weights back inside
        (old / graph.pop("data")).unlink()
        manifest["files"].pop(f"{graph['file']}.data")
        manifest["files"][graph["file"]] = hashlib.sha256((old / graph["file"]).read_bytes()).hexdigest()
    manifest.pop("shared_weights")
    manifest["runtime_format"] = 3
    (old / "manifest.json").write_text(json.dumps(manifest))
    sources = json.loads((out / "heldout.json").read_text())["src"][:4]
    assert export.load(old, threads=1).translate(sources) == export.load(out, threads=1).translate(sources)


def test_runtime_providers_name_the_fix(exported) -> None:
    """provider=cpu is the default; provider=cuda asks for CUDA with TF32 off (the export's parity), and where
    this onnxruntime has no CUDA provider, loading says to install onnxruntime-gpu instead of falling back."""
    out, _ = exported("transformer")
    assert export.load(out, provider="cpu").backend.decoder.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(rt.ExportRuntimeError, match=r"provider='tpu': choose one of \['cpu', 'cuda'\]"):
        export.load(out, provider="tpu")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        cuda = rt.execution_providers("cuda", device_id=1)[0]
        assert cuda == ("CUDAExecutionProvider", {"device_id": 1, "use_tf32": "0"})
    else:
        with pytest.raises(rt.ExportRuntimeError, match="install onnxruntime-gpu"):
            export.load(out, provider="cuda")


def test_throughput_mode_decodes_batches_concurrently_to_the_same_outputs(exported) -> None:
    """inter_threads=2: two copies of the sessions decode different batches of one call at once; every output
    (text, score, tokens, input order) is the one-search result, and a bad setting is refused naming the range."""
    out, _ = exported("transformer")
    sources = [f"Das Haus Nummer {i} ist {'sehr ' * (i % 4)}klein." for i in range(24)]
    one = export.load(out, threads=1)
    two = export.load(out, inter_threads=2, intra_threads=1)
    assert len(two.replicas) == 2 and two.replicas.models[1].backend is not two.backend
    for beam in (1, 3):
        expected = one.translate(sources, beam_size=beam, max_sentences=5, return_scores=True)
        got = two.translate(sources, beam_size=beam, max_sentences=5, return_scores=True)
        assert [[(t.text, t.tokens) for t in hyps] for hyps in got] == [
            [(t.text, t.tokens) for t in hyps] for hyps in expected
        ]
        np.testing.assert_allclose(
            [hyps[0].score for hyps in got], [hyps[0].score for hyps in expected], rtol=0, atol=1e-5
        )
    for bad in (0, 65, 1.5, True):
        with pytest.raises(rt.ExportRuntimeError, match=r"inter_threads=.*: give an integer 1 … 64"):
            export.load(out, inter_threads=bad)
    with pytest.raises(rt.ExportRuntimeError, match="threads=2 and intra_threads=1: give one"):
        export.load(out, threads=2, intra_threads=1)


def test_bench_threads_reports_every_configuration_at_every_point(exported, tmp_path) -> None:
    """`python -m export.bench.threads`: each (inter, intra) at the four standard points in fresh processes, the
    ratio to the first configuration, the peak memory, and a table naming them."""
    out, _ = exported("transformer")
    src = tmp_path / "src.txt"
    src.write_text("".join(f"Das Haus Nummer {i} ist klein.\n" for i in range(40)))
    report_file = tmp_path / "report.json"
    args = ["--export", str(out), "--src", str(src), "--configs", "1x1,2x1", "--rounds", "1", "--fixed-len", "3"]
    proc = subprocess.run(
        [sys.executable, "-m", "export.bench.threads", *args, "--sentences-b1", "3", "--sentences-b32", "6"]
        + ["--json", str(report_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(report_file.read_text())
    assert set(report["points"]) == {
        f"{p}/{c}" for p in ("greedy_b1", "greedy_b32", "beam5_b1", "beam5_b32") for c in ("1x1", "2x1")
    }
    assert all(p["ratio_to_first"] == 1.0 for k, p in report["points"].items() if k.endswith("/1x1"))
    assert all(p["median_sentences_per_s"] > 0 and p["peak_rss_mb"] > 0 for p in report["points"].values())
    assert "| beam5_b32 |" in proc.stdout and "2x1 sent/s (× 1x1)" in proc.stdout
    rendered = bench_threads.render(report, "r.json")
    assert (
        rendered.startswith("Rendered by `python -m export.bench.threads --render r.json`")
        and bench_threads.table(report) in rendered
    )


def _tampered(out: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "tampered"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def _add_file(name: str):
    def edit(m: dict) -> None:
        m["files"][name] = "0" * 64

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_add_file("../../escaped.txt"), "not a plain file name"),
        (_add_file("/etc/passwd"), "not a plain file name"),
        (_add_file("sub/x"), "not a plain file name"),
        (lambda m: m.update(tokenizer="../tokenizer.model"), "not a plain file name"),
        (lambda m: m["graphs"]["decoder"].update(file="/tmp/other.onnx"), "graphs.decoder.file"),
        (lambda m: m["files"].pop("decoder.onnx"), "not listed"),
        (lambda m: m["files"].pop("encoder.onnx.data"), "not listed"),
        (lambda m: m["graphs"]["decoder"].update(data="../decoder.onnx.data"), "not a plain file name"),
        (lambda m: m["graphs"]["decoder"].update(data="weights.bin"), "names this file 'decoder.onnx.data'"),
        (lambda m: m.update(shortlist={"file": "other.npz"}), "the export format names this file 'shortlist.npz'"),
        (lambda m: m.update(shortlist={"file": "shortlist.npz"}), "not listed"),
        (lambda m: m.pop("vocab"), "missing key 'vocab.pad_id'"),
        (lambda m: m.update(max_positions="512"), "'max_positions' has the wrong type"),
        (lambda m: m.update(caches=[{"name": "x"}]), r"caches\[0\]"),
        (lambda m: m["shared_weights"][0].update(offset=10**12), "reaches past the end"),
        (lambda m: m["shared_weights"][0].update(file="../encoder.onnx"), "not a plain file name"),
        (lambda m: m["shared_weights"][0].update(dtype="object"), "has dtype 'object'"),
        (lambda m: m["shared_weights"].append({"name": "x"}), r"shared_weights\[\d+\] needs name"),
    ],
)
def test_runtime_refuses_a_manifest_that_points_outside_or_lacks_keys(exported, tmp_path, edit, message) -> None:
    """An export directory is untrusted input: every file it names must be a plain, listed, checksummed name
    inside it, and a malformed manifest gives one line naming the key."""
    out, _ = exported("transformer")
    copy = _tampered(out, tmp_path, edit)
    with pytest.raises(rt.ExportedModelError, match=message) as err:
        export.load(copy)
    assert "\n" not in str(err.value) and "manifest.json" in str(err.value)
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(rt.ExportedModelError, match="cannot read"):
        export.load(copy)


def test_a_batch_of_long_sources_is_encoded_in_slices_with_the_same_outputs(exported, monkeypatch) -> None:
    """Issue 88: one encoder call's attention scores are kept within ENCODER_SCORE_BYTES by encoding a batch a few
    sources at a time. Sliced to one source a call, the encoder's outputs (memory, padding mask, every cross cache)
    equal the batch's in one call, and so do the translations."""
    from export.runtime import model as model_module

    assert model_module.encoder_rows(8, 256) == 4 and model_module.encoder_rows(8, 2048) == 1  # 8 MB of scores
    assert model_module.encoder_rows(8, 16) == (8 << 20) // (4 * 8 * 16 * 16)
    out, _ = exported("transformer")
    model = rt.load(out, threads=1)
    texts = json.loads((out / "heldout.json").read_text())["src"][:5]
    src = padded(model.encode_texts(texts), model.pad_id)
    whole, expected = model.encode(src, with_memory=True), model.translate(texts, beam_size=3)
    monkeypatch.setattr(model_module, "ENCODER_SCORE_BYTES", 1)  # one source a call
    calls, real = [], model.backend.encode
    monkeypatch.setattr(model.backend, "encode", lambda names, rows: calls.append(len(rows)) or real(names, rows))
    sliced = model.encode(src, with_memory=True)
    assert calls == [1] * len(texts) and sliced.keys() == whole.keys()
    for name, array in whole.items():
        assert sliced[name].shape == array.shape and sliced[name].dtype == array.dtype, name
        np.testing.assert_allclose(sliced[name], array, rtol=0, atol=1e-6, err_msg=name)
    assert model.translate(texts, beam_size=3) == expected


def test_auto_spinning_spins_only_where_every_copys_threads_fit_the_cores(monkeypatch) -> None:
    """Issue 88: spinning="auto" (export.load's and the served model's default) is True where copies × threads
    (0: a thread per core) fit the cores this process may run on, else False; where the process already runs
    onnxruntime on its shared pool it is "shared" (onnxruntime refuses a session's own pool then); any other choice
    is kept as given."""
    from export.runtime import backend

    cores = backend.usable_cores()
    assert cores == len(os.sched_getaffinity(0))
    assert rt.resolve_spinning("auto", 1) is True and rt.resolve_spinning("auto", 0) is True
    assert rt.resolve_spinning("auto", cores, copies=1) is True
    assert rt.resolve_spinning("auto", cores + 1) is False and rt.resolve_spinning("auto", 0, copies=2) is False
    assert rt.resolve_spinning("auto", 1, copies=cores) is True and rt.resolve_spinning("auto", 1, cores + 1) is False
    for kept in (False, True, "decoder", "shared"):
        assert rt.resolve_spinning(kept, 99, copies=99) is kept
    monkeypatch.setattr(backend, "_shared_pool_threads", [2])
    assert rt.resolve_spinning("auto", 1) == "shared"
    with pytest.raises(rt.ExportRuntimeError, match="choose one of"):
        rt.resolve_spinning("sometimes", 1)
