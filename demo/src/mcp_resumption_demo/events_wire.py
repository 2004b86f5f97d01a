# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""A tiny client of the Events extension over ordinary HTTP clients, the ones
the product's patches observe: httpx2 and its ``EventSource`` (the mcp 2.x
environment) or httpx and httpx-sse (the mcp 1.x environment).

    async with EventsWire(server.url) as wire:
        answer = await wire.poll("ticket.created", cursor=None)
        async with wire.stream("ticket.created", cursor=answer["cursor"]) as stream:
            event = await stream.next_event()
        # leaving the block aborts the request: the client closed the stream

Also :class:`WebhookReceiver`, a loopback endpoint that keeps and verifies
the signed POSTs a webhook subscription sends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version

PROTOCOL_VERSION = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/events"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


def default_library() -> str:
    """httpx2 where the mcp 2.x SDK is installed, httpx with the 1.x SDK."""
    try:
        return "httpx2" if int(version("mcp").split(".")[0]) >= 2 else "httpx"
    except Exception:
        return "httpx"


class EventsRpcError(Exception):
    def __init__(self, status: int, error: dict) -> None:
        super().__init__(f"{status} {error}")
        self.status = status
        self.code = error.get("code")
        self.message = error.get("message")
        self.data = error.get("data")


class EventsWire:
    def __init__(self, url: str, *, library: str | None = None, token: str | None = None,
                 ids: Callable[[], object] | None = None) -> None:
        self.url = url
        self.library = library or default_library()
        self.token = token
        counter = itertools.count(1)
        self._ids = ids or (lambda: next(counter))
        if self.library == "httpx2":
            import httpx2 as http
        else:
            import httpx as http
        self._http_module = http
        self.http = None

    async def __aenter__(self) -> EventsWire:
        timeout = self._http_module.Timeout(30.0, read=None)
        self.http = self._http_module.AsyncClient(timeout=timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    def message(self, method: str, params: dict | None = None,
                request_id: object = None) -> tuple[dict, dict]:
        """The JSON-RPC body and the headers the 2026-07-28 transport asks for."""
        body_params = dict(params or {})
        body_params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "events-wire", "version": "1"},
        }
        body = {"jsonrpc": "2.0", "id": self._ids() if request_id is None else request_id,
                "method": method, "params": body_params}
        headers = {"accept": "application/json, text/event-stream",
                   "content-type": "application/json",
                   "mcp-protocol-version": PROTOCOL_VERSION, "mcp-method": method}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        return body, headers

    async def request(self, method: str, params: dict | None = None,
                      request_id: object = None) -> dict:
        """The result of one request answered with JSON; an error raises EventsRpcError."""
        body, headers = self.message(method, params, request_id)
        response = await self.http.post(self.url, json=body, headers=headers)
        answer = response.json()
        if "error" in answer:
            raise EventsRpcError(response.status_code, answer["error"])
        return answer["result"]

    async def discover(self) -> dict:
        return await self.request("server/discover")

    async def list_types(self) -> list[dict]:
        return (await self.request("events/list"))["events"]

    async def poll(self, name: str, cursor: str | None = None, *, arguments: dict | None = None,
                   max_age_ms: int | None = None, max_events: int | None = None,
                   request_id: object = None) -> dict:
        params: dict = {"name": name, "arguments": arguments or {}, "cursor": cursor}
        if max_age_ms is not None:
            params["maxAgeMs"] = max_age_ms
        if max_events is not None:
            params["maxEvents"] = max_events
        return await self.request("events/poll", params, request_id)

    @contextlib.asynccontextmanager
    async def stream(self, name: str, cursor: str | None = None, *,
                     arguments: dict | None = None, max_age_ms: int | None = None,
                     request_id: object = None, wait_active: bool = True
                     ) -> AsyncIterator[PushStream]:
        """An open ``events/stream``; leaving the block closes it from the client."""
        params: dict = {"name": name, "arguments": arguments or {}, "cursor": cursor}
        if max_age_ms is not None:
            params["maxAgeMs"] = max_age_ms
        body, headers = self.message("events/stream", params, request_id)
        async with self.http.stream("POST", self.url, json=body, headers=headers) as response:
            stream = PushStream(body["id"], response, self.library)
            if response.headers.get("content-type", "").startswith("application/json"):
                await response.aread()
                raise EventsRpcError(response.status_code, response.json()["error"])
            stream.start()
            try:
                if wait_active:
                    await stream.next("notifications/events/active")
                yield stream
            finally:
                await stream.stop()

    async def subscribe(self, name: str, url: str, secret: str, cursor: str | None = None, *,
                        arguments: dict | None = None, ttl_ms: object = ...,
                        max_age_ms: int | None = None, request_id: object = None) -> dict:
        params: dict = {"name": name, "arguments": arguments or {}, "cursor": cursor,
                        "delivery": {"mode": "webhook", "url": url, "secret": secret}}
        if ttl_ms is not ...:
            params["ttlMs"] = ttl_ms
        if max_age_ms is not None:
            params["maxAgeMs"] = max_age_ms
        return await self.request("events/subscribe", params, request_id)

    async def unsubscribe(self, name: str, url: str, *, arguments: dict | None = None) -> dict:
        params = {"name": name, "arguments": arguments or {}, "delivery": {"url": url}}
        return await self.request("events/unsubscribe", params)


class PushStream:
    """Notifications of one ``events/stream`` response, read by a task of its own."""

    def __init__(self, request_id: object, response, library: str) -> None:
        self.request_id = request_id
        self.response = response
        self.library = library
        self.messages: list[dict] = []  # every JSON-RPC message, in order
        self.cursor: str | None = None  # the latest cursor the stream carried
        self.result: dict | None = None  # the final frame, when the server ended it
        self.broken: BaseException | None = None  # the read error, when the connection died
        self.ended = asyncio.Event()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    @property
    def events(self) -> list[dict]:
        return [m["params"] for m in self.messages
                if m.get("method") == "notifications/events/event"]

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._read())

    async def _sse(self) -> AsyncIterator[str]:
        if self.library == "httpx2":
            import httpx2

            async for event in httpx2.EventSource(self.response):
                yield event.data
        else:
            import httpx_sse

            async for event in httpx_sse.EventSource(self.response).aiter_sse():
                yield event.data

    async def _read(self) -> None:
        try:
            async for data in self._sse():
                if not data:
                    continue
                message = json.loads(data)
                self.messages.append(message)
                params = message.get("params") or {}
                if "cursor" in params:
                    self.cursor = params["cursor"]
                if "result" in message or "error" in message:
                    self.result = message
                self._queue.put_nowait(message)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the connection died under the read
            self.broken = error
        finally:
            self.ended.set()
            self._queue.put_nowait(None)

    async def next(self, method: str | None = None, timeout: float = 15) -> dict:
        """The next message (of ``method``, skipping others); raises
        EOFError when the stream ended first, TimeoutError after ``timeout``."""

        async def take() -> dict:
            while True:
                message = await self._queue.get()
                if message is None:
                    self._queue.put_nowait(None)
                    raise EOFError(f"stream {self.request_id} ended ({self.broken!r})")
                if method is None or message.get("method") == method:
                    return message

        return await asyncio.wait_for(take(), timeout)

    async def next_event(self, timeout: float = 15) -> dict:
        return (await self.next("notifications/events/event", timeout))["params"]

    async def wait_ended(self, timeout: float = 15) -> None:
        await asyncio.wait_for(self.ended.wait(), timeout)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class WebhookReceiver:
    """A loopback http endpoint keeping every POST; answers ``status`` (200)."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.statuses: list[int] = []  # answered first, one per POST; then 200
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.posts.append({"headers": headers, "raw": raw,
                                           "body": json.loads(raw), "status": status})
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks/client"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def received(self) -> list[dict]:
        with self._lock:
            return list(self.posts)

    def accepted(self) -> list[dict]:
        """Bodies of the POSTs answered 2xx, in arrival order."""
        return [p["body"] for p in self.received() if 200 <= p["status"] < 300]

    @staticmethod
    def verify(post: dict, secret: str) -> bool:
        """Standard Webhooks: v1, HMAC-SHA256 over id.timestamp.body."""
        headers = post["headers"]
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + post["raw"]
        key = base64.b64decode(secret[len("whsec_"):])
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        return any(hmac.compare_digest(f"v1,{expected}", s)
                   for s in headers["webhook-signature"].split())

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
