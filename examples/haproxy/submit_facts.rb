#!/usr/bin/env ruby
# frozen_string_literal: true

# Fills a master's fact cache the way the master does when agents submit their facts:
# through Puppet's own JSON terminus ($server_datadir/facts, puppetserver 7) or YAML
# terminus ($vardir/yaml/facts, older masters). Used by the example and the tests, so
# the files puppet-kicker reads are in Puppet's real format.
#
#   submit_facts.rb SERVERS.yaml VARDIR [json|yaml]
#
# SERVERS.yaml maps certnames to facts; `age_days: N` backdates a server's facts.

require 'puppet'
require 'yaml'

servers_file, vardir, format = ARGV
abort "usage: #{$PROGRAM_NAME} SERVERS.yaml VARDIR [json|yaml]" unless servers_file && vardir
format ||= 'json'
abort "format must be json or yaml, not #{format}" unless %w[json yaml].include?(format)

Puppet.initialize_settings(['--vardir', vardir, '--confdir', File.join(vardir, 'etc'), '--logdir', File.join(vardir, 'log')])
# The termini pick the master's directories only in the server run mode.
Puppet.settings.preferred_run_mode = :server
Puppet::Node::Facts.indirection.terminus_class = format.to_sym

# A master creates its yamldir at start-up; the YAML terminus expects it.
require 'fileutils'
FileUtils.mkdir_p(Puppet[:yamldir])

servers = YAML.safe_load(File.read(servers_file))
servers.each do |certname, facts|
  facts = facts.dup
  age_days = facts.delete('age_days').to_i
  node_facts = Puppet::Node::Facts.new(certname, facts)
  node_facts.timestamp = Time.now - (age_days * 86_400)
  Puppet::Node::Facts.indirection.save(node_facts)
end
dir = format == 'json' ? File.join(Puppet[:server_datadir], 'facts') : File.join(Puppet[:yamldir], 'facts')
puts dir
