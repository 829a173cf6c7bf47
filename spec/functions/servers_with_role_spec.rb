# frozen_string_literal: true

require 'spec_helper'

describe 'servers_with_role' do
  # The compiling node's environment (rspec-puppet's default is rp_env).
  let(:environment) { 'production' }

  let(:node) { 'lb1.example.com' }

  each_backend do
    def certnames(servers)
      servers.map { |s| s['certname'] }
    end

    it 'returns the servers of a role in fqdn order, with all their facts' do
      servers = subject.execute('node')
      expect(certnames(servers)).to eq(%w[node1.example.com node2.example.com node3.example.com])
      expect(servers.first).to include('hostname' => 'node1', 'ipaddress' => '10.0.0.11', 'role' => 'node')
      expect(servers.first['os']['release']).to eq('full' => '12.5', 'major' => '12', 'minor' => '5')
    end

    it 'leaves out servers whose facts are older than max_age (node0 stopped reporting)' do
      expect(certnames(subject.execute('node'))).not_to include('node0.example.com')
    end

    it 'takes the environment as the second argument, as the original README meant' do
      expect(certnames(subject.execute('node', 'staging'))).to eq(['node9.staging.example.com'])
    end

    it 'takes a list of roles (any of them) and /regex/ roles' do
      expect(certnames(subject.execute(%w[haproxy node])).first(2)).to eq(%w[lb1.example.com node1.example.com])
      expect(certnames(subject.execute('/^hap/'))).to eq(['lb1.example.com'])
    end

    it 'returns [] for a role nobody has on a healthy index' do
      is_expected.to run.with_params('nosuchrole').and_return([])
    end

    it 'rejects arguments of the wrong type' do
      is_expected.to run.with_params(42).and_raise_error(ArgumentError, /expects a value of type String or Array/)
      is_expected.to run.with_params('').and_raise_error(ArgumentError)
    end

    it 'names a bad regex role' do
      is_expected.to run.with_params('/(?=x)/').and_raise_error(Puppet::ParseError, %r{servers_with_role: role /\(\?=x\)/: invalid regex})
    end
  end
end

describe 'server_with_role' do
  # The compiling node's environment (rspec-puppet's default is rp_env).
  let(:environment) { 'production' }

  each_backend do
    it 'returns the first server of the role' do
      expect(subject.execute('node')['certname']).to eq('node1.example.com')
    end

    it 'returns the default when no server has the role' do
      is_expected.to run.with_params('nosuchrole', 'hostname' => 'localhost').and_return('hostname' => 'localhost')
      is_expected.to run.with_params('nosuchrole').and_return(nil)
    end
  end
end
