# frozen_string_literal: true

require 'json'

# What users check before they install: metadata.json (read by the Forge, `puppet
# module install` and r10k) and the README's "Supported platforms" must say the same.
describe 'metadata.json and the README' do
  let(:metadata) { JSON.parse(File.read(File.join(ROOT, 'metadata.json'))) }
  let(:platforms) do
    readme = File.read(File.join(ROOT, 'README.md'))
    section = readme[/^### Supported platforms\n(.*?)(?=^##)/m]
    expect(section).not_to be_nil, 'README.md has no "### Supported platforms" section (under Setup)'
    section
  end

  it 'requires Puppet and OpenVox 7 and 8' do
    expect(metadata['requirements']).to contain_exactly(
      { 'name' => 'puppet', 'version_requirement' => '>= 7.0.0 < 9.0.0' },
      { 'name' => 'openvox', 'version_requirement' => '>= 7.0.0 < 9.0.0' }
    )
  end

  it 'lists in the README every requirement of metadata.json, with its version range' do
    metadata['requirements'].each do |req|
      expect(platforms).to include("`#{req['name']} #{req['version_requirement']}`")
    end
  end

  it 'supports exactly the systems the README says are tested' do
    declared = metadata['operatingsystem_support'].flat_map do |os|
      os['operatingsystemrelease'].map { |release| "#{os['operatingsystem']} #{release}" }
    end
    tested = platforms.scan(/^\| (\w+ \d+) \|/).flatten
    expect(tested).not_to be_empty, 'the README lists no tested system (rows "| Debian 12 | ...")'
    expect(declared).to match_array(tested)
  end
end
