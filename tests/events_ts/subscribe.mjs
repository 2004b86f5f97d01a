// The Vercel AI SDK's MCP client (@ai-sdk/mcp) as an application uses its
// Events support: webhook subscriptions only (its source refuses any other
// delivery mode: "Only webhook event delivery is supported").
//
//   node subscribe.mjs MCP_URL TOKEN CALLBACK_URL SCENARIO
//
// SCENARIO:
//   refresh  subscribe (ttlMs 3000), refresh once before refreshBefore,
//            unsubscribe: the subscription never lapses
//   lapse    subscribe (ttlMs 500), then stop without refreshing
//
// Prints one JSON line per step ({"step", "result"}), then {"step": "done"}.
import { createMCPClient } from '@ai-sdk/mcp';

const [url, token, callback, scenario] = process.argv.slice(2);

// The client persists each subscription (its key, cursor, refreshBefore) in
// a store of the application's: here, memory.
const subscriptions = new Map();
const store = {
  async get(key) { return subscriptions.get(key); },
  async getById(id) {
    return [...subscriptions.values()].find((s) => s.id === id);
  },
  async set(subscription) { subscriptions.set(subscription.key, subscription); },
  async update(key, patch) {
    subscriptions.set(key, { ...subscriptions.get(key), ...patch });
  },
  async delete(key) { subscriptions.delete(key); },
};

function say(step, result) {
  process.stdout.write(JSON.stringify({ step, result }) + '\n');
}

const client = await createMCPClient({
  transport: { type: 'http', url, headers: { Authorization: `Bearer ${token}` } },
  experimental_events: { store },
});
try {
  const listed = await client.experimental_events.list();
  say('list', listed.events.map((e) => ({ name: e.name, delivery: e.delivery })));
  const ttlMs = scenario === 'lapse' ? 500 : 3000;
  const subscribed = await client.experimental_events.subscribe({
    name: 'ticket.created',
    arguments: { project: 'alpha' },
    delivery: { mode: 'webhook', url: callback, allowInsecureLocalhost: true },
    ttlMs,
  });
  say('subscribe', subscribed);
  if (scenario === 'refresh') {
    const refreshed = await client.experimental_events.refresh({ id: subscribed.id });
    say('refresh', refreshed);
    await client.experimental_events.unsubscribe({ id: subscribed.id });
    say('unsubscribe', null);
  }
} finally {
  await client.close();
}
say('done', null);
