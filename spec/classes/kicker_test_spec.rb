# frozen_string_literal: true

require 'spec_helper'

describe 'kicker_test' do
  # The compiling node's environment (rspec-puppet's default is rp_env).
  let(:environment) { 'production' }

  let(:node) { 'lb1.example.com' }

  each_backend do
    it 'answers from a manifest' do
      is_expected.to contain_file('/tmp/manifest.txt').with_content("node1,node2,node3 lb=lb1 big=node2,node3\n")
    end

    it 'answers from ERB, through call_function and the legacy function_* form' do
      is_expected.to contain_file('/tmp/erb.cfg').with_content(<<~CFG)
        modern node1 10.0.0.11
        modern node2 10.0.0.12
        modern node3 10.0.0.13
        legacy node3
        first none
      CFG
    end

    it 'answers from EPP' do
      is_expected.to contain_file('/tmp/epp.cfg').with_content("epp lb1 haproxy\nepp node1 node\nepp node2 node\nepp node3 node\n")
    end

    it "renders the example's haproxy.cfg with one server line per node, in order" do
      is_expected.to contain_file('/tmp/haproxy.cfg').with_content(
        /listen web\n.*\n.*\n.*\n      server node1 10.0.0.11:8080 check inter 2000\n      server node2 10.0.0.12:8080 check inter 2000\n      server node3 10.0.0.13:8080 check inter 2000\n\z/
      )
    end

    context 'when the index has no data at all' do
      include_context 'with its own puppet_kicker.yaml'

      let(:nowhere) { { 'puppet_cache' => { 'dirs' => ['/nonexistent/facts'] }, 'cache' => { 'dir' => 'cache', 'cold_start_timeout' => 2 } } }

      context 'by default' do
        let(:settings) { nowhere }

        it 'fails the compile instead of rendering an empty pool' do
          is_expected.to compile.and_raise_error(%r{servers_with_role: puppet-kicker has no fact data.*/nonexistent/facts \(not found\).*on_no_data: empty})
        end
      end

      context 'with on_no_data: empty' do
        let(:settings) { nowhere.merge('on_no_data' => 'empty') }

        it 'returns [] as the original did' do
          is_expected.to contain_file('/tmp/manifest.txt').with_content(" lb= big=\n")
        end
      end
    end

    context 'with a malformed puppet_kicker.yaml' do
      include_context 'with its own puppet_kicker.yaml'
      let(:settings) { { 'cache' => { 'ttl' => 'soon' } } }

      it 'fails naming the file and the key' do
        is_expected.to compile.and_raise_error(/puppet_kicker.yaml: 'cache.ttl' must be a duration/)
      end
    end
  end
end
