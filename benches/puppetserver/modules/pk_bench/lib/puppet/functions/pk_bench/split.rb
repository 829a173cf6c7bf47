# frozen_string_literal: true

# @summary
#   Where the time of a kept answer goes, timed from Ruby inside the compile
#   (benches/puppetserver/run): each part of an identical repeated
#   `servers_with_role(role, environment)` call, on its own, `reps` times in a row,
#   and the median over `rounds` rounds (each part in turn in each), in nanoseconds
#   per call. Works with the facade of this checkout and with a baseline's, whose
#   functions' bodies were in their files (a part it lacks is left out). Under the
#   ffi backend only.
Puppet::Functions.create_function(:'pk_bench::split', Puppet::Functions::InternalFunction) do
  dispatch :split do
    scope_param
    param 'String[1]', :role
    param 'String[1]', :environment
    param 'Integer[1]', :reps
    param 'Integer[1]', :rounds
  end

  def split(scope, role, environment, reps, rounds)
    native = PuppetKicker.native
    lib = native.instance_variable_get(:@lib)
    node = scope.compiler.node
    parts = {
      'Puppet function call: the no-op (`pk_bench_servers_with_role`)' =>
        -> { call_function('pk_bench_servers_with_role', role, environment) },
      'Puppet function call: `servers_with_role`' => -> { call_function('servers_with_role', role, environment) },
      "its method's one line: the function's body (`PuppetKicker::Functions.servers_with_role`)" =>
        answer(scope, role, environment),
      "of which the compile's state (`PuppetKicker.compile(scope)`)" =>
        PuppetKicker.respond_to?(:compile) ? -> { PuppetKicker.compile(scope) } : nil,
      "of which the backend's kept answer (`kept('servers_with_role', role, environment)`)" =>
        native.respond_to?(:kept) ? -> { native.kept('servers_with_role', role, environment) } : nil,
      'of which a C call (`pk_answer_holds(0)`, which returns at once)' => -> { lib.pk_answer_holds(0) },
      'not on its path, the first call of a compile only: the settings check (`PuppetKicker.configure`)' =>
        -> { PuppetKicker.configure },
      'not on its path: whether the core has lines to log (`log_pending`, a C call)' => -> { native.log_pending },
      "not on its path: noting the node's environment (`note_environment`, unchanged)" =>
        -> { native.note_environment(node.name, environment) },
    }.compact # (a baseline's lib/ may lack a part)
    # Every part run once first (JRuby compiles what is hot), then the rounds, each
    # timing every part in turn: a part is not the dearer for coming first.
    parts.each_value { |part| reps.times { part.call } }
    samples = Array.new(rounds) { parts.transform_values { |part| time(part, reps) } }
    parts.keys.to_h { |name| [name, samples.map { |round| round[name] }.sort[rounds / 2]] }
  end

  private

  def answer(scope, role, environment)
    if PuppetKicker::Functions.respond_to?(:servers_with_role)
      -> { PuppetKicker::Functions.servers_with_role(scope, role, environment) }
    else
      lambda do
        PuppetKicker::Functions.answer(scope, 'servers_with_role') do
          PuppetKicker.servers_with_role(role, environment)
        end
      end
    end
  end

  # Nanoseconds per call of `part`, over `reps` calls in a row.
  def time(part, reps)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    reps.times { part.call }
    (Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - started) / reps
  end
end
