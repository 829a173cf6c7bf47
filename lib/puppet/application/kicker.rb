# frozen_string_literal: true

require 'puppet/application/face_base'
require_relative '../../puppet_kicker/face'

# Puppet's console log destination, with every line on stderr: stdout carries only
# what the action answers, so `--render-as json` output parses, log lines or not.
Puppet::Util::Log.newdesttype :kicker_console do
  def handle(message)
    console = (@console ||= Puppet::Util::Log.desttypes[:console].new)
    stdout = $stdout
    $stdout = $stderr
    console.handle(message)
  ensure
    $stdout = stdout
  end
end

class Puppet::Application # rubocop:disable Style/ClassAndModuleChildren (Puppet's own class, reopened)
  # `puppet kicker`: the operator's command line (lib/puppet/face/kicker.rb).
  class Kicker < FaceBase
    # `--environment ENV` is the environment the functions would be called in, not one
    # whose code must exist here: a master's code may live elsewhere.
    environment_mode :not_required

    def setup
      super
      Puppet::Util::Log.close(:console)
      Puppet::Util::Log.newdestination(:kicker_console)
    end

    # FaceBase#main, but a puppet-kicker error (a bad clause, an unknown node, no
    # data, the source's failure) is its message alone (its backtrace with --trace),
    # and the process ends with the exit code the action asked for
    # (PuppetKicker::Face.exit_code: `status --max-age`, a failed `kick`). Every
    # action takes its arguments as |*args|, so FaceBase's arity check has nothing
    # to check.
    def main
      result = @face.send(@action.name, *arguments)
      puts render(result, arguments) unless result.nil?
      exit(PuppetKicker::Face.exit_code || 0)
    rescue PuppetKicker::Error => e
      Puppet.log_exception(e)
      exit(1)
    rescue StandardError => e
      Puppet.log_exception(e)
      Puppet.err("Try 'puppet help kicker #{@action.name}' for usage")
      exit(1)
    end
  end
end
