# frozen_string_literal: true

require 'spec_helper'

describe Puppet::Type.type(:kick) do
  it 'takes a role, roles, or fact clauses' do
    expect(described_class.new(title: 'a', role: 'haproxy')[:role]).to eq('haproxy')
    expect(described_class.new(title: 'b', role: %w[web db])[:role]).to eq(%w[web db])
    expect(described_class.new(title: 'c', facts: ['role=db', 'os.family=Debian'], environment: 'staging')[:facts].size).to eq(2)
  end

  it 'needs exactly one of role and facts' do
    expect { described_class.new(title: 'none') }.to raise_error(Puppet::Error, /set exactly one of role and facts/)
    expect { described_class.new(title: 'both', role: 'x', facts: ['a=b']) }.to raise_error(Puppet::Error, /exactly one/)
  end

  it 'rejects empty roles and things that are not clauses' do
    expect { described_class.new(title: 'e', role: '') }.to raise_error(Puppet::Error, /role must be a non-empty String/)
    expect { described_class.new(title: 'f', facts: ['role']) }.to raise_error(Puppet::Error, /facts must be clauses/)
  end
end
