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

    it 'says that run and status are not available yet, and lists plan for anything else' do
      expect { described_class.request(['run'], {}, 'production') }
        .to raise_error(PuppetKicker::QueryError, 'puppet kicker rollout run: not available yet; use plan ' \
                                                  '(run and status are not available yet)')
      expect { described_class.request(['status'], {}, 'production') }.to raise_error(/rollout status: not available yet/)
      expect { described_class.request(['apply'], {}, 'production') }
        .to raise_error(PuppetKicker::QueryError, /rollout apply: no such subcommand; use plan/)
      expect { described_class.request([], {}, 'production') }
        .to raise_error(PuppetKicker::QueryError, /rollout: give a subcommand: use plan/)
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
