# frozen_string_literal: true

# Where the native libraries are: one rule for the facade and the masterless helper.
module PuppetKicker
  # Both libraries sit in native/, beside lib/: in the module (`rake compile`, the
  # package) and in the gem (extconf.rb). Not under lib/, which pluginsync copies to
  # every agent, and agents never load them. The only place looked in.
  LIBRARY_DIR = File.expand_path('../../native', __dir__)
  NATIVE_LIBRARY = File.join(LIBRARY_DIR, 'puppet_kicker.so')
  FFI_LIBRARY = File.join(LIBRARY_DIR, 'libpuppet_kicker_ffi.so')
  # Under JRuby, the ffi backend's reader of pk_fetch replies in Java (the same objects
  # as FetchReader's, built faster); `rake jar` builds it, the module package carries it.
  JRUBY_READER = File.join(LIBRARY_DIR, 'puppet_kicker_jruby.jar')
end
