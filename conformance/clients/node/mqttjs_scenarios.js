'use strict';
/**
 * MQTT conformance scenarios driven by MQTT.js (npm mqtt 5.16.0, installed here by `npm ci` from
 * package-lock.json); cross_protocol also uses the official RocketMQ 5 Node.js client.
 *
 *   node conformance/clients/node/mqttjs_scenarios.js SCENARIO CONFIG_JSON
 *
 * CONFIG_JSON: {"endpoint": gRPC host:port, "mqtt": {"host", "port"}, "prefix": unique per (run,
 * scenario, client), "topics", "groups", "timeout", "params"}. Prints one JSON line
 * {"client": "mqttjs", "scenario", "ok", "reason", "details"}; exit 0 = pass. A scenario name
 * <base>_v311 / <base>_v5 selects the protocol version (see conformance/protocols/mqtt.py).
 * Every connection has reconnectPeriod 0: a connection the server closes stays closed.
 */

const mqtt = require('mqtt');

const CLIENT = 'mqttjs';
const SESSION_TAKEN_OVER = 0x8e;
const DISCONNECT_WITH_WILL = 0x04;
const MAX_SHARED_BATCHES = 3;

class Fail extends Error {}

function check(cond, reason) {
  if (!cond) throw new Fail(reason);
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

function expectExact(got, want, what) {
  check(same(got, want), `${what}: got ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
}

function versionOf(scenario) {
  if (scenario.endsWith('_v311')) return [ scenario.slice(0, -5), 4 ];
  if (scenario.endsWith('_v5')) return [ scenario.slice(0, -3), 5 ];
  return [ scenario, null ];
}

/** Messages one connection received, in arrival order; waitFor() resolves true/false (timeout). */
class Inbox {
  constructor(name) {
    this.name = name;
    this.messages = [];
    this.waiters = new Set();
  }

  add(m) {
    this.messages.push(m);
    for (const w of [ ...this.waiters ]) w();
  }

  waitFor(pred, ms) {
    if (pred(this.messages)) return Promise.resolve(true);
    return new Promise(resolve => {
      const done = ok => {
        clearTimeout(timer);
        this.waiters.delete(w);
        resolve(ok);
      };
      const w = () => { if (pred(this.messages)) done(true); };
      const timer = setTimeout(() => done(false), Math.max(0, ms));
      this.waiters.add(w);
    });
  }

  waitCount(n, ms) {
    return this.waitFor(ms_ => ms_.length >= n, ms);
  }

  waitTopic(topic, ms) {
    return this.waitFor(ms_ => ms_.some(m => m.topic === topic), ms);
  }

  topics(keep = () => true) {
    return this.messages.filter(keep).map(m => m.topic);
  }
}

// MQTT.js folds user properties into an object (a repeated name gets an array of values).
function userPairs(obj) {
  const out = [];
  for (const [ k, v ] of Object.entries(obj || {})) {
    for (const x of Array.isArray(v) ? v : [ v ]) out.push([ k, x ]);
  }
  return out;
}

function userObject(pairs) {
  const out = {};
  for (const [ k, v ] of pairs) {
    if (!(k in out)) out[k] = v;
    else out[k] = [].concat(out[k], v);
  }
  return out;
}

function received(topic, payload, packet) {
  const p = packet.properties || {};
  const props = {};
  if (p.contentType !== undefined) props.content_type = p.contentType;
  if (p.responseTopic !== undefined) props.response_topic = p.responseTopic;
  if (p.correlationData !== undefined) props.correlation_data = Buffer.from(p.correlationData);
  if (p.payloadFormatIndicator !== undefined) props.payload_format = Number(p.payloadFormatIndicator);
  if (p.messageExpiryInterval !== undefined) props.expiry = p.messageExpiryInterval;
  if (p.userProperties !== undefined) props.user_properties = userPairs(p.userProperties);
  return { topic, payload: Buffer.from(payload), qos: packet.qos, retain: !!packet.retain, props };
}

const short = m => `${m.topic} q${m.qos}${m.retain ? ' r' : ''} ${JSON.stringify(m.payload.subarray(0, 24).toString())}`;

class Ctx {
  constructor(cfg, scenario) {
    this.cfg = cfg;
    const [ base, v ] = versionOf(scenario);
    this.base = base;
    this.params = cfg.params || {};
    this.version = Number(this.params.version || v || 5);
    this.host = cfg.mqtt.host;
    this.port = Number(cfg.mqtt.port);
    this.endpoint = cfg.endpoint;
    this.prefix = cfg.prefix;
    this.topics = cfg.topics || {};
    this.groups = cfg.groups || {};
    this.quietMs = (this.params.quiet_s ?? 0.5) * 1000;
    this.started = Date.now();
    // Leave a margin so the script reports a reason before the runner kills it.
    this.deadline = this.started + Math.max(5000, ((cfg.timeout || 30) - 5) * 1000);
    const versioned = this.params.version || v;
    this.details = { mqtt_version: versioned ? (this.version === 5 ? '5.0' : '3.1.1') : '3.1.1 + 5.0' };
    this.cleanups = [];
  }

  remaining() {
    return this.deadline - Date.now();
  }

  /** A bounded wait for one expected event, never past the scenario's deadline. */
  waitMs(limit = 10000) {
    return Math.max(100, Math.min(limit, this.remaining()));
  }

  topic(...levels) {
    return [ this.prefix, ...levels ].join('/');
  }

  /** The topic belongs to this scenario (root wildcard subscribers see every scenario's). */
  own(topic) {
    return [ this.prefix, `$${this.prefix}` ].some(r => topic === r || topic.startsWith(`${r}/`));
  }

  async cleanup() {
    for (const fn of this.cleanups.reverse()) {
      try {
        await withTimeout(Promise.resolve().then(fn), 5000, 'cleanup');
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

/** One MQTT.js connection. */
class Conn {
  constructor(ctx, name, { clientId, version, will, tee } = {}) {
    this.ctx = ctx;
    this.name = name;
    this.version = version || ctx.version;
    this.clientId = clientId ?? `${ctx.prefix}-${name}`;
    this.will = will;
    this.inbox = new Inbox(name);
    this.tee = tee;
    this.connack = null;
    this.disconnectPacket = null;
    this.closed = false;
    this.closeWaiters = [];
  }

  async connect() {
    const opts = {
      host: this.ctx.host,
      port: this.ctx.port,
      protocolVersion: this.version,
      clientId: this.clientId,
      clean: true,
      keepalive: 30,
      reconnectPeriod: 0,
      connectTimeout: this.ctx.waitMs(),
    };
    if (this.will) opts.will = this.will;
    const c = this.client = mqtt.connect(opts);
    this.ctx.cleanups.push(() => this.close());
    c.on('message', (topic, payload, packet) => {
      const m = received(topic, payload, packet);
      this.inbox.add(m);
      if (this.tee) this.tee.add(m);
    });
    c.on('disconnect', packet => { this.disconnectPacket = packet; });
    c.on('close', () => {
      this.closed = true;
      for (const w of this.closeWaiters.splice(0)) w();
    });
    c.on('error', e => { this.lastError = e; });
    this.connack = await withTimeout(new Promise((resolve, reject) => {
      c.once('connect', resolve);
      c.once('error', reject);
      c.once('close', () => reject(new Fail(`${this.name}: connection closed before CONNACK`)));
    }), this.ctx.waitMs(), `${this.name} CONNACK`); // a refusal is an 'error' (the reason code)
    return this;
  }

  waitClosed(ms) {
    if (this.closed) return Promise.resolve(true);
    return new Promise(resolve => {
      const t = setTimeout(() => resolve(false), ms);
      this.closeWaiters.push(() => { clearTimeout(t); resolve(true); });
    });
  }

  /** subs: [[filter, qos or options]] in one SUBSCRIBE; returns the granted QoS / reason codes. */
  async subscribe(...subs) {
    const map = {};
    for (const [ f, o ] of subs) map[f] = typeof o === 'number' ? { qos: o } : o;
    const granted = await withTimeout(this.client.subscribeAsync(map), this.ctx.waitMs(), `${this.name} SUBACK`);
    return granted.map(g => g.qos);
  }

  async publish(topic, payload, qos = 1, { retain = false, properties } = {}) {
    const opts = { qos, retain };
    if (properties) opts.properties = properties;
    const pkt = await withTimeout(this.client.publishAsync(topic, payload, opts), this.ctx.waitMs(),
      `${this.name} publish to ${topic}`);
    if (qos && this.version === 5 && pkt && pkt.reasonCode) {
      throw new Fail(`${this.name}: publish to ${topic} answered reason ${pkt.reasonCode}`);
    }
  }

  async disconnect(reasonCode) {
    const opts = reasonCode === undefined ? {} : { reasonCode };
    await withTimeout(this.client.endAsync(false, opts), this.ctx.waitMs(), `${this.name} DISCONNECT`);
  }

  /** Abnormal end: the TCP socket is destroyed without a DISCONNECT packet. */
  async kill() {
    this.client.stream.destroy();
    check(await this.waitClosed(this.ctx.waitMs()), `${this.name}: socket did not close`);
    this.client.end(true);
  }

  close() {
    if (this.closed) return undefined;
    return this.client.endAsync(true);
  }
}

async function conn(ctx, name, opts) {
  return new Conn(ctx, name, opts).connect();
}

const enc = s => Buffer.from(s);

// ------------------------------------------------------------------------------------ scenarios

async function scConnect(ctx) {
  const v = ctx.version;
  const a = await conn(ctx, 'a');
  check(a.connack.sessionPresent === false, `clean connect reports session present: ${JSON.stringify(a.connack)}`);
  ctx.details.connack = { sessionPresent: a.connack.sessionPresent, properties: a.connack.properties || {} };
  // Empty client id: 3.1.1 allows it with a clean session; 5.0 assigns one.
  const e = await conn(ctx, 'empty', { clientId: '' });
  if (v === 5) {
    const assigned = (e.connack.properties || {}).assignedClientIdentifier;
    check(assigned, `5.0 CONNACK for an empty client id has no Assigned Client Identifier: ${JSON.stringify(e.connack)}`);
    ctx.details.assigned_client_id = assigned;
  }
  await e.disconnect();
  const echo = ctx.topic('echo');
  expectExact(await a.subscribe([ echo, 1 ]), [ 1 ], 'granted QoS');
  await a.publish(echo, enc('ping'), 1);
  check(await a.inbox.waitTopic(echo, ctx.waitMs()), 'own message did not come back');
  // Takeover: a second connection with the same client id closes the first.
  const b = await conn(ctx, 'b', { clientId: a.clientId });
  check(await a.waitClosed(ctx.waitMs()), 'first connection still open after a takeover of its client id');
  if (v === 5) {
    const rc = a.disconnectPacket && a.disconnectPacket.reasonCode;
    check(rc === SESSION_TAKEN_OVER, `taken-over 5.0 client got DISCONNECT ${rc}, expected 0x8E`);
    ctx.details.takeover_reason = rc;
  }
  expectExact(await b.subscribe([ echo, 1 ]), [ 1 ], 'granted QoS after takeover');
  await b.publish(echo, enc('after-takeover'), 1);
  check(await b.inbox.waitTopic(echo, ctx.waitMs()), 'the new connection gets nothing');
  await b.disconnect();
  check(await b.waitClosed(ctx.waitMs()), 'connection not closed after DISCONNECT');
}

// (last topic level, subscription QoS, publish QoS); delivered QoS = the smaller. Same-QoS cases
// send n text payloads plus a binary, an empty and a 64 KiB one; the others 3 text payloads.
const QOS_CASES = [[ 'q0', 0, 0 ], [ 'q1', 1, 1 ], [ 'q2', 2, 2 ], [ 'down', 1, 2 ], [ 'up', 2, 1 ]];

function qosPayloads(level, sq, pq, n) {
  const out = [];
  for (let i = 0; i < (sq === pq ? n : 3); i++) out.push(enc(`${level}-${i}`));
  if (sq === pq) out.push(Buffer.from([ ...Array(256).keys() ]), Buffer.alloc(0), Buffer.alloc(65536, 0xa5));
  return out;
}

async function scQos(ctx) {
  const n = ctx.params.count || 10;
  const sub = await conn(ctx, 'sub');
  const granted = await sub.subscribe(...QOS_CASES.map(([ level, sq ]) => [ ctx.topic(level), sq ]));
  expectExact(granted, QOS_CASES.map(([ , sq ]) => sq), 'granted QoS');
  const pub = await conn(ctx, 'pub');
  const sent = {};
  for (const [ level, sq, pq ] of QOS_CASES) {
    sent[level] = qosPayloads(level, sq, pq, n);
    for (const body of sent[level]) await pub.publish(ctx.topic(level), body, pq);
  }
  const of = (ms, level) => ms.filter(m => m.topic === ctx.topic(level));
  await sub.inbox.waitFor(ms => QOS_CASES.every(([ level ]) => of(ms, level).length >= sent[level].length),
    ctx.waitMs(15000));
  const got = sub.inbox.messages;
  ctx.details.received = Object.fromEntries(QOS_CASES.map(([ level ]) => [ level, of(got, level).length ]));
  for (const [ level, sq, pq ] of QOS_CASES) {
    const what = `${level} (publish QoS ${pq}, subscription QoS ${sq})`;
    const ms = of(got, level);
    check(ms.length === sent[level].length, `${what}: received ${ms.length} of ${sent[level].length}`);
    check(ms.every((m, i) => m.payload.equals(sent[level][i])), `${what}: payloads differ or out of order`);
    const qs = [ ...new Set(ms.map(m => m.qos)) ];
    check(same(qs, [ Math.min(sq, pq) ]), `${what}: delivered with QoS ${qs}, expected ${Math.min(sq, pq)}`);
    check(!ms.some(m => m.retain), `${what}: live message flagged retained`);
  }
}

async function scRetained(ctx) {
  const r = ctx.topic('r');
  const s = ctx.topic('s');
  const everything = ctx.topic('#');
  const pub = await conn(ctx, 'pub');
  await pub.publish(r, enc('keep'), 1, { retain: true });
  await pub.publish(s, enc('sentinel'), 1, { retain: true });
  ctx.cleanups.push(() => pub.publish(s, Buffer.alloc(0), 1, { retain: true }));
  const s1 = await conn(ctx, 's1');
  await s1.subscribe([ everything, 1 ]);
  check(await s1.inbox.waitCount(2, ctx.waitMs()), `retained on subscribe: ${s1.inbox.topics()}`);
  const first = Object.fromEntries(s1.inbox.messages.map(m => [ m.topic, m ]));
  expectExact(Object.keys(first).sort(), [ r, s ].sort(), 'retained on subscribe');
  check(first[r].payload.toString() === 'keep' && first[r].retain, `retained ${r}: ${short(first[r])}`);
  check(first[s].retain, `retained ${s} delivered without the retain flag`);
  await pub.publish(r, enc('live'), 1);
  check(await s1.inbox.waitCount(3, ctx.waitMs()), 'live publish not delivered');
  const live = s1.inbox.messages[2];
  check(live.topic === r && live.payload.toString() === 'live' && !live.retain, `live copy: ${short(live)}`);
  await pub.publish(r, Buffer.alloc(0), 1, { retain: true }); // clears the retained message
  check(await s1.inbox.waitCount(4, ctx.waitMs()), 'the empty retained publish was not delivered');
  const empty = s1.inbox.messages[3];
  check(empty.topic === r && empty.payload.length === 0, `empty retained publish delivered as ${short(empty)}`);
  const s2 = await conn(ctx, 's2');
  await s2.subscribe([ everything, 1 ]);
  check(await s2.inbox.waitTopic(s, ctx.waitMs()), 'the remaining retained message was not delivered');
  await s2.inbox.waitTopic(r, ctx.quietMs);
  check(!s2.inbox.topics().includes(r), `cleared retained message still delivered: ${s2.inbox.topics()}`);
  ctx.details.second_subscriber = s2.inbox.messages.map(short);
  if (ctx.version === 5) {
    // Retain handling 2: nothing retained on subscribe; retain-as-published keeps the flag live.
    const s3 = await conn(ctx, 's3');
    await s3.subscribe([ everything, { qos: 1, rap: true, rh: 2 } ]);
    await pub.publish(s, enc('again'), 1, { retain: true });
    check(await s3.inbox.waitTopic(s, ctx.waitMs()), 'retain handling 2 subscriber got no live message');
    const m = s3.inbox.messages;
    check(m[0].payload.toString() === 'again', `retain handling 2 still sent retained messages: ${m.map(short)}`);
    check(m[0].retain, 'retain-as-published subscription got the retain flag cleared');
    check(await s1.inbox.waitCount(5, ctx.waitMs()), 's1 missed the retained live publish');
    check(!s1.inbox.messages[4].retain, 'a plain subscription got a live message with retain 1');
  }
}

async function scWildcards(ctx) {
  const p = ctx.prefix;
  const d = `$${ctx.prefix}`;
  const pubs = [ `${p}/a/temp`, `${p}/b/temp`, `${p}/a/hum`, `${p}/a/b/temp`, p, `${d}/a/temp` ];
  const specs = {
    plus: [ `${p}/+/temp`, [ `${p}/a/temp`, `${p}/b/temp` ] ],
    hash: [ `${p}/#`, pubs.slice(0, 5) ],
    root: [ '#', pubs.slice(0, 5) ],
    rootplus: [ '+/a/temp', [ `${p}/a/temp` ] ],
    dollar: [ `${d}/#`, [ `${d}/a/temp` ] ],
  };
  const conns = {};
  for (const [ name, [ filter ] ] of Object.entries(specs)) {
    conns[name] = await conn(ctx, name);
    await conns[name].subscribe([ filter, 1 ]);
  }
  const pub = await conn(ctx, 'pub');
  for (const t of pubs) await pub.publish(t, enc(t), 1);
  const own = m => ctx.own(m.topic);
  for (const [ name, [ , want ] ] of Object.entries(specs)) {
    await conns[name].inbox.waitFor(ms => want.every(t => ms.some(m => m.topic === t)), ctx.waitMs());
  }
  await conns.root.inbox.waitTopic(pubs[5], ctx.quietMs); // give a wrong '$' delivery time to show up
  const got = Object.fromEntries(Object.keys(specs).map(n => [ n, conns[n].inbox.topics(own).sort() ]));
  ctx.details.received = got;
  for (const [ name, [ , want ] ] of Object.entries(specs)) {
    expectExact(got[name], [ ...want ].sort(), `subscriber ${name}`);
    for (const m of conns[name].inbox.messages.filter(own)) {
      check(m.payload.toString() === m.topic, `${name}: payload of ${m.topic} is ${m.payload}`);
    }
  }
}

async function scWill(ctx) {
  const v = ctx.version;
  const root = ctx.topic('will');
  const will = (name, payload) => ({ topic: `${root}/${name}`, payload: enc(payload), qos: 1, retain: false });
  const obs = await conn(ctx, 'observer');
  await obs.subscribe([ `${root}/#`, 1 ]);
  const normal = await conn(ctx, 'normal', { will: will('normal', 'normal-will') });
  await normal.disconnect();
  const expect = { [`${root}/abnormal`]: 'abnormal-will' };
  if (v === 5) {
    const w4 = await conn(ctx, 'reason4', { will: will('reason4', 'reason4-will') });
    await w4.disconnect(DISCONNECT_WITH_WILL);
    expect[`${root}/reason4`] = 'reason4-will';
  }
  const ab = await conn(ctx, 'abnormal', { will: will('abnormal', 'abnormal-will') });
  await ab.kill();
  await obs.inbox.waitFor(ms => Object.keys(expect).every(t => ms.some(m => m.topic === t)), ctx.waitMs());
  await obs.inbox.waitTopic(`${root}/normal`, ctx.quietMs);
  const got = obs.inbox.messages;
  ctx.details.received = got.map(short);
  check(!got.some(m => m.topic === `${root}/normal`), 'will published although the client sent a normal DISCONNECT');
  for (const [ topic, payload ] of Object.entries(expect)) {
    const ms = got.filter(m => m.topic === topic);
    check(ms.length === 1, `will ${topic}: received ${ms.length} times`);
    check(ms[0].payload.toString() === payload && ms[0].qos === 1, `will ${topic}: ${short(ms[0])}`);
  }
}

async function scShared(ctx) {
  const n = ctx.params.count || 20;
  const share = `$share/${ctx.prefix}/${ctx.prefix}/#`;
  const both = new Inbox('members');
  const members = [ await conn(ctx, 'm1', { tee: both }), await conn(ctx, 'm2', { tee: both }) ];
  for (const m of members) expectExact(await m.subscribe([ share, 1 ]), [ 1 ], `${m.name} shared SUBACK`);
  const plain = await conn(ctx, 'plain');
  await plain.subscribe([ ctx.topic('#'), 1 ]);
  const pub = await conn(ctx, 'pub');
  const sent = [];
  // Which member gets a message is up to the server; if one got none of the first batch, send more
  // (at most MAX_SHARED_BATCHES): a server that never uses the second member still fails.
  for (let b = 0; b < MAX_SHARED_BATCHES; b++) {
    const base = sent.length;
    for (let i = 0; i < n; i++) {
      const body = `item-${base + i}`;
      await pub.publish(ctx.topic('items'), enc(body), 1);
      sent.push(body);
    }
    await both.waitCount(sent.length, ctx.waitMs(15000));
    if (members.every(m => m.inbox.messages.length)) break;
  }
  await plain.inbox.waitCount(sent.length, ctx.waitMs());
  await both.waitCount(sent.length + 1, ctx.quietMs); // room for a late duplicate
  const [ a, b ] = members.map(m => m.inbox.messages.map(x => x.payload.toString()));
  const plainGot = plain.inbox.messages.map(x => x.payload.toString());
  Object.assign(ctx.details, { sent: sent.length, m1: a.length, m2: b.length, plain: plainGot.length });
  check(new Set(a).size === a.length && new Set(b).size === b.length, 'a member got a message twice');
  const inBoth = a.filter(x => b.includes(x));
  check(inBoth.length === 0, `${inBoth.length} messages went to both members`);
  const missing = sent.filter(x => !a.includes(x) && !b.includes(x));
  check(missing.length === 0, `${missing.length} messages reached no member`);
  check(a.length && b.length, `one member got nothing (m1=${a.length}, m2=${b.length})`);
  check(same(plainGot, sent), `the non-shared subscriber got ${plainGot.length} of ${sent.length}`);
}

async function scProperties(ctx) {
  const reqT = ctx.topic('req');
  const respT = ctx.topic('resp');
  const responder = await conn(ctx, 'responder');
  await responder.subscribe([ reqT, 1 ]);
  const requester = await conn(ctx, 'requester');
  await requester.subscribe([ respT, 1 ]);
  // MQTT.js keeps user properties in an object: repeats of a name stay in order, names in
  // first-seen order, so the pairs below (repeats adjacent) survive its representation unchanged.
  const user = [[ 'trace', 't-1' ], [ 'dup', '1' ], [ 'dup', '2' ], [ 'ünïcode', 'välue' ]];
  const corr = Buffer.from('\x00corr\xff-42', 'latin1');
  await requester.publish(reqT, enc('{"q": 1}'), 1, { properties: {
    userProperties: userObject(user),
    contentType: 'application/json',
    responseTopic: respT,
    correlationData: corr,
    payloadFormatIndicator: true, // MQTT.js types it as a boolean (a number breaks the encoder)
    messageExpiryInterval: 120,
  } });
  check(await responder.inbox.waitTopic(reqT, ctx.waitMs()), 'request not delivered');
  const req = responder.inbox.messages[0];
  ctx.details.request_properties = { ...req.props, correlation_data: req.props.correlation_data && req.props.correlation_data.toString('hex') };
  check(req.payload.toString() === '{"q": 1}', `request payload ${req.payload}`);
  // the W3C traceparent the gateway gives a message published without one: well formed, set aside
  const tps = (req.props.user_properties || []).filter(([k]) => k === 'traceparent');
  check(tps.every(([, v]) => /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/.test(v)), `traceparent ${JSON.stringify(tps)}`);
  expectExact((req.props.user_properties || []).filter(([k]) => k !== 'traceparent'), user, 'user properties');
  check(req.props.content_type === 'application/json', `content type ${req.props.content_type}`);
  check(req.props.response_topic === respT, `response topic ${req.props.response_topic}`);
  check(req.props.correlation_data && req.props.correlation_data.equals(corr), `correlation data ${req.props.correlation_data}`);
  check(req.props.payload_format === 1, `payload format ${req.props.payload_format}`);
  const expiry = req.props.expiry;
  check(expiry > 0 && expiry <= 120, `message expiry interval ${expiry}, expected 1..120`);
  await responder.publish(req.props.response_topic, enc('answer'), 1, { properties: {
    userProperties: { status: 'ok' },
    correlationData: req.props.correlation_data,
  } });
  check(await requester.inbox.waitTopic(respT, ctx.waitMs()), 'response not delivered');
  const resp = requester.inbox.messages[0];
  check(resp.payload.toString() === 'answer', `response payload ${resp.payload}`);
  check(resp.props.correlation_data && resp.props.correlation_data.equals(corr), 'response correlation data differs');
  expectExact((resp.props.user_properties || []).filter(([k]) => k !== 'traceparent'), [[ 'status', 'ok' ]], 'response user properties');
  check(resp.props.content_type === undefined, 'request properties leaked into the response');
}

// The official RocketMQ 5 Node.js client's half of cross_protocol (the same package scenarios.js uses).
async function rocketmqClient(ctx, client, what) {
  ctx.cleanups.push(() => client.shutdown());
  await withTimeout(client.startup(), Math.min(15000, ctx.remaining()), `${what} startup`);
  return client;
}

async function scCrossProtocol(ctx) {
  const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');
  const { sensors, orders } = ctx.topics;
  const consumer = await rocketmqClient(ctx, new SimpleConsumer({
    endpoints: ctx.endpoint, namespace: '', consumerGroup: ctx.groups.sensors,
    subscriptions: new Map([[ sensors, '*' ]]), awaitDuration: 2000,
  }), 'simple consumer');
  const p311 = await conn(ctx, 'pub311', { version: 4 });
  const p5 = await conn(ctx, 'pub5', { version: 5 });
  await p311.publish(`${sensors}/dev1/temp`, enc('21.5'), 1);
  await p5.publish(`${sensors}/dev2/temp`, enc('19.0'), 1, {
    properties: { userProperties: { unit: 'C' }, contentType: 'text/plain' },
  });
  const got = [];
  while (got.length < 2 && ctx.remaining() > 0) {
    for (const m of (await consumer.receive(16, 20000)) || []) {
      got.push(m);
      await consumer.ack(m);
    }
  }
  const byPath = {};
  for (const m of got) (byPath[m.properties.get('mqtt.topic')] ||= []).push(m);
  ctx.details.rocketmq_received = Object.fromEntries(Object.entries(byPath).map(([ k, ms ]) =>
    [ k, ms.map(m => [ m.body.toString(), Object.fromEntries(m.properties) ]) ]));
  check(got.length === 2, `RocketMQ consumer got ${got.length} messages, expected 2`);
  const sent = {
    [`${sensors}/dev1/temp`]: [ '21.5', {}],
    [`${sensors}/dev2/temp`]: [ '19.0', { 'mqtt.user_properties': '[["unit","C"]]', 'mqtt.content_type': 'text/plain' }],
  };
  for (const [ path, [ body, extra ] ] of Object.entries(sent)) {
    const ms = byPath[path] || [];
    check(ms.length === 1, `${ms.length} RocketMQ messages with mqtt.topic=${path}`);
    const m = ms[0];
    check(m.body.toString() === body, `${path}: body ${m.body}`);
    check(m.topic === sensors, `${path}: store topic ${m.topic} != ${sensors}`);
    check(m.properties.get('mqtt.qos') === '1', `${path}: mqtt.qos ${m.properties.get('mqtt.qos')}`);
    // mqtt.retain is "1" for a retained publish, absent (older gateways: "0") otherwise
    check(m.properties.get('mqtt.retain') !== '1', `${path}: not retained but mqtt.retain = 1`);
    for (const [ k, v ] of Object.entries(extra)) check(m.properties.get(k) === v, `${path}: ${k} = ${m.properties.get(k)}`);
  }
  // RocketMQ -> MQTT: path <topic>/<tag>, or <topic> without a tag; QoS 1.
  const subs = [ await conn(ctx, 'sub311', { version: 4 }), await conn(ctx, 'sub5', { version: 5 }) ];
  for (const s of subs) expectExact(await s.subscribe([ `${orders}/#`, 2 ]), [ 2 ], `${s.name} SUBACK`);
  const producer = await rocketmqClient(ctx, new Producer({ endpoints: ctx.endpoint, namespace: '', topics: [ orders ] }), 'producer');
  await producer.send({ topic: orders, tag: 'created', body: enc('order-1') });
  await producer.send({ topic: orders, body: enc('order-2') });
  const want = [[ `${orders}/created`, 'order-1', 1 ], [ orders, 'order-2', 1 ]].sort();
  for (const s of subs) await s.inbox.waitCount(2, ctx.waitMs(15000));
  for (const s of subs) {
    ctx.details[`${s.name}_received`] = s.inbox.messages.map(short);
    expectExact(s.inbox.messages.map(m => [ m.topic, m.payload.toString(), m.qos ]).sort(), want, `${s.name} got`);
  }
}

const SCENARIOS = {
  connect: scConnect,
  qos: scQos,
  retained: scRetained,
  wildcards: scWildcards,
  will: scWill,
  shared: scShared,
  properties: scProperties,
  cross_protocol: scCrossProtocol,
};

async function main(argv) {
  const scenario = argv[2];
  if (argv.length !== 4 || !SCENARIOS[versionOf(scenario || '')[0]]) {
    process.stderr.write(`usage: node mqttjs_scenarios.js {${Object.keys(SCENARIOS).join(',')}}[_v311|_v5] CONFIG_JSON\n`);
    return 2;
  }
  const ctx = new Ctx(JSON.parse(argv[3]), scenario);
  let ok = false;
  let reason = '';
  try {
    await withTimeout(SCENARIOS[ctx.base](ctx), Math.max(1000, ctx.remaining()), scenario);
    ok = true;
  } catch (e) {
    reason = e instanceof Fail ? e.message : `${e.name}: ${e.message}`;
    if (!(e instanceof Fail)) process.stderr.write(`${e.stack}\n`);
  }
  await ctx.cleanup();
  ctx.details.elapsed_s = (Date.now() - ctx.started) / 1000;
  const line = { client: CLIENT, scenario, ok, reason, details: ctx.details };
  await new Promise(resolve => process.stdout.write(JSON.stringify(line) + '\n', resolve));
  return ok ? 0 : 1;
}

// Clients keep timers and sockets open: exit explicitly.
main(process.argv).then(code => process.exit(code), e => {
  process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
