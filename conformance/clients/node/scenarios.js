'use strict';
/**
 * RocketMQ 5 gRPC conformance scenarios driven by the official Node.js client
 * (npm rocketmq-client-nodejs 1.0.8, installed here by `npm ci` from package-lock.json).
 *
 *   node conformance/clients/node/scenarios.js SCENARIO CONFIG_JSON
 *
 * CONFIG_JSON: {"endpoint": "127.0.0.1:8081", "topics": {role: name}, "groups": {role: name},
 * "timeout": seconds, "params": {...}}. Prints exactly one JSON line on stdout,
 * {"client": "node", "scenario": ..., "ok": bool, "reason": str, "details": {...}}, and exits 0 when
 * the scenario passed, 1 when it failed. The client's own log goes to $HOME/logs/rocketmq/.
 */

const {
  Producer, SimpleConsumer, PushConsumer, ConsumeResult, FilterExpression,
} = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const CLIENT = 'node';
const MIB = 1024 * 1024;

class Fail extends Error {}

function check(cond, reason) {
  if (!cond) throw new Fail(reason);
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

class Ctx {
  constructor(cfg) {
    this.cfg = cfg;
    this.endpoint = cfg.endpoint;
    this.topics = cfg.topics || {};
    this.groups = cfg.groups || {};
    this.params = cfg.params || {};
    this.started = Date.now();
    // Leave a margin so the script reports a reason before the runner kills it.
    this.deadline = this.started + Math.max(5000, ((cfg.timeout || 60) - 5) * 1000);
    this.clients = [];
    this.details = {};
  }

  remaining() {
    return this.deadline - Date.now();
  }

  // Clients with topics wait (forever) for the gateway's Settings reply in startup(): bound it.
  async start(client, what) {
    this.clients.push(client);
    await withTimeout(client.startup(), Math.min(15000, this.remaining()), `${what} startup`);
    return client;
  }

  producer(topics = [], checker) {
    const opts = { endpoints: this.endpoint, namespace: '', topics };
    if (checker) opts.checker = checker;
    return this.start(new Producer(opts), 'producer');
  }

  simpleConsumer(group, subscriptions, awaitMs = 5000) {
    const subs = subscriptions instanceof Map ? subscriptions : new Map(subscriptions.map(t => [ t, '*' ]));
    return this.start(new SimpleConsumer({
      endpoints: this.endpoint, namespace: '', consumerGroup: group, subscriptions: subs, awaitDuration: awaitMs,
    }), 'simple consumer');
  }

  async shutdown() {
    for (const c of this.clients.reverse()) {
      try {
        await withTimeout(c.shutdown(), 5000, 'shutdown');
      } catch (_) { /* best effort */ }
    }
  }
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Fail(`${what} did not finish within ${Math.round(ms / 1000)}s`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

function textMessage(topic, body, { tag, keys, props, group, deliverAt } = {}) {
  const m = { topic, body: Buffer.from(body) };
  if (tag) m.tag = tag;
  if (keys) m.keys = keys;
  if (props) m.properties = new Map(Object.entries(props));
  if (group) m.messageGroup = group;
  if (deliverAt) m.deliveryTimestamp = new Date(deliverAt);
  return m;
}

const bodyOf = m => m.body.toString();

async function receiveUntil(ctx, consumer, done, { maxNum = 16, invisibleMs = 20000, ack = true, onMessage } = {}) {
  const received = [];
  while (!done(received) && ctx.remaining() > 0) {
    const batch = await consumer.receive(maxNum, invisibleMs);
    for (const m of batch || []) {
      m.conformanceReceivedAt = Date.now();
      received.push(m);
      if (onMessage) onMessage(m);
      if (ack) await consumer.ack(m);
    }
  }
  return received;
}

// One short receive that should come back empty (a consumer created with a short awaitDuration).
async function quietPoll(consumer) {
  const got = (await consumer.receive(16, 20000)) || [];
  for (const m of got) await consumer.ack(m);
  return got;
}

// ------------------------------------------------------------------------------------ scenarios

async function scNormal(ctx) {
  const topic = ctx.topics.main;
  const n = ctx.params.count || 10;
  const consumer = await ctx.simpleConsumer(ctx.groups.all, [ topic ], 1000);
  const tagConsumer = await ctx.simpleConsumer(ctx.groups.taga, new Map([[ topic, new FilterExpression('TagA') ]]), 1000);
  const p = await ctx.producer([ topic ]);
  const sent = new Map();
  for (let i = 0; i < n; i++) {
    const tag = i % 2 === 0 ? 'TagA' : 'TagB';
    const r = await p.send(textMessage(topic, `normal-${i}`, { tag, keys: [ `key-${i}` ], props: { seq: String(i) } }));
    check(r.messageId, `send ${i} returned no message id`);
    sent.set(r.messageId, { i, tag });
  }
  const got = await receiveUntil(ctx, consumer, r => r.length >= n);
  check(got.length === n, `received ${got.length} of ${n} messages`);
  for (const m of got) {
    const s = sent.get(m.messageId);
    check(s, `received unknown message id ${m.messageId}`);
    check(bodyOf(m) === `normal-${s.i}`, `body mismatch for ${m.messageId}: ${bodyOf(m)}`);
    check(m.tag === s.tag, `tag mismatch: ${m.tag} != ${s.tag}`);
    check(m.keys.includes(`key-${s.i}`), `keys mismatch: ${m.keys}`);
    check(m.properties.get('seq') === String(s.i), `property seq mismatch: ${[ ...m.properties ]}`);
    check(m.deliveryAttempt === 1, `first delivery has deliveryAttempt ${m.deliveryAttempt}`);
    check(m.topic === topic, `topic mismatch ${m.topic}`);
    check(!m.corrupted, 'message flagged corrupted (body digest mismatch)');
  }
  const tagA = [ ...sent.values() ].filter(s => s.tag === 'TagA').map(s => s.i).sort((a, b) => a - b);
  const gotA = await receiveUntil(ctx, tagConsumer, r => r.length >= tagA.length);
  const gotASeq = gotA.map(m => Number(m.properties.get('seq'))).sort((a, b) => a - b);
  check(JSON.stringify(gotASeq) === JSON.stringify(tagA), `TagA filter delivered seq ${gotASeq}, expected ${tagA}`);
  const extra = [ ...await quietPoll(consumer), ...await quietPoll(tagConsumer) ];
  check(extra.length === 0, `acked messages came back: ${extra.map(bodyOf)}`);
  Object.assign(ctx.details, { sent: n, received: got.length, tag_filtered: gotA.length });
}

async function scFifo(ctx) {
  const topic = ctx.topics.main;
  const groups = [ 'g-a', 'g-b', 'g-c' ];
  const per = ctx.params.per_group || 5;
  const consumer = await ctx.simpleConsumer(ctx.groups.main, [ topic ]);
  const p = await ctx.producer([ topic ]);
  for (let i = 0; i < per; i++) {
    for (const g of groups) await p.send(textMessage(topic, `${g}:${i}`, { group: g }));
  }
  const seen = Object.fromEntries(groups.map(g => [ g, [] ]));
  const got = await receiveUntil(ctx, consumer, r => r.length >= per * groups.length, {
    onMessage: m => {
      const [ g, i ] = bodyOf(m).split(':');
      check(m.messageGroup === g, `messageGroup ${m.messageGroup} != ${g}`);
      seen[g].push(Number(i));
    },
  });
  check(got.length === per * groups.length, `received ${got.length} of ${per * groups.length}`);
  for (const g of groups) {
    check(JSON.stringify(seen[g]) === JSON.stringify([ ...Array(per).keys() ]), `group ${g} consumed out of order: ${seen[g]}`);
  }
  Object.assign(ctx.details, { groups: groups.length, per_group: per, order: seen });
}

async function scDelay(ctx) {
  const topic = ctx.topics.main;
  const delayMs = (ctx.params.delay_s || 3) * 1000;
  const toleranceMs = (ctx.params.tolerance_s || 1.0) * 1000;
  const consumer = await ctx.simpleConsumer(ctx.groups.main, [ topic ], 2000);
  const p = await ctx.producer([ topic ]);
  const deliverAt = Date.now() + delayMs;
  await p.send(textMessage(topic, 'delayed', { deliverAt }));
  await p.send(textMessage(topic, 'immediate'));
  const got = await receiveUntil(ctx, consumer, r => r.some(m => bodyOf(m) === 'delayed'));
  const order = got.map(bodyOf);
  check(order.includes('delayed'), `delayed message never arrived (got ${order})`);
  check(order.indexOf('immediate') < order.indexOf('delayed'), `normal message was held up: ${order}`);
  const m = got.find(x => bodyOf(x) === 'delayed');
  const offset = m.conformanceReceivedAt - deliverAt;
  Object.assign(ctx.details, { delay_s: delayMs / 1000, offset_s: offset / 1000,
    delivery_timestamp: m.deliveryTimestamp && m.deliveryTimestamp.getTime() });
  check(offset >= -toleranceMs, `delivered ${(-offset / 1000).toFixed(2)}s before its delivery time`);
  check(offset <= toleranceMs, `delivered ${(offset / 1000).toFixed(2)}s after its delivery time`);
  check(m.deliveryTimestamp && Math.abs(m.deliveryTimestamp.getTime() - deliverAt) < 1000,
    `deliveryTimestamp ${m.deliveryTimestamp} != ${new Date(deliverAt).toISOString()}`);
}

async function scTransaction(ctx) {
  const topic = ctx.topics.main;
  const calls = [];
  const answers = { 'tx-check-commit': TransactionResolution.COMMIT, 'tx-check-rollback': TransactionResolution.ROLLBACK };
  const checker = {
    async check(messageView) {
      const body = bodyOf(messageView);
      calls.push(body);
      return answers[body] || TransactionResolution.ROLLBACK;
    },
  };
  const consumer = await ctx.simpleConsumer(ctx.groups.main, [ topic ], 2000);
  const p = await ctx.producer([ topic ], checker);
  for (const kind of [ 'commit', 'rollback', 'check-commit', 'check-rollback' ]) {
    const tx = p.beginTransaction();
    const r = await p.send(textMessage(topic, `tx-${kind}`), tx);
    check(r.transactionId, `half message ${kind} got no transaction id`);
    if (kind === 'commit') await tx.commit();
    if (kind === 'rollback') await tx.rollback();
  }
  const want = [ 'tx-commit', 'tx-check-commit' ];
  const got = await receiveUntil(ctx, consumer, r => {
    const bodies = r.map(bodyOf);
    return want.every(b => bodies.includes(b)) && calls.includes('tx-check-commit') && calls.includes('tx-check-rollback');
  });
  got.push(...await quietPoll(consumer));
  const bodies = got.map(bodyOf).sort();
  Object.assign(ctx.details, { delivered: bodies, checker_calls: [ ...calls ].sort() });
  check(bodies.includes('tx-commit'), 'committed message not delivered');
  check(!bodies.includes('tx-rollback'), 'rolled back message was delivered');
  check(calls.includes('tx-check-commit'), 'checker was not asked about the unresolved transaction');
  check(calls.includes('tx-check-rollback'), 'checker was not asked about the 2nd unresolved transaction');
  check(bodies.includes('tx-check-commit'), 'checker answered COMMIT but the message was not delivered');
  check(!bodies.includes('tx-check-rollback'), 'checker answered ROLLBACK but the message was delivered');
  check(!calls.includes('tx-commit') && !calls.includes('tx-rollback'), 'checker asked about a resolved transaction');
  check(bodies.filter(b => b === 'tx-commit' || b === 'tx-check-commit').length === 2, `duplicates: ${bodies}`);
}

async function scSimpleConsumer(ctx) {
  const topic = ctx.topics.main;
  const consumer = await ctx.simpleConsumer(ctx.groups.main, [ topic ], 3000);
  const p = await ctx.producer([ topic ]);
  for (const body of [ 'ack-me', 'retry-me', 'extend-me' ]) await p.send(textMessage(topic, body));
  const first = await receiveUntil(ctx, consumer, r => r.length >= 3, { invisibleMs: 30000, ack: false });
  const byBody = Object.fromEntries(first.map(m => [ bodyOf(m), m ]));
  check(Object.keys(byBody).sort().join() === 'ack-me,extend-me,retry-me', `first receive got ${Object.keys(byBody)}`);
  check(first.every(m => m.deliveryAttempt === 1), 'first delivery attempt is not 1');
  await consumer.ack(byBody['ack-me']);
  const extend = byBody['extend-me'];
  const oldHandle = extend.receiptHandle;
  await consumer.changeInvisibleDuration(extend, 60000);
  check(extend.receiptHandle && extend.receiptHandle !== oldHandle, 'changeInvisibleDuration did not return a new receipt handle');
  await consumer.ack(extend);
  const retry = byBody['retry-me'];
  await consumer.changeInvisibleDuration(retry, 1000);
  const t0 = Date.now();
  const again = await receiveUntil(ctx, consumer, r => r.length >= 1, { invisibleMs: 30000, ack: false });
  const waited = (Date.now() - t0) / 1000;
  check(again.length === 1, `expected one redelivery, got ${again.map(bodyOf)}`);
  const m = again[0];
  check(bodyOf(m) === 'retry-me', `redelivered ${bodyOf(m)}, expected 'retry-me'`);
  check(m.messageId === retry.messageId, 'redelivered message has another message id');
  check(m.deliveryAttempt === 2, `redelivery has deliveryAttempt ${m.deliveryAttempt}, expected 2`);
  await consumer.ack(m);
  const extra = await quietPoll(consumer);
  check(extra.length === 0, `acked messages came back: ${extra.map(bodyOf)}`);
  Object.assign(ctx.details, { redelivered_after_s: waited, delivery_attempt: m.deliveryAttempt });
}

async function scPushConsumer(ctx) {
  const topic = ctx.topics.main;
  const group = ctx.groups.main;
  const maxAttempts = ctx.params.max_attempts || 3;
  const attempts = {};
  const listener = {
    consume(m) {
      const body = bodyOf(m);
      (attempts[body] = attempts[body] || []).push(m.deliveryAttempt);
      if (body === 'always-fail') return ConsumeResult.FAILURE;
      if (body === 'fail-once' && m.deliveryAttempt === 1) return ConsumeResult.FAILURE;
      return ConsumeResult.SUCCESS;
    },
  };
  const p = await ctx.producer([ topic ]);
  await ctx.start(new PushConsumer({
    endpoints: ctx.endpoint, namespace: '', consumerGroup: group,
    subscriptions: new Map([[ topic, '*' ]]), messageListener: listener,
  }), 'push consumer');
  for (const body of [ 'ok', 'fail-once', 'always-fail' ]) await p.send(textMessage(topic, body));
  const done = () => attempts.ok && (attempts['fail-once'] || []).length >= 2 && (attempts['always-fail'] || []).length >= maxAttempts;
  while (!done() && ctx.remaining() > 0) await sleep(100);
  ctx.details.attempts = JSON.parse(JSON.stringify(attempts));
  const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);
  check(eq(attempts.ok, [ 1 ]), `'ok' deliveries: ${attempts.ok}`);
  check(eq(attempts['fail-once'], [ 1, 2 ]), `'fail-once' deliveries: ${attempts['fail-once']}`);
  check(eq((attempts['always-fail'] || []).slice(0, maxAttempts), [ ...Array(maxAttempts).keys() ].map(i => i + 1)),
    `'always-fail' deliveries: ${attempts['always-fail']}`);
  const dlqTopic = `%DLQ%${group}`;
  let found = [];
  let lastError;
  let dlq;
  while (!found.length && ctx.remaining() > 0) {
    try {
      // The DLQ topic may have no route until the first dead letter: (re)create the consumer until it does.
      dlq = dlq || await ctx.simpleConsumer(ctx.groups.dlq, [ dlqTopic ], 2000);
      found = await receiveUntil(ctx, dlq, r => r.length >= 1);
    } catch (e) {
      lastError = e;
      dlq = undefined;
      await sleep(200);
    }
  }
  check(found.length, `nothing arrived in ${dlqTopic} (last error: ${lastError})`);
  const bodies = found.map(bodyOf);
  Object.assign(ctx.details, { dlq: bodies, dlq_properties: Object.fromEntries(found[0].properties) });
  check(eq(bodies, [ 'always-fail' ]), `${dlqTopic} holds ${bodies}, expected ['always-fail']`);
  const total = (attempts['always-fail'] || []).length;
  check(total === maxAttempts, `'always-fail' was delivered ${total} times, max attempts ${maxAttempts}`);
}

async function scGroupSplit(ctx) {
  const topic = ctx.topics.main;
  const n = ctx.params.count || 20;
  const c1 = await ctx.simpleConsumer(ctx.groups.main, [ topic ], 2000);
  const c2 = await ctx.simpleConsumer(ctx.groups.main, [ topic ], 2000);
  const p = await ctx.producer([ topic ]);
  const sent = new Set();
  for (let i = 0; i < n; i++) sent.add((await p.send(textMessage(topic, `split-${i}`))).messageId);
  const results = { c1: [], c2: [] };
  const total = () => results.c1.length + results.c2.length;
  const worker = async (name, c) => {
    while (total() < n && ctx.remaining() > 0) {
      for (const m of (await c.receive(2, 30000)) || []) {
        await c.ack(m);
        results[name].push(m.messageId);
      }
    }
  };
  await Promise.all([ worker('c1', c1), worker('c2', c2) ]);
  const a = results.c1;
  const b = results.c2;
  Object.assign(ctx.details, { sent: n, c1: a.length, c2: b.length });
  check(new Set(a).size === a.length && new Set(b).size === b.length, 'a consumer got a message twice');
  const both = a.filter(id => b.includes(id));
  check(both.length === 0, `${both.length} messages went to both consumers`);
  const missing = [ ...sent ].filter(id => !a.includes(id) && !b.includes(id));
  check(missing.length === 0, `${missing.length} messages were not received`);
  check(a.length > 0 && b.length > 0, `one consumer got nothing (c1=${a.length}, c2=${b.length})`);
}

async function scTopicNotFound(ctx) {
  const topic = ctx.params.missing_topic;
  const p = await ctx.producer();
  let err;
  try {
    const r = await p.send(textMessage(topic, 'nowhere'));
    throw new Fail(`send to missing topic succeeded: ${r.messageId}`);
  } catch (e) {
    if (e instanceof Fail) throw e;
    err = e;
  }
  Object.assign(ctx.details, { error: `${err.name}: ${err.message}`, code: err.code });
  check(err.code === 40402, `expected TOPIC_NOT_FOUND (40402), got ${err.name}: ${err.message}`);
}

async function scBodyTooLarge(ctx) {
  const topic = ctx.topics.main;
  const limit = ctx.params.max_body_size || 4 * MIB;
  const p = await ctx.producer([ topic ]); // startup waits for the gateway's Settings
  const advertised = p.publishingSettings.maxBodySizeBytes;
  let local;
  try {
    await p.send(textMessage(topic, 'x'.repeat(limit + 1)));
  } catch (e) {
    local = `${e.name}: ${e.message}`;
  }
  // The client refuses bodies over the advertised limit itself; lift it so the request reaches the gateway.
  Object.defineProperty(p.publishingSettings, 'maxBodySizeBytes', { get: () => 64 * MIB });
  let err;
  try {
    await p.send(textMessage(topic, 'x'.repeat(limit + 1)));
  } catch (e) {
    err = e;
  }
  check(err, `a ${limit + 1}-byte body was accepted`);
  const atLimit = await p.send(textMessage(topic, 'y'.repeat(limit)));
  Object.assign(ctx.details, { advertised_max_body_size: advertised, client_side_error: local,
    error: `${err.name}: ${err.message}`, code: err.code, at_limit_message_id: atLimit.messageId });
  check(err.code === 41301, `expected MESSAGE_BODY_TOO_LARGE (41301), got ${err.name}: ${err.message}`);
}

const SCENARIOS = {
  normal: scNormal,
  fifo: scFifo,
  delay: scDelay,
  transaction: scTransaction,
  simple_consumer: scSimpleConsumer,
  push_consumer: scPushConsumer,
  group_split: scGroupSplit,
  topic_not_found: scTopicNotFound,
  body_too_large: scBodyTooLarge,
};

async function main(argv) {
  const scenario = argv[2];
  if (argv.length !== 4 || !SCENARIOS[scenario]) {
    process.stderr.write(`usage: node scenarios.js {${Object.keys(SCENARIOS).join(',')}} CONFIG_JSON\n`);
    return 2;
  }
  const ctx = new Ctx(JSON.parse(argv[3]));
  let ok = false;
  let reason = '';
  try {
    await withTimeout(SCENARIOS[scenario](ctx), Math.max(1000, ctx.remaining()), scenario);
    ok = true;
  } catch (e) {
    reason = e instanceof Fail ? e.message : `${e.name}: ${e.message}`;
    if (!(e instanceof Fail)) process.stderr.write(`${e.stack}\n`);
  }
  await ctx.shutdown();
  ctx.details.elapsed_s = (Date.now() - ctx.started) / 1000;
  const line = { client: CLIENT, scenario, ok, reason, details: ctx.details };
  await new Promise(resolve => process.stdout.write(JSON.stringify(line) + '\n', resolve));
  return ok ? 0 : 1;
}

// The client keeps timers and streams open: exit explicitly.
main(process.argv).then(code => process.exit(code), e => {
  process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
