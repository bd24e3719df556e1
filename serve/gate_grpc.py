"""The gate's gRPC front (serve/gate.py runs it): the methods it names, inference messages read from the wire and
rebuilt, streams ended here — each message one unary call to Triton that runs to its end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from serve.gate_config import ADMIN_KEY, RESTARTING, UNREACHABLE, GateConfig
from serve.grpc_infer import read_grpc_infer, read_model_name
from serve.infer_request import RequestRefused, client_name, encode_grpc
from serve.launch import GRPC_ADMIN_HEADER
from serve.proxy import CLIENT_ID_HEADER
from serve.served_models import served_extensions
from serve.upstreams import Replica, UpstreamLost, Upstreams
from serve.wire import encode_len_field

MAX_SMALL_MESSAGE = 4096  # a health, metadata, index or settings request is a few bytes: more is not one of them
SERVICE = "/inference.GRPCInferenceService/"
# gRPC methods: open ones, and those Triton restricts to the admin key (forwarded with the key, rebuilt)
PUBLIC_METHODS = ("ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelConfig")
ADMIN_METHODS = ("RepositoryIndex", "ModelStatistics", "LogSettings", "TraceSetting")


def grpc_server(config: GateConfig, upstreams: Upstreams) -> Any:
    """A grpc.aio server answering the methods the gate names (PUBLIC_METHODS, ModelInfer, ModelStreamInfer, and
    ADMIN_METHODS with the admin key); each request Triton receives is one the gate built."""
    import grpc
    from tritonclient.grpc import service_pb2

    def channel(port: int | None) -> Any:
        return grpc.aio.insecure_channel(
            f"127.0.0.1:{port}",
            options=[
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1),
                # reconnect within a second of a restarted tritonserver (gRPC's default back-off grows to 120 s)
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 1000),
                # no retries by the channel: a call that did not reach Triton is the gate's to retry, on another
                # replica (serve/upstreams.py)
                ("grpc.enable_retries", 0),
            ],
        )

    methods = (*PUBLIC_METHODS, *ADMIN_METHODS, "ModelInfer")
    stubs = {r.index: {m: channel(r.grpc_port).unary_unary(SERVICE + m) for m in methods} for r in upstreams.replicas}
    invalid = grpc.StatusCode.INVALID_ARGUMENT

    def lost(exc: grpc.aio.AioRpcError) -> UpstreamLost | None:
        """The UpstreamLost a failed call stands for (None: it is an answer of Triton's)."""
        details = (exc.details() or "").lower()
        if exc.code() != grpc.StatusCode.UNAVAILABLE or not any(s in details for s in UNREACHABLE):
            return None
        return UpstreamLost(broke_off="failed to connect" not in details and "refused" not in details, detail=details)

    def call(method: str, built: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
        async def send(replica: Replica) -> bytes:
            try:
                return await stubs[replica.index][method](built, metadata=metadata, timeout=config.upstream_timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise (lost(exc) or exc) from None

        return send

    def client(context: Any) -> str:
        """The client nginx names in the call's metadata (CLIENT_ID_HEADER), as the lanes share by it."""
        for item in context.invocation_metadata() or ():
            if item.key == CLIENT_ID_HEADER and isinstance(item.value, str):
                return client_name(item.value)
        return ""

    def admin_metadata(context: Any) -> tuple[tuple[str, str], ...]:
        for item in context.invocation_metadata() or ():
            if item.key == GRPC_ADMIN_HEADER and isinstance(item.value, str) and ADMIN_KEY.match(item.value):
                return ((GRPC_ADMIN_HEADER, item.value),)
        return ()

    def rebuilt(method: str, request: bytes) -> bytes:
        """The request Triton receives for a method other than inference (RequestRefused when it is not one)."""
        if len(request) > MAX_SMALL_MESSAGE:
            raise RequestRefused(f"a {method} request of {len(request)} bytes; it takes a few")
        if method in ("ServerLive", "ServerReady", "ServerMetadata"):
            return b""
        if method in ("ModelReady", "ModelMetadata", "ModelConfig"):
            name, version = read_model_name(request, config.models)
            return getattr(service_pb2, f"{method}Request")(name=name, version=version).SerializeToString()
        message = getattr(service_pb2, f"{method}Request").FromString(request)  # admin: small, key-holders only
        message.DiscardUnknownFields()
        return message.SerializeToString()

    def unary(method: str) -> Callable[..., Any]:
        async def handle(request: bytes, context: Any) -> bytes:
            refusal, digest = "", b""
            try:
                if method == "ModelInfer":
                    infer = read_grpc_infer(request, config.models)
                    infer.client = client(context)
                    built, digest = encode_grpc(infer), upstreams.memory.digest(infer.fingerprint())
                else:
                    built = rebuilt(method, request)
            except RequestRefused as exc:
                refusal = str(exc)
            except Exception:  # a small admin message protobuf could not read
                refusal = f"the {method} request message could not be read"
            del request  # a refused message is not kept alive by the abort's traceback
            if refusal:
                await context.abort(invalid, refusal)
            wait = upstreams.memory.refused_for(digest) if digest else 0.0
            if wait:
                await context.abort(grpc.StatusCode.UNAVAILABLE, upstreams.memory.message(wait))
            metadata = admin_metadata(context) if method in ADMIN_METHODS else ()
            try:
                answer = await upstreams.call(digest, call(method, built, metadata))
            except UpstreamLost:
                await context.abort(grpc.StatusCode.UNAVAILABLE, RESTARTING)
            except grpc.aio.AioRpcError as exc:  # Triton's own answer
                await context.abort(exc.code(), exc.details() or "")
            if method == "ServerMetadata":
                meta = service_pb2.ServerMetadataResponse.FromString(answer)
                kept = served_extensions(list(meta.extensions))
                del meta.extensions[:]
                meta.extensions.extend(kept)
                answer = meta.SerializeToString()
            return answer

        return handle

    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """ModelStreamInfer ends here: each message is one unary ModelInfer call to Triton, answered in order; a
        message the gate does not serve (or Triton refuses) gets its error in the stream, which goes on."""
        who = client(context)
        async for request in requests:
            try:
                infer = read_grpc_infer(request, config.models)
            except RequestRefused as exc:
                refusal = str(exc)
            else:
                refusal = ""
            del request
            if refusal:
                yield encode_len_field(1, refusal.encode())
                continue
            infer.client = who
            built, digest = encode_grpc(infer), upstreams.memory.digest(infer.fingerprint())
            wait = upstreams.memory.refused_for(digest)
            if wait:
                yield encode_len_field(1, upstreams.memory.message(wait).encode())
                continue
            try:
                answer = await upstreams.call(digest, call("ModelInfer", built))
            except UpstreamLost:
                yield encode_len_field(1, RESTARTING.encode())
                continue
            except grpc.aio.AioRpcError as exc:
                yield encode_len_field(1, (exc.details() or str(exc.code())).encode())
                continue
            yield encode_len_field(2, answer)

    handlers = {SERVICE + m: grpc.unary_unary_rpc_method_handler(unary(m)) for m in methods}
    handlers[SERVICE + "ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(stream)

    class Served(grpc.GenericRpcHandler):
        def service(self, handler_call_details: Any) -> Any:
            return handlers.get(handler_call_details.method)  # None: UNIMPLEMENTED, answered by grpc itself

    server = grpc.aio.server(
        handlers=[Served()],
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes + (1 << 20)),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_insecure_port(f"127.0.0.1:{config.grpc_port}")
    return server
