"""A streamable-HTTP MCP server that requires OAuth, for mcp/oauth.rs.

The resource server is the official Python SDK's (`MCPServer` with a
`token_verifier` and `AuthSettings`: it answers 401 with a
`WWW-Authenticate` naming its protected resource metadata, which it
serves). Its authorization server, on the same port, answers RFC 8414
metadata and the client-credentials grant (RFC 6749 4.4; the SDK's own
authorization server has only the authorization-code grant): client
`cairn-test` with the secret `m2m-s3cret`, and the MCP server's URL as the
`resource` (RFC 8707), else it refuses.
Usage: oauth_server.py PORT"""
import secrets
import sys
import time

import uvicorn
from starlette.responses import JSONResponse

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer

port = int(sys.argv[1])
base = f"http://127.0.0.1:{port}"
resource = f"{base}/mcp"
CLIENT_ID, CLIENT_SECRET, SCOPE = "cairn-test", "m2m-s3cret", "mcp"
issued: dict[str, AccessToken] = {}


def say(text):
    print(text, file=sys.stderr, flush=True)


class Verifier:
    async def verify_token(self, token: str) -> AccessToken | None:
        found = issued.get(token)
        if found is None:
            say("refused a bearer token it did not issue")
        return found


server = MCPServer(
    "oauth",
    token_verifier=Verifier(),
    auth=AuthSettings(
        issuer_url=base,
        resource_server_url=resource,
        required_scopes=[SCOPE],
        validate_token_resource=True,
    ),
)


@server.tool()
def whoami() -> str:
    """Say how the caller got in."""
    return "you hold a token from the client-credentials grant"


@server.custom_route("/.well-known/oauth-authorization-server", methods=["GET"])
async def metadata(request):
    return JSONResponse({
        "issuer": base,
        "authorization_endpoint": f"{base}/authorize",
        "token_endpoint": f"{base}/token",
        "token_endpoint_auth_methods_supported": ["client_secret_post"],
        "grant_types_supported": ["client_credentials"],
        "response_types_supported": ["code"],
        "scopes_supported": [SCOPE],
    })


@server.custom_route("/token", methods=["POST"])
async def token(request):
    form = await request.form()
    if form.get("grant_type") != "client_credentials":
        return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
    if form.get("client_id") != CLIENT_ID or form.get("client_secret") != CLIENT_SECRET:
        say("refused a client")
        return JSONResponse({"error": "invalid_client"}, status_code=401)
    if form.get("resource") != resource:
        say(f"refused a token request for resource {form.get('resource')!r}")
        return JSONResponse({"error": "invalid_target"}, status_code=400)
    value = secrets.token_urlsafe(24)
    issued[value] = AccessToken(
        token=value, client_id=CLIENT_ID, scopes=[SCOPE], expires_at=int(time.time()) + 3600, resource=resource
    )
    say("issued a token")
    return JSONResponse({"access_token": value, "token_type": "Bearer", "expires_in": 3600, "scope": SCOPE})


say("listening")
uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
