// ali-ons 3.12.0 (npm) with AccessKey/SecretKey against shardmq: sends COUNT messages to
// TOPIC, push-consumes them in GROUP, prints one JSON line {sent, received, errors} and exits.
// Usage: node ali_ons_acl.js NAMESRV TOPIC GROUP ACCESS_KEY SECRET_KEY COUNT TIMEOUT_MS
'use strict';

const { Producer, Consumer, Message } = require('ali-ons');

const [namesrv, topic, group, accessKeyId, accessKeySecret, count, timeoutMs] =
  process.argv.slice(2);
const total = Number(count);
// ali-ons asks for an HTTP client for its Aliyun address server; with nameSrv it is unused.
const httpclient = {
  request() {
    throw new Error('no address server here: nameSrv is given');
  },
};
const common = { httpclient, nameSrv: namesrv, accessKeyId, accessKeySecret };
const result = { sent: 0, received: 0, errors: [] };
const seen = new Set();

function finish() {
  console.log(JSON.stringify(result));
  process.exit(0);
}

setTimeout(finish, Number(timeoutMs)).unref();

(async () => {
  const producer = new Producer({ ...common, producerGroup: group + '_pg' });
  producer.on('error', err => result.errors.push('producer: ' + err.message));
  await producer.ready();
  for (let i = 0; i < total; i++) {
    try {
      const sent = await producer.send(new Message(topic, 'TagA', 'ali-ons ' + i));
      if (sent.sendStatus === 'SEND_OK') result.sent++;
      else result.errors.push('send status ' + sent.sendStatus);
    } catch (err) {
      result.errors.push('send: ' + err.message);
      break;
    }
  }
  if (result.sent < total) finish();
  const consumer = new Consumer({
    ...common,
    consumerGroup: group,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    rebalanceInterval: 1000,
  });
  consumer.on('error', err => result.errors.push('consumer: ' + err.message));
  consumer.subscribe(topic, '*', async msg => {
    seen.add(msg.body.toString());
    result.received = seen.size;
    if (seen.size === total) finish();
  });
  await consumer.ready();
})().catch(err => {
  result.errors.push(err.message);
  finish();
});
