"""OpenTelemetry spans of conversation trees (the ``otel`` extra).

- ``SpanObserver``: turns steps into ``invoke_agent``, ``chat`` and ``execute_tool``
  spans after the GenAI semantic conventions, parented along the delegation tree; the
  hook a runtime calls with each step it records (live spans), and what
  ``record_tree`` feeds from a recorded log;
- ``tree_spans`` / ``send_otlp``: a recorded tree's spans, sent to an OTLP/HTTP
  endpoint (``fanfold export ID --format otlp``).

No prompt or output text is put in a span unless ``capture_content`` is set.
"""

from fanfold.otel.export import (
    ExportFailed,
    record_tree,
    send_otlp,
    shown_url,
    traces_url,
    tree_spans,
)
from fanfold.otel.spans import ServedBy, SpanObserver, config_served_by

__all__ = [
    "ExportFailed",
    "ServedBy",
    "SpanObserver",
    "config_served_by",
    "record_tree",
    "send_otlp",
    "shown_url",
    "traces_url",
    "tree_spans",
]
