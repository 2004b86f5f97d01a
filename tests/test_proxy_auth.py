"""MCP authorization through mcp-resumption-proxy, configured as
proxy/README.md says.

The server is the installed MCP SDK's own resource server (its
``AuthSettings`` and a ``TokenVerifier`` of this test's, as the SDK's auth
examples build one): its OAuth protected-resource metadata and its 401's
``WWW-Authenticate: ... resource_metadata=...`` name the URL it is
configured with (``resource_server_url``), never the request's host, so the
way to have them name the proxy is to configure the proxy's URL there.  The
server runs under uvicorn with its defaults, ``--proxy-headers`` and
``--forwarded-allow-ips 127.0.0.1``: from the proxy's ``X-Forwarded-For`` and
``X-Forwarded-Proto`` it knows the client's address and scheme.

The client connects from 127.0.0.2 (the proxy, its upstream router and the
server are on 127.0.0.1), so the address the server reports is the client's
only if the proxy forwarded it.  The truth is what the client received, the
upstream router's record of what the server answered, and the verifier's own
record of the tokens it was asked about.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx

from mcp_resumption_demo.loopback import LoopbackServer
from mcp_resumption_demo.router import Backend, Route
from proxy_harness import Proxy, RawRouter
from wire import MCP_MAJOR

ISSUER = "https://auth.example.com"
GOOD = "token-of-the-test"
CLIENT_ADDRESS = "127.0.0.2"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "auth-test", "version": "1"}}}
MCP_HEADERS = {"accept": "application/json, text/event-stream",
               "content-type": "application/json"}


class Verifier:
    """The test's TokenVerifier: one token is good; every token asked about
    is recorded."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def verify_token(self, token: str):
        from mcp.server.auth.provider import AccessToken

        self.asked.append(token)
        if token != GOOD:
            return None
        return AccessToken(token=token, client_id="test-client", scopes=["mcp"])


def resource_server(resource_url: str, verifier: Verifier):
    """The installed major's server as a resource server for ``resource_url``,
    with a route that reports the client and scheme its request names."""
    from mcp.server.auth.settings import AuthSettings
    from starlette.responses import JSONResponse

    auth = AuthSettings(issuer_url=ISSUER, resource_server_url=resource_url,
                        required_scopes=["mcp"])
    if MCP_MAJOR == 1:
        from mcp.server.fastmcp import FastMCP

        server = FastMCP("auth", auth=auth, token_verifier=verifier)
    else:
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("auth", auth=auth, token_verifier=verifier)

    @server.tool()
    def echo(text: str) -> str:
        return text

    @server.custom_route("/whoami", methods=["GET"])
    async def whoami(request):
        return JSONResponse({"client": request.client.host, "scheme": request.url.scheme})

    return server.streamable_http_app()


def test_the_metadata_and_the_401_name_the_proxy_and_the_server_knows_the_client() -> None:
    verifier = Verifier()

    async def scenario():
        backend: dict[str, int] = {}
        upstream = await RawRouter(lambda request: Route(Backend("rs", backend["port"]))).start()
        running = await asyncio.to_thread(Proxy, upstream.url + "/mcp")
        server = None
        try:
            # Configured as the docs say: its resource URL is the proxy's.
            server = await LoopbackServer(resource_server(running.url, verifier),
                                          name="rs").astart()
            backend["port"] = server.port
            transport = httpx.AsyncHTTPTransport(local_address=CLIENT_ADDRESS)
            async with httpx.AsyncClient(transport=transport, timeout=10) as client:
                refused = await client.post(running.url, json=INITIALIZE, headers=MCP_HEADERS)
                challenge = refused.headers.get("www-authenticate", "")
                found = re.search(r'resource_metadata="([^"]+)"', challenge)
                metadata = await client.get(found.group(1)) if found else None
                accepted = await client.post(running.url, json=INITIALIZE, headers={
                    **MCP_HEADERS, "authorization": f"Bearer {GOOD}"})
                seen = (await client.get(running.origin + "/whoami")).json()
                seen_tls = (await client.get(running.origin + "/whoami", headers={
                    "x-forwarded-proto": "https"})).json()
            return running, upstream, refused, found, metadata, accepted, seen, seen_tls
        finally:
            await asyncio.to_thread(running.close)
            await upstream.close()
            if server is not None:
                await asyncio.to_thread(server.close)

    running, upstream, refused, found, metadata, accepted, seen, seen_tls = asyncio.run(
        scenario())
    assert refused.status_code == 401, refused.text
    assert found, refused.headers.get("www-authenticate")
    assert found.group(1) == running.origin + "/.well-known/oauth-protected-resource/mcp"
    # The server wrote it so (the upstream leg's record), the proxy passed it on.
    [server_401] = [x for x in upstream.exchanges if x.status == 401]
    assert found.group(1) in (server_401.response_header("www-authenticate") or "")
    assert metadata is not None and metadata.status_code == 200, metadata
    document = metadata.json()
    assert document["resource"] == running.url, document
    assert [url.rstrip("/") for url in document["authorization_servers"]] == [ISSUER]
    assert json.loads(bytes(next(x for x in upstream.exchanges if "oauth-protected-resource"
                                 in x.request.target).raw))["resource"] == running.url
    assert accepted.status_code == 200, accepted.text
    assert accepted.headers.get("mcp-session-id")
    assert verifier.asked == [GOOD], verifier.asked  # the token crossed the proxy as it was
    # uvicorn's proxy headers, from what the proxy added: the client's
    # address (not the proxy's, on 127.0.0.1) and the scheme the client used.
    assert seen == {"client": CLIENT_ADDRESS, "scheme": "http"}, seen
    assert seen_tls == {"client": CLIENT_ADDRESS, "scheme": "https"}, seen_tls
