"""Request handling shared by the Python-backend models of both repository variants (copied next to them).

Why this file looks the way it does:
- It needs only numpy, the backend's utilities and the export runtime: the model object (export runtime or BLS) is
  built by the subclass in model.py, so both variants answer requests in exactly the same way.
- It is where a served model finds the project's code, once for both variants: model.py imports this file first
  (beside it: the python backend appends the version directory to sys.path), and this file puts `packages/` (a
  copy of the `export` package: its `__init__` and `runtime/`) first on sys.path, so `import export.runtime` here
  and in model.py is this model's own copy, as in any other caller of the runtime.
- All requests of one lane batch with the same search and output options (model_requests.py `batch_key`) are
  generated (or scored) together in one runtime call — that is where batching pays off on CPU; their length
  settings (min_len, max_len_a, max_len_b) and target prefixes may differ, as each row keeps its own, and with
  sampling each row draws by its index within its own request, so a request's samples do not depend on its
  neighbours.
- Reading a request is model_requests.py's job, writing its response model_outputs.py's (where an optional
  output is added).
- Every failure is answered per request (`InferenceResponse(error=…)`): one bad request never fails the others
  of its batch, and no request goes unanswered.

Translation request: input `TEXT` (TYPE_STRING, [batch, 1], UTF-8), optional input `PREFIX` (TYPE_STRING,
[batch, 1]: per source the target text its output starts with, "" = none). Optional request parameters: the
export runtime's search settings (beam_size, len_penalty, max_len_a, max_len_b, min_len, shortlist,
no_repeat_ngram_size, repetition_penalty, sampling, top_k, top_p, temperature, seed; bounded by its SEARCH_LIMITS;
unset = the manifest's defaults; shortlist=1 needs an export built with a shortlist), `num_hypotheses` (an
integer 1 … beam_size, or 1 … 64 samples with sampling=1; default 1) and `return_scores` (a boolean, default
false); any other parameter is refused with an error naming the allowed ones. Response: `OUTPUT` (TYPE_STRING,
[batch, num_hypotheses], best first) and `TRUNCATED` (TYPE_BOOL, [batch, 1]: the source was longer than the
model's limit and was cut, as the export runtime does); with return_scores also `SCORES` (TYPE_FP32, [batch,
num_hypotheses]: summed token log-probs, eos included, / length ** len_penalty — what the search ranks by).
Without the new parameters the response is what it always was. Defined results: an empty or whitespace-only
source gives "" without running the model (score NaN), whatever its prefix.

Scoring request (forced decoding): inputs `TEXT` and `TARGET` (TYPE_STRING, [batch, 1], one target per source);
only `len_penalty` may be set. Response: `SCORES` ([batch, 1], the sentence score on the search's scale),
`TOKEN_SCORES` (TYPE_FP32, [batch, T]: each target token's log-prob, then eos's, NaN-padded to the longest row)
and `TRUNCATED`. Targets are cut to what the model can produce (max_positions - 2 tokens).

Cost limits (one client must not starve the others): a translation's cost is rows × beam × maximum output tokens
(each row's limit from max_len_a/max_len_b, capped by the model's positions; with sampling, rows × num_hypotheses
× maximum output tokens; a prefix's tokens are steps within that limit), a scoring request's its target
tokens + eos per row; both computed before anything runs. Over `max_request_cost` a request is refused
(INVALID_ARGUMENT, naming the budget). Its price (model_prices.py) weighs those row-steps by what its options cost
and adds what every row and request costs, as measured for this model (`prices.json`); the lanes count prices.
`execute` only parses and prices: a request priced at most `express_cost`
goes to the express lane, any other to the bulk lane (model_lanes.py); each lane runs batches of up to
`max_execute_cost` in arrival order (the express lane: smaller batches, cheapest first), the two at once, and
answers through the requests' response senders, so a cheap request never waits behind a heavy one. A lane
holding `max_queued_cost` of work answers the next request UNAVAILABLE (retry). Texts are cut to what the model
can use in characters before tokenising (a 300 MB text costs no more than a long sentence) and tokenised once.
Client mistakes are answered INVALID_ARGUMENT (HTTP 400), never INTERNAL.

Metrics (model_metrics.py): every request answered or refused is counted in the zoo_* series of /metrics; a
request's latency runs from its `execute` to its response.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from model_lanes import EXPRESS_BATCHES, Lane, Ticket
from model_metrics import ModelMetrics
from model_prices import PRICES_FILE, PriceRule, options_of

# First on sys.path, so that this copy is the `export` imported, not a project checkout on PYTHONPATH or an installed
# one. packages/ holds that package only: files beside model.py stay where the python backend put them, last on
# sys.path, behind every library they might be named like.
PACKAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "packages")
if PACKAGES not in sys.path:
    sys.path.insert(0, PACKAGES)
from model_outputs import SCORES, generated_tokens, response_arrays  # noqa: E402
from model_requests import (  # noqa: E402 (imports the runtime: after the sys.path line above)
    INPUT,
    PREFIX,
    SCORING_SETTINGS,
    TARGET,
    RequestError,
    batch_key,
    client_of,
    decode_texts,
    parse_parameters,
    request_work,
    translation_settings,
)

from export.runtime import generation  # noqa: E402 (after the sys.path line above, which finds it)
from export.runtime.search import (  # noqa: E402 — budgets in decoder row-steps (rows × beam × max output tokens)
    DEFAULT_EXPRESS_COST,
    DEFAULT_MAX_EXECUTE_COST,
    DEFAULT_MAX_REQUEST_COST,
)

TRUNCATED = "TRUNCATED"
TOKEN_SCORES = "TOKEN_SCORES"
QUEUED_BATCHES = 4  # a lane holds at most this many batches' worth of work (max_queued_cost by default)
EXPRESS, BULK = "express", "bulk"
MAX_PIECE_CHARS = 16  # sentencepiece's default max_sentencepiece_length: a token covers at most this many chars


class Busy(RuntimeError):
    """A valid request this `execute` has no budget left for: answered UNAVAILABLE, to be retried."""


def _error(exc: Exception) -> Any:
    code = pb_utils.TritonError.UNAVAILABLE if isinstance(exc, Busy) else pb_utils.TritonError.INVALID_ARG
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), code))


def _send(sender: Any, response: Any) -> None:
    """A request's one and only response (execute returns None: every request is answered through its sender).
    A failed send (the client went away) is logged, never raised: the lane goes on with the others."""
    try:
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    except Exception as exc:
        pb_utils.Logger.log_warn(f"a response could not be sent: {type(exc).__name__}: {exc}")


class _Request:
    """One request, parsed and priced. `encoded`: source ids per row (None: an empty source, not run);
    `targets`: target ids per row for a scoring request, else None; `key`: requests with equal keys run together;
    a translation's `search` (every option as one value) and `work` (its non-empty sources checked for it by the
    decoding driver's `prepare`: length bounds, prefixes, sampling keys)."""

    def __init__(
        self,
        index: int,
        encoded: list[list[int] | None],
        truncated: list[bool],
        cost: int,
        key: tuple[Any, ...],
        targets: list[list[int]] | None = None,
        search: Any = None,
        work: Any = None,
    ) -> None:
        self.index, self.encoded, self.truncated, self.cost, self.key = index, encoded, truncated, cost, key
        self.targets, self.search, self.work = targets, search, work

    @property
    def source_tokens(self) -> int:
        return sum(len(ids) for ids in self.encoded if ids is not None)


class TextModel:
    """Text in, text out over an `ExportedModel` (the decoding driver's engine, with its `search_settings`,
    `request_cost`, `score_cost`, `tokenizer`); subclasses say how it is built (`load`)."""

    def load(self, directory: str, params: dict[str, str], args: dict[str, str]) -> Any:
        raise NotImplementedError

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        directory = os.path.join(args["model_repository"], args["model_version"])
        self.model = self.load(directory, params, args)
        self.limit = max(1, self.model.max_positions // 2)  # what export_runtime.encode_texts keeps
        # a source longer than this many characters has more than `limit` tokens whatever it says: cut it
        # before tokenising (the cut part would be truncated away anyway)
        self.max_chars = self.limit * MAX_PIECE_CHARS + MAX_PIECE_CHARS
        self.target_limit = max(0, self.model.max_positions - 2)  # what export_runtime.encode_targets keeps
        self.max_target_chars = self.target_limit * MAX_PIECE_CHARS + MAX_PIECE_CHARS
        self.max_request_cost = int(params.get("max_request_cost", DEFAULT_MAX_REQUEST_COST))
        self.max_execute_cost = max(
            int(params.get("max_execute_cost", DEFAULT_MAX_EXECUTE_COST)), self.max_request_cost
        )
        self.logger = pb_utils.Logger
        self.metrics = ModelMetrics(args["model_name"], args["model_version"])
        self.express_cost = int(params.get("express_cost", DEFAULT_EXPRESS_COST))
        self.prices = PriceRule.read(os.path.join(directory, PRICES_FILE))  # the lanes count prices, not row-steps
        queued = int(params.get("max_queued_cost", QUEUED_BATCHES * self.max_execute_cost))
        express_batch = max(1, min(self.max_execute_cost, EXPRESS_BATCHES * self.express_cost))
        self.lanes = {
            EXPRESS: Lane(EXPRESS, express_batch, queued, self._run, cheapest_first=True),
            BULK: Lane(BULK, self.max_execute_cost, queued, self._run),
        }

    # ------------------------------------------------------------------ parsing and pricing
    def _encode_sources(self, texts: list[str], keep_empty: bool) -> tuple[list[list[int] | None], list[bool]]:
        """Token ids per source (None for an empty one unless `keep_empty`: scoring runs every row) and
        truncation flags, cutting in characters first."""
        live = [j for j, t in enumerate(texts) if keep_empty or t.strip()]
        cut = [texts[j][: self.max_chars] for j in live]
        ids = self.model.tokenizer.encode_sources(cut) if cut else []
        encoded: list[list[int] | None] = [None] * len(texts)
        truncated = [False] * len(texts)
        for j, piece_ids, text in zip(live, ids, cut, strict=True):
            encoded[j] = piece_ids[: self.limit] or [self.model.unk_id]
            truncated[j] = len(piece_ids) > self.limit or len(texts[j]) > len(text)
        return encoded, truncated

    def _over_budget(self, cost: int, fix: str) -> RequestError:
        return RequestError(
            f"request cost {cost} exceeds this model's budget max_request_cost={self.max_request_cost}; {fix}"
        )

    def _price(self, index: int, request: Any) -> _Request:
        """Parse, tokenise once and price one request; RequestError for anything the client must fix."""
        tensor = pb_utils.get_input_tensor_by_name(request, INPUT)
        if tensor is None:
            raise RequestError(f"input {INPUT} is missing")
        texts = decode_texts(tensor.as_numpy())
        given = parse_parameters(request.parameters())
        target = pb_utils.get_input_tensor_by_name(request, TARGET)
        prefix = pb_utils.get_input_tensor_by_name(request, PREFIX)
        if target is not None:
            if prefix is not None:
                raise RequestError(
                    f"{PREFIX} does not apply to scoring (a request with {TARGET}); send {PREFIX} to translate, "
                    f"{TARGET} to score"
                )
            return self._price_scoring(index, texts, decode_texts(target.as_numpy(), TARGET), given)
        search = translation_settings(self.model, given)
        encoded, truncated = self._encode_sources(texts, keep_empty=False)
        prefix_texts = None if prefix is None else decode_texts(prefix.as_numpy(), PREFIX)
        work = request_work(self.model, encoded, search, prefix_texts, self.max_target_chars)
        cost = self.model.request_cost([len(ids) for ids in work.encoded], search)
        if cost > self.max_request_cost:
            rows = "num_hypotheses (samples)" if search.sampling else "beam_size"
            raise self._over_budget(
                cost,
                f"(rows × {rows} × maximum output tokens); send fewer rows per request, a smaller "
                f"{rows.split()[0]} or smaller max_len_a/max_len_b",
            )
        price = self.prices.price(cost, len(texts), options_of(search))
        return _Request(index, encoded, truncated, price, batch_key(search), search=search, work=work)

    def _price_scoring(self, index: int, texts: list[str], targets: list[str], given: dict[str, Any]) -> _Request:
        if len(targets) != len(texts):
            raise RequestError(
                f"{TARGET} has {len(targets)} rows but {INPUT} has {len(texts)}; send one target per source"
            )
        extra = sorted(set(given) - set(SCORING_SETTINGS))
        if extra:
            raise RequestError(
                f"parameter(s) {extra} do not apply to scoring (a request with {TARGET}); "
                f"allowed: {list(SCORING_SETTINGS)}"
            )
        len_penalty = translation_settings(self.model, given).len_penalty  # checked where a Search is made
        encoded, truncated = self._encode_sources(texts, keep_empty=True)
        cut = [t[: self.max_target_chars] for t in targets]
        target_ids = [ids[: self.target_limit] for ids in self.model.tokenizer.encode_targets(cut)] if cut else []
        cost = self.model.score_cost(target_ids)
        if cost > self.max_request_cost:
            raise self._over_budget(cost, "(target tokens + eos per row); send fewer or shorter targets per request")
        price = self.prices.price(cost, len(texts), ())
        return _Request(index, encoded, truncated, price, ("score", float(len_penalty)), target_ids)

    # ------------------------------------------------------------------ execution
    def execute(self, requests: list[Any]) -> None:
        """Parse and price each request, then hand it to its lane (model_lanes) and return at once: the lane
        answers it through its response sender. A request the client must fix, or one no lane has room for, is
        answered here."""
        started = time.perf_counter()
        for i, request in enumerate(requests):
            sender = request.get_response_sender()
            try:
                priced = self._price(i, request)
            except (RequestError, ValueError) as exc:
                _send(sender, _error(exc))
                self.metrics.refused_one("invalid")
                continue
            lane = self.lanes[EXPRESS if priced.cost <= self.express_cost else BULK]
            refused = lane.put(Ticket(priced, sender, started, client_of(request.parameters())))
            if refused is not None:
                _send(sender, _error(Busy(refused)))
                self.metrics.refused_one("busy")
        return None

    def _run(self, batch: list[Ticket]) -> None:
        """One lane batch: its requests with the same search settings generated (or scored) together, each group
        answered as it finishes; a group that fails is answered with the reason — no ticket goes unanswered."""
        groups: dict[tuple[Any, ...], list[Ticket]] = {}
        for ticket in batch:
            groups.setdefault(ticket.request.key, []).append(ticket)
        for key, tickets in groups.items():
            try:
                responses = self._answer(key, tickets)
            except Exception as exc:  # the whole group failed: answer each of its requests with the reason
                error = pb_utils.TritonError(f"generation failed: {type(exc).__name__}: {exc}")
                responses = [pb_utils.InferenceResponse(error=error) for _ in tickets]
                for _ in tickets:
                    self.metrics.refused_one("failed")
            for ticket, response in zip(tickets, responses, strict=True):
                _send(ticket.sender, response)

    def _answer(self, key: tuple[Any, ...], tickets: list[Ticket]) -> list[Any]:
        """The responses of one group of a batch (same key), counted in the metrics."""
        items = [t.request for t in tickets]
        answers = self._score(items, key[1]) if key[0] == "score" else self._translate(items)
        responses = []
        for ticket, (tensors, _) in zip(tickets, answers, strict=True):
            truncated = np.array(ticket.request.truncated, dtype=bool).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[*tensors, pb_utils.Tensor(TRUNCATED, truncated)])
            )
        for ticket, (_, generated) in zip(tickets, answers, strict=True):  # counted once every response is built
            req = ticket.request
            self.metrics.answered(
                rows=len(req.encoded),
                source_tokens=req.source_tokens,
                generated_tokens=generated,
                truncated=sum(req.truncated),
                seconds=time.perf_counter() - ticket.started,
            )
        cut = sum(t for req in items for t in req.truncated)
        if cut:
            self.logger.log_warn(f"{cut} source(s) longer than {self.limit} tokens were truncated")
        return responses

    def _translate(self, items: list[_Request]) -> list[tuple[list[Any], int]]:
        """Several requests' sources (one batch key) → one run of the decoding driver, each row within its own
        request's length bounds, with its own prefix and sampling key (its index within its request) → per request
        its output tensors (model_outputs.py) and the number of tokens it returns."""
        search = items[0].search  # the group's options but for the length settings each row keeps (its key)
        n = search.num_hypotheses
        work = generation.join([req.work for req in items])
        found = iter(generation.translations(self.model, generation.run(self.model, work, search)))
        answers = []
        for req in items:
            grid: list[list[Any]] = [[None] * n for _ in req.encoded]
            for row, ids in enumerate(req.encoded):
                if ids is not None:
                    hyps = next(found)
                    grid[row][: len(hyps)] = hyps  # fewer than n only if the search finished fewer
            tensors = [pb_utils.Tensor(name, array) for name, array in response_arrays(grid, search)]
            answers.append((tensors, generated_tokens(grid)))
        return answers

    def _score(self, items: list[_Request], len_penalty: float) -> list[tuple[list[Any], int]]:
        """Several scoring requests → one `generation.score` call → per request SCORES [rows, 1] and TOKEN_SCORES
        [rows, T] (NaN-padded); no tokens are generated."""
        sources = [ids for req in items for ids in req.encoded]
        targets = [ids for req in items for ids in req.targets or []]
        scored = iter(generation.score(self.model, sources, targets, len_penalty))
        answers = []
        for req in items:
            rows = [next(scored) for _ in req.encoded]
            width = max(len(s.token_logprobs) for s in rows)
            token_scores = np.full((len(rows), width), np.nan, dtype=np.float32)
            for j, s in enumerate(rows):
                token_scores[j, : len(s.token_logprobs)] = s.token_logprobs
            sentence = np.array([[s.score] for s in rows], dtype=np.float32)
            answers.append(([pb_utils.Tensor(SCORES, sentence), pb_utils.Tensor(TOKEN_SCORES, token_scores)], 0))
        return answers

    def finalize(self) -> None:
        for lane in self.lanes.values():
            for ticket in lane.stop():
                _send(ticket.sender, _error(Busy("the model is being unloaded; retry")))
        self.model = None
        self.metrics.close()
