"""What serves fanfold to other programs: the servers above the runtime.

- ``fanfold.serve.mcp_server``: fanfold's delegation served to MCP hosts (``fanfold
  mcp``): ``delegate_task``, ``list_sub_agents``, ``get_delegation_result`` and the
  decisions of a person (the ``mcp`` extra);
- ``fanfold.serve.mcp_http``: that server over Streamable HTTP on a loopback port
  (``fanfold mcp --http``), behind its Host and bearer-token guard;
- ``fanfold.serve.ui_server``: ``fanfold ui``'s web application, the trace pages of a
  whole database served live (the ``ui`` extra).

They stand beside the CLI and the workers, above everything they use (the runtime, the
log, the trace page's builder): nothing below imports them.
"""
