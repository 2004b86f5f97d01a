// The TypeScript SDK v2 requester of MCP tasks: @modelcontextprotocol/client
// with @modelcontextprotocol/ext-tasks, calling one tool of a 2026-07-28
// tasks server and following its task to the end.
//
//   node client.mjs URL TOOL ARGS_JSON TIMEOUT_MS
//
// Prints one JSON line: {"ok": true, "text": ..., "era": ...} or
// {"ok": false, "error": ...}. ext-tasks asks the host for the raw request
// path of 2026-07-28 (the SDK's codecs reject task results): rawDispatch
// below is a plain POST to the same endpoint, carrying the headers ext-tasks
// hands it (Mcp-Name on tasks/*), as the package's guide describes.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import {
  createTaskSessionFromClient,
  resultFromTaskOutcome,
} from "@modelcontextprotocol/ext-tasks/client";

const [url, tool, argsJson = "{}", timeoutMs = "20000"] = process.argv.slice(2);
const PROTOCOL = "2026-07-28";
const clientInfo = { name: "tasks-ts-client", version: "1.0.0" };
const clientCapabilities = { extensions: { "io.modelcontextprotocol/tasks": {} } };

function messagesOf(contentType, body) {
  if (!contentType.includes("text/event-stream")) return [JSON.parse(body)];
  const found = [];
  for (const block of body.split(/\r?\n\r?\n/)) {
    const data = block
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).trimStart())
      .join("\n");
    if (data) found.push(JSON.parse(data));
  }
  return found;
}

let nextId = 1;

// ext-tasks hands over the method and params (framed with the 2026-07-28
// _meta); the envelope, the id and the transport headers are the host's.
async function rawDispatch(framed, options = {}) {
  const request = { jsonrpc: "2.0", id: `tasks-${nextId++}`, ...framed };
  const response = await fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": PROTOCOL,
      // 2026-07-28's routing headers: the method, and the name it acts on
      // (a tool's; on tasks/* ext-tasks gives the task id in the context)
      "mcp-method": request.method,
      ...(request.method === "tools/call" ? { "mcp-name": request.params.name } : {}),
      ...(options.context?.headers ?? {}),
    },
    body: JSON.stringify(request),
    signal: options.signal,
  });
  const body = await response.text();
  const answer = messagesOf(response.headers.get("content-type") ?? "", body).find(
    (m) => m.id === request.id && ("result" in m || "error" in m),
  );
  if (answer === undefined) throw new Error(`HTTP ${response.status} without an answer: ${body.slice(0, 300)}`);
  return "error" in answer
    ? { kind: "error", error: answer.error }
    : { kind: "result", result: answer.result };
}

const client = new Client(clientInfo, {
  capabilities: clientCapabilities,
  versionNegotiation: { mode: { pin: PROTOCOL } },
});
const timer = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, error: "timeout" }));
  process.exit(2);
}, Number(timeoutMs));
let out;
try {
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  const session = createTaskSessionFromClient(client, {
    endpointId: "tasks-ts",
    rawDispatch,
    v2RequestFraming: { protocolVersion: PROTOCOL, clientInfo, clientCapabilities },
  });
  try {
    const execution = await session.callTool(tool, JSON.parse(argsJson));
    const { outcome } = await execution.settle();
    const result = resultFromTaskOutcome(outcome);
    out = { ok: true, era: client.getProtocolEra(), text: result.content?.[0]?.text ?? null };
  } finally {
    await session.close();
  }
} catch (error) {
  out = { ok: false, error: String(error?.message ?? error), code: error?.code ?? null, cause: String(error?.cause?.message ?? error?.cause ?? ""), detail: JSON.stringify(error?.data ?? error?.error ?? null) };
  if (process.env.TASKS_TS_DEBUG) console.error(error);
} finally {
  clearTimeout(timer);
  await client.close().catch(() => {});
}
console.log(JSON.stringify(out));
process.exit(0);
