"""A streamable-HTTP MCP server (the official Python SDK's MCPServer) that
answers only requests carrying `Authorization: Bearer s3cret` and
`X-Tenant: acme` (others get 401), for mcp_servers.rs's header test.
Usage: headers_server.py PORT"""
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("headers")


@server.tool()
def hello(name: str) -> str:
    """Say hello."""
    return f"hello {name}, you were let in"


inner = server.streamable_http_app()


async def app(scope, receive, send):
    if scope["type"] == "http":
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if headers.get("authorization") != "Bearer s3cret" or headers.get("x-tenant") != "acme":
            print("refused a request without the headers", file=sys.stderr, flush=True)
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong headers"})
            return
    await inner(scope, receive, send)


print("listening", file=sys.stderr, flush=True)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
