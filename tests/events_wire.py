"""The Events client lives in the demo (its events rows drive it):
``mcp_resumption_demo.events_wire``."""

from mcp_resumption_demo.events_wire import *  # noqa: F403
