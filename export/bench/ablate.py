"""What each kind of small kernel costs inside a real decoder step: the export's decoder graph timed on one captured
step's feeds, whole and with every node of one kind replaced by an Identity of its first input.

Why: `export.bench.op_costs` times kernels alone, in chains of their own; in a step they run between matmuls, on
the threads and caches the matmuls leave. Taking a kind out of the very graph the runtime runs says what that kind
costs there — and, with every small kind out at once, what the step's matmuls and their plumbing take, against
`export.bench --roofline`'s matmuls alone (results/runtime/fused_attention.md). Timing only: the outputs of a
variant are wrong by construction.

    python -m export.bench.ablate --export <dir> [--step 15] [--beam 1] [--threads 2] [--spinning decoder]
        [--rounds 5] [--runs 100] [--json <report>]
    python -m export.bench.ablate --table <report> [<report> …]     # the reports side by side, as markdown
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from export.bench import table as bench_table
from export.runtime import ExportedModel, ExportRuntimeError, OrtBackend, Search, forced_limits, read_manifest
from export.runtime.backend import CPU_DISABLED_OPTIMIZERS, SPINNING_TEXT, graph_session_options, spinning_from_text
from export.runtime.generation import padded, search_batch
from zoo.errors import one_line_errors

Rule = Callable[[onnx.NodeProto], bool]


def kinds(graph: onnx.GraphProto) -> dict[str, Rule]:
    """The kinds a variant takes out, each a rule over the graph's nodes. An Add is a bias when one input is a 1-D
    initializer and a residual when a LayerNormalization reads its sum; a MultiHeadAttention is taken out only where
    nothing reads its outputs beyond the first (an alignment head's probabilities stay)."""
    vectors = {i.name for i in graph.initializer if len(i.dims) == 1 and i.data_type == onnx.TensorProto.FLOAT}
    normalized = {n.input[0] for n in graph.node if n.op_type == "LayerNormalization"}
    read = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    rules: dict[str, Rule] = {
        "LayerNormalization": lambda n: n.op_type == "LayerNormalization",
        "MultiHeadAttention": lambda n: (
            n.op_type == "MultiHeadAttention" and not any(o in read for o in n.output[1:] if o)
        ),
        "Relu": lambda n: n.op_type == "Relu",
        "bias Add": lambda n: n.op_type == "Add" and any(x in vectors for x in n.input),
        "residual Add": lambda n: n.op_type == "Add" and n.output[0] in normalized,
    }
    small = list(rules.values())
    rules["all of these"] = lambda n: any(rule(n) for rule in small)
    return rules


def without(model: onnx.ModelProto, rule: Rule) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` whose nodes matching `rule` are Identities of their first input (the kinds of `kinds` keep
    their first input's shape), and how many there were."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes, taken = [], 0
    for node in copy.graph.node:
        if rule(node):
            nodes.append(helper.make_node("Identity", [node.input[0]], [node.output[0]], name=f"{node.name}_ablated"))
            taken += 1
        else:
            nodes.append(node)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy, taken


def captured_step(model: ExportedModel, step: int, beam: int) -> tuple[list[str], dict[str, np.ndarray]]:
    """The decoder's outputs and feeds at `step` of the first held-out sentence decoded to `step` + 1 tokens."""
    captured: list[tuple[list[str], dict[str, np.ndarray]]] = []
    decode = model.backend.decode

    def capture(outputs: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        captured.append((list(outputs), {k: np.array(v, copy=True) for k, v in inputs.items()}))
        return decode(outputs, inputs)

    model.backend.decode = capture  # type: ignore[method-assign]
    text = json.loads((model.directory / "heldout.json").read_text())["src"][0]
    src = padded(model.encode_texts([text]), model.pad_id)
    search_batch(model, src, Search(beam_size=beam), forced_limits([step + 1], model.max_positions))
    model.backend.decode = decode  # type: ignore[method-assign]
    return captured[step]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every variant's median seconds a run in each of the interleaved rounds, with the runtime's own session
    options; a kind's cost is the median over rounds of the whole step's run less the variant's."""
    directory = Path(args.export)
    manifest = read_manifest(directory)
    spinning = spinning_from_text(args.spinning)
    backend = OrtBackend(directory, manifest, args.threads, spinning=spinning)
    model = ExportedModel(directory, manifest, backend)
    outputs, feeds = captured_step(model, args.step, args.beam)
    graph = onnx.load(str(directory / manifest["graphs"]["decoder"]["file"]))
    _, options = graph_session_options(manifest, args.threads, None, spinning, "cpu")  # the runtime's decoder's
    for name, (_, value) in backend.shared.items():
        options.add_initializer(name, value)
    variants: dict[str, Any] = {"whole step": (graph, 0)}
    variants.update({kind: without(graph, rule) for kind, rule in kinds(graph.graph).items()})
    sessions = {
        name: ort.InferenceSession(
            m.SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=CPU_DISABLED_OPTIMIZERS,
        )
        for name, (m, _) in variants.items()
    }
    seconds: dict[str, list[float]] = {name: [] for name in sessions}
    for r in range(args.rounds):
        order = list(sessions)[r % len(sessions) :] + list(sessions)[: r % len(sessions)]
        for name in order:
            session = sessions[name]
            for _ in range(3):
                session.run(outputs, feeds)
            runs = []
            for _ in range(args.runs):
                start = time.perf_counter()
                session.run(outputs, feeds)
                runs.append(time.perf_counter() - start)
            seconds[name].append(statistics.median(runs))
    whole = seconds["whole step"]
    return {
        "export": str(directory),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": bench_table.machine(),
        "variants": {
            name: {
                "nodes_taken_out": variants[name][1],
                "run_ms": 1e3 * statistics.median(seconds[name]),
                # per round, the whole step less the variant, both timed in that round: the drift cancels
                "cost_rounds_ms": [1e3 * (w - v) for w, v in zip(whole, seconds[name], strict=True)],
                "cost_ms": 1e3 * statistics.median(w - v for w, v in zip(whole, seconds[name], strict=True)),
                "rounds_ms": [1e3 * s for s in seconds[name]],
            }
            for name in sessions
        },
    }


def lines(report: dict[str, Any]) -> list[str]:
    """The report as the lines the command prints: a variant's run, and what its kind costs in the step."""
    out = [f"{bench_table.cpu_name(report['machine'])}; {report['export']}, step {report['args']['step']}"]
    for name, v in report["variants"].items():
        taken = f"{v['nodes_taken_out']} nodes out: " if name != "whole step" else ""
        spread = f"{min(v['cost_rounds_ms']):.3f} … {max(v['cost_rounds_ms']):.3f}"
        cost = f", the kind costs {v['cost_ms']:.3f} ms (rounds {spread})" if name != "whole step" else ""
        out.append(f"{name}: {taken}{v['run_ms']:.3f} ms a run{cost}")
    return out


def table(reports: list[dict[str, Any]]) -> str:
    """Stored reports side by side: a row per variant, a column per report (its search and step) — the whole step's
    run, and each kind's cost with its range over rounds."""
    heads = [
        f"{'greedy' if r['args']['beam'] == 1 else 'beam ' + str(r['args']['beam'])} batch 1, step {r['args']['step']}"
        for r in reports
    ]
    machines = sorted({bench_table.cpu_name(r["machine"]) for r in reports})
    rows = [
        f"Rendered by `python -m export.bench.ablate --table` from {len(reports)} reports; {'; '.join(machines)}; "
        f"spinning {', '.join(sorted({r['args']['spinning'] for r in reports}))}, {reports[0]['args']['threads']} "
        "threads. A kind's cost: the median over rounds of the whole step less the variant (its range over rounds).",
        "",
        "| kind (nodes taken out) | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(reports),
    ]
    for name, first in reports[0]["variants"].items():
        cells = []
        for r in reports:
            v = r["variants"][name]
            if name == "whole step":
                cells.append(f"{v['run_ms']:.2f} ms a run")
            else:
                spread = f"{min(v['cost_rounds_ms']):.2f} … {max(v['cost_rounds_ms']):.2f}"
                cells.append(f"{v['cost_ms']:.3f} ms ({spread})")
        rows.append(f"| {name} ({first['nodes_taken_out']}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m export.bench.ablate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", help="export dir (python -m export …)")
    ap.add_argument("--table", nargs="+", metavar="REPORT", help="render stored reports side by side as markdown")
    ap.add_argument("--step", type=int, default=15, help="the decoder step whose feeds are timed (0-based)")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spinning", default="decoder", choices=list(SPINNING_TEXT), help="the runtime's setting")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the variants")
    ap.add_argument("--runs", type=int, default=100, help="timed runs per variant and round (median kept)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    if bench_table.stored_reports_mode(args, ap, table):
        return
    with one_line_errors(ExportRuntimeError):
        report = measure(args)
    print("\n".join(lines(report)))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
