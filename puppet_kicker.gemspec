# frozen_string_literal: true

require_relative 'lib/puppet_kicker/version'

Gem::Specification.new do |spec|
  spec.name = 'puppet_kicker'
  spec.version = PuppetKicker::VERSION
  spec.summary = "Cross-server Puppet notifications: other servers' facts from a cached index, and kicks"
  spec.description = 'Puppet functions servers_with_role, servers_with_facts and server_with_role answered ' \
                     'from a Rust fact index, and the kick report processor.'
  spec.authors = ['puppet-kicker maintainers']
  spec.license = 'Apache-2.0'
  spec.homepage = 'https://github.com/puppet-kicker/puppet-kicker'
  # 2.6: puppetserver's JRuby 9.3 (which uses the C-ABI library through ffi).
  spec.required_ruby_version = '>= 2.6'

  spec.files = Dir[
    'Cargo.toml', 'Cargo.lock', 'rustfmt.toml', 'src/**/*.rs', 'benches/**/*.rs',
    'ext/puppet_kicker/Cargo.toml', 'ext/puppet_kicker/build.rs', 'ext/puppet_kicker/extconf.rb', 'ext/puppet_kicker/src/**/*.rs',
    'ext/puppet_kicker/benches/*.rs',
    'ext/puppet_kicker_ffi/Cargo.toml', 'ext/puppet_kicker_ffi/build.rs', 'ext/puppet_kicker_ffi/src/**/*.rs',
    'ext/puppet_kicker_ffi/include/*.h', 'ext/puppet_kicker_jruby/src/**/*.java',
    'lib/**/*.rb', 'templates/*', 'examples/**/*', 'metadata.json', 'README.md', 'REFERENCE.md',
    'CHANGELOG.md', 'docs/*.md', 'ext/puppet_kicker_ffi/README.md', 'LICENSE'
  ]
  spec.require_paths = ['lib']
  # Builds both libraries into the gem's native/ (where lib/puppet_kicker.rb looks):
  # the magnus extension (MRI only) and the C-ABI one (ffi).
  spec.extensions = ['ext/puppet_kicker/extconf.rb']
end
