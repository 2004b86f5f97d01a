"""A short outage of the upstream, seen by the requests themselves (issue 45,
point 5).

The upstream is a real SDK server in a process of its own, on a loopback
port; the proxy (a child, tests/proxy_harness.py) probes it once at its
start and then not for ten minutes (``--upstream-probe 600``), so that
whatever changes after the start is what the requests told it.  The server
is killed (SIGKILL: its port refuses connections), three requests get
``502 upstream unreachable (ConnectError)``, the server is started again on
the same port, one request is answered.  Ground truth: the server's process
(dead, then listening again) and what each request got.  What the proxy must
do: the first request that cannot connect writes the unreachable line and
makes ``/readyz`` answer 503 before that request's 502 is sent; the first
answer afterwards writes the back line and makes it ready; one line per
change, however many requests saw it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import httpx

from proxy_harness import proxy
from test_proxy_admin import BACK, PING, UNREACHABLE, lines, until_line
from test_proxy_shutdown import admin_of, status_of, until_status

# The server of wire.sdk_app, on the port its first line of input names (0:
# a free one), its port printed once it listens.  It reads that line after
# its imports: the server that comes back is started with the first, and
# listens as soon as it is told.
SERVER = r"""
import socket, sys, uvicorn
sys.path.insert(0, sys.argv[1])
from wire import sdk_app
app = sdk_app()
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.stdin.readline())))
sock.listen(16)
print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning", log_config=None)).run(sockets=[sock])
"""
# Once at the start, then not within the test.
PROBE = ("--upstream-probe", "600")
HEADERS = {"accept": "application/json, text/event-stream"}


def server() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SERVER, os.path.dirname(__file__)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def listen(process: subprocess.Popen, port: int = 0) -> int:
    process.stdin.write(f"{port}\n")
    process.stdin.flush()
    return int(process.stdout.readline())


def post(url: str) -> httpx.Response:
    return httpx.post(url, json=PING, headers=HEADERS, timeout=10.0)


def test_a_request_that_cannot_connect_is_the_news_and_the_next_answer_the_end_of_it() -> None:
    upstream, restarted = server(), server()
    try:
        port = listen(upstream)
        with proxy(f"http://127.0.0.1:{port}/mcp", "--admin", "127.0.0.1:0", *PROBE) as running:
            admin = admin_of(running)
            asyncio.run(until_status(admin + "/readyz", 200))  # the probe at the start
            assert post(running.url).status_code != 502
            upstream.send_signal(signal.SIGKILL)
            upstream.wait(timeout=10)
            failed = post(running.url)
            # Before its 502 was sent: not ready, and the line written.
            ready_after_first = status_of(admin + "/readyz")
            failed_more = [post(running.url) for _ in range(2)]
            asyncio.run(until_line(running, UNREACHABLE))
            assert listen(restarted, port) == port
            still = httpx.get(admin + "/readyz", timeout=2.0)  # no probe since
            answered = post(running.url)
            ready_after_answer = status_of(admin + "/readyz")
            asyncio.run(until_line(running, BACK))
            stderr = running.stderr
    finally:
        for process in (upstream, restarted):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    for response in (failed, *failed_more):
        assert response.status_code == 502, response.text
        assert "upstream unreachable (ConnectError)" in response.text, response.text
    assert ready_after_first == 503, stderr
    assert (still.status_code, still.text) == (503, "not ready: the upstream is unreachable\n")
    assert answered.status_code != 502, answered.text
    assert ready_after_answer == 200, stderr
    # One line per change, in order, whatever the number of requests.
    assert lines(stderr, UNREACHABLE) == 1, stderr
    assert lines(stderr, BACK) == 1, stderr
    assert stderr.index(UNREACHABLE) < stderr.index(BACK), stderr
    assert f"the upstream 127.0.0.1:{port} is unreachable (ConnectError)" in stderr, stderr
    assert "Traceback" not in stderr, stderr
