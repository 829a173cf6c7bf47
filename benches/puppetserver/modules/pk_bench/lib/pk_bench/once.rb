# frozen_string_literal: true

module PkBench
  # servers_with_role's method, in a module Ruby loads once per process (`require`),
  # for pk_bench_once_servers_with_role: Puppet evaluates a function's file anew
  # for each compile, so the methods defined there are always new to JRuby, which
  # interprets them; a method of this module is the same one in every compile, and
  # JRuby compiles it once it is hot.
  module Once
    def servers_with_role(role, environment = nil)
      PuppetKicker::Functions.servers_with_role(closure_scope, role, environment)
    end
  end
end
