"""``fanfold export ID --format otlp``: a recorded tree's spans sent to an OTLP endpoint."""

from __future__ import annotations

import os

import click

from fanfold.cli.display import printable
from fanfold.cli.errors import CliError
from fanfold.cli.output import hint
from fanfold.db import Store

DEFAULT_ENDPOINT = "http://localhost:4318"

format_option = click.option(
    "--format",
    "export_format",
    type=click.Choice(["jsonl", "otlp"]),
    default="jsonl",
    show_default=True,
    help="jsonl: the portable log; otlp: OpenTelemetry spans sent to --endpoint "
    "(needs the otel extra).",
)
endpoint_option = click.option(
    "--endpoint",
    default=None,
    help="OTLP/HTTP endpoint for --format otlp (default: $OTEL_EXPORTER_OTLP_ENDPOINT "
    f"or {DEFAULT_ENDPOINT}); /v1/traces is added unless given.",
)
content_option = click.option(
    "--capture-content",
    is_flag=True,
    help="With --format otlp: put prompts, messages, tool arguments and results in the "
    "spans (left out by default: they may hold anything).",
)


def export_otlp(
    store: Store, conversation_id: str, endpoint: str | None, capture_content: bool
) -> None:
    """Send the tree's spans; one-line errors for a missing extra or a failed send."""
    try:
        from fanfold.otel import ExportFailed, send_otlp, traces_url, tree_spans
    except ImportError:
        raise CliError("--format otlp needs the otel extra: pip install 'fanfold[otel]'") from None
    from_env = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    target = endpoint or from_env or DEFAULT_ENDPOINT
    if not target.startswith(("http://", "https://")):
        where = "--endpoint" if endpoint else "$OTEL_EXPORTER_OTLP_ENDPOINT"
        raise CliError(f"{where} must be an http:// or https:// URL, not {target!r}")
    spans = tree_spans(store, conversation_id, capture_content=capture_content)
    try:
        send_otlp(spans, target)
    except ExportFailed as exc:
        raise CliError(str(exc)) from None
    hint(
        f"sent {len(spans)} span(s) of tree {printable(conversation_id)} to "
        f"{printable(traces_url(target))}"
        + ("" if capture_content else " (no prompt or output text: --capture-content adds it)")
    )
