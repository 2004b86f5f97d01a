"""A program that uses httpx against a plain HTTP server of its own, and
(with the argument ``mcp``) also POSTs one JSON-RPC request, which is MCP
traffic.  Its last line is the time (ns) at which it was done: the parent
measures the exit delay from there."""

from __future__ import annotations

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class Plain(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        body = b'{"jsonrpc": "2.0", "id": 1, "result": {}}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/"
with httpx.Client() as client:
    assert client.get(url).status_code == 200
    if sys.argv[1:] == ["mcp"]:
        request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        accept = {"accept": "application/json, text/event-stream"}  # as MCP clients send
        assert client.post(url, json=request, headers=accept).status_code == 200
server.shutdown()
print(time.time_ns(), flush=True)
