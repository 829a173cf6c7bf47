# frozen_string_literal: true

require 'spec_helper'
require_relative '../../lib/puppet_kicker/face_rollout'

# `puppet kicker rollout`'s Ruby side without Puppet or the native library: the request
# it sends the core and the plan it shows people. spec/face/rollout_spec.rb runs the
# action for real.
describe PuppetKicker::FaceRollout do
  describe '.request' do
    it 'sends plan with the environment, --roles as a list, and --batch as a number' do
      request = described_class.request(['plan'], { roles: 'db, node,,haproxy', batch: '10', order: 'given' }, 'staging')
      expect(request).to eq('environment' => 'staging', 'roles' => %w[db node haproxy], 'clauses' => [],
                            'order' => 'given', 'batch' => 10)
    end

    it 'takes --facts and the clauses that follow it, commas and all' do
      request = described_class.request(['plan', 'os.release.major=12', 'hostname=/^web{1,2}/'],
                                        { facts: 'os.family=Debian' }, 'production')
      expect(request['clauses']).to eq(['os.family=Debian', 'os.release.major=12', 'hostname=/^web{1,2}/'])
      expect(request).not_to include('batch', 'order')
    end

    it 'refuses stray arguments without --facts, naming the first' do
      expect { described_class.request(%w[plan role=node], {}, 'production') }
        .to raise_error(PuppetKicker::QueryError, /"role=node" is not an option: give clauses after --facts/)
    end

    it 'refuses a --batch that is not a whole number, naming it' do
      %w[ten -1 1.5].each do |value|
        expect { described_class.request(['plan'], { batch: value }, 'production') }
          .to raise_error(PuppetKicker::QueryError, /--batch "#{Regexp.escape(value)}": give a whole number/)
      end
      expect(described_class.request(['plan'], { batch: '0' }, 'production')['batch']).to eq(0) # the core says why not
    end

    it 'names the subcommands there are for anything else' do
      expect { described_class.request(['apply'], {}, 'production') }
        .to raise_error(PuppetKicker::QueryError, 'puppet kicker rollout apply: no such subcommand; use plan, run, status')
      expect { described_class.request([], {}, 'production') }
        .to raise_error(PuppetKicker::QueryError, /rollout: give a subcommand: use plan, run, status/)
    end

    it "adds run's own options, and refuses a --timeout-per-batch that is not whole seconds" do
      request = described_class.run_request(['run'], { roles: 'db', continue_on_failure: true, timeout_per_batch: '900',
                                                       resume: true, }, 'production')
      expect(request).to include('roles' => ['db'], 'continue_on_failure' => true, 'timeout_per_batch' => 900, 'resume' => true)
      expect { described_class.run_request(['run'], { timeout_per_batch: '15m' }, 'production') }
        .to raise_error(PuppetKicker::QueryError, /--timeout-per-batch "15m": give whole seconds/)
    end
  end

  describe '.run_loop' do
    def answer(over, lines = [], batch: 1)
      { 'over' => over, 'lines' => lines, 'rollout' => { 'phase' => { 'phase' => over ? 'finished' : 'batch' } },
        'progress' => { 'batch' => batch, 'batches' => 2, 'done' => 1, 'failed' => 0, 'running' => 1, 'servers' => 3 }, }
    end

    it 'steps until the rollout is over, logging each line, with a progress line only on a terminal' do
      steps = [answer(false, [{ 'warning' => false, 'text' => 'batch 1 of 2 (db): db1' }]), answer(false),
               answer(true, [{ 'warning' => true, 'text' => 'db1: its run failed' }], batch: 2),]
      calls = []
      command = lambda do |name, request|
        calls << [name, request]
        steps.shift
      end
      logged = []
      tty = StringIO.new
      last = described_class.run_loop(command, answer(false), log: ->(w, t) { logged << [w, t] }, tty: tty, pause: 0)
      expect(last['over']).to be(true)
      expect(calls.map(&:first)).to eq(%w[rollout_step rollout_step rollout_step])
      expect(logged).to eq([[false, 'batch 1 of 2 (db): db1'], [true, 'db1: its run failed']])
      expect(tty.string).to include('batch 2 of 2: 1 done, 0 failed, 1 running of 3 servers')

      steps.replace([answer(true)])
      quiet = described_class.run_loop(command, answer(false), log: ->(*) {}, tty: nil, pause: 0)
      expect(quiet['over']).to be(true)
    end

    it 'turns SIGTERM into one abort, then steps until the core says it is over' do
      calls = []
      command = lambda do |name, request|
        calls << [name, request]
        Process.kill('TERM', Process.pid) if calls.size == 1
        sleep 0.05
        answer(calls.size >= 4)
      end
      last = described_class.run_loop(command, answer(false), log: ->(*) {}, pause: 0)
      expect(last['over']).to be(true)
      expect(calls).to include(['rollout_abort', { 'why' => 'stopped by SIGTERM' }])
      expect(calls.count { |c| c.first == 'rollout_abort' }).to eq(1)
      expect(Signal.trap('TERM', 'DEFAULT')).not_to be_nil # the trap was put back
    end
  end

  describe '.text' do
    let(:answer) do
      rule = 'roles in a kick cycle run together as one group, after every role that kicks into the cycle and ' \
             'before every role the cycle kicks; within the group, certname order'
      {
        'environment' => 'production', 'roles' => [], 'clauses' => [], 'unmatched_roles' => [],
        'order' => 'graph', 'batch' => 2,
        'groups' => [
          { 'name' => 'db', 'roles' => ['db'], 'cycle' => false, 'servers' => ['db1'], 'batches' => [['db1']] },
          { 'name' => 'haproxy, node', 'roles' => %w[haproxy node], 'cycle' => true,
            'servers' => %w[lb1 node1 node2], 'batches' => [%w[lb1 node1], ['node2']], },
          { 'name' => '(no role)', 'roles' => [], 'cycle' => false, 'servers' => ['bare'], 'batches' => [['bare']] },
        ],
        'cycles' => [{ 'roles' => %w[haproxy node], 'edges' => [%w[haproxy node], %w[node haproxy]], 'group' => 2,
                       'rule' => rule, }],
        'totals' => { 'servers' => 5, 'roles' => 3, 'groups' => 3, 'batches' => 4 },
      }
    end

    it 'shows each group k of n with its batches, then the cycles and the rule that broke them' do
      expect("#{described_class.text(answer).join("\n")}\n").to eq(<<~TEXT)
        Rollout plan for production (order: graph, batches of 2): 5 servers in 3 groups, 4 batches

        Group 1 of 3: db
          batch 1 of 1: db1
        Group 2 of 3: haproxy, node  (a kick cycle: these roles run together)
          batch 1 of 2: lb1, node1
          batch 2 of 2: node2
        Group 3 of 3: (no role)
          batch 1 of 1: bare

        Kick cycles (1), each broken by one rule: #{answer['cycles'][0]['rule']}.
          haproxy, node: haproxy -> node, node -> haproxy; group 2

        Nothing was run: this is the plan only.
      TEXT
    end

    it 'says when there is no --batch, and which --roles matched nothing' do
      one = answer.merge('batch' => nil, 'cycles' => [], 'unmatched_roles' => ['nope'],
                         'totals' => { 'servers' => 1, 'roles' => 1, 'groups' => 1, 'batches' => 1 })
      lines = described_class.text(one)
      expect(lines.first).to eq('Rollout plan for production (order: graph, each group in one batch): ' \
                                '1 server in 1 group, 1 batch')
      expect(lines).to include('No server of these --roles: nope')
      expect(lines).not_to include(start_with('Kick cycles'))
    end
  end
end
