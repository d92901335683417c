# The Ruby client test (internal/sqlapi): the pg gem, connection from the
# libpq environment (PGHOST, ...). Prints one line per step for the Go test.
require 'json'
require 'pg'

$stdout.sync = true
conn = PG.connect
schema = conn.quote_ident(ENV.fetch('PGWAKE_SCHEMA'))
queue = ENV.fetch('PGWAKE_QUEUE')
jobs = Integer(ENV.fetch('PGWAKE_JOBS'))
gap = Integer(ENV.fetch('PGWAKE_GAP_MS')) / 1000.0
insert = "INSERT INTO #{schema}.orders (note) VALUES ($1)"
enqueue = "SELECT #{schema}.enqueue($1, $2::jsonb, queue => $3, max_attempts => $4::int)"

# Rolled back: the order and the job go together.
conn.exec('BEGIN')
conn.exec_params(insert, ['ruby rollback'])
id = conn.exec_params(enqueue, ['sqlapi.test', JSON.generate(client: 'ruby'), queue, 5]).getvalue(0, 0)
conn.exec('ROLLBACK')
puts "rolledback #{id}"

jobs.times do |n|
  conn.exec('BEGIN')
  conn.exec_params(insert, ["ruby #{n}"])
  id = conn.exec_params(enqueue, ['sqlapi.test', JSON.generate(client: 'ruby', n: n), queue, 5]).getvalue(0, 0)
  commit_us = Process.clock_gettime(Process::CLOCK_REALTIME, :microsecond)
  conn.exec('COMMIT')
  puts "committed #{id} #{commit_us}"
  sleep gap
end

# max_attempts 0: PW006.
begin
  conn.exec_params(enqueue, ['sqlapi.test', '{}', queue, 0])
rescue PG::Error => e
  puts "sqlstate #{e.result.error_field(PG::PG_DIAG_SQLSTATE)} #{e.result.error_field(PG::PG_DIAG_COLUMN_NAME)}"
end
conn.close
