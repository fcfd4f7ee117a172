"""Built-in toolsets. Each is an MCP server made with the official `mcp` SDK."""
