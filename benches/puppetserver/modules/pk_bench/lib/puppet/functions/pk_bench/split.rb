# frozen_string_literal: true

# @summary
#   Where the time of a kept answer goes, timed from Ruby inside the compile
#   (benches/puppetserver/run): each part of an identical repeated
#   `servers_with_role(role, environment)` call, on its own, `reps` times in a row,
#   and the median over `rounds` rounds (each part in turn in each), in nanoseconds
#   per call. Works with the facade of this checkout and with a baseline's, whose
#   functions' bodies were in their files. Under the ffi backend only.
Puppet::Functions.create_function(:'pk_bench::split', Puppet::Functions::InternalFunction) do
  dispatch :split do
    scope_param
    param 'String[1]', :role
    param 'String[1]', :environment
    param 'Integer[1]', :reps
    param 'Integer[1]', :rounds
  end

  def split(scope, role, environment, reps, rounds)
    roles = [role]
    native = PuppetKicker.native
    lib = native.instance_variable_get(:@lib)
    node = scope.compiler.node
    parts = {
      'Puppet function call: the no-op (pk_bench_servers_with_role)' =>
        -> { call_function('pk_bench_servers_with_role', role, environment) },
      'Puppet function call: servers_with_role' => -> { call_function('servers_with_role', role, environment) },
      "the function's body (PuppetKicker::Functions)" => answer(scope, role, environment),
      'PuppetKicker.configure (the settings check)' => -> { PuppetKicker.configure },
      'backend: servers_with_role (kept answer)' => -> { native.servers_with_role(roles, environment) },
      'backend: log_pending (a C call)' => -> { native.log_pending },
      'a C call alone (pk_answer_holds(0), which returns at once)' => -> { lib.pk_answer_holds(0) },
      'backend: note_environment (unchanged)' => -> { native.note_environment(node.name, environment) },
    }
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
