"""Where an exported model's two graphs run: what differs between the in-process model and the Triton BLS model.

`ExportedModel` holds a backend and does everything else (tokenizer, search, stores, batching) itself. `OrtBackend`
runs both graphs in onnxruntime sessions of this process; serve/triton/bls_model.py's `BlsBackend` sends them to
the Triton models that serve the graphs.

onnxruntime is imported inside the functions that make sessions, not at the top: zoo (a torch process) imports the
runtime for its search types and must not load onnxruntime with them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .device_state import Bound, Device
from .errors import ExportedModelError, ExportRuntimeError, GraphRunError
from .manifest import Manifest, SharedWeight
from .stores import release_free_heap, use_shared_cpu_arena

if TYPE_CHECKING:
    import onnxruntime as ort

OPTIMIZATION_LEVELS = {  # name → the member of onnxruntime's GraphOptimizationLevel (looked up in session_options)
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
PROVIDERS = ("cpu", "cuda")
# Where a search keeps its decoding state (device_state.py): "host" numpy stores (stores.py), "device" the execution
# provider's memory through I/O binding, "auto" the faster of the two on the provider — on CUDA the device (the host
# path copies every row's past to the GPU each step); on the CPU the host. Measured: results/runtime/device_path.md
STATES = ("auto", "host", "device")
DEFAULT_STATE = {"cpu": "host", "cuda": "device"}
# On the CPU, residual Add + LayerNormalization stay two nodes: onnxruntime's fused SkipLayerNormalization made a
# decoder step slower at beam × batch rows, and no faster at batch 1 (measured again with onnxruntime 1.31 and the
# fused attention kernel: results/runtime/fused_attention.md). Earlier figures: results/runtime/docstring_figures.md
CPU_DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]
# `spinning`: whose idle threads spin-wait between kernels instead of sleeping, and only within a run (onnxruntime's
# `session.force_spinning_stop`: a pool stops spinning when a run returns, so the host's work between steps, the
# other session's runs and an idle process get the cores) — False neither session's, True both, "decoder" the
# decoder's only, "shared" both sessions on one pool of the process (onnxruntime's global thread pools: made once per
# process, so every later load of the process must use it), "auto" (the default) True where the runtime's threads fit
# the cores this process may run on, else False (`resolve_spinning`). On 2 AMD EPYC cores, greedy batch 1 (ms a
# sentence): False 31, "decoder" 25 and True 45 before the stop at a run's end, "decoder" 23, True 23, "shared" 21
# with it. Measured: results/runtime/fast_defaults.md
SPINNING = (False, True, "decoder", "shared", "auto")
SPINNING_TEXT = {"false": False, "true": True, "decoder": "decoder", "shared": "shared", "auto": "auto"}  # as a text
# The size of this process's shared pool once made ("shared" spinning): onnxruntime makes it once per process.
_shared_pool_threads: list[int] = []


def shared_thread_pool(threads: int) -> None:
    """Make this process's one onnxruntime thread pool of `threads` intra-op threads (0: one per core), or check that
    the one already made has that size: onnxruntime cannot replace it, so another size is refused naming the fix."""
    import onnxruntime.capi.onnxruntime_pybind11_state as ort_state  # see the module docstring

    if _shared_pool_threads:
        if _shared_pool_threads[0] != threads:
            raise ExportRuntimeError(
                f'spinning="shared" with threads={threads or "all cores"}: this process\'s shared thread pool was made '
                f"with threads={_shared_pool_threads[0] or 'all cores'}, and onnxruntime makes it once per process; "
                "load with that many threads, or in another process"
            )
        return
    try:
        ort_state.set_global_thread_pool_sizes(threads, 1)  # its threads spin: onnxruntime's default for them
    except Exception as exc:  # made by other code of this process, whose size we cannot read
        raise ExportRuntimeError(
            f'spinning="shared": onnxruntime\'s global thread pools of this process were already made elsewhere '
            f"({exc}); load in a fresh process, or choose another spinning setting"
        ) from None
    _shared_pool_threads.append(threads)


def spinning_from_text(text: str) -> bool | str:
    """A `SPINNING` choice from its text (`SPINNING_TEXT`), refused with the choices named."""
    if text not in SPINNING_TEXT:
        raise ExportRuntimeError(f"spinning={text!r}: choose one of {list(SPINNING_TEXT)} (whose idle threads spin)")
    return SPINNING_TEXT[text]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which taskset and container CPU sets narrow;
    os.cpu_count where the OS has none, as on macOS)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_spinning(spinning: bool | str, threads: int, copies: int = 1) -> bool | str:
    """A concrete `SPINNING` choice for "auto": "shared" where this process already runs onnxruntime on its shared
    pool (onnxruntime then refuses pools of a session's own), else True where `copies` sets of sessions with
    `threads` intra-op threads each (0: one per core) fit the usable cores — spinning on cores another busy thread
    of ours needs would slow both — else False. Any other choice is returned as it is. Not "shared" by itself: its
    pool is the process's for good (another thread count, or a pool of a session's own, is refused after it)."""
    spinning = check_spinning(spinning)
    if spinning != "auto":
        return spinning
    if _shared_pool_threads:
        return "shared"
    cores = usable_cores()
    return copies * (threads or cores) <= cores


def check_spinning(value: bool | str) -> bool | str:
    """`value` as its `SPINNING` choice — a bool, or a text of `SPINNING_TEXT` (so a "decoder" built at run time, by
    a config parser say, is the constant itself) — refused with the choices named."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in SPINNING_TEXT:
        return SPINNING_TEXT[value]
    raise ExportRuntimeError(f"spinning={value!r}: choose one of {list(SPINNING)} (whose idle threads spin)")


def spinning_text(spinning: bool | str) -> str:
    """The text of a `SPINNING` choice (the inverse of `spinning_from_text`)."""
    for text, choice in SPINNING_TEXT.items():
        if spinning is choice:
            return text
    raise ExportRuntimeError(f"spinning={spinning!r}: choose one of {list(SPINNING)} (whose idle threads spin)")


class Backend(Protocol):
    """What `ExportedModel` needs of the place its graphs run."""

    decoder_inputs: frozenset[str]  # the decoder graph's input names (feeds it does not take are left out)
    per_source_cross: bool  # whether the decoder may get one cross-cache row per source (the graph's own layout)

    def encode(self, outputs: list[str], src: np.ndarray) -> list[np.ndarray]:
        """Run the encoder graph on src_tokens [B, S] int64: `outputs` as arrays the caller may keep, in order."""
        ...

    def decode(self, outputs: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run the decoder graph once: `outputs` as writable arrays, in order."""
        ...


def execution_providers(provider: str, device_id: int = 0) -> list[Any]:
    """onnxruntime's provider list for `provider` (cpu | cuda). CUDA runs with TF32 off: TF32 moved the outputs
    far enough from the CPU's to change hypotheses, and the parity the export verified (≤ 1e-4) is what a served
    model should keep. Measured: results/runtime/docstring_figures.md."""
    if provider not in PROVIDERS:
        raise ExportRuntimeError(f"provider={provider!r}: choose one of {list(PROVIDERS)}")
    if provider == "cpu":
        return ["CPUExecutionProvider"]
    import onnxruntime as ort  # here, not at the top: see the module docstring

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ExportRuntimeError(
            f"provider=cuda, but this onnxruntime ({ort.__version__}) has no CUDAExecutionProvider "
            f"(it has {ort.get_available_providers()}): install onnxruntime-gpu instead of onnxruntime, "
            "or use provider=cpu"
        )
    preload_cuda_libraries(ort)
    return [("CUDAExecutionProvider", {"device_id": int(device_id), "use_tf32": "0"}), "CPUExecutionProvider"]


_CUDA_PRELOADED = False


def preload_cuda_libraries(ort: Any) -> None:
    """Load the CUDA and cuDNN libraries of the nvidia-* pip packages, once per process, where this onnxruntime can
    (`preload_dlls`, onnxruntime ≥ 1.21): installed from pip, they are on no library path, and the CUDA provider
    would fail to load its libcublas / libcudnn at the first session."""
    global _CUDA_PRELOADED
    if not _CUDA_PRELOADED and hasattr(ort, "preload_dlls"):
        _CUDA_PRELOADED = True
        try:
            ort.preload_dlls()
        except OSError:  # none found: the first CUDA session says which library it lacks
            pass


def shared_initializers(directory: Path, weights: Sequence[SharedWeight]) -> dict[str, tuple[np.ndarray, Any]]:
    """One in-memory copy of each weight both graphs hold (the tied embedding, the positions table), for both
    sessions (`SessionOptions.add_initializer`), where each session would keep its own: read from the bytes the
    manifest points at, so the runtime needs no ONNX parser. The arrays are returned beside their OrtValues, which
    do not own them. Measured: results/runtime/docstring_figures.md."""
    import onnxruntime as ort  # here, not at the top: see the module docstring

    shared = {}
    for w in weights:
        dtype, count = np.dtype(w["dtype"]), math.prod(w["shape"])
        array = np.fromfile(directory / w["file"], dtype=dtype, count=count, offset=w["offset"]).reshape(w["shape"])
        shared[w["name"]] = (array, ort.OrtValue.ortvalue_from_numpy(array))
    return shared


def session_threads(manifest: Manifest, threads: int | None) -> int:
    """Intra-op threads of a session: `threads` if given, else the manifest's default; 0 is onnxruntime's (a core
    each)."""
    threads = threads if threads is not None else manifest.get("runtime", {}).get("threads")
    return int(threads or 0)


def session_options(
    manifest: Manifest,
    threads: int | None,
    optimization: str | None,
    spinning: bool,
    provider: str,
    shared_pool: bool = False,
) -> ort.SessionOptions:
    """Both sessions' options: the manifest's runtime defaults unless given, sequential execution; `shared_pool`: the
    session runs on the process's shared thread pool (`shared_thread_pool`), whose size and spinning are its own."""
    import onnxruntime as ort  # here, not at the top: see the module docstring

    defaults = manifest.get("runtime", {})
    options = ort.SessionOptions()
    if shared_pool:  # its sizes are the pool's (onnxruntime warns that a session's would be ignored)
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads, options.inter_op_num_threads = session_threads(manifest, threads), 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    level = optimization or defaults.get("graph_optimization_level", "all")
    if level not in OPTIMIZATION_LEVELS:
        raise ExportedModelError(f"unknown graph optimization level {level!r}; use {sorted(OPTIMIZATION_LEVELS)}")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION_LEVELS[level])
    options.log_severity_level = 3
    # spinning trades CPU for wake-up latency between a run's kernels; it stops when the run returns (`SPINNING`)
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    # No memory pattern: every decoder step has new shapes (the past grows by one position, beams finish),
    # so patterns never repeat. On the CPU, both sessions allocate from the one arena of the process
    # (`use_shared_cpu_arena`: see there why an arena, and why one).
    options.enable_mem_pattern = False
    if provider == "cpu":
        use_shared_cpu_arena(options)
    else:
        options.enable_cpu_mem_arena = False
    return options


def graph_session_options(
    manifest: Manifest, threads: int | None, optimization: str | None, spinning: bool | str, provider: str
) -> tuple[ort.SessionOptions, ort.SessionOptions]:
    """The encoder's and the decoder's options for a `SPINNING` choice: whose threads spin, and whether both run on
    the process's shared pool (made by the caller: `shared_thread_pool`)."""
    shared = spinning == "shared"
    return (
        session_options(manifest, threads, optimization, spinning is True, provider, shared),
        session_options(manifest, threads, optimization, spinning in (True, "decoder"), provider, shared),
    )


class OrtBackend:
    """Both graphs in onnxruntime sessions of this process (CPU, or CUDA with provider=cuda)."""

    per_source_cross = True

    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        threads: int | None = None,
        optimization: str | None = None,
        spinning: bool | str = "auto",
        provider: str = "cpu",
        device_id: int = 0,
        state: str = "auto",
        profile_prefix: str | None = None,
    ) -> None:
        if state not in STATES:
            raise ExportRuntimeError(f"state={state!r}: choose one of {list(STATES)} (where a search keeps its caches)")
        spinning = resolve_spinning(spinning, session_threads(manifest, threads))
        if spinning == "shared":
            shared_thread_pool(session_threads(manifest, threads))
        elif _shared_pool_threads:  # onnxruntime's own message would say only "use_per_session_threads must be false"
            raise ExportRuntimeError(
                f"spinning={spinning_text(spinning)}: this process runs onnxruntime on a shared thread pool (a model "
                'was loaded with spinning="shared"), and onnxruntime then refuses sessions with pools of their own; '
                f'load with spinning="shared" and threads={_shared_pool_threads[0]}, or in another process'
            )
        options, decoder_options = graph_session_options(manifest, threads, optimization, spinning, provider)
        if profile_prefix is not None:  # onnxruntime's profiler (export/bench/kernels.py reads its traces)
            for o in (options, decoder_options):
                o.enable_profiling = True
                o.profile_file_prefix = profile_prefix
        providers = execution_providers(provider, device_id)
        self.state = DEFAULT_STATE[provider] if state == "auto" else state
        # the device the decoding state lives on with state="device" (device_state.py), else None
        self.device = Device(provider, device_id, options, providers) if self.state == "device" else None
        self.shared = shared_initializers(directory, manifest.get("shared_weights", []))
        for name, (_, value) in self.shared.items():
            options.add_initializer(name, value)
            decoder_options.add_initializer(name, value)
        graphs = manifest["graphs"]
        disabled = CPU_DISABLED_OPTIMIZERS if provider == "cpu" else []
        self.encoder = open_session(directory / graphs["encoder"]["file"], options, providers, disabled)
        self.decoder = open_session(directory / graphs["decoder"]["file"], decoder_options, providers, disabled)
        release_free_heap()  # the parsed graph files are gone now; glibc keeps their pages unless asked
        self.decoder_inputs = frozenset(i.name for i in self.decoder.get_inputs())
        check_position_table(self.encoder, manifest, graphs["encoder"]["file"])

    def encode(self, outputs: list[str], src: np.ndarray) -> list[np.ndarray]:
        return run_graph(self.encoder, "encoder", outputs, {"src_tokens": src})

    def encode_bound(self, outputs: list[str], src: np.ndarray) -> list[Bound]:
        """The encoder on src_tokens [B, S] int64 with `outputs` left on the backend's device (state="device")."""
        assert self.device is not None
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("src_tokens", src)
        for name in outputs:
            binding.bind_output(name, self.device.name, self.device.id)
        run_bound(self.encoder, "encoder", binding, {"src_tokens": src})
        return [Bound.of(value) for value in binding.get_outputs()]

    def run_bound(self, binding: ort.IOBinding) -> None:
        """The decoder graph once over a bound step (device_state.py's `DeviceState`)."""
        run_bound(self.decoder, "decoder", binding, {})

    def decode(self, outputs: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """numpy in, numpy out (`InferenceSession.run`): onnxruntime reads contiguous arrays in place and hands its
        outputs over as arrays, which costs less per call than wrapping each input in an OrtValue from Python
        (the state lives on the host between steps, so there is nothing to keep as OrtValues).
        Measured: results/runtime/docstring_figures.md."""
        return run_graph(self.decoder, "decoder", outputs, inputs)


def open_session(
    path: Path, options: ort.SessionOptions, providers: list[Any], disabled: list[str]
) -> ort.InferenceSession:
    """An onnxruntime session of one graph file, or one line naming the file and the fix where onnxruntime cannot
    load it (a graph or its weights file damaged, or naming weights outside its directory)."""
    import onnxruntime as ort  # here, not at the top: see the module docstring

    try:
        return ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=disabled)
    except Exception as exc:
        if not from_onnxruntime(exc):
            raise
        reason = " ".join(str(exc).split())[:300]
        raise ExportedModelError(f"{path}: onnxruntime cannot load it ({reason}); re-export the model") from exc


def from_onnxruntime(exc: Exception) -> bool:
    """onnxruntime's own failure (Fail, InvalidGraph, …: its exceptions derive from Exception alone)."""
    return type(exc).__module__.startswith("onnxruntime")


def check_position_table(session: ort.InferenceSession, manifest: Manifest, file: str) -> None:
    """ExportedModelError when the manifest's max_positions is over the position table the graph was exported
    with (its metadata `max_positions`; exports before it recorded none: read_manifest's check against
    model_config is what there is). Sources are cut to max_positions/2 tokens, so a larger value made every
    source longer than the table fail inside onnxruntime."""
    table = session.get_modelmeta().custom_metadata_map.get("max_positions", "")
    if table.isascii() and table.isdigit() and manifest["max_positions"] > int(table):
        raise ExportedModelError(
            f"manifest.json: max_positions={manifest['max_positions']} is over the position table of {file} "
            f"({table} positions); set it to at most {table}, or re-export the model"
        )


def run_graph(
    session: ort.InferenceSession, which: str, outputs: list[str], feeds: dict[str, np.ndarray]
) -> list[np.ndarray]:
    """`session.run`, with onnxruntime's own failures as one GraphRunError line naming the graph and the input
    shapes — not its internal node names."""
    try:
        return session.run(outputs, feeds)
    except Exception as exc:
        error = graph_run_error(exc, which, feeds)
        if error is exc:
            raise
        raise error from exc


def run_bound(session: ort.InferenceSession, which: str, binding: ort.IOBinding, shown: dict[str, np.ndarray]) -> None:
    """`session.run_with_iobinding`, failures as `run_graph`'s (`shown`: host inputs the message may name)."""
    try:
        session.run_with_iobinding(binding)
    except Exception as exc:
        error = graph_run_error(exc, which, shown)
        if error is exc:
            raise
        raise error from exc


def graph_run_error(exc: Exception, which: str, feeds: dict[str, np.ndarray]) -> Exception:
    """onnxruntime's failure as one GraphRunError line naming the graph and input shapes; any other exception as
    it is."""
    if not from_onnxruntime(exc):
        return exc
    shapes = ", ".join(f"{name} {list(value.shape)}" for name, value in list(feeds.items())[:3])
    return GraphRunError(
        f"the {which} graph failed ({type(exc).__name__}) on inputs {shapes}; the export's manifest may not "
        "match its graphs (max_positions?): re-export the model"
    )
