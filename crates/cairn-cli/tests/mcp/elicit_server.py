"""A stdio MCP server (the official Python SDK's MCPServer) whose tool
`greet` asks the user for their name (`elicitation/create`, form mode)
and answers with what it got: `hello NAME`, or the action when the user
declined or cancelled. For the elicitation tests (faces.rs, mcp_servers.rs)."""
from pydantic import BaseModel

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("ask")


class Name(BaseModel):
    name: str


@server.tool()
async def greet(ctx: Context) -> str:
    """Greet the user by the name they give."""
    result = await ctx.elicit("What is your name?", Name)
    if result.action == "accept":
        return f"hello {result.data.name}"
    return f"no name: {result.action}"


server.run()
