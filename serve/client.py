"""Query a served attention-zoo model over Triton's HTTP or gRPC protocol (KServe v2).

    python -m serve.client "Guten Morgen." "Wie geht es dir?"
    echo "Guten Morgen." | python -m serve.client --protocol grpc --model transformer-deen --beam-size 1
    python -m serve.client --num-hypotheses 3 --scores "Guten Morgen."     # n-best: i ||| text ||| score
    printf 'Guten Morgen.\tGood morning.\n' | python -m serve.client --score   # forced decoding: a score per line
    printf 'Guten Morgen.\tGood\n' | python -m serve.client --prefix          # the output starts with "Good"
    python -m serve.client --beam-size 1 --sampling 1 --top-p 0.9 --seed 7 --num-hypotheses 3 "Guten Morgen."

    from serve.client import translate
    translate(["Guten Morgen."], url="127.0.0.1:8000", protocol="http")

Ordinary flags, not Hydra: free text such as "Guten Morgen." is not a Hydra override. The client splits
inputs into requests of at most the model's max_batch_size rows, so any number of sentences can be sent (a
sampled source draws by its row within its request: beyond max_batch_size rows, its samples are not those of
`export.load(dir).translate` over the same list).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serve.errors import ServeError
from serve.launch import ADMIN_HEADER, GRPC_ADMIN_HEADER
from zoo.errors import one_line_errors

INPUT, OUTPUT, TRUNCATED = "TEXT", "OUTPUT", "TRUNCATED"
TARGET, SCORES, TOKEN_SCORES = "TARGET", "SCORES", "TOKEN_SCORES"
PREFIX = "PREFIX"  # per source the target text its output starts with
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
# the served search settings (export.SEARCH_LIMITS; named here so that the client does not import the runtime)
SEARCH_PARAMETERS = (
    "beam_size",
    "len_penalty",
    "max_len_a",
    "max_len_b",
    "min_len",
    "shortlist",
    "no_repeat_ngram_size",
    "repetition_penalty",
    "sampling",
    "top_k",
    "top_p",
    "temperature",
    "seed",
)
ALIGNMENT = "ALIGNMENT"
# every option of a translation request: the fields of the runtime's `Search` (its settings and what to return)
OPTIONS = (*SEARCH_PARAMETERS, "num_hypotheses", "return_scores", "return_alignments")


class Hypothesis(NamedTuple):
    """One served hypothesis: its text and score (None unless scores were asked for). Not the runtime's
    Translation(text, score, tokens): the served response carries no token ids (the wire format stays as it is)."""

    text: str
    score: float | None = None
    alignment: list[int] | None = None  # per output token the source piece it attended to most (asked for)


class Scored(NamedTuple):
    """A served forced decoding: each target token's log-prob, then eos's, and the sentence score — the runtime's
    Scored without its token ids, which the served response does not carry."""

    token_logprobs: list[float]
    score: float


class ClientError(ServeError):
    """A request the server refused or could not answer; the message is Triton's (or the model's) reason."""


def _text(item: Any) -> str:
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)


def _encode(texts: Sequence[str | bytes]) -> np.ndarray:
    return np.array([t if isinstance(t, bytes) else t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)


class Client:
    """One connection to a Triton server (HTTP or gRPC); thread-compatible, not thread-safe: one per thread."""

    def __init__(
        self,
        url: str | None = None,
        protocol: str = "http",
        model: str | None = None,
        timeout: float = 120.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        if protocol not in DEFAULT_PORTS:
            raise ClientError(f"protocol {protocol!r}; use http or grpc")
        self.protocol = protocol
        self.url = url or f"127.0.0.1:{DEFAULT_PORTS[protocol]}"
        self.timeout = timeout
        # e.g. serve.server.admin_headers(info) for the restricted APIs; gRPC carries the key as Triton's
        # prefixed metadata key
        self.headers = {
            GRPC_ADMIN_HEADER if protocol == "grpc" and k == ADMIN_HEADER else k: v for k, v in (headers or {}).items()
        }
        self.lib: Any = httpclient if protocol == "http" else grpcclient
        try:
            if protocol == "http":
                self.client: Any = httpclient.InferenceServerClient(
                    self.url, connection_timeout=timeout, network_timeout=timeout
                )
            else:
                self.client = grpcclient.InferenceServerClient(self.url)
        except InferenceServerException as exc:
            raise ClientError(f"cannot connect to {self.url} ({protocol}): {exc}") from exc
        self.model = model or self._only_model()
        self._max_batch: int | None = None

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.headers:
            kwargs["headers"] = self.headers
        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            hint = ""
            if str(exc.status()) in ("403", "StatusCode.PERMISSION_DENIED") or "restricted" in str(exc.message()):
                hint = (
                    "; this API is restricted to the server's admin: pass the key from <repo>.serve/admin_key "
                    "(--admin-key-file), or name the model with --model"
                )
            raise ClientError(f"{what} failed: {exc.message() or exc}{hint}") from exc
        except OSError as exc:  # connection refused / reset (HTTP)
            raise ClientError(
                f"{what} failed: cannot reach {self.url} ({exc}); is the server running "
                "(`python -m serve.start repo=…`) and is this its port?"
            ) from exc

    def ready_models(self) -> list[str]:
        index = self._call(
            "listing the models",
            self.client.get_model_repository_index,
            **({"as_json": True} if self.protocol == "grpc" else {}),
        )
        if self.protocol == "grpc":
            index = index.get("models", [])
        return sorted(m["name"] for m in index if m.get("state") == "READY")

    def _only_model(self) -> str:
        models = self.ready_models()
        if len(models) != 1:
            raise ClientError(
                f"the server at {self.url} has {len(models)} ready models {models}; name one with --model / model="
            )
        return models[0]

    @property
    def max_batch_size(self) -> int:
        if self._max_batch is None:
            config = self._call(
                f"reading {self.model}'s config",
                self.client.get_model_config,
                self.model,
                **({"as_json": True} if self.protocol == "grpc" else {}),
            )
            config = config.get("config", config)
            self._max_batch = int(config.get("max_batch_size", 0)) or 1 << 30
        return self._max_batch

    def infer(
        self,
        texts: Sequence[str | bytes],
        parameters: dict[str, Any] | None = None,
        prefixes: Sequence[str | bytes] | None = None,
    ) -> tuple[list[str], list[bool]]:
        """One request (no splitting): outputs and truncation flags; errors as ClientError."""
        inputs = {INPUT: texts} if prefixes is None else {INPUT: texts, PREFIX: prefixes}
        result = self._request(inputs, [OUTPUT, TRUNCATED], parameters or {})
        out = [_text(b) for b in result.as_numpy(OUTPUT).reshape(-1)]
        return out, [bool(x) for x in result.as_numpy(TRUNCATED).reshape(-1)]

    def _request(self, inputs: dict[str, Sequence[str | bytes]], outputs: list[str], parameters: dict[str, Any]) -> Any:
        """One request of BYTES inputs [rows, 1] → the result object (errors as ClientError)."""
        tensors = []
        for name, texts in inputs.items():
            tensor = self.lib.InferInput(name, [len(texts), 1], "BYTES")
            tensor.set_data_from_numpy(_encode(texts))
            tensors.append(tensor)
        wanted = [self.lib.InferRequestedOutput(name) for name in outputs]
        kwargs: dict[str, Any] = {"parameters": parameters} if parameters else {}
        if self.protocol == "grpc":
            kwargs["client_timeout"] = self.timeout
        return self._call(
            f"inference on {self.model}", self.client.infer, self.model, tensors, outputs=wanted, **kwargs
        )

    def translate(
        self,
        texts: Sequence[str | bytes],
        prefixes: Sequence[str | bytes] | None = None,
        search: Any = None,
        **options: Any,
    ) -> list[str] | list[list[Hypothesis]]:
        """Any number of texts → outputs in order, as `export.load(dir).translate`: `prefixes`, per text the target
        text its output starts with ("" = none); `search`, every option as one value (the runtime's `Search`, or a
        dict of OPTIONS), `options` any of OPTIONS by name (None: the model's default). With `num_hypotheses`,
        `return_scores` or `return_alignments`, per text a list of `Hypothesis(text, score, alignment)` instead,
        best first (the server checks 1 ≤ num_hypotheses ≤ beam_size, or ≤ 64 samples with sampling=1)."""
        given = search if isinstance(search, dict) or search is None else {n: getattr(search, n) for n in OPTIONS}
        parameters = self._parameters({**(given or {}), **options})
        lists = "num_hypotheses" in parameters or any(parameters.get(f) for f in ("return_scores", "return_alignments"))
        if prefixes is not None and len(prefixes) != len(texts):
            raise ClientError(f'got {len(prefixes)} prefixes for {len(texts)} texts; give one per text ("" = none)')
        wanted = {SCORES: "return_scores", ALIGNMENT: "return_alignments"}
        outputs = [OUTPUT, *(name for name, flag in wanted.items() if parameters.get(flag))]
        out: list[Any] = []
        for start in range(0, len(texts), self.max_batch_size):
            stop = start + self.max_batch_size
            inputs = {INPUT: texts[start:stop], **({} if prefixes is None else {PREFIX: prefixes[start:stop]})}
            result = self._request(inputs, outputs, parameters)
            rows = result.as_numpy(OUTPUT)
            scores = result.as_numpy(SCORES) if SCORES in outputs else np.full(rows.shape, np.nan)
            aligned = result.as_numpy(ALIGNMENT) if ALIGNMENT in outputs else None
            for r, (row, row_scores) in enumerate(zip(rows, scores, strict=True)):
                hyps = [
                    Hypothesis(
                        _text(t),
                        None if SCORES not in outputs else float(sc),
                        None if aligned is None else [int(a) for a in aligned[r, j] if a >= 0],
                    )
                    for j, (t, sc) in enumerate(zip(row, row_scores, strict=True))
                ]
                out.append(hyps if lists else hyps[0].text)
        return out

    @staticmethod
    def _parameters(options: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ClientError(f"unknown option(s) {unknown}; use {list(OPTIONS)}")
        return {k: v for k, v in options.items() if v is not None}

    def score(
        self, sources: Sequence[str | bytes], targets: Sequence[str | bytes], len_penalty: float | None = None
    ) -> list[Scored]:
        """Forced decoding: per (source, target) pair the target's token log-probs (then eos's) and its sentence
        score on the search's scale (`len_penalty`: default the model's)."""
        if len(sources) != len(targets):
            raise ClientError(f"got {len(sources)} sources but {len(targets)} targets; give one target per source")
        parameters = {} if len_penalty is None else {"len_penalty": len_penalty}
        out: list[Scored] = []
        for start in range(0, len(sources), self.max_batch_size):
            stop = start + self.max_batch_size
            result = self._request(
                {INPUT: sources[start:stop], TARGET: targets[start:stop]}, [SCORES, TOKEN_SCORES], parameters
            )
            for sentence, tokens in zip(result.as_numpy(SCORES), result.as_numpy(TOKEN_SCORES), strict=True):
                out.append(Scored([float(v) for v in tokens if not np.isnan(v)], float(sentence[0])))
        return out

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics of this model (inference_count, execution_count, timings) as JSON."""
        stats = self._call(
            "reading statistics",
            self.client.get_inference_statistics,
            self.model,
            **({"as_json": True} if self.protocol == "grpc" else {}),
        )
        return stats["model_stats"][0]

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def translate(
    texts: str | Sequence[str],
    url: str | None = None,
    protocol: str = "http",
    model: str | None = None,
    timeout: float = 120.0,
    headers: dict[str, str] | None = None,
    **options: Any,
) -> list[str] | list[list[Hypothesis]]:
    """Translate (or summarise) texts on a running server (`options`: as `Client.translate`'s); the model may be
    omitted when it serves one (finding it lists the repository, a restricted API: pass the admin header then)."""
    if isinstance(texts, str):
        texts = [texts]
    with Client(url, protocol, model, timeout, headers) as client:
        return client.translate(list(texts), **options)


def _pairs(texts: list[str], flag: str, second: str) -> tuple[list[str], list[str]]:
    """`source<TAB>second` inputs → (sources, seconds); ClientError naming the inputs without a tab."""
    pairs = [t.split("\t", 1) for t in texts]
    bad = [i + 1 for i, p in enumerate(pairs) if len(p) != 2]
    if bad:
        raise ClientError(f"{flag} reads `source<TAB>{second}` per input; input(s) {bad[:5]} have no tab")
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _answer(client: Client, args: argparse.Namespace, texts: list[str], search: dict[str, Any]) -> list[str]:
    """The CLI's output lines for its mode: translations, an n-best list, or forced-decoding scores."""
    if args.score:
        sources, targets = _pairs(texts, "--score", "target")
        scored = client.score(sources, targets, search["len_penalty"])
        if args.token_scores:
            return [f"{s.score:.6f}\t" + " ".join(f"{v:.6f}" for v in s.token_logprobs) for s in scored]
        return [f"{s.score:.6f}" for s in scored]
    prefixes = None
    if args.prefix:
        texts, prefixes = _pairs(texts, "--prefix", "prefix")
    if args.num_hypotheses is not None or args.scores:
        nbest = client.translate(texts, prefixes, search, num_hypotheses=args.num_hypotheses or 1, return_scores=True)
        return [f"{i} ||| {h.text} ||| {h.score:.6f}" for i, hyps in enumerate(nbest) for h in hyps]
    return client.translate(texts, prefixes, search)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve.client", description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=sorted(DEFAULT_PORTS), default="http")
    parser.add_argument("--url", help="host:port (default 127.0.0.1:8000 for http, :8001 for grpc)")
    parser.add_argument(
        "--model",
        help="model name (may be omitted when the server has one model and "
        "--admin-key-file is given: listing models is an admin API)",
    )
    parser.add_argument("--admin-key-file", help="the server's <repo>.serve/admin_key, for the restricted APIs")
    parser.add_argument("--beam-size", type=int, help="1 = greedy; default: the model's (manifest)")
    parser.add_argument("--len-penalty", type=float)
    parser.add_argument("--max-len-a", type=float)
    parser.add_argument("--max-len-b", type=int)
    parser.add_argument("--min-len", type=int)
    parser.add_argument(
        "--shortlist", type=int, choices=(0, 1), help="1: decode over the export's vocabulary shortlist (if it has one)"
    )
    parser.add_argument("--no-repeat-ngram-size", type=int, help="no n-gram of this size twice in an output (0: off)")
    parser.add_argument("--repetition-penalty", type=float, help="> 1 lowers tokens already in the output (1: off)")
    parser.add_argument(
        "--sampling", type=int, choices=(0, 1), help="1: draw each token (with --beam-size 1) instead of the best"
    )
    parser.add_argument("--top-k", type=int, help="sampling: among the k most likely tokens (0: all)")
    parser.add_argument("--top-p", type=float, help="sampling: among the nucleus of this probability mass, (0, 1]")
    parser.add_argument("--temperature", type=float, help="sampling: logits / temperature")
    parser.add_argument("--seed", type=int, help="sampling: the same seed gives the same samples")
    parser.add_argument(
        "--prefix",
        action="store_true",
        help="each input is `source<TAB>prefix`: the output starts with the prefix (a target text)",
    )
    parser.add_argument(
        "--num-hypotheses",
        type=int,
        help="n-best: print `i ||| text ||| score` lines, n per source (≤ beam size; samples with --sampling 1)",
    )
    parser.add_argument("--scores", action="store_true", help="print the search scores (`i ||| text ||| score`)")
    parser.add_argument(
        "--score",
        action="store_true",
        help="forced decoding: each input is `source<TAB>target`; print the target's sentence score per line",
    )
    parser.add_argument("--token-scores", action="store_true", help="with --score: also each token's log-prob")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("text", nargs="*", help="source texts; stdin lines when none are given")
    args = parser.parse_args(argv)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin]
    search = {name: getattr(args, name) for name in SEARCH_PARAMETERS}
    with one_line_errors(ServeError):
        try:
            headers = {ADMIN_HEADER: Path(args.admin_key_file).read_text().strip()} if args.admin_key_file else None
        except OSError as exc:
            raise ClientError(f"cannot read --admin-key-file {args.admin_key_file}: {exc}") from exc
        with Client(args.url, args.protocol, args.model, args.timeout, headers) as client:
            for line in _answer(client, args, texts, search):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
