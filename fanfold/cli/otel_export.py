"""``fanfold export ID --format otlp``: a recorded tree's spans sent to an OTLP endpoint."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from fanfold.cli.errors import CliError

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.db import Store
    from fanfold.otel import ServedBy

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
    from fanfold.cli.display import printable
    from fanfold.cli.output import hint

    try:
        from fanfold.otel import ExportFailed, send_otlp, shown_url, traces_url, tree_spans
    except ImportError:
        raise CliError("--format otlp needs the otel extra: pip install 'fanfold[otel]'") from None
    from_env = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    target = endpoint or from_env or DEFAULT_ENDPOINT
    if not target.startswith(("http://", "https://")):
        where = "--endpoint" if endpoint else "$OTEL_EXPORTER_OTLP_ENDPOINT"
        raise CliError(f"{where} must be an http:// or https:// URL, not {shown_url(target)!r}")
    spans = tree_spans(
        store,
        conversation_id,
        capture_content=capture_content,
        served_by=recorded_served_by(store, conversation_id),
    )
    try:
        send_otlp(spans, target)
    except ExportFailed as exc:
        raise CliError(str(exc)) from None
    hint(
        f"sent {len(spans)} span(s) of tree {printable(conversation_id)} to "
        f"{printable(shown_url(traces_url(target)))}"
        + ("" if capture_content else " (no prompt or output text: --capture-content adds it)")
    )


def recorded_served_by(store: Store, conversation_id: str) -> ServedBy | None:
    """The provider and model of the tree's calls, from the configuration it recorded:
    ``scripted`` for a scripted tree, a profile's provider and model otherwise (as
    ``show`` prices them). Only for the user's own trees (the provenance mark verifies
    with the user's key): a log from elsewhere names files of its choosing, which are
    never read. None (spans name no provider) when unknown."""
    from fanfold.cli.recorded import recorded_config
    from fanfold.db.provenance import UserKey, refusal
    from fanfold.otel import config_served_by
    from fanfold.providers.description import SCRIPT, DescriptionError, ProviderDescription

    row = store.conversation(conversation_id)
    if row is None:
        return None
    record = store.tree_record(row.root_id)
    key = UserKey.existing()
    if record is None or record.provider is None or key is None:
        return None
    if refusal(record, key, store.instance_id, row.root_id) is not None:
        return None
    try:
        description = ProviderDescription.from_json(record.provider)
    except DescriptionError:
        return None
    if description.kind == SCRIPT:
        return lambda model, depth: ("scripted", model)
    config = recorded_config(record.provider)
    return config_served_by(config) if config is not None else None
