'use strict';
/**
 * The official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs, installed under
 * conformance/clients/node; the test passes NODE_PATH) with session credentials, driven by
 * tests/adapters/grpc/test_auth.py:
 *
 *   node node_client.js ENDPOINT TOPIC GROUP ACCESS_KEY SECRET_KEY
 *
 * Sends one message, then receives with a simple consumer, and prints one JSON line with each
 * step's outcome: {"send": {"id"} | {"error", "code"}, "receive": {"got": [...]} | {"error", "code"}}.
 */
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const STEP_MS = 20000;

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

// startup() wraps the client's exception in an Error whose message carries "response-code=NNNNN".
function refusal(e) {
  const message = String((e && e.message) || e);
  let code = e && typeof e.code === 'number' ? e.code : null;
  const m = /response-code=(\d+)/.exec(message);
  if (code === null && m) code = Number(m[1]);
  return { error: (e && e.name) || 'Error', code, message };
}

async function main() {
  const [ endpoints, topic, group, accessKey, accessSecret ] = process.argv.slice(2);
  const common = { endpoints, namespace: '', sessionCredentials: { accessKey, accessSecret }, requestTimeout: 5000 };
  const out = {};
  const producer = new Producer({ ...common, topics: [ topic ] });
  try {
    await withTimeout(producer.startup(), STEP_MS, 'producer startup');
    const r = await withTimeout(producer.send({ topic, tag: 'TagA', body: Buffer.from('hello-0') }), STEP_MS, 'send');
    out.send = { id: r.messageId };
  } catch (e) {
    out.send = refusal(e);
  }
  try {
    await withTimeout(producer.shutdown(), 5000, 'producer shutdown');
  } catch (_) { /* best effort */ }
  const consumer = new SimpleConsumer({
    ...common, consumerGroup: group, subscriptions: new Map([[ topic, '*' ]]), awaitDuration: 2000,
  });
  try {
    await withTimeout(consumer.startup(), STEP_MS, 'consumer startup');
    const got = [];
    const deadline = Date.now() + 15000;
    while (got.length === 0 && Date.now() < deadline) {
      for (const m of (await withTimeout(consumer.receive(16, 20000), STEP_MS, 'receive')) || []) {
        got.push({ id: m.messageId, body: m.body.toString() });
        await consumer.ack(m);
      }
    }
    out.receive = { got };
  } catch (e) {
    out.receive = refusal(e);
  }
  try {
    await withTimeout(consumer.shutdown(), 5000, 'consumer shutdown');
  } catch (_) { /* best effort */ }
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().then(() => process.exit(0), err => {
  console.error('[fatal]', (err && err.stack) || err);
  process.exit(2);
});
