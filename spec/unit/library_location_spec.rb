# frozen_string_literal: true

# The native libraries live in native/, beside lib/: pluginsync copies a module's lib/
# to every agent, and agents never load the libraries (only masters and `puppet
# apply` compile). The module and the gem find them there by one rule.
describe 'where the native libraries are' do
  it 'is native/ beside lib/, outside what pluginsync copies' do
    expect(PuppetKicker::LIBRARY_DIR).to eq(File.join(ROOT, 'native'))
    expect(PuppetKicker::LIBRARIES.values).to all(start_with("#{ROOT}/native/"))
    expect(Dir.glob(File.join(ROOT, 'lib', '**', '*.{so,dylib,bundle,dll}'))).to be_empty
  end

  it 'says where it looked when a library is missing' do
    expect { PuppetKicker.send(:load_ffi, '/nonexistent/libpuppet_kicker_ffi.so') }.to raise_error(
      PuppetKicker::Error,
      %r{/nonexistent/libpuppet_kicker_ffi.so \(ffi backend\): no such file\. puppet-kicker looks for its libraries only in #{Regexp.escape(ROOT)}/native/ }
    )
  end
end
