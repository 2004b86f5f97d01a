"""The Events server's log lives in the demo: ``mcp_resumption_demo.events_log``."""

from mcp_resumption_demo.events_log import *  # noqa: F403
