# Copyright The OpenTelemetry Authors
# SPDX-License-Identifier: Apache-2.0
"""Every name this instrumentation puts into telemetry.

Dashboards, alert rules and users' queries depend on these strings: change
one only with a changelog entry.
"""

# Re-exported (``X as X``), so that every name stays reachable from this module.
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE as ERROR_TYPE
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_RESPONSE_STATUS_CODE as HTTP_RESPONSE_STATUS_CODE,
)
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS as SERVER_ADDRESS
from opentelemetry.semconv.attributes.server_attributes import SERVER_PORT as SERVER_PORT

from ..rules.continuity import GapKind, Outcome
from ..rules.events import Kind as EventGapKind
from ..rules.fates import Fate
from ..rules.jsonrpc import LISTEN_FILTERS
from ..rules.tasks import Fate as TaskFate

# The transports (mcp.transport values) are the tracker's names for them: one set.
from ..tracking.tracker import SSE as TRANSPORT_SSE
from ..tracking.tracker import STREAMABLE_HTTP as TRANSPORT_STREAMABLE_HTTP

INSTRUMENTATION_NAME = "opentelemetry.instrumentation.mcp_resumption"
# The semantic conventions release whose MCP attributes (mcp.method.name,
# mcp.session.id, mcp.protocol.version, jsonrpc.request.id) these names follow.
# A literal: opentelemetry-semantic-conventions at our floor (0.60b0) lists
# schemas up to 1.38 only.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.39.0"

# Stable attributes come from opentelemetry-semantic-conventions (imported
# above).  The MCP and JSON-RPC ones below exist there only as incubating
# modules of releases newer than our floor, not a stable import: spelled out.

# -- MCP semantic-convention attributes
MCP_SESSION_ID = "mcp.session.id"
MCP_PROTOCOL_VERSION = "mcp.protocol.version"
MCP_METHOD_NAME = "mcp.method.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
JSONRPC_REQUEST_ID = "jsonrpc.request.id"

# -- attributes of our own: the conventions have none for resumption (README, "Names")
MCP_TRANSPORT = "mcp.transport"
RESUMPTION_LAST_EVENT_ID = "mcp.resumption.last_event_id"
RESUMPTION_PREVIOUS_SESSION_ID = "mcp.resumption.previous_session.id"
RESUMPTION_PREVIOUS_TRANSPORT = "mcp.resumption.previous_transport"
RESUMPTION_FIRST_EVENT_ID = "mcp.resumption.first_event_id"
RESUMPTION_REPLAYED_EVENTS = "mcp.resumption.replayed_events"
RESUMPTION_OUTCOME = "mcp.resumption.outcome"
GAP_KIND = "mcp.resumption.gap.kind"
GAP_EXPECTED = "mcp.resumption.gap.expected"
GAP_OBSERVED = "mcp.resumption.gap.observed"
SUBSCRIPTION_NOTIFICATIONS = "mcp.resumption.subscription.notifications"
SUBSCRIPTION_RELISTENED = "mcp.resumption.subscription.relistened"
REISSUE_IDEMPOTENT = "mcp.resumption.reissue.idempotent"
REISSUE_RISK = "mcp.resumption.reissue.risk"
# Which leg of a proxy (mcp-resumption-proxy) a finding is about: set by the
# proxy on everything it reports, never by the halves on their own.
RESUMPTION_LEG = "mcp.resumption.leg"

# -- values
# TRANSPORT_SSE, TRANSPORT_STREAMABLE_HTTP: imported above, the tracker's own.
NO_PREVIOUS_TRANSPORT = "none"
REQUEST_FATE = "mcp.resumption.request.fate"
# The kinds counted on GAPS; a lost subscription is counted on its own
# counter (LOST_SUBSCRIPTIONS), never as a gap of a resume.
GAP_KINDS = tuple(kind.value for kind in GapKind if kind is not GapKind.SUBSCRIPTION_LOST)
# The fates counted; ``elsewhere`` (another process of a shared state decides) never is.
FATES = tuple(fate.value for fate in Fate if fate is not Fate.ELSEWHERE)
OUTCOMES = tuple(outcome.value for outcome in Outcome)
PREVIOUS_TRANSPORTS = (NO_PREVIOUS_TRANSPORT, TRANSPORT_SSE, TRANSPORT_STREAMABLE_HTTP)

# mcp.resumption.reissue.idempotent: what the server's last tools/list said
IDEMPOTENT_VALUES = ("true", "false", "unknown")
# mcp.resumption.reissue.risk: whether the first attempt may still have run
REISSUE_SAFE = "none"  # declared idempotent or read-only, or not a tools/call
REISSUE_MAY_RUN_TWICE = "may_run_twice"  # not declared so, and the server's
# protocol (before 2026-07-28) does not take a closed stream for cancellation
REISSUE_RISKS = (REISSUE_SAFE, REISSUE_MAY_RUN_TWICE)
BOOLEAN_VALUES = ("true", "false")
# mcp.resumption.leg: the client's connection to the proxy, or the proxy's
# connection to the server.
LEG_CLIENT_PROXY = "client_proxy"
LEG_PROXY_SERVER = "proxy_server"
LEGS = (LEG_CLIENT_PROXY, LEG_PROXY_SERVER)
# mcp.resumption.subscription.notifications: the kinds a subscription asked
# for, sorted and joined by "," (jsonrpc.listen_filter), or "none".
SUBSCRIPTION_FILTERS = LISTEN_FILTERS

# -- spans and events
RESUME_SPAN_NAME = "mcp.resume"
GAP_EVENT_NAME = "resumption.gap"

# -- metrics: (name, unit, description)
ATTEMPTS = (
    "mcp.client.resumption.attempts",
    "{attempt}",
    "Resumes of an MCP stream with Last-Event-ID, by outcome",
)
GAPS = (
    "mcp.client.resumption.gaps",
    "{gap}",
    "Continuity gaps found on resumed MCP streams, by kind",
)
DURATION = (
    "mcp.client.resumption.duration",
    "s",
    "Time from the reconnect request to the resume's verdict",
)
# Bucket boundaries for DURATION, in seconds: a verdict takes milliseconds on a
# healthy replay and up to the confirmation window (5 s by default, set by
# OTEL_PYTHON_MCP_RESUMPTION_CONFIRM_TIMEOUT) or a slow server's first event.
# The SDK's default buckets (0, 5, 10, ... 10000) are meant for milliseconds and
# put every verdict into the first bucket.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
REPLAYED_EVENTS = (
    "mcp.client.resumption.replayed_events",
    "{event}",
    "Events delivered by a resumed stream up to its verdict",
)
STREAM_EVENTS = (
    "mcp.client.stream.events",
    "{event}",
    "SSE events delivered to MCP clients",
)
BROKEN_REQUESTS = (
    "mcp.client.resumption.broken_requests",
    "{request}",
    "JSON-RPC requests whose stream ended without their answer, by fate",
)
LOST_SUBSCRIPTIONS = (
    "mcp.client.resumption.lost_subscriptions",
    "{subscription}",
    "subscriptions/listen streams that ended without the server's graceful close "
    "or the client's own, by whether the client re-listened",
)
REISSUES = (
    "mcp.client.resumption.reissues",
    "{request}",
    "Broken requests the client sent again under a new id, by whether the tool is "
    "declared idempotent and whether the first attempt may have run too",
)
DUPLICATE_RUNS = (
    "mcp.client.resumption.duplicate_runs",
    "{call}",
    "Re-issued calls whose first attempt was answered too: proven to have run twice",
)
# The MCP semantic conventions' client metric (semantic-conventions-genai,
# Development stability): one point per request that got an answer or a fate.
OPERATION_DURATION = (
    "mcp.client.operation.duration",
    "s",
    "The duration of the MCP request as observed on the sender from the time it was "
    "sent until the response is received",
)
# The boundaries the conventions recommend for it.
OPERATION_BUCKETS = (
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# mcp.method.name on it: the methods a client sends; any other is "_OTHER",
# so that a peer cannot make the metric's series unbounded.
CLIENT_METHODS = frozenset(
    {
        "initialize", "ping", "server/discover", "tools/list", "tools/call",
        "resources/list", "resources/templates/list", "resources/read",
        "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
        "completion/complete", "logging/setLevel", "tasks/get", "tasks/list",
        "tasks/result", "tasks/cancel",
    }
)  # fmt: skip
OTHER = "_OTHER"
# The shared state (docs/shared-state.md): operations that fell back to
# memory, by operation (read, write) and reason (redis_state.REASONS).
STATE_FALLBACKS = (
    "mcp.client.resumption.state.fallbacks",
    "{operation}",
    "Shared-state operations (Redis) that failed or were skipped, so that the "
    "plugin went on from this process's memory",
)
STATE_OPERATION = "mcp.resumption.state.operation"
STATE_REASON = "mcp.resumption.state.reason"
# Tasks (the io.modelcontextprotocol/tasks extension, and 2025-11-25's
# experimental form): every task the client was handed, by its one fate
# (tasks.Fate); docs/rules.md, "Tasks".
TASKS = (
    "mcp.client.resumption.tasks",
    "{task}",
    "MCP tasks the client was handed (or whose handle was lost), by their one fate",
)
TASK_DURATION = (
    "mcp.client.resumption.task.duration",
    "s",
    "Time from a task's handle to the fate the client saw, by fate",
)
# Tasks run for seconds to hours: the resume buckets, longer at the top.
TASK_DURATION_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)  # fmt: skip
TASK_POLLS = (
    "mcp.client.resumption.task.polls",
    "{poll}",
    "tasks/get polls the client sent per task, recorded at the task's end, by fate",
)
TASK_POLL_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
TASK_UNROUTABLE = (
    "mcp.client.resumption.task.unroutable",
    "{request}",
    "tasks/* requests over streamable HTTP without the Mcp-Name header a load "
    "balancer routes them by",
)
TASK_FATE = "mcp.resumption.task.fate"
TASK_FATES = tuple(fate.value for fate in TaskFate)
# Only where true: an acknowledged tasks/cancel followed by a completed status.
TASK_CANCEL_IGNORED = "mcp.resumption.task.cancel_ignored"
# The Events extension (io.modelcontextprotocol/events; docs/rules.md,
# "Events"): each break of a subscription's thread of cursors, by kind
# (events.Kind), delivery and event type; duplicates delivered again; the
# push streams opened, ended, reopened with continuity proven, and found
# silent.
EVENT_GAPS = (
    "mcp.client.resumption.event_gaps",
    "{gap}",
    "Breaks of an event subscription's thread of cursors (the Events extension), by kind",
)
EVENT_DUPLICATES = (
    "mcp.client.resumption.event_duplicates",
    "{event}",
    "Events delivered again with the same eventId and payload (at-least-once delivery)",
)
EVENT_STREAMS = (
    "mcp.client.resumption.event_streams",
    "{stream}",
    "events/stream push streams, by what happened to them: opened, ended, reopened "
    "with continuity proven, found silent",
)
EVENT_GAP_KIND = "mcp.events.gap.kind"
EVENT_GAP_KINDS = tuple(kind.value for kind in EventGapKind)
EVENT_DELIVERY = "mcp.events.delivery"
EVENT_DELIVERIES = ("poll", "push", "webhook")
# The event type's name, as the server's events/list declares it; at most
# MAX_EVENT_NAMES per process, then OTHER (a bound on a server that mints names).
EVENT_NAME = "mcp.events.name"
MAX_EVENT_NAMES = 256
EVENT_STREAM_STATE = "mcp.events.stream.state"
# On the gap event of unreplayable_window: the seconds nothing could be delivered.
EVENT_WINDOW = "mcp.events.window"
EVENT_STREAM_OPENED = "opened"
EVENT_STREAM_ENDED = "ended"
EVENT_STREAM_REOPENED = "reopened"
EVENT_STREAM_SILENT = "silent"
EVENT_STREAM_STATES = (
    EVENT_STREAM_OPENED, EVENT_STREAM_ENDED, EVENT_STREAM_REOPENED, EVENT_STREAM_SILENT,
)  # fmt: skip
EVICTED_STREAMS = (
    "mcp.client.resumption.evicted_streams",
    "{stream}",
    "Tracked streams dropped because OTEL_PYTHON_MCP_RESUMPTION_MAX_STREAMS was reached",
)

# -- the server side (opentelemetry.instrumentation.mcp_resumption.server)
# What a server did with one resume request (a GET with Last-Event-ID), as
# far as its store can tell; the value of RESUMPTION_OUTCOME on SERVER_REQUESTS.
SERVER_REPLAYED = "replayed"
SERVER_NOTHING_TO_REPLAY = "nothing_to_replay"
SERVER_UNKNOWN_CURSOR = "unknown_cursor"
SERVER_OTHER_SESSION = "other_session"
SERVER_UNKNOWN_SESSION = "unknown_session"
SERVER_NO_STORE = "no_store"
SERVER_REJECTED_BY_GUARD = "rejected_by_guard"
SERVER_OUTCOMES = (
    SERVER_REPLAYED,
    SERVER_NOTHING_TO_REPLAY,
    SERVER_UNKNOWN_CURSOR,
    SERVER_OTHER_SESSION,
    SERVER_UNKNOWN_SESSION,
    SERVER_NO_STORE,
    SERVER_REJECTED_BY_GUARD,
)
# The outcomes that lose events: each also writes a resumption.gap event whose
# GAP_KIND is the outcome; a rejected_by_guard point carries GAP_KIND too (what
# the guard refused: one of these or no_store).
SERVER_GAP_KINDS = (SERVER_UNKNOWN_CURSOR, SERVER_OTHER_SESSION)
SERVER_GUARDED = (*SERVER_GAP_KINDS, SERVER_NO_STORE)
SERVER_REQUESTS = (
    "mcp.server.resumption.requests",
    "{request}",
    "Resume requests (Last-Event-ID) an MCP server received, by what it could do with them",
)
SERVER_REPLAYED_EVENTS = (
    "mcp.server.resumption.replayed_events",
    "{event}",
    "Events an MCP server's store replayed per resume request",
)

# The MCP semantic conventions' server metrics (semantic-conventions-genai,
# Development stability), recorded by the server half: the SDKs record none.
SERVER_OPERATION_DURATION = (
    "mcp.server.operation.duration",
    "s",
    "MCP request or notification duration as observed on the receiver from the time it "
    "was received until the result or ack is sent",
)
SERVER_SESSION_DURATION = (
    "mcp.server.session.duration",
    "s",
    "The duration of the MCP session as observed on the MCP server",
)
NETWORK_TRANSPORT = "network.transport"
# mcp.method.name on the server's metric: what a client sends a server; any
# other is "_OTHER" (a peer cannot make the series unbounded).
SERVER_METHODS = CLIENT_METHODS | frozenset(
    {
        "subscriptions/listen", "tasks/update", "notifications/initialized",
        "notifications/cancelled", "notifications/progress", "notifications/roots/list_changed",
        "notifications/elicitation/complete",
    }
)  # fmt: skip
# What became of each answer a server computed (the value of DELIVERY_FATE on
# SERVER_DELIVERIES): written to an open stream or as the JSON body; written
# to the event store after its stream was gone; delivered later by a resume;
# reaching nobody (no open stream and no store, or stored and never replayed
# before its session ended); the handler cancelled by the client's close
# (2026-07-28) before it answered.
DELIVERY_FATE = "mcp.resumption.delivery.fate"
DELIVERED = "delivered"
STORED = "stored"
DELIVERY_REPLAYED = "replayed"
UNDELIVERED = "undelivered"
DELIVERY_CANCELLED = "cancelled"
DELIVERY_FATES = (DELIVERED, STORED, DELIVERY_REPLAYED, UNDELIVERED, DELIVERY_CANCELLED)
SERVER_DELIVERIES = (
    "mcp.server.resumption.deliveries",
    "{request}",
    "Answers an MCP server computed, by what became of them",
)
# A tools/call whose handler ran to completion after its client's stream was
# gone; TOOL_HINT says whether the tool declared a second run harmless.
TOOL_HINT = "mcp.resumption.tool.hint"
HINT_NONE = "none"
HINT_IDEMPOTENT = "idempotent"
HINT_READ_ONLY = "read_only"
SERVER_WORK_FOR_NOBODY = (
    "mcp.server.resumption.work_for_nobody",
    "{call}",
    "Tool calls an MCP server ran to completion after their client's stream was gone",
)
SERVER_SECOND_RUNS = (
    "mcp.server.resumption.second_runs",
    "{call}",
    "Tool calls an MCP server ran again, with the same arguments, within the "
    "confirmation window after a run whose answer reached nobody",
)
# How a subscriptions/listen stream ended, seen from the server.
LISTEN_END = "mcp.resumption.listen.end"
LISTEN_FILTER = "mcp.resumption.listen.filter"
LISTEN_CLOSED_BY_CLIENT = "closed_by_client"
LISTEN_CLOSED_BY_SERVER = "closed_by_server"
LISTEN_LOST = "lost"
LISTEN_ENDS = (LISTEN_CLOSED_BY_CLIENT, LISTEN_CLOSED_BY_SERVER, LISTEN_LOST)
SERVER_LISTENS = (
    "mcp.server.resumption.listens",
    "{stream}",
    "subscriptions/listen streams an MCP server served, by how they ended",
)
