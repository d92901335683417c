// The Node client test (internal/sqlapi): pg from npm, connection from the
// libpq environment (PGHOST, ...). Prints one line per step for the Go test.
'use strict';
const { Client } = require('pg');

const schema = '"' + process.env.PGWAKE_SCHEMA.replace(/"/g, '""') + '"';
const queue = process.env.PGWAKE_QUEUE;
const jobs = Number(process.env.PGWAKE_JOBS);
const gap = Number(process.env.PGWAKE_GAP_MS);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const { performance } = require('perf_hooks');
const nowMicros = () => Math.round((performance.timeOrigin + performance.now()) * 1000).toString();

async function main() {
  const client = new Client();
  await client.connect();
  const insert = `INSERT INTO ${schema}.orders (note) VALUES ($1)`;
  const enqueue = `SELECT ${schema}.enqueue($1, $2::jsonb, queue => $3) AS id`;

  // Rolled back: the order and the job go together.
  await client.query('BEGIN');
  await client.query(insert, ['node rollback']);
  let r = await client.query(enqueue, ['sqlapi.test', JSON.stringify({ client: 'node' }), queue]);
  await client.query('ROLLBACK');
  console.log('rolledback', r.rows[0].id);

  for (let n = 0; n < jobs; n++) {
    await client.query('BEGIN');
    await client.query(insert, [`node ${n}`]);
    r = await client.query(enqueue, ['sqlapi.test', JSON.stringify({ client: 'node', n }), queue]);
    const commitUs = nowMicros();
    await client.query('COMMIT');
    console.log('committed', r.rows[0].id, commitUs);
    await sleep(gap);
  }

  // A negative delay: PW005.
  try {
    await client.query(`SELECT ${schema}.enqueue($1, delay => $2::interval, queue => $3)`, ['sqlapi.test', '-1 second', queue]);
  } catch (e) {
    console.log('sqlstate', e.code, e.column);
  }
  await client.end();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
