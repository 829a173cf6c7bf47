# benches/puppetserver/run, after the timed compiles (so that it warms nothing they
# measure), in an environment of its own: where the time of a kept answer goes,
# timed from Ruby inside this compile (pk_bench::split), part by part.
node default {
  notify { 'pk-bench':
    message => pk_bench::json({ 'split' => pk_bench::split('haproxy', 'production', 2000, 9) }),
  }
}
