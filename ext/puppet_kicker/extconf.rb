# frozen_string_literal: true

# Writes the Makefile with which RubyGems builds puppet_kicker.so: cargo does the
# work, so no rb_sys gem is needed (Debian packages none). Building offline works
# once the crates are in cargo's cache (`cargo fetch`).
#
# Cargo builds in a temporary target directory that `make install` deletes, so the
# installed gem does not keep ~140 MB of build artefacts. Set CARGO_TARGET_DIR to
# build (and keep) elsewhere.

require 'rbconfig'
require 'tmpdir'

root = File.expand_path('../..', __dir__)
own_target = ENV['CARGO_TARGET_DIR'].to_s.empty?
target = own_target ? File.join(Dir.tmpdir, "puppet-kicker-cargo-#{Process.pid}") : ENV['CARGO_TARGET_DIR']
so = "puppet_kicker.#{RbConfig::CONFIG['DLEXT']}"

File.write('Makefile', <<~MAKE)
  ROOT = #{root}
  TARGET = #{target}
  SO = #{so}

  all: $(SO)

  $(SO):
  \tcd "$(ROOT)" && CARGO_TARGET_DIR="$(TARGET)" RUBY="#{RbConfig.ruby}" cargo build --release --locked -p puppet-kicker-ruby
  \tcp "$(TARGET)/release/libpuppet_kicker_ruby.so" $(SO)

  install: $(SO)
  \tmkdir -p "$(ROOT)/lib/puppet_kicker" "$(sitearchdir)/puppet_kicker"
  \tcp $(SO) "$(ROOT)/lib/puppet_kicker/$(SO)"
  \tcp $(SO) "$(sitearchdir)/puppet_kicker/$(SO)"
  #{own_target ? "\trm -rf \"$(TARGET)\"" : "\t@true"}

  clean:
  \trm -f $(SO)
MAKE
