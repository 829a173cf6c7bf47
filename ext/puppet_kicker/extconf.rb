# frozen_string_literal: true

# Writes the Makefile with which RubyGems builds puppet-kicker's two native
# libraries: cargo does the work, so no rb_sys gem is needed (Debian packages none).
# Building offline works once the crates are in cargo's cache (`cargo fetch`).
#
# - puppet_kicker.so: the magnus extension, for MRI; built only when this Ruby is
#   MRI (a C extension means nothing to JRuby, and needs MRI's headers);
# - libpuppet_kicker_ffi.so: the C-ABI library that Ruby's ffi loads, for JRuby
#   (puppetserver) and any other Ruby; always built.
# Both go to the gem's native/ (beside lib/), the one place lib/puppet_kicker.rb
# looks for them (as in the module package).
#
# Cargo builds in a temporary target directory that `make install` deletes, so the
# installed gem does not keep ~140 MB of build artefacts. Set CARGO_TARGET_DIR to
# build (and keep) elsewhere. Ruby 2.6 syntax: JRuby runs this file too.

require 'rbconfig'
require 'tmpdir'

root = File.expand_path('../..', __dir__)
own_target = ENV['CARGO_TARGET_DIR'].to_s.empty?
target = own_target ? File.join(Dir.tmpdir, "puppet-kicker-cargo-#{Process.pid}") : ENV.fetch('CARGO_TARGET_DIR', nil)
magnus = RUBY_ENGINE == 'ruby'
so = "puppet_kicker.#{RbConfig::CONFIG['DLEXT']}"
ffi = 'libpuppet_kicker_ffi.so'
crates = magnus ? '-p puppet-kicker-ruby -p puppet-kicker-ffi' : '-p puppet-kicker-ffi'
built = magnus ? "$(SO) #{ffi}" : ffi

File.write('Makefile', <<~MAKE)
  ROOT = #{root}
  TARGET = #{target}
  SO = #{so}
  FFI = #{ffi}

  all: .built

  .built:
  \tcd "$(ROOT)" && CARGO_TARGET_DIR="$(TARGET)" RUBY="#{RbConfig.ruby}" cargo build --release --locked #{crates}
  #{magnus ? "\tcp \"$(TARGET)/release/libpuppet_kicker_ruby.so\" $(SO)" : "\t@true"}
  \tcp "$(TARGET)/release/$(FFI)" $(FFI)
  \ttouch .built

  install: .built
  \tmkdir -p "$(ROOT)/native"
  \tfor f in #{built}; do cp $$f "$(ROOT)/native/$$f" || exit 1; done
  #{own_target ? "\trm -rf \"$(TARGET)\"" : "\t@true"}

  clean:
  \trm -f .built $(SO) $(FFI)
MAKE
