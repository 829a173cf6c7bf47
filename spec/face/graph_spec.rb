# frozen_string_literal: true

require 'rexml/document'
require 'yaml'
require_relative 'face_helper'

describe 'puppet kicker graph', type: :face do
  # A masterless run of `certname` whose report (through the `kick` processor) kicks
  # `role`: the planner draws an edge from certname's role to role's.
  def report_kick(dir, certname, role)
    puppet = %w[confdir vardir logdir rundir codedir].flat_map { |name| ["--#{name}", File.join(dir, 'puppet', name)] }
    env = { 'PUPPET_KICKER_CONFIG' => File.join(dir, 'puppet_kicker.yaml'), 'RUBYLIB' => File.join(ROOT, 'lib'),
            'PUPPET_KICKER_HELPER' => '0', }
    out, status = Open3.capture2e(env, *KickerFace::PUPPET, 'apply', '--certname', certname, '--reports', 'kick',
                                  *puppet, '-e', "notify { 'kick -> #{role}': }")
    expect(status).to be_success, out
    expect(out).to include('puppet-kicker: dry run: would kick')
  end

  # lb1's kick of role node reaches node1..3: three kicks along haproxy -> node.
  context 'with kicks seen in reports: node -> haproxy (twice), haproxy -> node' do
    before(:all) do
      @dir = ScratchMaster.create('kick' => { 'dry_run' => true })
      [%w[node1.example.com haproxy], %w[lb1.example.com node], %w[node2.example.com haproxy]].each do |certname, role|
        report_kick(@dir, certname, role)
      end
    end

    it 'prints aligned lines with kick counts, marks the edges on a cycle, and lists the cycles' do
      run = kicker(@dir, 'graph')
      expect(run.exitstatus).to eq(0), run.to_s
      expect(run.stdout).to eq(<<~TEXT)
        haproxy -> node     (3 kicks)  on a cycle
        node    -> haproxy  (2 kicks)  on a cycle

        Cycles (1):
          haproxy -> node -> haproxy
      TEXT
    end

    it 'gives DOT with the cycle edges red and bold, the same bytes each time' do
      run = kicker(@dir, 'graph', '--format', 'dot')
      expect(run.exitstatus).to eq(0), run.to_s
      expect(run.stdout).to include("  r0 [label=\"haproxy\"];\n  r1 [label=\"node\"];\n")
      expect(run.stdout).to include('r1 -> r0 [label="2", color=red, fontcolor=red, style=bold, penwidth=2];')
      expect(run.stdout).to start_with("digraph kicks {\n")
      expect(kicker(@dir, 'graph', '--format', 'dot').stdout).to eq(run.stdout)
    end

    it 'renders SVG with the real dot: XML that names the roles, cycle edges in red' do
      run = kicker(@dir, 'graph', '--format', 'svg')
      expect(run.exitstatus).to eq(0), run.to_s
      svg = REXML::Document.new(run.stdout)
      expect(svg.root.name).to eq('svg')
      texts = REXML::XPath.match(svg, '//text').map(&:text)
      expect(texts).to include('haproxy', 'node', '3', '2')
      red = REXML::XPath.match(svg, "//g[@class='edge']/path[@stroke='red']")
      expect(red.size).to eq(2)
    end

    it 'gives the edges and cycles with --render-as json' do
      run = kicker(@dir, 'graph', '--render-as', 'json')
      expect(run.json['edges']).to eq([
                                        { 'from' => 'haproxy', 'to' => 'node', 'kicks' => 3, 'in_cycle' => true },
                                        { 'from' => 'node', 'to' => 'haproxy', 'kicks' => 2, 'in_cycle' => true },
                                      ])
      expect(run.json['cycles']).to eq([%w[haproxy node haproxy]])
    end

    it 'says how to install graphviz when dot is missing' do
      run = kicker(@dir, 'graph', '--format', 'svg', env: { 'PATH' => File.join(@dir, 'no-such-bin') })
      expect(run.exitstatus).to eq(1), run.to_s
      expect(run.stderr).to include("needs Graphviz's `dot`").and include('apt install graphviz')
      expect(run.stderr).not_to match(/\.rb:\d+:in/)
    end

    it 'answers from the kick state when the fact source is gone' do
      config = File.join(@dir, 'puppet_kicker.yaml')
      offline = YAML.safe_load(File.read(config)).merge('puppet_cache' => { 'dirs' => ['no-such-dir'] })
      File.write(File.join(@dir, 'offline.yaml'), offline.to_yaml)
      run = kicker(@dir, 'graph', env: { 'PUPPET_KICKER_CONFIG' => File.join(@dir, 'offline.yaml') })
      expect(run.exitstatus).to eq(0), run.to_s
      expect(run.stdout).to start_with('haproxy -> node')
    end
  end

  it 'says so when no kick between roles was seen' do
    run = kicker(ScratchMaster.create, 'graph')
    expect([run.exitstatus, run.stdout]).to eq([0, "No kicks between roles seen yet.\n"])
  end

  it 'refuses an unknown format' do
    run = kicker(ScratchMaster.create, 'graph', '--format', 'png')
    expect([run.exitstatus, run.stderr]).to match([1, include('--format "png": use text, dot or svg')])
  end
end
