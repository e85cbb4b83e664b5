"""A streamable-HTTP MCP server whose tokens come from the authorization-
code flow, for mcp/oauth.rs (`cairn mcp login`).

Both halves are the official Python SDK's: `MCPServer` with an
`auth_server_provider` serves the protected resource metadata (RFC 9728),
the authorization server's metadata (RFC 8414), dynamic client
registration (RFC 7591), /authorize (PKCE S256 required) and /token
(authorization_code and refresh_token grants), and answers 401 without a
valid bearer token. The provider below is the test's: it keeps
everything in memory and approves every authorization request at once
(the "browser" is the test's HTTP client following the redirect), issuing
access tokens that live ACCESS_SECONDS and refresh tokens that rotate.
POST /test/refuse-refresh makes it refuse every refresh token from then on
(a revoked login). Each event is one stderr line the test counts.
Usage: oauth_code_server.py PORT"""
import secrets
import sys
import time

import uvicorn
from starlette.responses import JSONResponse

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

port = int(sys.argv[1])
base = f"http://127.0.0.1:{port}"
resource = f"{base}/mcp"
SCOPE = "mcp"
ACCESS_SECONDS = 3600
refuse_refresh = False


def say(text):
    print(text, file=sys.stderr, flush=True)


class Provider:
    def __init__(self):
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id):
        return self.clients.get(client_id)

    async def register_client(self, client_info):
        self.clients[client_info.client_id] = client_info
        say(f"registered a client {client_info.token_endpoint_auth_method}")

    async def authorize(self, client, params: AuthorizationParams):
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or [SCOPE], expires_at=time.time() + 300, client_id=client.client_id,
            code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly, resource=params.resource,
        )
        say("authorized a request")
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, authorization_code):
        return self.codes.get(authorization_code)

    def issue(self, client_id, scopes, resource_):
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes,
                                          expires_at=int(time.time()) + ACCESS_SECONDS, resource=resource_)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource_)
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=ACCESS_SECONDS,
                          scope=" ".join(scopes), refresh_token=refresh)

    async def exchange_authorization_code(self, client, authorization_code):
        self.codes.pop(authorization_code.code, None)
        say("issued a token for a code")
        return self.issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client, refresh_token):
        if refuse_refresh:
            say("refused a refresh token")
            return None
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token, scopes):
        self.refresh.pop(refresh_token.token, None)
        say("refreshed a token")
        return self.issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token):
        found = self.access.get(token)
        if found is None:
            say("refused a bearer token it did not issue")
        return found

    async def revoke_token(self, token):
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


provider = Provider()
server = MCPServer(
    "oauth-code",
    auth_server_provider=provider,
    auth=AuthSettings(
        issuer_url=base,
        resource_server_url=resource,
        required_scopes=[SCOPE],
        validate_token_resource=True,
        client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=[SCOPE],
                                                              default_scopes=[SCOPE]),
    ),
)


@server.tool()
def whoami() -> str:
    """Say how the caller got in."""
    return "you hold a token from the authorization-code grant"


@server.custom_route("/test/refuse-refresh", methods=["POST"])
async def refuse(request):
    global refuse_refresh
    refuse_refresh = True
    return JSONResponse({"refusing": True})


@server.custom_route("/test/forget-access", methods=["POST"])
async def forget(request):
    # Every access token issued so far is refused from now on (as after a
    # server restart): the next request gets 401 and must refresh.
    provider.access.clear()
    return JSONResponse({"forgot": True})


say("listening")
uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
