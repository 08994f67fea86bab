"""The trace page: a tree's log as one self-contained HTML file (``fanfold trace``).

- ``build_trace(store, id, vs=None)``: the page's data (agents in tree order with their
  marks, messages and outcomes; every step of the replay; the first divergence; a
  fork's origin and the tree beside it, its original or ``vs``), plain JSON;
- ``render_html(data)``: the page, CSS, script and data inline, no network.

Built on the read side only (``fanfold.db.Store``, ``fanfold.replay``): nothing runs.
"""

from fanfold.trace.build import FORMAT, VERSION, build_trace
from fanfold.trace.html import embed_json, render_html

__all__ = ["FORMAT", "VERSION", "build_trace", "embed_json", "render_html"]
