"""The device-resident decoding path (export/runtime/device_state.py, row_gather.py) against the
host-owned one it replaces on GPUs: the same hypotheses, scores, n-best lists, alignments and scores of forced
decoding for every export signature, here on the CPU provider (the same code runs on CUDA).

Every export here is a random-init representative of the parity test (tests/export_testing.py): its hypotheses run
to different lengths, so rows finish at different steps. One thread each: the two cores are shared.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import export
from export import runtime as rt
from export.runtime import generation
from export.runtime.device_state import DeviceState
from export.runtime.row_gather import ONNX_ELEMENT_TYPES, gather_model
from export.runtime.stepper import Stepper
from tests.export_testing import REPRESENTATIVES


def _loaded(out, state: str) -> rt.ExportedModel:
    return export.load(out, threads=1, state=state, check_files=False)


def _nbest(model: rt.ExportedModel, encoded, search: rt.Search, n: int, alignments: bool = False, **kw) -> list:
    search = replace(search, num_hypotheses=n, return_alignments=alignments)
    return generation.translations(model, generation.generate(model, encoded, search, **kw))


@pytest.mark.parametrize("dtype", sorted(ONNX_ELEMENT_TYPES, key=str))
def test_the_row_gather_is_the_model_onnx_helper_makes_and_gathers_rows(dtype: np.dtype) -> None:
    """row_gather.py's hand-written bytes: onnx reads and checks them as the Gather model its helper builds, and
    onnxruntime gathers rows with them."""
    made = onnx.load_from_string(gather_model(dtype))
    onnx.checker.check_model(made, full_check=True)
    element = ONNX_ELEMENT_TYPES[dtype]
    reference = helper.make_graph(
        [helper.make_node("Gather", ["data", "rows"], ["out"], name="gather", axis=0)],
        "row_gather",
        [
            helper.make_tensor_value_info("data", element, ["n", "w"]),
            helper.make_tensor_value_info("rows", TensorProto.INT64, ["k"]),
        ],
        [helper.make_tensor_value_info("out", element, ["k", "w"])],
    )
    assert made.graph == reference
    assert [(o.domain, o.version) for o in made.opset_import] == [("", 13)]
    data = (np.arange(24) % 7).astype(dtype).reshape(6, 4)
    rows = np.array([5, 0, 0, 3], dtype=np.int64)
    session = ort.InferenceSession(made.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"data": data, "rows": rows})[0], data[rows])
    with pytest.raises(ValueError, match="no row gather for dtype float64"):
        gather_model(np.dtype(np.float64))


@pytest.mark.parametrize("entry", REPRESENTATIVES)
def test_the_device_path_searches_as_the_host_path(entry: str, exported) -> None:
    """Greedy and beam n-best (hypotheses, scores, token ids, and alignments where the export has them) over
    sentences with different length limits — rows leave the batch at different steps — equal on both paths."""
    out, manifest = exported(entry)
    host, device = _loaded(out, "host"), _loaded(out, "device")
    assert isinstance(device.decoding(np.array([[5, device.eos_id]]), steps=2).state, DeviceState)
    encoded = host.encode_texts(manifest_heldout(out)[:8])
    limits = rt.RowLimits(np.zeros(8, dtype=np.int64), np.array([1, 9, 3, 14, 6, 2, 11, 4], dtype=np.int64))
    aligns = manifest["alignment"]["output"] is not None
    for beam in (1, 4):
        search = rt.Search(beam_size=beam)
        want = _nbest(host, encoded, search, beam, limits=limits, alignments=aligns)
        assert _nbest(device, encoded, search, beam, limits=limits, alignments=aligns) == want
        assert len({len(hyps[0].tokens) for hyps in want}) > 2  # the rows did end at different steps


def manifest_heldout(out) -> list[str]:
    import json

    return json.loads((out / "heldout.json").read_text())["src"]


def test_the_device_path_keeps_every_search_option(exported) -> None:
    """Target prefixes, repetition control, sampling (the whole distribution fetched), forced decoding's scores,
    and a shortlisted decoder graph: the same on both paths."""
    out, _ = exported("transformer")
    host, device = _loaded(out, "host"), _loaded(out, "device")
    texts = manifest_heldout(out)[:6]
    encoded = host.encode_texts(texts)
    prefixes = [host.encode_targets(["a"])[0][:1]] * len(texts)
    for search, kw in [
        (rt.Search(beam_size=3, repetition_penalty=1.5, no_repeat_ngram_size=2), {}),
        (rt.Search(beam_size=1, sampling=1, top_k=20, temperature=0.8, seed=7), {}),
        (rt.Search(beam_size=3), {"prefixes": prefixes}),
    ]:
        assert _nbest(device, encoded, search, 2 if search.sampling else 3, **kw) == _nbest(
            host, encoded, search, 2 if search.sampling else 3, **kw
        )
    targets = [h[0].text for h in _nbest(host, encoded, rt.Search(beam_size=2), 1)]
    assert device.score(texts, targets) == host.score(texts, targets)
    shortlisted, _ = exported("transformer", "shortlist.build=true")
    host, device = _loaded(shortlisted, "host"), _loaded(shortlisted, "device")
    search = rt.Search(beam_size=4, shortlist=1)
    assert _nbest(device, encoded, search, 4) == _nbest(host, encoded, search, 4)


def test_device_stores_regrow_where_a_caller_outruns_their_size(exported) -> None:
    """A stepper sized for 1 position of 1 row, then stepped over 6 rows for 9 positions with rows reordered and
    dropped: its stores regrow on the device (wider, then longer) and every step's top-k equals the host's."""
    out, _ = exported("mlk_4head")  # running sums and growing caches both
    host, device = _loaded(out, "host"), _loaded(out, "device")
    src = generation.padded(host.encode_texts(manifest_heldout(out)[:3]), host.pad_id)
    rows = np.repeat(np.arange(3), 2)
    a = host.stepper(host.encode(src), rows, steps=1, slots=1)
    b = Stepper(device, DeviceState(device, src, np.arange(3), len(rows), 1, 1), rows, np.arange(3))
    last = np.full(len(rows), host.bos_id, dtype=np.int64)
    for t in range(9):
        (lp_a, tok_a), (lp_b, tok_b) = a(last, t, 5), b(last, t, 5)
        np.testing.assert_array_equal(lp_b, lp_a)
        np.testing.assert_array_equal(tok_b, tok_a)
        # swap every sentence's two beams; at step 4 the middle sentence leaves
        keep = np.arange(len(last)).reshape(-1, 2)[:, ::-1]
        keep = (keep[[0, 2]] if t == 4 else keep).reshape(-1).copy()
        a.select(keep)
        b.select(keep)
        last = tok_a[keep, 0]
    assert b.state.cache.capacity >= 9 and b.state.cache.width == 6


def test_an_unknown_state_is_refused_with_the_choices(exported) -> None:
    out, _ = exported("transformer")
    with pytest.raises(rt.ExportRuntimeError, match=r"state='gpu': choose one of \['auto', 'host', 'device'\]"):
        export.load(out, threads=1, state="gpu")
