# benches/puppetserver/run: what an identical repeated call of each puppet-kicker
# function costs in a real compile, next to a no-op function with the same
# signature (pk_bench_*, in modules/pk_bench: outside any module's namespace, as
# the real ones are, so Puppet finds both the same way), both timed from this
# manifest the same way: the monotonic clock (pk_bench::clock) read before and
# after the call. Each compile takes $samples samples of each; the first call of
# each function, before them, makes the answer the timed calls get back (a kept
# answer: pk_bench::same checks that each returns the warm-up call's very object).
# The figures go into the catalog, as JSON in the message of Notify['pk-bench'].
node default {
  $samples = 15

  # Warm-up: the answers the timed calls get back, and each no-op called once.
  $kept = {
    'servers_with_role'  => servers_with_role('haproxy'),
    'servers_with_facts' => servers_with_facts('role=haproxy', 'os.family=Debian'),
    'server_with_role'   => server_with_role('haproxy', { 'certname' => 'none' }),
  }
  $warm_noops = [
    pk_bench_servers_with_role('haproxy'),
    pk_bench_servers_with_facts('role=haproxy', 'os.family=Debian'),
    pk_bench_server_with_role('haproxy', { 'certname' => 'none' }),
    pk_bench_scope_servers_with_role('haproxy'),
    pk_bench_body_servers_with_role('haproxy'),
    pk_bench_once_servers_with_role('haproxy'),
    pk_bench_scoped_servers_with_role('haproxy'),
  ]

  # Each sample, for each call: two pairs, each between reads of the clock: the no-op
  # then the call, and the call then the no-op (where a call stands in the manifest
  # changes what it costs there: each is timed in both places).
  $timed = Integer[1, $samples].map |$i| {
    # What reading the clock twice costs, with nothing between (part of every figure).
    $c0 = pk_bench::clock()
    $c1 = pk_bench::clock()

    $ar0 = pk_bench::clock()
    $ar_noop = pk_bench_servers_with_role('haproxy')
    $ar1 = pk_bench::clock()
    $ar_call = servers_with_role('haproxy')
    $ar2 = pk_bench::clock()
    $br0 = pk_bench::clock()
    $br_call = servers_with_role('haproxy')
    $br1 = pk_bench::clock()
    $br_noop = pk_bench_servers_with_role('haproxy')
    $br2 = pk_bench::clock()

    $af0 = pk_bench::clock()
    $af_noop = pk_bench_servers_with_facts('role=haproxy', 'os.family=Debian')
    $af1 = pk_bench::clock()
    $af_call = servers_with_facts('role=haproxy', 'os.family=Debian')
    $af2 = pk_bench::clock()
    $bf0 = pk_bench::clock()
    $bf_call = servers_with_facts('role=haproxy', 'os.family=Debian')
    $bf1 = pk_bench::clock()
    $bf_noop = pk_bench_servers_with_facts('role=haproxy', 'os.family=Debian')
    $bf2 = pk_bench::clock()

    $as0 = pk_bench::clock()
    $as_noop = pk_bench_server_with_role('haproxy', { 'certname' => 'none' })
    $as1 = pk_bench::clock()
    $as_call = server_with_role('haproxy', { 'certname' => 'none' })
    $as2 = pk_bench::clock()
    $bs0 = pk_bench::clock()
    $bs_call = server_with_role('haproxy', { 'certname' => 'none' })
    $bs1 = pk_bench::clock()
    $bs_noop = pk_bench_server_with_role('haproxy', { 'certname' => 'none' })
    $bs2 = pk_bench::clock()

    # Where the time goes (servers_with_role): no-ops with its signature that each do
    # one part of what its call does more than the no-op, timed the same way.
    $aps0 = pk_bench::clock()
    $aps_noop = pk_bench_servers_with_role('haproxy')
    $aps1 = pk_bench::clock()
    $aps_call = pk_bench_scope_servers_with_role('haproxy')
    $aps2 = pk_bench::clock()
    $bps0 = pk_bench::clock()
    $bps_call = pk_bench_scope_servers_with_role('haproxy')
    $bps1 = pk_bench::clock()
    $bps_noop = pk_bench_servers_with_role('haproxy')
    $bps2 = pk_bench::clock()

    $apb0 = pk_bench::clock()
    $apb_noop = pk_bench_servers_with_role('haproxy')
    $apb1 = pk_bench::clock()
    $apb_call = pk_bench_body_servers_with_role('haproxy')
    $apb2 = pk_bench::clock()
    $bpb0 = pk_bench::clock()
    $bpb_call = pk_bench_body_servers_with_role('haproxy')
    $bpb1 = pk_bench::clock()
    $bpb_noop = pk_bench_servers_with_role('haproxy')
    $bpb2 = pk_bench::clock()

    $apo0 = pk_bench::clock()
    $apo_noop = pk_bench_servers_with_role('haproxy')
    $apo1 = pk_bench::clock()
    $apo_call = pk_bench_once_servers_with_role('haproxy')
    $apo2 = pk_bench::clock()
    $bpo0 = pk_bench::clock()
    $bpo_call = pk_bench_once_servers_with_role('haproxy')
    $bpo1 = pk_bench::clock()
    $bpo_noop = pk_bench_servers_with_role('haproxy')
    $bpo2 = pk_bench::clock()

    $apc0 = pk_bench::clock()
    $apc_noop = pk_bench_servers_with_role('haproxy')
    $apc1 = pk_bench::clock()
    $apc_call = pk_bench_scoped_servers_with_role('haproxy')
    $apc2 = pk_bench::clock()
    $bpc0 = pk_bench::clock()
    $bpc_call = pk_bench_scoped_servers_with_role('haproxy')
    $bpc1 = pk_bench::clock()
    $bpc_noop = pk_bench_servers_with_role('haproxy')
    $bpc2 = pk_bench::clock()

    # Per call: [[no-op first, no-op second], [call second, call first], whether
    # both calls returned the kept answer]. (A Hash literal cannot begin a
    # statement: named, then given back.)
    $sample = {
      'clock'              => $c1 - $c0,
      'servers_with_role'  => [
        [$ar1 - $ar0, $br2 - $br1], [$ar2 - $ar1, $br1 - $br0],
        pk_bench::same($ar_call, $kept['servers_with_role']) and
          pk_bench::same($br_call, $kept['servers_with_role']),
      ],
      'servers_with_facts' => [
        [$af1 - $af0, $bf2 - $bf1], [$af2 - $af1, $bf1 - $bf0],
        pk_bench::same($af_call, $kept['servers_with_facts']) and
          pk_bench::same($bf_call, $kept['servers_with_facts']),
      ],
      'server_with_role'   => [
        [$as1 - $as0, $bs2 - $bs1], [$as2 - $as1, $bs1 - $bs0],
        pk_bench::same($as_call, $kept['server_with_role']) and
          pk_bench::same($bs_call, $kept['server_with_role']),
      ],
      'scope'              => [
        [$aps1 - $aps0, $bps2 - $bps1], [$aps2 - $aps1, $bps1 - $bps0],
        true,
      ],
      'body'               => [
        [$apb1 - $apb0, $bpb2 - $bpb1], [$apb2 - $apb1, $bpb1 - $bpb0],
        pk_bench::same($apb_call, $kept['servers_with_role']) and
          pk_bench::same($bpb_call, $kept['servers_with_role']),
      ],
      'once'               => [
        [$apo1 - $apo0, $bpo2 - $bpo1], [$apo2 - $apo1, $bpo1 - $bpo0],
        pk_bench::same($apo_call, $kept['servers_with_role']) and
          pk_bench::same($bpo_call, $kept['servers_with_role']),
      ],
      'scoped'             => [
        [$apc1 - $apc0, $bpc2 - $bpc1], [$apc2 - $apc1, $bpc1 - $bpc0],
        pk_bench::same($apc_call, $kept['servers_with_role']) and
          pk_bench::same($bpc_call, $kept['servers_with_role']),
      ],
    }
    $sample
  }

  notify { 'pk-bench':
    message => pk_bench::json({
      'samples' => $timed,
      'servers' => $kept['servers_with_role'].length,
      'engine'  => inline_template('<%= RUBY_ENGINE %> <%= RUBY_ENGINE_VERSION %>'),
      'puppet'  => inline_template('<%= Puppet.version %>'),
      'backend' => inline_template('<%= PuppetKicker.backend %>'),
    }),
  }
}
