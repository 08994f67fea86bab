"""fanfold and the Model Context Protocol (the ``mcp`` extra).

- ``fanfold.mcp.server``: fanfold's delegation served to MCP hosts (``fanfold mcp``):
  ``delegate_task``, ``list_sub_agents``, ``get_delegation_result``.

Nothing here is imported by the rest of fanfold unless an MCP feature is used: the
``mcp`` SDK is an optional dependency.
"""
