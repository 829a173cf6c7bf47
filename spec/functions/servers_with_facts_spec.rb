# frozen_string_literal: true

require 'spec_helper'

describe 'servers_with_facts' do
  # The compiling node's environment (rspec-puppet's default is rp_env).
  let(:environment) { 'production' }

  each_backend do
    def hostnames(*clauses)
      subject.execute(*clauses).map { |s| s['hostname'] }
    end

    it 'ANDs clauses in the compiling node environment' do
      expect(hostnames('role=node')).to eq(%w[node1 node2 node3])
      expect(hostnames('role=node', 'processors.count>=4')).to eq(%w[node2 node3])
    end

    it 'accepts the original syntax: regex values, legacy operators' do
      expect(hostnames('hostname=/^node1$|^lb1$/')).to eq(%w[lb1 node1])
      expect(hostnames('processors.count=>8')).to eq(%w[node3])
      expect(hostnames('processors.count=<2', 'role==node')).to eq(%w[node1])
    end

    it 'compares dotted versions as versions' do
      expect(hostnames('role=node', 'os.release.full>=11.2')).to eq(%w[node1 node2 node3])
      expect(hostnames('role=node', 'os.release.full<12')).to eq(%w[node3])
    end

    it 'lets a clause on environment replace the implicit scope' do
      expect(hostnames('environment=staging')).to eq(%w[node9])
    end

    it 'never matches a missing fact, not even with !=' do
      is_expected.to run.with_params('nosuchfact!=x').and_return([])
    end

    it 'fails the compile with the clause and the column of a syntax error' do
      is_expected.to run.with_params('role=node', 'uptime').and_raise_error(
        Puppet::ParseError, /servers_with_facts: clause 'uptime': no operator.*column 7/
      )
      is_expected.to run.with_params('hostname=/^(?!db)/').and_raise_error(Puppet::ParseError, /look-around/)
    end

    it 'needs at least one clause' do
      is_expected.to run.with_params.and_raise_error(ArgumentError, /expects at least 1 argument/)
    end
  end
end
