// The TypeScript MCP SDK 1.x client (the version demo/src/mcp_resumption_demo/
// ts_server/package-lock.json pins, imported from there), calling one tool
// with arguments and a progress callback, as an application that shows
// progress does (the progress token makes the server stream its answer):
//
//   node ts_call.mjs URL TOOL ARGS_JSON TIMEOUT_MS
//
// Writes {"progress": n} on stdout at each progress notification (a test
// can wait for it), then one JSON line: {result | error, elapsedMs, progress}.
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const SDK = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'demo', 'src',
  'mcp_resumption_demo', 'ts_server', 'node_modules', '@modelcontextprotocol', 'sdk',
  'dist', 'esm');
const { Client } = await import(pathToFileURL(join(SDK, 'client', 'index.js')).href);
const { StreamableHTTPClientTransport } = await import(
  pathToFileURL(join(SDK, 'client', 'streamableHttp.js')).href);

const [url, tool = 'work', argsJson = '{}', timeoutMs = '8000'] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url));
const client = new Client({ name: 'ts-call', version: '0' });
const started = Date.now();
const report = { progress: 0 };
try {
  await client.connect(transport);
  const result = await client.callTool({ name: tool, arguments: JSON.parse(argsJson) },
    undefined, {
      timeout: Number(timeoutMs),
      onprogress: () => {
        report.progress += 1;
        console.log(JSON.stringify({ progress: report.progress }));
      },
    });
  report.result = result.content?.[0]?.text ?? null;
} catch (error) {
  report.error = String(error?.message ?? error);
}
report.elapsedMs = Date.now() - started;
console.log(JSON.stringify(report));
await client.close().catch(() => {});
process.exit(0);
