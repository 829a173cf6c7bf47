# frozen_string_literal: true

require_relative 'errors'

module PuppetKicker
  # What `puppet kicker rollout` (lib/puppet/face/kicker/rollout.rb) does around the
  # core's plan (src/command/rollout.rs): its subcommand and options read into the
  # core's request, and the plan shown to people. Apart from the action so that both
  # are tested without Puppet or the native library (spec/unit/face_rollout_spec.rb).
  module FaceRollout
    module_function

    # The subcommands there are now, and those planned but not available yet.
    SUBCOMMANDS = %w[plan run status].freeze
    NOT_YET = [].freeze
    # How long the run loop waits between steps when a step did nothing new.
    STEP_PAUSE = 1.0
    ORDERS = %w[graph given].freeze

    # The core's `rollout_plan` request for `puppet kicker rollout plan ...`: `args` the
    # action's arguments (the subcommand first, then clauses following --facts),
    # `options` the action's options, `environment` Puppet's `environment` setting.
    # A subcommand that is not `plan`, stray arguments or a malformed --batch raise
    # QueryError naming them; --order and --batch's value are the core's to check.
    def request(args, options, environment)
      subcommand(args.first)
      rest = args.drop(1)
      unless rest.empty? || options[:facts]
        raise QueryError, "puppet kicker rollout plan: #{rest.first.inspect} is not an option: give clauses " \
                          'after --facts'
      end
      request = { 'environment' => environment, 'roles' => list(options[:roles]),
                  'clauses' => options[:facts] ? [options[:facts].to_s] + rest : [], }
      request['order'] = options[:order].to_s if options[:order]
      request['batch'] = batch(options[:batch]) if options[:batch]
      request
    end

    # `plan`, or an error that lists the subcommands (and says which are not there yet).
    def subcommand(word)
      return word if SUBCOMMANDS.include?(word)

      available = "use #{SUBCOMMANDS.join(', ')}"
      raise QueryError, "puppet kicker rollout: give a subcommand: #{available}" if word.nil?
      raise QueryError, "puppet kicker rollout #{word}: not available yet; #{available}" if NOT_YET.include?(word)

      raise QueryError, "puppet kicker rollout #{word}: no such subcommand; #{available}"
    end

    # The core's `rollout_run` request: the plan's, and the run's own options.
    def run_request(args, options, environment)
      request = request(args, options, environment)
      request['continue_on_failure'] = true if options[:continue_on_failure]
      request['resume'] = true if options[:resume]
      if options[:timeout_per_batch]
        text = options[:timeout_per_batch].to_s.strip
        raise QueryError, "puppet kicker rollout run: --timeout-per-batch #{text.inspect}: give whole seconds" unless /\A\d{1,6}\z/.match?(text)

        request['timeout_per_batch'] = text.to_i
      end
      request
    end

    # Runs the rollout `start` began, step by step, through `command` (name, request
    # => answer): each step's lines to `log`, a progress line on `tty` (an IO, or nil
    # when not a terminal: nothing then). INT and TERM stop it: the core re-enables
    # what it disabled, in the steps that follow, before this returns. The last answer.
    def run_loop(command, start, log:, tty: nil, pause: STEP_PAUSE)
      signalled = nil
      traps = %w[INT TERM].to_h { |sig| [sig, Signal.trap(sig) { signalled ||= "SIG#{sig}" }] }
      began = Time.now
      answer = start
      aborted = false
      until answer['over']
        if signalled && !aborted
          answer = command.call('rollout_abort', 'why' => "stopped by #{signalled}")
          aborted = true
        end
        answer = command.call('rollout_step', {})
        answer['lines'].each { |line| log.call(line['warning'], line['text']) }
        tty&.print("\r#{progress_line(answer, Time.now - began)}\e[K")
        sleep(pause) if answer['lines'].empty? && !answer['over']
      end
      tty&.print("\r\e[K")
      answer
    ensure
      traps&.each { |sig, handler| Signal.trap(sig, handler || 'DEFAULT') }
    end

    # `batch 2 of 5: 6 done, 1 failed, 2 running of 12 servers, 41 s`
    def progress_line(answer, elapsed)
      p = answer['progress']
      "batch #{p['batch']} of #{p['batches']}: #{p['done']} done, #{p['failed']} failed, #{p['running']} running " \
        "of #{p['servers']} servers, #{elapsed.round} s"
    end

    # A rollout for people: where it stands, then each server's outcome in plan order.
    def rollout_text(answer)
      rollout = answer['rollout']
      phase = rollout['phase']
      where = case phase['phase']
              when 'finished' then 'finished'
              when 'stopped' then "stopped: #{phase['why']}"
              when 'stopping' then "stopping: #{phase['why']}"
              when 'batch' then "running batch #{phase['index'] + 1} of #{rollout['batches'].size}"
              else 'disabling Puppet on its servers'
              end
      p = answer['progress']
      lines = ["Rollout #{rollout['id']} of #{rollout['environment']}: #{where}; #{p['done']} done, #{p['failed']} failed, " \
               "#{p['running']} running, #{p['disabled']} disabled of #{p['servers']} servers", '',]
      rollout['batches'].each_with_index do |batch, i|
        lines << "batch #{i + 1} of #{rollout['batches'].size} (#{batch['group']}):"
        batch['servers'].each { |server| lines << "  #{server}: #{server_text(rollout['servers'][server])}" }
      end
      lines
    end

    def server_text(state)
      case state['state']
      when 'done' then "ran, #{state['status']} (#{state['after_ms'] / 1000} s)"
      when 'failed' then "FAILED: #{state['why']}"
      when 'running' then state['started'] ? 'running' : 'busy, asked again'
      when 'disabled' then 'disabled, waiting for its batch'
      when 'released' then 'not run (enabled again)'
      when 'skipped' then 'not run (never disabled)'
      else 'not yet disabled'
      end
    end

    # A comma-separated option as a list ("a, b" => ["a", "b"]); nil => [].
    def list(option)
      option.to_s.split(',').map(&:strip).reject(&:empty?)
    end

    # --batch as a whole number (the core refuses 0 and says why).
    def batch(value)
      text = value.to_s.strip
      return text.to_i if /\A\d{1,9}\z/.match?(text)

      raise QueryError, "puppet kicker rollout plan: --batch #{value.to_s.inspect}: give a whole number of " \
                        'servers per batch, at least 1'
    end

    # The plan for people: a heading, each group with its batches, then the cycles and
    # how each was broken, and the --roles entries that matched nothing.
    def text(answer)
      groups = answer['groups']
      totals = answer['totals']
      batching = answer['batch'] ? "batches of #{answer['batch']}" : 'each group in one batch'
      lines = ["Rollout plan for #{answer['environment']} (order: #{answer['order']}, #{batching}): " \
               "#{count(totals['servers'], 'server')} in #{count(totals['groups'], 'group')}, " \
               "#{count(totals['batches'], 'batch')}", '',]
      groups.each_with_index do |group, k|
        mark = group['cycle'] ? '  (a kick cycle: these roles run together)' : ''
        lines << "Group #{k + 1} of #{groups.size}: #{group['name']}#{mark}"
        group['batches'].each_with_index do |servers, j|
          lines << "  batch #{j + 1} of #{group['batches'].size}: #{servers.join(', ')}"
        end
      end
      lines + cycle_lines(answer['cycles']) + unmatched_lines(answer['unmatched_roles'] || []) +
        ['', 'Nothing was run: this is the plan only.']
    end

    def cycle_lines(cycles)
      return [] if cycles.empty?

      lines = ['', "Kick cycles (#{cycles.size}), each broken by one rule: #{cycles.first['rule']}."]
      cycles.each do |cycle|
        edges = cycle['edges'].map { |from, to| "#{from} -> #{to}" }.join(', ')
        where = cycle['group'] ? "group #{cycle['group']}" : 'no group of its own (its servers have a later role too)'
        lines << "  #{cycle['roles'].join(', ')}: #{edges}; #{where}"
      end
      lines
    end

    def unmatched_lines(unmatched)
      return [] if unmatched.empty?

      ['', "No server of these --roles: #{unmatched.join(', ')}"]
    end

    def count(number, noun)
      plural = noun.end_with?('ch') ? "#{noun}es" : "#{noun}s"
      "#{number} #{number == 1 ? noun : plural}"
    end
  end
end
