# frozen_string_literal: true

# What the `kick` report processor costs per report, next to Puppet's own `store`
# processor (which every master runs) on the same report: a real in-process catalog
# apply of 200 resources, one run with nothing to kick and one with a kick (dry run,
# so nothing leaves the machine). Run after `rake compile`: ruby benches/ruby/kick_report.rb
# Markdown on stdout; with PK_BENCH_RESULTS=FILE, the medians as JSON in FILE too.
require_relative 'support'
require 'json'
require 'yaml'
require 'puppet'
require 'puppet/reports'

ROOT = BenchSupport::ROOT
$LOAD_PATH.unshift(File.join(ROOT, 'lib')) # where Puppet's autoloader finds reports/kick.rb
work = BenchSupport.scratch_dir('puppet-kicker-report-bench')
Puppet.initialize_settings(['--confdir', File.join(work, 'etc'), '--vardir', File.join(work, 'var'),
                            '--certname', 'node1.example.com', '--environment', 'production',])
Puppet[:reportdir] = File.join(work, 'reports')
Puppet::Util::Log.newdestination(Puppet::Test::LogCollector.new([])) if defined?(Puppet::Test::LogCollector)
system('ruby', File.join(ROOT, 'examples/haproxy/submit_facts.rb'), File.join(ROOT, 'examples/haproxy/servers.yaml'),
       File.join(work, 'master'), 'json', out: File::NULL, exception: true)
File.write(File.join(work, 'puppet_kicker.yaml'), { 'puppet_cache' => { 'dirs' => ['master/server_data/facts'] },
                                                    'cache' => { 'dir' => 'cache' }, 'kick' => { 'dry_run' => true }, }.to_yaml)
ENV['PUPPET_KICKER_CONFIG'] = File.join(work, 'puppet_kicker.yaml')
require File.join(ROOT, 'lib/puppet_kicker')
require File.join(ROOT, 'lib/puppet_kicker/kick')
Puppet.settings.preferred_run_mode = :server # a master: no wait for dispatch at the end

def report(kick)
  env = Puppet::Node::Environment.create(:production, [])
  catalog = Puppet::Resource::Catalog.new('node1.example.com', env)
  200.times { |i| catalog.add_resource(Puppet::Type.type(:notify).new(title: "resource #{i}")) }
  catalog.add_resource(Puppet::Type.type(:notify).new(title: 'kick -> haproxy')) if kick
  catalog.apply.report.tap(&:finalize_report)
end

def per_call(&block)
  BenchSupport.measure(seconds: 2.0, min_samples: 20, &block)[:median]
end

quiet = report(false)
kicking = report(true)
store = Puppet::Reports.report(:store)
kick = Puppet::Reports.report(:kick)
rows = [
  ['kick: nothing to kick (200 resources)', per_call { quiet.dup.extend(kick).process }],
  ['kick: one Notify[kick -> haproxy] (dry run)', per_call { kicking.dup.extend(kick).process }],
  ['store: the same report written as YAML (Puppet\'s own)', per_call { quiet.dup.extend(store).process }],
]
puts "#{RUBY_DESCRIPTION}, Puppet #{Puppet.version}; medians of at least 2 s of calls (at least 20), after #{BenchSupport::WARM_UP} s of them."
puts
puts '| Report processor | Median per report |'
puts '| --- | ---: |'
rows.each { |name, seconds| puts "| #{name} | #{BenchSupport.human(seconds)} |" }
if (file = ENV.fetch('PK_BENCH_RESULTS', nil))
  File.write(file, JSON.generate(%w[kick_quiet kick_one store].zip(rows.map(&:last)).to_h))
end
