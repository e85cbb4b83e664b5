"""A stdio MCP server (the official Python SDK's MCPServer) whose tool
`greet` asks the user for their name (`elicitation/create`, form mode)
and answers with what it got: `hello NAME`, or the action when the user
declined or cancelled; `signup` asks for a form of every kind of field
(required text, an email, a bounded integer, an enum and a boolean with
defaults) and answers with the JSON the SDK validated; `connect` asks the
user to open a sign-in URL (URL mode) and answers with the action. For the
elicitation tests (faces.rs, mcp_servers.rs, pty.rs)."""
from typing import Literal

from pydantic import BaseModel, Field

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


class Signup(BaseModel):
    name: str = Field(description="as you like to be called", min_length=1)
    email: str = Field(json_schema_extra={"format": "email"})
    age: int = Field(ge=0, le=150)
    colour: Literal["red", "green", "blue"] = "green"
    newsletter: bool = False


@server.tool()
async def signup(ctx: Context) -> str:
    """Sign the user up with the details they give."""
    result = await ctx.elicit("Sign up for the club?", Signup)
    if result.action == "accept":
        return f"signed up {result.data.model_dump_json()}"
    return f"not signed up: {result.action}"


SIGN_IN = "https://auth.example.org/connect?client=cairn-test"


@server.tool()
async def connect(ctx: Context) -> str:
    """Connect the user's account (they sign in on the service's own page)."""
    result = await ctx.elicit_url("Sign in to the example service", SIGN_IN, "sign-in-1")
    return f"url: {result.action}"


server.run()
