"""The runtime's error base: it imports nothing of zoo, so it cannot use zoo's."""

from __future__ import annotations


class ExportRuntimeError(Exception):
    """The torch-free runtime's own error base: a bad export directory or a bad request."""


class ExportedModelError(ExportRuntimeError):
    """An export directory that cannot be loaded (missing, corrupt or from a newer exporter)."""


class GraphRunError(ExportRuntimeError):
    """onnxruntime failed while running a graph. One line without onnxruntime's node names (internal detail a
    client should not see; the original stays chained for the log): usually a manifest that does not match its
    graphs."""
