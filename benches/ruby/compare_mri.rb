# frozen_string_literal: true

# The MRI binding of this checkout next to git revision REV's, like for like: what a
# change to ext/puppet_kicker costs or saves, figures from one run.
#
#   ruby benches/ruby/compare_mri.rb REV [SERVERS]
#   (script/bench --compare REV; script/bench --report --compare REV puts the table
#   in docs/performance.md)
#
# 1. Builds the magnus extension twice, as `rake compile` does (cargo build
#    --release): this checkout's, and REV's in a temporary git worktree with a target
#    dir of its own, both removed afterwards (PK_BENCH_COMPARE_TARGET=DIR keeps REV's
#    build in DIR instead, for repeated runs).
# 2. Writes one synthetic fleet, shared by every run.
# 3. Runs `benches/ruby/functions.rb --native-only` PK_BENCH_COMPARE_ROUNDS (5) times
#    with each extension, alternately (REV, this, this, REV, REV, ...): the same
#    command, environment, fleet and facade (this checkout's lib/, copied beside each
#    extension), so that only the extension differs, and drift on a busy machine
#    falls on both alike.
# 4. Prints, per query shape, the first call of an index generation (the median of
#    every run's samples), in ms and per server returned, and the distinct and
#    identical calls (the median of the runs' medians), each with the difference.
#
# Markdown on stdout, progress on stderr; with PK_BENCH_RESULTS=FILE, the figures as
# JSON in FILE too.

require 'fileutils'
require 'json'
require 'open3'
require 'tmpdir'
require_relative '../../lib/puppet_kicker/ruby_abi'
require_relative 'support'

ROOT = BenchSupport::ROOT
REV = ARGV.fetch(0) { abort 'usage: ruby benches/ruby/compare_mri.rb REV [SERVERS]' }
SERVERS = Integer(ARGV.fetch(1, '10000'))
SEED = 1
ROUNDS = Integer(ENV.fetch('PK_BENCH_COMPARE_ROUNDS', '5'))
BUILT = 'libpuppet_kicker_ruby.so'
CALLS = %w[first distinct identical].freeze

def run!(*command, **options)
  system(*command, exception: true, **options)
end

def capture!(*command, chdir: ROOT)
  out, status = Open3.capture2(*command, chdir: chdir)
  raise "#{command.join(' ')} failed" unless status.success?

  out.strip
end

def median(values)
  sorted = values.sort
  middle = sorted.size / 2
  sorted.size.odd? ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
end

def human(seconds)
  if seconds.abs < 1e-3 then format('%.1f µs', seconds * 1e6)
  else
    format('%.2f ms', seconds * 1e3)
  end
end

def signed(text, value)
  value.negative? ? text.sub('-', '−') : "+#{text}"
end

def count(number)
  number.to_s.reverse.scan(/\d{1,3}/).join(',').reverse
end

# Builds the magnus extension of the checkout at `dir` (cargo build --release, as
# `rake compile`) and copies it to `native`/puppet_kicker.so beside a copy of this
# checkout's facade (lib/).
def install(dir, target, side)
  warn "==> building the magnus extension of #{dir} (target dir #{target})"
  run!({ 'CARGO_TARGET_DIR' => target }, 'cargo', 'build', '--release', '--locked', '-p', 'puppet-kicker-ruby',
       chdir: dir, out: $stderr)
  FileUtils.mkdir_p(File.join(side, 'native'))
  FileUtils.cp_r(File.join(ROOT, 'lib'), side)
  library = File.join(side, 'native', 'puppet_kicker.so')
  FileUtils.cp(File.join(target, 'release', BUILT), library)
  stamp(library)
  side
end

# A revision from before the extension recorded the Ruby it was built for
# (ext/puppet_kicker/build.rs) has no record, and this checkout's facade does not load
# such a library. It was just built here, for this Ruby (rb-sys builds for the `ruby`
# that runs this script), so the record it lacks is this Ruby's: appended to the file,
# where the facade looks for it (the loader ignores bytes past the ELF's sections).
def stamp(library)
  return unless PuppetKicker::RubyABI.record(library).nil?

  fields = PuppetKicker::RubyABI.running.map { |name, value| "#{name}=#{value}" }.join(' ')
  File.open(library, 'ab') { |f| f.write("#{PuppetKicker::RubyABI::MARK}#{fields}\0") }
  warn "==> #{library}: no Ruby ABI record (an older revision); appended this Ruby's (#{fields})"
end

rev_commit = capture!('git', 'rev-parse', '--verify', "#{REV}^{commit}")
head_commit = capture!('git', 'rev-parse', 'HEAD')
dirty = !capture!('git', 'status', '--porcelain', '--untracked-files=no').empty?
scratch = Dir.mktmpdir('pk-bench-compare-mri')
source = File.join(scratch, 'rev-source')
at_exit do
  system('git', '-C', ROOT, 'worktree', 'remove', '--force', source, err: File::NULL) if File.directory?(source)
  FileUtils.rm_rf(scratch)
end

started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
this_side = install(ROOT, ENV.fetch('CARGO_TARGET_DIR', File.join(ROOT, 'target')), File.join(scratch, 'this'))
run!('git', '-C', ROOT, 'worktree', 'add', '--detach', '--quiet', source, rev_commit, out: $stderr)
rev_side = install(source, ENV.fetch('PK_BENCH_COMPARE_TARGET', File.join(scratch, 'rev-target')), File.join(scratch, 'rev'))
run!('git', '-C', ROOT, 'worktree', 'remove', '--force', source)
FileUtils.rm_rf(File.join(scratch, 'rev-target'))
build_seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started

facts = File.join(scratch, 'fleet', 'facts')
BenchSupport.synthetic_fleet(facts, SERVERS, SEED, out: $stderr)

sides = { rev: rev_side, this: this_side }
runs = { rev: [], this: [] }
order = Array.new(2 * ROUNDS) { |i| %i[rev this this rev][i % 4] }
load_at_start = BenchSupport.load_average
order.each_with_index do |side, i|
  results = File.join(scratch, "run-#{i}.json")
  warn "==> run #{i + 1} of #{order.size}: #{side == :rev ? "REV (#{REV})" : 'this checkout'}"
  env = { 'PK_BENCH_RESULTS' => results, 'PUPPET_KICKER_BACKEND' => 'magnus' }
  run!(env, RbConfig.ruby, File.join(ROOT, 'benches', 'ruby', 'functions.rb'), '--native-only', '--facts', facts,
       '--facade', sides[side], SERVERS.to_s, chdir: ROOT, out: $stderr)
  figures = JSON.parse(File.read(results))
  expected = File.join(sides[side], 'native', 'puppet_kicker.so')
  measured = figures['backend'] == 'magnus' && File.identical?(figures['library'], expected)
  abort "run #{i + 1}: measured the #{figures['backend']} backend from #{figures['library']}, not #{expected}" unless measured
  runs[side] << figures
end
load_at_end = BenchSupport.load_average

# Per shape and side: the first call's median over every run's samples, the other
# calls' median of the runs' medians, and the servers returned.
figures = runs.transform_values do |side_runs|
  side_runs.first['shapes'].each_index.map do |s|
    shapes = side_runs.map { |r| r['shapes'][s] }
    returned = shapes.map { |x| x['returned'] }.uniq
    raise "#{shapes.first['shape']}: the runs returned #{returned.join(' and ')} servers" unless returned.size == 1

    { 'shape' => shapes.first['shape'], 'returned' => returned.first,
      'first' => median(shapes.flat_map { |x| x['first_samples'] }),
      'first_runs' => shapes.map { |x| median(x['first_samples']) },
      'distinct' => median(shapes.map { |x| x.dig('distinct', 'native') }),
      'identical' => median(shapes.map { |x| x.dig('identical', 'native') }), }
  end
end
figures[:rev].zip(figures[:this]).each do |rev, this|
  raise "#{rev['shape']}: #{rev['returned']} servers with REV, #{this['returned']} with this checkout" unless rev['returned'] == this['returned']
end

short = rev_commit[0, 12]
this_name = "this commit (`#{head_commit[0, 12]}`#{dirty ? ', dirty' : ''})"
named = rev_commit.start_with?(REV) ? '' : " (`#{REV}`)"
puts "#{RUBY_DESCRIPTION}; #{count(SERVERS)} servers (synthetic fleet, seed #{SEED}). REV is `#{short}`#{named}. " \
     "#{ROUNDS} run#{ROUNDS == 1 ? '' : 's'} of `benches/ruby/functions.rb --native-only` with each extension, alternately " \
     "(#{order.map { |s| s == :rev ? 'REV' : 'this' }.join(', ')}), the same fleet, facade and process settings. " \
     "First calls: the median of #{runs[:rev].sum { |r| r['shapes'].first['first_samples'].size }} fresh index " \
     "generations a side (per server: each run's own median in brackets, in µs); distinct and identical calls: the median of the runs' " \
     "medians. Load average #{load_at_start} at the start, #{load_at_end} at the end; building took " \
     "#{format('%.0f', build_seconds)} s."
puts
puts "| Query shape (servers returned) | Call | REV `#{short}` | #{this_name} | difference | per server: REV | this commit | difference |"
puts '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |'
per_server = []
figures[:rev].zip(figures[:this]).each do |rev, this|
  CALLS.each_with_index do |call, row|
    before = rev[call]
    after = this[call]
    change = after - before
    percent = format('%+.0f %%', 100.0 * change / before).sub('-', '−')
    cells = [human(before), human(after), "#{signed(human(change), change)} (#{percent})"]
    if call == 'first'
      n = rev['returned']
      runs_of = ->(f) { f['first_runs'].map { |v| format('%.1f', v * 1e6 / n) }.join(', ') }
      each = [before / n, after / n, change / n]
      per_server << { 'shape' => rev['shape'], 'returned' => n, 'rev' => each[0], 'this' => each[1], 'difference' => each[2] }
      cells += ["#{human(each[0])} [#{runs_of[rev]}]", "#{human(each[1])} [#{runs_of[this]}]", signed(human(each[2]), each[2])]
    else
      cells += ['', '', '']
    end
    label = row.zero? ? "`#{rev['shape']}` (#{count(rev['returned'])})".gsub('|', '\\|') : ''
    puts "| #{label} | #{call} call | #{cells.join(' | ')} |"
  end
end
low, high = per_server.map { |s| s['difference'] }.minmax
puts
puts "A first call's difference per server returned: #{signed(human(low), low)} to #{signed(human(high), high)} " \
     "(negative: this commit is faster). Rerun with `script/bench --compare #{REV}` " \
     "(or `ruby benches/ruby/compare_mri.rb #{rev_commit} #{SERVERS}`)."

if (file = ENV.fetch('PK_BENCH_RESULTS', nil))
  File.write(file, JSON.pretty_generate('rev' => REV, 'rev_commit' => rev_commit, 'head_commit' => head_commit,
                                        'dirty' => dirty, 'servers' => SERVERS, 'rounds' => ROUNDS,
                                        'rev_figures' => figures[:rev], 'this_figures' => figures[:this],
                                        'per_server' => per_server))
end
