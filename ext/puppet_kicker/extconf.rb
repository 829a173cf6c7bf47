# frozen_string_literal: true

# Writes the Makefile with which RubyGems builds puppet-kicker's two native
# libraries: cargo does the work, so no rb_sys gem is needed (Debian packages none).
# Building offline works once the crates are in cargo's cache (`cargo fetch`).
#
# - puppet_kicker.so: the magnus extension, for MRI; built only when this Ruby is
#   MRI (a C extension means nothing to JRuby, and needs MRI's headers);
# - libpuppet_kicker_ffi.so: the C-ABI library that Ruby's ffi loads, for JRuby
#   (puppetserver) and any other Ruby; always built.
# - puppet_kicker_jruby.jar: the ffi backend's Java reader of pk_fetch replies;
#   built only under JRuby, when a JDK's javac and jar are on PATH (else the
#   slower Ruby reader converts servers, and this says so).
# All go to the gem's native/ (beside lib/), the one place lib/puppet_kicker.rb
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
jruby_jar = File.join(RbConfig::CONFIG['libdir'], 'jruby.jar')
jdk = %w[javac jar].all? { |tool| system('sh', '-c', "command -v #{tool}", out: File::NULL) }
java = !magnus && jdk && File.file?(jruby_jar)
if java
  built += ' puppet_kicker_jruby.jar'
elsif !magnus
  puts "puppet-kicker: no JDK (javac, jar) or no #{jruby_jar}: the Java reader is not built; JRuby converts " \
       'servers with the slower Ruby reader'
end
sources = Dir[File.join(root, 'ext', 'puppet_kicker_jruby', 'src', '**', '*.java')].sort.map { |f| %("#{f}") }.join(' ')
java_rule = "\trm -rf classes && mkdir classes && javac --release 11 -cp \"#{jruby_jar}\" -d classes #{sources}\n" \
            "\tjar --create --file puppet_kicker_jruby.jar -C classes ."

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
  #{java ? java_rule : "\t@true"}
  \ttouch .built

  install: .built
  \tmkdir -p "$(ROOT)/native"
  \tfor f in #{built}; do cp $$f "$(ROOT)/native/$$f" || exit 1; done
  #{own_target ? "\trm -rf \"$(TARGET)\"" : "\t@true"}

  clean:
  \trm -rf .built $(SO) $(FFI) puppet_kicker_jruby.jar classes
MAKE
