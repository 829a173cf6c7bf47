# frozen_string_literal: true

# `ruby benches/ruby/ffi_vs_magnus.rb [SERVERS]`, after `rake compile`, on MRI (where both
# bindings load): one function call through the magnus extension (Ruby objects built
# by Rust) next to the same call through the C-ABI library and Ruby's ffi (JSON
# written by Rust, copied, parsed by Ruby's JSON), on a synthetic fleet written by
# `pk-synthetic-facts` as puppetserver's JSON fact cache (~150 facts a server). The
# ffi call is also split into its parts: the C call that returns the JSON (Rust
# query + serialization + copy into a Ruby String) and JSON.parse, for the JSON
# functions pk_servers_at and pk_values that the backend used before C ABI 6; and
# the whole first conversion as the backend does it now: pk_select, then pk_fetch
# (one binary reply) read by FetchReader into a new table, so every server, name
# and value is built. Standard library only.

require 'json'
require_relative 'support'

ROOT = BenchSupport::ROOT
SERVERS = Integer(ARGV.fetch(0, '1000'))
ENVIRONMENT = 'production'
MEASURE = 1.0 # seconds of samples per case
MIN_SAMPLES = 5

BenchSupport.require_facade

abort 'benches/ruby/ffi_vs_magnus.rb: run it with MRI, where both bindings load' unless RUBY_ENGINE == 'ruby'
PuppetKicker::LIBRARIES.each_value do |path|
  abort "benches/ruby/ffi_vs_magnus.rb: #{path} is missing; run `rake compile` first" unless File.exist?(path)
end

def measure(&block)
  BenchSupport.measure(seconds: MEASURE, min_samples: MIN_SAMPLES, &block)[:median]
end

def human(seconds)
  BenchSupport.human(seconds)
end

work = BenchSupport.scratch_dir('puppet-kicker-bench-ffi')
facts = File.join(work, 'var', 'server_data', 'facts')
BenchSupport.synthetic_fleet(facts, SERVERS, 1, out: File::NULL)
FileUtils.mkdir_p(File.join(work, 'etc'))

backends = PuppetKicker::BACKENDS.to_h do |name|
  PuppetKicker.backend = name
  native = PuppetKicker.native
  native.configure(File.join(work, 'etc'), File.join(work, 'var'), nil, nil)
  [name, native]
end

cases = [
  ['version (no data: the call itself)', ->(n) { n.version }],
  ['server_with_role: 1 server', ->(n) { n.server_with_role(['haproxy'], ENVIRONMENT) }],
  ['servers_with_facts: role=haproxy', ->(n) { n.servers_with_facts(['role=haproxy'], ENVIRONMENT) }],
  ['servers_with_role: node', ->(n) { n.servers_with_role(['node'], ENVIRONMENT) }],
]

ffi = backends.fetch('ffi')
lib = ffi.instance_variable_get(:@lib)
# The JSON functions the backend no longer calls, for the parts of the old first call.
%i[pk_servers_at pk_values].each { |name| lib.attach_function name, %i[string size_t], :strptr }
call_raw = lambda do |function, request|
  json = JSON.generate(request)
  text, pointer = lib.send(function, json, json.bytesize)
  lib.pk_free(pointer)
  text
end
# What a first call of an index generation moves, without the backend's caches:
# select, fetch every server selected (as ids), then every name and value behind
# the ids; returns the texts to parse.
raw = lambda do |request|
  selected = JSON.parse(call_raw.call(:pk_select, request))['ok']
  generation = selected['generation']
  servers = call_raw.call(:pk_servers_at, 'generation' => generation, 'positions' => selected['positions'])
  ids = JSON.parse(servers)['ok']
  values = call_raw.call(:pk_values, 'generation' => generation, 'keys' => ids.flat_map(&:first).uniq,
                                     'values' => ids.flat_map { |server| server[1] }.uniq)
  [servers, values]
end
# The first conversion as the backend does it: every server built from a new
# session's reply into a new table.
fetch_all = lambda do |request|
  selected = JSON.parse(call_raw.call(:pk_select, request))['ok']
  positions = selected['positions']
  session = FFI::AutoPointer.new(lib.pk_session_new, lib.method(:pk_session_free))
  pointer = lib.pk_fetch(session, selected['generation'], 0, positions.pack('L*'), positions.size)
  begin
    PuppetKicker::FetchReader.servers(pointer, []) { |error| raise error.to_s }
  ensure
    lib.pk_free_fetch(pointer)
  end
end
requests = {
  'server_with_role: 1 server' => { 'op' => 'server_with_role', 'roles' => ['haproxy'], 'environment' => ENVIRONMENT },
  'servers_with_facts: role=haproxy' => { 'op' => 'servers_with_facts', 'clauses' => ['role=haproxy'], 'environment' => ENVIRONMENT },
  'servers_with_role: node' => { 'op' => 'servers_with_role', 'roles' => ['node'], 'environment' => ENVIRONMENT },
}

puts "#{SERVERS} synthetic servers; #{RUBY_DESCRIPTION}"
puts "#{`nproc`.strip} CPUs: #{File.read('/proc/cpuinfo')[/^model name\s*:\s*(.*)$/, 1]}"
puts
puts '| Call | Servers returned | magnus | ffi | ffi / magnus | ffi before ABI 6, first call: C calls + copy | ' \
     'ffi before ABI 6, first call: JSON.parse | JSON bytes | ffi, first call: pk_select + pk_fetch + FetchReader |'
puts '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |'
cases.each do |label, call|
  result = call.call(backends.fetch('magnus'))
  raise "#{label}: the backends disagree" unless call.call(ffi) == result

  count = if result.is_a?(Array)
            result.size
          else
            (result.is_a?(Hash) ? 1 : 0)
          end
  magnus_time = measure { call.call(backends.fetch('magnus')) }
  ffi_time = measure { call.call(ffi) }
  parts = ['', '', '', '']
  if (request = requests[label])
    texts = raw.call(request)
    parse = measure { texts.each { |text| JSON.parse(text, max_nesting: false, create_additions: false) } }
    fetched = fetch_all.call(request)
    raise "#{label}: pk_fetch disagrees" unless (request['op'] == 'server_with_role' ? fetched.first : fetched) == result

    parts = [human(measure { raw.call(request) }), human(parse), "#{(texts.sum(&:bytesize) / 1024.0).round} KiB",
             human(measure { fetch_all.call(request) }),]
  end
  puts "| #{label} | #{count} | #{human(magnus_time)} | #{human(ffi_time)} | #{format('%.2fx', ffi_time / magnus_time)} | #{parts.join(' | ')} |"
end
