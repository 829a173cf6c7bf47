# The seed's story: a load balancer whose haproxy.cfg lists every server of role
# `node`, from the facts the master already has. Run it with `script/example`.
#
# On a real master the file would be /etc/haproxy/haproxy.cfg and notify the
# service; here it goes to the directory in the `kicker_example_dir` fact.

$output_dir = $facts['kicker_example_dir']
if $output_dir =~ Undef {
  fail('set FACTER_kicker_example_dir to the directory to write haproxy.cfg to')
}

# Every server of role `node` in this node's environment, sorted by fqdn.
$nodes = servers_with_role('node')
$listen = 'web'

file { "${output_dir}/haproxy.cfg":
  ensure  => file,
  content => template('kicker/haproxy.cfg.erb'),
}

# The same file from an EPP template.
file { "${output_dir}/haproxy-epp.cfg":
  ensure  => file,
  content => epp('kicker/haproxy.cfg.epp', {
    'nodes'       => $nodes,
    'listen'      => $listen,
    'environment' => $environment,
  }),
}

# The first load balancer, and what a template could ask with a query.
$lb = server_with_role('haproxy', { 'hostname' => 'localhost', 'ipaddress' => '127.0.0.1' })
$big = servers_with_facts('role=node', 'processors.count>=4', 'os.release.full>=11.2').map |$n| { $n['hostname'] }
notice("load balancer: ${lb['hostname']} (${lb['ipaddress']}); nodes with 4+ CPUs: ${big}")
