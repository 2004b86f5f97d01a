// A real TypeScript MCP SDK server for the interop tests: the package's own
// StreamableHTTPServerTransport and example InMemoryEventStore, with tools that
// poll (extra.closeSSEStream) the way protocol 2025-11-25 allows.
//
// It logs its wire to WIRE_LOG, one JSON object a line, so that a test can
// prove from the server's side what happened and what was lost:
//   {kind: "request", rid, method, lastEventId, sessionId, body}
//   {kind: "status", rid, status}
//   {kind: "frame", rid, id, retry, data}      an SSE event written to the client
//   {kind: "keepalive", rid}                   an SSE comment written
//   {kind: "end", rid, body}                   the response ended (body: a non-SSE body)
//   {kind: "store", streamId, eventId, message}
//   {kind: "replay", lastEventId, streamId}    what the store answered a resume
//   {kind: "tool", name, step}                 a tool's own progress
// Env: PORT (0: any; the port is printed as {"port": N} on stdout), WIRE_LOG,
// RETRY_MS (the priming event's retry:), KEEPALIVE_MS.
import { randomUUID } from 'node:crypto';
import { appendFileSync } from 'node:fs';
import { createServer } from 'node:http';

import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

const wireLog = process.env.WIRE_LOG;
const retryMs = process.env.RETRY_MS ? Number(process.env.RETRY_MS) : undefined;
const keepAliveMs = process.env.KEEPALIVE_MS ? Number(process.env.KEEPALIVE_MS) : undefined;

function log(entry) {
  if (wireLog) appendFileSync(wireLog, JSON.stringify({ t: Date.now(), ...entry }) + '\n');
}

class LoggedEventStore extends InMemoryEventStore {
  async storeEvent(streamId, message) {
    const eventId = await super.storeEvent(streamId, message);
    log({ kind: 'store', streamId, eventId, message });
    return eventId;
  }

  async replayEventsAfter(lastEventId, { send }) {
    const streamId = await super.replayEventsAfter(lastEventId, { send });
    log({ kind: 'replay', lastEventId, streamId });
    return streamId;
  }

  forget() {
    this.events.clear();
  }
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
const transports = new Map();

function buildServer(store) {
  const server = new McpServer(
    { name: 'ts-interop', version: '1.0.0' },
    { capabilities: { logging: {} } }
  );
  const progress = (extra, text) =>
    extra.sendNotification({ method: 'notifications/message', params: { level: 'info', data: text } });

  // cuts: close the request's stream this many times, each after one
  // notification; away_ms: wait after each cut (the client is away, then back);
  // burst: notifications written in one go around the first cut (same ms);
  // forget: the store loses every event after the first cut.
  server.registerTool(
    'poll',
    {
      inputSchema: {
        cuts: z.number().int().default(1),
        away_ms: z.number().int().default(0),
        before_result_ms: z.number().int().default(0),
        burst: z.number().int().default(0),
        forget: z.boolean().default(false),
      },
    },
    async ({ cuts, away_ms, before_result_ms, burst, forget }, extra) => {
      for (let cut = 1; cut <= cuts; cut++) {
        if (burst && cut === 1) {
          for (let i = 0; i < burst; i++) await progress(extra, `burst ${i} before`);
          log({ kind: 'tool', name: 'poll', step: 'cut', cut });
          extra.closeSSEStream?.();
          for (let i = 0; i < burst; i++) await progress(extra, `burst ${i} after`);
        } else {
          await progress(extra, `before cut ${cut}`);
          log({ kind: 'tool', name: 'poll', step: 'cut', cut });
          extra.closeSSEStream?.();
        }
        if (forget && cut === 1) {
          store.forget();
          log({ kind: 'tool', name: 'poll', step: 'forgot' });
        }
        await sleep(away_ms);
      }
      await sleep(before_result_ms);
      log({ kind: 'tool', name: 'poll', step: 'result' });
      return { content: [{ type: 'text', text: 'done' }] };
    }
  );

  // Notifications on the standalone GET stream, which is closed in between.
  server.registerTool(
    'announce',
    { inputSchema: { away_ms: z.number().int().default(300) } },
    async ({ away_ms }, extra) => {
      await server.server.sendLoggingMessage({ level: 'info', data: 'announce 1' });
      await sleep(100);
      log({ kind: 'tool', name: 'announce', step: 'cut' });
      extra.closeStandaloneSSEStream?.();
      await sleep(away_ms);
      await server.server.sendLoggingMessage({ level: 'info', data: 'announce 2' });
      log({ kind: 'tool', name: 'announce', step: 'result' });
      return { content: [{ type: 'text', text: 'announced' }] };
    }
  );
  return server;
}

function logWire(rid, res) {
  let pending = '';
  const parse = chunk => {
    pending += typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    let end;
    while ((end = pending.indexOf('\n\n')) !== -1) {
      const block = pending.slice(0, end);
      pending = pending.slice(end + 2);
      const frame = { id: null, retry: null, data: null };
      let comment = false;
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) comment = true;
        else if (line.startsWith('id: ')) frame.id = line.slice(4);
        else if (line.startsWith('retry: ')) frame.retry = Number(line.slice(7));
        else if (line.startsWith('data: ')) frame.data = (frame.data ?? '') + line.slice(6);
      }
      if (comment && frame.id === null && frame.data === null) log({ kind: 'keepalive', rid });
      else log({ kind: 'frame', rid, ...frame });
    }
  };
  const { writeHead, write, end } = res;
  let sse = false;
  const isSse = () => sse || String(res.getHeader('content-type') ?? '').includes('text/event-stream');
  res.writeHead = function (status, ...rest) {
    sse = JSON.stringify(rest).includes('text/event-stream');
    log({ kind: 'status', rid, status });
    return writeHead.call(this, status, ...rest);
  };
  let text = null;
  const keep = chunk => {
    text = (text ?? '') + (typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8'));
  };
  res.write = function (chunk, ...rest) {
    if (isSse()) parse(chunk);
    else keep(chunk);
    return write.call(this, chunk, ...rest);
  };
  res.end = function (chunk, ...rest) {
    if (chunk && typeof chunk !== 'function') {
      if (isSse()) parse(chunk);
      else keep(chunk);
    }
    log({ kind: 'end', rid, body: text });
    return end.call(this, chunk, ...rest);
  };
}

let requests = 0;
const pid = process.pid;
const httpServer = createServer(async (req, res) => {
  const rid = `${pid}-${++requests}`;
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const raw = Buffer.concat(chunks).toString('utf8');
  const body = raw ? JSON.parse(raw) : undefined;
  const sessionId = req.headers['mcp-session-id'];
  log({
    kind: 'request', rid, method: req.method, sessionId: sessionId ?? null,
    lastEventId: req.headers['last-event-id'] ?? null, body: body ?? null,
  });
  logWire(rid, res);
  let transport = sessionId ? transports.get(sessionId) : undefined;
  if (!transport && !sessionId && req.method === 'POST' && isInitializeRequest(body)) {
    const store = new LoggedEventStore();
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: store,
      retryInterval: retryMs,
      keepAliveMs,
      onsessioninitialized: id => transports.set(id, transport),
    });
    await buildServer(store).connect(transport);
  }
  if (!transport) {
    // Unknown session (a restarted server): the SDK transport's own session
    // check answers it, 404 {"code": -32001}, as a one-session server that
    // restarted does (marked initialized under another id to reach that check).
    if (sessionId) {
      const orphan = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID() });
      orphan._webStandardTransport._initialized = true;
      orphan._webStandardTransport.sessionId = 'not-' + sessionId;
      await orphan.handleRequest(req, res, body);
      return;
    }
    res.writeHead(400, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'no session' }, id: null }));
    return;
  }
  await transport.handleRequest(req, res, body);
});

httpServer.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: httpServer.address().port }) + '\n');
});
