# frozen_string_literal: true

require 'puppet/application/face_base'
require_relative '../../puppet_kicker/face'

class Puppet::Application # rubocop:disable Style/ClassAndModuleChildren (Puppet's own class, reopened)
  # `puppet kicker`: the operator's command line (lib/puppet/face/kicker.rb).
  class Kicker < FaceBase
    # `--environment ENV` is the environment the functions would be called in, not one
    # whose code must exist here: a master's code may live elsewhere.
    environment_mode :not_required

    # An action may ask, through PuppetKicker::Face.exit_code, to end with a code of
    # its own once its output is rendered (`status --max-age`, a failed `kick`).
    # (Kernel#exit's own signature, which FaceBase#main calls.)
    def exit(status = true) # rubocop:disable Style/OptionalBooleanParameter
      code = PuppetKicker::Face.exit_code
      super(status == true && code ? code : status)
    end
  end
end
