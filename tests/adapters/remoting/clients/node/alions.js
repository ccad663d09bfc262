'use strict';
// ali-ons (pure JS RocketMQ 4.x client) driven by tests/adapters/remoting: one mode per run, one JSON object
// per line on stdout, client logs on stderr.
//
//   node alions.js produce --namesrv H:P --topic T [--count N] [--tag TAG] [--prefix P] [--group G]
//   node alions.js consume --namesrv H:P --topic T --group G --expect N [--timeout S] [--retry-first]
//
// produce prints {"event":"sent","body":..,"msgId":..,"queueId":..,"queueOffset":..} per message.
// consume prints {"event":"received",...} per delivery; with --retry-first it returns
// ACTION_RETRY the first time it sees each body (the gateway must redeliver it through the
// retry topic); it exits 0 once --expect distinct bodies were consumed successfully, 1 on timeout.
// Both take --access-key AK --secret-key SK: ali-ons then signs every request (ACL 1.0).
const { Producer, Consumer, Message } = require('ali-ons');

function args(argv) {
  const out = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a.startsWith('--')) {
      const key = a.slice(2);
      const next = argv[i + 1];
      if (next === undefined || next.startsWith('--')) {
        out[key] = true;
      } else {
        out[key] = next;
        i++;
      }
    } else {
      out._.push(a);
    }
  }
  return out;
}

function credentials(opt) {
  return opt['access-key'] ? { accessKey: opt['access-key'], secretKey: opt['secret-key'] } : {};
}

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

const quiet = {
  info() {},
  debug() {},
  warn(...a) { console.error('[warn]', ...a); },
  error(...a) { console.error('[error]', ...a); },
};

async function produce(opt) {
  const producer = new Producer({
    httpclient: {},
    nameSrv: opt.namesrv,
    producerGroup: opt.group || 'PG_ALIONS',
    logger: quiet,
    ...credentials(opt),
  });
  await producer.ready();
  const count = Number(opt.count || 1);
  for (let i = 0; i < count; i++) {
    const body = `${opt.prefix || 'alions'}-${i}`;
    const msg = new Message(opt.topic, opt.tag || 'TagA', body);
    msg.keys = [ `key-${i}` ];
    msg.properties.origin = 'ali-ons';
    const r = await producer.send(msg);
    emit({
      event: 'sent', body, msgId: r.msgId, status: r.sendStatus,
      queueId: r.messageQueue.queueId, queueOffset: r.queueOffset,
    });
  }
  await producer.close();
}

async function consume(opt) {
  const expect = Number(opt.expect || 1);
  const timeout = Number(opt.timeout || 60) * 1000;
  const consumer = new Consumer({
    httpclient: {},
    nameSrv: opt.namesrv,
    consumerGroup: opt.group,
    logger: quiet,
    persistConsumerOffsetInterval: 500,
    rebalanceInterval: 2000,
    consumeFromWhere: opt['from-last'] ? 'CONSUME_FROM_LAST_OFFSET' : 'CONSUME_FROM_FIRST_OFFSET',
    ...credentials(opt),
  });
  consumer.on('error', err => console.error('[consumer error]', err && err.message));
  const seen = new Set();
  const done = new Set();
  let finish;
  const finished = new Promise(resolve => { finish = resolve; });
  consumer.subscribe(opt.topic, opt.tag || '*', async msg => {
    const body = msg.body.toString();
    const first = !seen.has(body);
    seen.add(body);
    const retry = opt['retry-first'] && first;
    emit({
      event: 'received', body, msgId: msg.msgId, topic: msg.topic, tags: msg.tags, keys: msg.keys,
      reconsumeTimes: msg.reconsumeTimes, queueId: msg.queueId, queueOffset: msg.queueOffset,
      uniqKey: msg.properties.UNIQ_KEY, origin: msg.properties.origin || null, retry,
    });
    if (retry) {
      return Consumer.ACTION_RETRY;
    }
    done.add(body);
    if (done.size >= expect) {
      finish(true);
    }
  });
  const timer = setTimeout(() => finish(false), timeout);
  const ok = await finished;
  clearTimeout(timer);
  // The consume loop records a message's offset only after its handler returned: give it a moment,
  // then close() persists the offsets (UPDATE_CONSUMER_OFFSET) to the gateway.
  await new Promise(resolve => setTimeout(resolve, 300));
  await consumer.close();
  emit({ event: ok ? 'done' : 'timeout', consumed: done.size });
  process.exit(ok ? 0 : 1);
}

async function main() {
  const opt = args(process.argv.slice(2));
  const mode = opt._[0];
  if (mode === 'produce') {
    await produce(opt);
  } else if (mode === 'consume') {
    await consume(opt);
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
}

main().then(() => process.exit(0), err => {
  console.error('[fatal]', err && err.stack || err);
  emit({ event: 'error', message: String(err && err.message || err) });
  process.exit(2);
});
