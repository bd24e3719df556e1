"""One error base for serving: a repository, server, proxy or client problem the user can fix.

Serving commands report a `ServeError` (and the torch-free runtime's `ExportRuntimeError`) through
`zoo.errors.one_line_errors`, as every other command does: one `error: …` line on stderr, exit status 2.
"""

from __future__ import annotations


class ServeError(Exception):
    """A serving problem the user can fix; the message names it and the fix."""


class ServerError(ServeError):
    """A server that cannot start or stop; the message names the cause and the fix (raised by serve.server and
    the modules it starts a server with: serve.launch, serve.server_settings)."""


__all__ = ["ServeError", "ServerError"]
