"""fanfold as a client of the Model Context Protocol (the ``mcp`` extra): the servers a
tree's tools come from (``config``: their declarations; ``client``: ``McpHub``, which
runs them; ``resources``; ``shrink``). fanfold served *to* MCP hosts (``fanfold mcp``)
is ``fanfold.serve.mcp_server``, above the runtime.

Nothing here is imported by the rest of fanfold unless an MCP feature is used: the
``mcp`` SDK is an optional dependency.
"""
