"""The trace page as one self-contained HTML file: CSS, script and data inline.

The data is JSON in a ``<script type="application/json">`` block, with ``<``, ``>``
and ``&`` written as ``\\u`` escapes, so no text of the log (a model's reply holding
``</script>``, say) can end the block or be read as markup; the page's script reads it
with ``JSON.parse`` and puts every text in the page with ``textContent``. A Content
Security Policy allows only the page's own script (by its hash) and no network but the
page's own origin (which ``fanfold ui`` serves; a file has none).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from importlib import resources
from typing import Any


def file_name(tree_id: str) -> str:
    """``trace-<id>.html``, the file ``fanfold trace ID`` writes by default, the id
    kept to safe characters (an imported log's id is anyone's text: it never names
    another directory, and a page's link to it is never anything but a file name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", tree_id).lstrip(".") or "tree"
    return f"trace-{safe[:80]}.html"


def _asset(name: str) -> str:
    return resources.files("fanfold.trace").joinpath(name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside an HTML ``<script>`` element: ASCII only, and no
    ``<``, ``>`` or ``&`` (each a ``\\u`` escape, which JSON.parse reads back)."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _script_hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "sha256-" + base64.b64encode(digest).decode("ascii")


def render_page(
    title: str, script_name: str, blocks: dict[str, Any], body: str, *, live: bool = False
) -> str:
    """A page of the trace viewer: ``body`` (fixed markup), the JSON ``blocks`` (by
    element id), the stylesheet and the script ``script_name``, all inline."""
    script = _asset(script_name)
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src '{_script_hash(script)}'; "
        + ("connect-src 'self'; " if live else "")
        + "base-uri 'none'; form-action 'none'"
    )
    data_blocks = "\n".join(
        f'<script type="application/json" id="{name}">{embed_json(value)}</script>'
        for name, value in blocks.items()
    )
    return (
        "<!doctype html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n"
        f"<style>\n{_asset('page.css')}</style>\n</head>\n<body>\n{body}\n"
        f"{data_blocks}\n<script>{script}</script>\n</body>\n</html>\n"
    )


_TRACE_BODY = """<header id="summary"></header>
<div id="banner" role="alert" hidden></div>
<section id="requests" aria-label="requests for a person's decision" hidden></section>
<main>
<section id="timeline" aria-label="timeline">
<div id="toolbar">
<label>Filter <input id="filter" type="text" placeholder="id, task or status (/)" size="24"></label>
<label><input id="bad-only" type="checkbox"> failed and cancelled only</label>
<span id="shown"></span>
<label>Search <input id="search" type="search" placeholder="in messages, tool calls, results (s)"
 size="28" aria-controls="hits"></label>
<span id="zoom" role="group" aria-label="zoom">
<button id="zoom-out" class="btn" title="zoom out (-)">&minus;</button>
<button id="zoom-in" class="btn"
 title="zoom in (+; Ctrl+wheel on the timeline, wheel on the axis)">+</button>
<button id="zoom-fit" class="btn" title="whole trace (0)">fit</button>
<span id="zoom-label">whole trace</span></span>
<span id="legend"><span><i class="m-model"></i>model call</span>
<span><i class="m-tool"></i>tool</span>
<span><i class="m-retry"></i>retry back-off</span><span><i class="m-wait"></i>waiting</span>
<span><i class="m-cancel"></i>cancel</span><span><i class="m-deadline"></i>deadline</span>
<span><i class="err"></i>error</span><span><i class="aborted"></i>aborted</span></span>
</div>
<div id="hits" role="region" aria-label="search hits" aria-live="polite" hidden></div>
<div id="axis" aria-hidden="true" title="wheel: zoom; drag or Shift+wheel: pan"></div>
<div id="rows" tabindex="0" role="listbox"
 aria-label="agents in tree order (arrows move, left/right: parent/child)">
<div id="rows-inner"></div></div>
</section>
<section id="stepper" aria-label="replay steps">
<div class="controls">
<button id="prev" class="btn" title="previous step ([)">&#9664;</button>
<input id="step" type="range" min="0" max="0" value="0" aria-label="step of the replay">
<button id="next" class="btn" title="next step (])">&#9654;</button>
<span id="step-label"></span>
</div>
<div id="step-info" aria-live="polite"></div>
</section>
<aside id="detail" tabindex="-1" aria-label="agent detail"></aside>
</main>
<div id="tooltip" role="tooltip" hidden></div>
<section id="divergence" role="dialog" aria-label="first divergence" hidden></section>
<section id="compare" role="dialog" aria-label="side by side" hidden></section>"""


def render_html(data: dict[str, Any], *, live: dict[str, str] | None = None) -> str:
    """The trace page of ``data`` (``build_trace``'s result). ``live``: the URLs of a
    ``fanfold ui`` server (``events``: server-sent events, ``data``: the trace as JSON)
    that the page follows for updates."""
    blocks: dict[str, Any] = {"trace-data": data}
    if live is not None:
        blocks["trace-live"] = live
    return render_page(
        f"fanfold trace {data['root']}", "page.js", blocks, _TRACE_BODY, live=live is not None
    )
