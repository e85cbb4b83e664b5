"""A stdio MCP server (the official Python SDK's MCPServer) whose tool
`big` answers `size` bytes of text, for mcp_servers.rs's size test."""
from mcp.server.mcpserver import MCPServer

server = MCPServer("big")


@server.tool()
def big(size: int) -> str:
    """Answer `size` bytes of text."""
    return "x" * size


server.run()
