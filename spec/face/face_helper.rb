# frozen_string_literal: true

require 'json'
require 'open3'
require 'rbconfig'

# `puppet kicker ...` run for real, as a process: this checkout's lib on RUBYLIB, a
# Puppet of its own under the scratch directory, PUPPET_KICKER_CONFIG pointing at the
# directory's puppet_kicker.yaml (a ScratchMaster: the example's fact cache).
module KickerFace
  # What one run printed and how it ended.
  Run = Struct.new(:stdout, :stderr, :status) do
    def json
      JSON.parse(stdout)
    end

    def exitstatus
      status.exitstatus
    end

    # For failure messages: everything the run printed.
    def to_s
      "exit #{status.exitstatus}\n--- stdout\n#{stdout}\n--- stderr\n#{stderr}"
    end
  end

  PUPPET = ['/usr/bin/puppet'].freeze

  # Runs `puppet kicker *args` in `dir` (a ScratchMaster directory) with the given
  # backend and extra environment.
  def kicker(dir, *args, backend: 'magnus', env: {})
    puppet = %w[confdir vardir logdir rundir codedir].flat_map { |name| ["--#{name}", File.join(dir, 'puppet', name)] }
    environment = {
      'PUPPET_KICKER_CONFIG' => File.join(dir, 'puppet_kicker.yaml'),
      'PUPPET_KICKER_BACKEND' => backend,
      'RUBYLIB' => File.join(ROOT, 'lib'),
    }.merge(env)
    Run.new(*Open3.capture3(environment, *PUPPET, 'kicker', *args, *puppet, chdir: dir))
  end
end

RSpec.configure { |c| c.include KickerFace, type: :face }
