# frozen_string_literal: true

require 'puppet/face'
require_relative '../../puppet_kicker/face'

# Each action is a file of its own in lib/puppet/face/kicker/, loaded by Puppet.
Puppet::Face.define(:kicker, '1.0.0') do
  copyright 'puppet-kicker contributors', 2026
  license 'Apache-2.0'

  summary 'Ask puppet-kicker what the functions see, why, how fresh it is, and what the kicks do.'
  description <<-DESCRIPTION
    Inspects and drives puppet-kicker with the same native core and configuration
    (puppet_kicker.yaml, Puppet's settings) as the functions and the `kick` report
    processor: `query`, `explain`, `status`, `refresh`, `kick`, `graph`, `metrics` and
    `rollout`.
    Every action but `refresh` and `kick` answers from the snapshot when the fact
    source is unreachable. Output is for people; `--render-as json` or `yaml` gives
    machine output. `--environment ENV` is the environment a compile would ask from
    (default: Puppet's `environment` setting).
  DESCRIPTION
end
