"""The Events server lives in the demo (its events rows run it):
``mcp_resumption_demo.events_server``; here for tests that import it by
its old name, and as ``python tests/events_server.py``."""

from mcp_resumption_demo.events_server import *  # noqa: F403
from mcp_resumption_demo.events_server import main

if __name__ == "__main__":
    main()
