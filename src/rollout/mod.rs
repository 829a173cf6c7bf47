//! Ordered rollouts (`puppet kicker rollout`): in which order the servers of an
//! environment should run Puppet so that a change reaches each role before the roles
//! that depend on it, from the role-to-role kick graph reports drew
//! ([`crate::kick::RoleGraph`]).
//!
//! An edge `node -> haproxy` says servers of role `node` kick `haproxy`: haproxy has
//! to run after node changed, so node's group comes first. [`plan`] is pure (no I/O,
//! no index, no clock): the same servers, edges and options give the same plan, byte
//! for byte once serialized. `command::rollout` feeds it from the index and the saved
//! kick state; docs/rollouts.md states the rules for operators.

mod plan;
mod run;

pub use plan::{plan, Cycle, Group, Member, Options, Order, Plan, RolloutError, Totals, CYCLE_RULE, NO_ROLE};
pub use run::{decode, Batch, Line, Phase, Progress, Rollout, ServerState, MAX_STATE_BYTES, STEP_CALLS};
