// A real TypeScript MCP SDK client for the server-guard tests: connects to URL
// (argv[2]), calls the tool argv[3] (default "slow") with a request timeout of
// argv[4] ms (default 8000), and prints one JSON line:
//   {elapsedMs, result | error, transportErrors: [messages of onerror]}
// The server side decides what the resume of the tool's stream gets; this
// shows what the client makes of it (a prompt failure, a retry loop, a wait).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [url, tool = 'slow', timeoutArg = '8000'] = process.argv.slice(2);
const transportErrors = [];
const transport = new StreamableHTTPClientTransport(new URL(url));
const client = new Client({ name: 'guard-probe', version: '0' });
client.onerror = (error) => transportErrors.push(String(error?.message ?? error));
const started = Date.now();
const report = {};
try {
  await client.connect(transport);
  const result = await client.callTool({ name: tool, arguments: {} }, undefined, {
    timeout: Number(timeoutArg),
  });
  report.result = result.content?.[0]?.text ?? null;
} catch (error) {
  report.error = String(error?.message ?? error);
}
report.elapsedMs = Date.now() - started;
report.transportErrors = transportErrors;
console.log(JSON.stringify(report));
await client.close().catch(() => {});
process.exit(0);
