//! The order of a rollout: role groups in the kick graph's dependency order (or in the
//! order the operator gave), each group's servers sorted by certname and cut into
//! batches.
//!
//! The rules, which docs/rollouts.md states for operators:
//!
//! - `graph` order: an edge `a -> b` (servers of `a` kick `b`) puts `a`'s group before
//!   `b`'s. Only edges between two roles of the plan count. Roles that nothing orders
//!   come by name, so the same inputs always give the same plan.
//! - A kick cycle (a strongly connected set of roles, or a role that kicks itself) has
//!   no order that satisfies it: its roles run together as one group, after every role
//!   that kicks into the cycle and before every role the cycle kicks ([`CYCLE_RULE`]).
//! - `given` order: the roles in the order given, one group each; the graph is not read.
//! - A server whose role fact lists several roles runs once, in the latest group of its
//!   roles (after everything that kicks any of them). A group left with no server of
//!   its own that way is dropped.
//! - Servers without a role run last, in a group of their own ([`NO_ROLE`]): never
//!   dropped.
//! - Within a group: certnames in byte order, in batches of `batch` (all in one batch
//!   when none is given, as Choria's orchestrator does without `--batch`).
//!
//! Everything is iterative and at most `O((S + E) log S)` for S servers and E edges:
//! roles come from facts and edges from reports, so their number and shape are not
//! trusted (a deep chain of roles cannot overflow the stack).

use serde::ser::{SerializeStruct, Serializer};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::fmt;

/// The name shown for the group of servers with no role (its `roles` is empty).
pub const NO_ROLE: &str = "(no role)";

/// How a kick cycle is broken, said in the plan next to each cycle.
pub const CYCLE_RULE: &str = "roles in a kick cycle run together as one group, after every role that kicks into \
                              the cycle and before every role the cycle kicks; within the group, certname order";

/// Where the order of the role groups comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// The kick graph's dependency order, ties by role name.
    Graph,
    /// The roles in the order the operator typed them (`--roles`).
    Given,
}

impl Order {
    /// `graph` or `given`; anything else is an error naming `--order` and the value.
    pub fn parse(text: &str) -> Result<Order, RolloutError> {
        match text {
            "graph" => Ok(Order::Graph),
            "given" => Ok(Order::Given),
            other => Err(RolloutError::UnknownOrder(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Order::Graph => "graph",
            Order::Given => "given",
        }
    }
}

/// One selected server: its certname and the roles it has in this rollout (none: it
/// goes to the last group, [`NO_ROLE`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    pub certname: &'a str,
    pub roles: Vec<&'a str>,
}

/// What shapes the plan besides the servers and the graph.
#[derive(Clone, Copy, Debug)]
pub struct Options<'a> {
    pub order: Order,
    /// The roles in the order given (`--roles`, regexes already expanded): the order
    /// of `given`; roles of servers missing from it come after it, by name.
    pub given: &'a [String],
    /// Servers per batch; `None`: each group in one batch.
    pub batch: Option<usize>,
}

impl Options<'_> {
    /// Whether a plan can be made with these options (a caller checks them before it
    /// selects servers: a bad option is said before anything about the data).
    pub fn check(&self) -> Result<(), RolloutError> {
        if self.batch == Some(0) {
            return Err(RolloutError::ZeroBatch);
        }
        if self.order == Order::Given && self.given.is_empty() {
            return Err(RolloutError::GivenWithoutRoles);
        }
        Ok(())
    }
}

/// Options no plan can be made from; each message names the option and its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutError {
    ZeroBatch,
    GivenWithoutRoles,
    UnknownOrder(String),
}

impl fmt::Display for RolloutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RolloutError::ZeroBatch => {
                f.write_str("--batch 0: a batch holds at least 1 server (leave --batch out for one batch per group)")
            }
            RolloutError::GivenWithoutRoles => {
                f.write_str("--order given needs --roles: the groups come in the order the roles are typed")
            }
            RolloutError::UnknownOrder(order) => write!(f, "--order {order:?}: use graph or given"),
        }
    }
}

impl std::error::Error for RolloutError {}

/// The rollout: groups in the order they run, the kick cycles found and how each was
/// broken, and the totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub order: Order,
    pub batch: Option<usize>,
    pub groups: Vec<Group>,
    pub cycles: Vec<Cycle>,
    pub totals: Totals,
}

/// Servers that run together: one role, the roles of a kick cycle, or none
/// ([`NO_ROLE`]). Serialized with its `name` and its `batches`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// By name; empty for the servers with no role.
    pub roles: Vec<String>,
    /// Whether the roles form a kick cycle (see [`Plan::cycles`]).
    pub cycle: bool,
    /// In certname order.
    pub servers: Vec<String>,
    /// Servers per batch: at least 1.
    batch_size: usize,
}

impl Group {
    /// The roles joined by ", ", or [`NO_ROLE`].
    pub fn name(&self) -> String {
        if self.roles.is_empty() {
            NO_ROLE.to_string()
        } else {
            self.roles.join(", ")
        }
    }

    /// The servers cut into batches, in order (slices of `servers`: not copied).
    pub fn batches(&self) -> std::slice::Chunks<'_, String> {
        self.servers.chunks(self.batch_size)
    }
}

impl Serialize for Group {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut group = serializer.serialize_struct("Group", 5)?;
        group.serialize_field("name", &self.name())?;
        group.serialize_field("roles", &self.roles)?;
        group.serialize_field("cycle", &self.cycle)?;
        group.serialize_field("servers", &self.servers)?;
        group.serialize_field("batches", &self.batches().collect::<Vec<_>>())?;
        group.end()
    }
}

/// A kick cycle among the plan's roles and how it was broken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cycle {
    /// By name.
    pub roles: Vec<String>,
    /// The graph's edges between them, sorted: `[from, to]`.
    pub edges: Vec<(String, String)>,
    /// The group (from 1) its roles run in; `None` when every server of its roles has
    /// a later role too, so that the group was dropped.
    pub group: Option<usize>,
    pub rule: &'static str,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub servers: usize,
    pub roles: usize,
    pub groups: usize,
    pub batches: usize,
}

/// The plan for `members` (each certname once: a repeated certname's roles are
/// merged) under the kick graph's `edges` (`from -> to`; edges that touch a role no
/// member has are ignored, and so are repeats).
pub fn plan<'a>(
    members: &[Member<'a>],
    edges: impl IntoIterator<Item = (&'a str, &'a str)>,
    options: &Options,
) -> Result<Plan, RolloutError> {
    options.check()?;
    let servers = merged(members);
    let roles: Vec<&str> =
        servers.iter().flat_map(|(_, roles)| roles.iter().copied()).collect::<BTreeSet<_>>().into_iter().collect();
    let id = |role: &str| roles.binary_search(&role).ok();
    // Edges by role id (ids follow names), deduplicated and sorted whatever the input order.
    let edges: BTreeSet<(usize, usize)> =
        edges.into_iter().filter_map(|(from, to)| Some((id(from)?, id(to)?))).collect();

    let (ranked, cycles) = match options.order {
        Order::Graph => graph_order(roles.len(), &edges),
        Order::Given => (given_order(&roles, options.given), Vec::new()),
    };
    // The rank of each role's group, then each server in the latest group of its roles.
    let mut rank_of = vec![0; roles.len()];
    for (rank, group) in ranked.iter().enumerate() {
        for role in group {
            rank_of[*role] = rank;
        }
    }
    let mut placed: Vec<Vec<String>> = vec![Vec::new(); ranked.len() + 1];
    for (certname, roles) in &servers {
        let rank = roles.iter().filter_map(|role| id(role)).map(|r| rank_of[r]).max().unwrap_or(ranked.len());
        placed[rank].push(certname.to_string());
    }

    let batch_size = |servers: &[String]| options.batch.unwrap_or(servers.len()).max(1);
    let mut groups = Vec::new();
    let mut group_number = vec![None; ranked.len()];
    let no_role = placed.pop().unwrap_or_default();
    for (rank, (members, servers)) in ranked.iter().zip(placed).enumerate() {
        if servers.is_empty() {
            continue;
        }
        group_number[rank] = Some(groups.len() + 1);
        let roles = members.iter().map(|r| roles[*r].to_string()).collect();
        groups.push(Group {
            roles,
            cycle: cycles.binary_search(&rank).is_ok(),
            batch_size: batch_size(&servers),
            servers,
        });
    }
    if !no_role.is_empty() {
        groups.push(Group { roles: Vec::new(), cycle: false, batch_size: batch_size(&no_role), servers: no_role });
    }
    let cycles = cycles
        .into_iter()
        .map(|rank| {
            let members = &ranked[rank];
            let inside = edges.iter().filter(|(from, to)| members.contains(from) && members.contains(to));
            Cycle {
                roles: members.iter().map(|r| roles[*r].to_string()).collect(),
                edges: inside.map(|(from, to)| (roles[*from].to_string(), roles[*to].to_string())).collect(),
                group: group_number[rank],
                rule: CYCLE_RULE,
            }
        })
        .collect();
    let totals = Totals {
        servers: servers.len(),
        roles: roles.len(),
        groups: groups.len(),
        batches: groups.iter().map(|g| g.batches().len()).sum(),
    };
    Ok(Plan { order: options.order, batch: options.batch, groups, cycles, totals })
}

/// Each certname once, in byte order, with its roles sorted and deduplicated.
fn merged<'a>(members: &[Member<'a>]) -> Vec<(&'a str, Vec<&'a str>)> {
    let mut servers: Vec<(&str, Vec<&str>)> = members.iter().map(|m| (m.certname, m.roles.clone())).collect();
    servers.sort_by(|a, b| a.0.cmp(b.0));
    servers.dedup_by(|later, first| {
        let same = later.0 == first.0;
        if same {
            first.1.append(&mut later.1);
        }
        same
    });
    for (_, roles) in &mut servers {
        roles.sort_unstable();
        roles.dedup();
    }
    servers
}

/// The role groups in graph order, each its role ids ascending (by name), and the
/// ranks of the groups that are kick cycles.
///
/// Strongly connected components (Tarjan's, iterative), then Kahn's topological sort
/// of the components, taking among the ready ones the one whose first role name is
/// smallest: a deterministic order that keeps every edge between two groups forward.
fn graph_order(roles: usize, edges: &BTreeSet<(usize, usize)>) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut successors = vec![Vec::new(); roles];
    for (from, to) in edges {
        successors[*from].push(*to);
    }
    let component = strongly_connected(&successors);
    let count = component.iter().copied().max().map_or(0, |c| c + 1);
    let mut members = vec![Vec::new(); count];
    for (role, c) in component.iter().enumerate() {
        members[*c].push(role); // ascending: roles are visited in id order
    }
    let between: BTreeSet<(usize, usize)> =
        edges.iter().map(|(from, to)| (component[*from], component[*to])).filter(|(from, to)| from != to).collect();
    let mut waiting_on = vec![0usize; count];
    let mut after = vec![Vec::new(); count];
    for (from, to) in &between {
        waiting_on[*to] += 1;
        after[*from].push(*to);
    }
    // Ready components by their smallest role id, i.e. their first role's name.
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> =
        (0..count).filter(|c| waiting_on[*c] == 0).map(|c| Reverse((members[c][0], c))).collect();
    let mut ranked = Vec::with_capacity(count);
    let mut cycles = Vec::new();
    while let Some(Reverse((_, c))) = ready.pop() {
        let group = std::mem::take(&mut members[c]);
        if group.len() > 1 || edges.contains(&(group[0], group[0])) {
            cycles.push(ranked.len());
        }
        ranked.push(group);
        for next in &after[c] {
            waiting_on[*next] -= 1;
            if waiting_on[*next] == 0 {
                ready.push(Reverse((members[*next][0], *next)));
            }
        }
    }
    (ranked, cycles)
}

/// Tarjan's strongly connected components without recursion: the component of each
/// node (numbered in the order they complete).
fn strongly_connected(successors: &[Vec<usize>]) -> Vec<usize> {
    let mut search = Tarjan::new(successors.len());
    for root in 0..successors.len() {
        if search.index[root] != Tarjan::UNSEEN {
            continue;
        }
        // (node, how many of its successors were looked at): the call stack, on the heap.
        let mut calls: Vec<(usize, usize)> = vec![(root, 0)];
        search.enter(root);
        while let Some(&(node, seen)) = calls.last() {
            if let Some(&next) = successors[node].get(seen) {
                if let Some(call) = calls.last_mut() {
                    call.1 += 1;
                }
                if search.index[next] == Tarjan::UNSEEN {
                    search.enter(next);
                    calls.push((next, 0));
                } else if search.on_stack[next] {
                    search.low[node] = search.low[node].min(search.index[next]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                search.low[parent] = search.low[parent].min(search.low[node]);
            }
            search.leave(node);
        }
    }
    search.component
}

/// The bookkeeping of [`strongly_connected`].
struct Tarjan {
    index: Vec<usize>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    component: Vec<usize>,
    next_index: usize,
    components: usize,
}

impl Tarjan {
    const UNSEEN: usize = usize::MAX;

    fn new(n: usize) -> Tarjan {
        Tarjan {
            index: vec![Tarjan::UNSEEN; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            stack: Vec::new(),
            component: vec![0; n],
            next_index: 0,
            components: 0,
        }
    }

    fn enter(&mut self, node: usize) {
        self.index[node] = self.next_index;
        self.low[node] = self.next_index;
        self.next_index += 1;
        self.stack.push(node);
        self.on_stack[node] = true;
    }

    /// After `node`'s successors: if it is its component's root, the component is
    /// what the stack holds above it.
    fn leave(&mut self, node: usize) {
        if self.low[node] != self.index[node] {
            return;
        }
        while let Some(member) = self.stack.pop() {
            self.on_stack[member] = false;
            self.component[member] = self.components;
            if member == node {
                break;
            }
        }
        self.components += 1;
    }
}

/// One group per role: those named in `given` in its order (the first mention
/// counts), then the others by name.
fn given_order(roles: &[&str], given: &[String]) -> Vec<Vec<usize>> {
    let position = |role: &str| given.iter().position(|g| g == role).unwrap_or(given.len());
    let mut ids: Vec<usize> = (0..roles.len()).collect();
    ids.sort_by_key(|id| (position(roles[*id]), *id));
    ids.into_iter().map(|id| vec![id]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member<'a>(certname: &'a str, roles: &[&'a str]) -> Member<'a> {
        Member { certname, roles: roles.to_vec() }
    }

    fn graph_plan(members: &[Member], edges: &[(&'static str, &'static str)], batch: Option<usize>) -> Plan {
        plan(members, edges.iter().copied(), &Options { order: Order::Graph, given: &[], batch }).unwrap()
    }

    /// Each group as its name and its batches.
    fn shape(plan: &Plan) -> Vec<(String, Vec<Vec<&str>>)> {
        plan.groups
            .iter()
            .map(|g| (g.name(), g.batches().map(|b| b.iter().map(String::as_str).collect()).collect()))
            .collect()
    }

    fn group(name: &str, batches: &[&[&'static str]]) -> (String, Vec<Vec<&'static str>>) {
        (name.to_string(), batches.iter().map(|b| b.to_vec()).collect())
    }

    fn fleet() -> Vec<Member<'static>> {
        vec![
            member("lb2", &["haproxy"]),
            member("node2", &["node"]),
            member("lb1", &["haproxy"]),
            member("db1", &["db"]),
            member("node1", &["node"]),
            member("node3", &["node"]),
        ]
    }

    #[test]
    fn a_role_that_kicks_another_comes_before_it() {
        let plan = graph_plan(&fleet(), &[("node", "haproxy"), ("db", "node")], None);
        assert_eq!(
            shape(&plan),
            [
                group("db", &[&["db1"]]),
                group("node", &[&["node1", "node2", "node3"]]),
                group("haproxy", &[&["lb1", "lb2"]]),
            ]
        );
        assert!(plan.cycles.is_empty());
        assert_eq!(plan.totals, Totals { servers: 6, roles: 3, groups: 3, batches: 3 });
    }

    #[test]
    fn roles_nothing_orders_come_by_name_whatever_the_input_order() {
        let by_name = graph_plan(&fleet(), &[], None);
        let names: Vec<String> = by_name.groups.iter().map(Group::name).collect();
        assert_eq!(names, ["db", "haproxy", "node"]);
        // Ties among ready roles by name: web and app wait on db, then come by name.
        let members = [member("w", &["web"]), member("a", &["app"]), member("d", &["db"]), member("z", &["zz"])];
        let edges = [("db", "web"), ("db", "app")];
        let mut reversed = members.to_vec();
        reversed.reverse();
        let one = graph_plan(&members, &edges, Some(1));
        let other =
            plan(&reversed, edges.iter().rev().copied(), &Options { order: Order::Graph, given: &[], batch: Some(1) });
        assert_eq!(one, other.unwrap());
        assert_eq!(one.groups.iter().map(Group::name).collect::<Vec<_>>(), ["db", "app", "web", "zz"]);
        assert_eq!(
            serde_json::to_string(&one).unwrap(),
            serde_json::to_string(&graph_plan(&members, &edges, Some(1))).unwrap()
        );
    }

    #[test]
    fn a_cycle_is_one_group_after_what_kicks_into_it_and_is_reported_with_the_rule() {
        let members = [
            member("lb1", &["haproxy"]),
            member("node1", &["node"]),
            member("db1", &["db"]),
            member("mon1", &["monitor"]),
            member("app1", &["app"]),
        ];
        // db -> node <-> haproxy -> monitor; app kicks itself.
        let edges = [("node", "haproxy"), ("haproxy", "node"), ("db", "node"), ("haproxy", "monitor"), ("app", "app")];
        let plan = graph_plan(&members, &edges, None);
        assert_eq!(
            shape(&plan),
            [
                group("app", &[&["app1"]]),
                group("db", &[&["db1"]]),
                group("haproxy, node", &[&["lb1", "node1"]]),
                group("monitor", &[&["mon1"]]),
            ]
        );
        assert_eq!(plan.groups.iter().map(|g| g.cycle).collect::<Vec<_>>(), [true, false, true, false]);
        let cycle = &plan.cycles[1];
        assert_eq!(cycle.roles, ["haproxy", "node"]);
        assert_eq!(
            cycle.edges,
            [("haproxy".to_string(), "node".to_string()), ("node".to_string(), "haproxy".to_string())]
        );
        assert_eq!((cycle.group, cycle.rule), (Some(3), CYCLE_RULE));
        assert_eq!((plan.cycles[0].roles.clone(), plan.cycles[0].group), (vec!["app".to_string()], Some(1)));
        let json = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["cycles"][1]["edges"], serde_json::json!([["haproxy", "node"], ["node", "haproxy"]]));
        assert_eq!(json["cycles"][1]["rule"], CYCLE_RULE);
    }

    #[test]
    fn two_cycles_and_a_long_chain_keep_every_edge_between_groups_forward() {
        // A chain of 5,000 roles (deep enough to break a recursive search) with two
        // cycles on it.
        let names: Vec<String> = (0..5000).map(|i| format!("r{i:05}")).collect();
        let certnames: Vec<String> = (0..5000).map(|i| format!("s{i:05}")).collect();
        let members: Vec<Member> =
            names.iter().zip(&certnames).map(|(r, c)| Member { certname: c, roles: vec![r] }).collect();
        let mut edges: Vec<(&str, &str)> = names.windows(2).map(|w| (w[1].as_str(), w[0].as_str())).collect();
        edges.push((&names[10], &names[20])); // r10 -> r20 -> ... -> r10 (the chain runs downwards)
        edges.push((&names[4000], &names[4002]));
        let plan =
            plan(&members, edges.iter().copied(), &Options { order: Order::Graph, given: &[], batch: None }).unwrap();
        assert_eq!(plan.groups.len(), 5000 - 10 - 2);
        assert_eq!(plan.cycles.len(), 2);
        assert_eq!(plan.cycles[0].roles.len(), 3, "r4000..r4002 come first: the chain runs from r4999 down");
        assert_eq!(plan.cycles[1].roles.len(), 11);
        let rank: std::collections::HashMap<&str, usize> = plan
            .groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| group.roles.iter().map(move |r| (r.as_str(), g)))
            .collect();
        assert!(edges.iter().all(|(from, to)| rank[from] <= rank[to]));
        assert_eq!(plan.groups[0].roles, ["r04999"]);
    }

    #[test]
    fn groups_are_cut_in_batches_of_n_in_certname_order() {
        let plan = graph_plan(&fleet(), &[], Some(2));
        assert_eq!(
            shape(&plan),
            [
                group("db", &[&["db1"]]),
                group("haproxy", &[&["lb1", "lb2"]]),
                group("node", &[&["node1", "node2"], &["node3"]]),
            ]
        );
        assert_eq!(plan.totals.batches, 4);
        let one = graph_plan(&fleet(), &[], Some(1));
        assert_eq!(one.totals.batches, 6);
        let json = serde_json::to_value(graph_plan(&fleet(), &[], Some(2))).unwrap();
        assert_eq!(json["groups"][2]["batches"], serde_json::json!([["node1", "node2"], ["node3"]]));
        assert_eq!(json["groups"][2]["servers"], serde_json::json!(["node1", "node2", "node3"]));
        assert_eq!(json["batch"], 2);
    }

    #[test]
    fn the_given_order_is_followed_and_unlisted_roles_come_after_by_name() {
        let given = ["node".to_string(), "db".to_string()];
        let members = [fleet(), vec![member("x1", &["extra"])]].concat();
        let options = Options { order: Order::Given, given: &given, batch: None };
        // The graph would put haproxy last; given order does not read it.
        let plan = plan(&members, [("haproxy", "node")], &options).unwrap();
        let names: Vec<String> = plan.groups.iter().map(Group::name).collect();
        assert_eq!(names, ["node", "db", "extra", "haproxy"]);
        assert!(plan.cycles.is_empty());
        assert_eq!(serde_json::to_value(&plan).unwrap()["order"], "given");
    }

    #[test]
    fn servers_without_a_role_run_last_and_are_never_dropped() {
        let members = [member("zeta", &[]), member("db1", &["db"]), member("alpha", &[])];
        let plan = graph_plan(&members, &[], None);
        assert_eq!(shape(&plan), [group("db", &[&["db1"]]), group(NO_ROLE, &[&["alpha", "zeta"]])]);
        assert!(plan.groups[1].roles.is_empty());
        assert_eq!(plan.totals, Totals { servers: 3, roles: 1, groups: 2, batches: 2 });
    }

    #[test]
    fn a_server_of_several_roles_runs_once_in_the_latest_group_of_its_roles() {
        let members = [
            member("both", &["haproxy", "node"]),
            member("node1", &["node"]),
            member("only-db", &["db"]),
            member("db-too", &["db", "cache"]),
            member("node1", &["node"]), // a repeated certname counts once
        ];
        let plan = graph_plan(&members, &[("node", "haproxy"), ("cache", "db")], None);
        assert_eq!(
            shape(&plan),
            [group("db", &[&["db-too", "only-db"]]), group("node", &[&["node1"]]), group("haproxy", &[&["both"]])]
        );
        assert_eq!(plan.totals.servers, 4, "cache's group had no server of its own: dropped");
        // A cycle whose every server has a later role too: reported, with no group.
        let members = [member("s", &["a", "b", "z"])];
        let plan = graph_plan(&members, &[("a", "b"), ("b", "a"), ("a", "z")], None);
        assert_eq!(shape(&plan), [group("z", &[&["s"]])]);
        assert_eq!(
            (plan.cycles[0].roles.clone(), plan.cycles[0].group),
            (vec!["a".to_string(), "b".to_string()], None)
        );
    }

    #[test]
    fn bad_options_are_errors_naming_the_option() {
        let options = |order, given: &'static [String], batch| Options { order, given, batch };
        let error = plan(&fleet(), [], &options(Order::Graph, &[], Some(0))).unwrap_err();
        assert_eq!(error, RolloutError::ZeroBatch);
        assert!(error.to_string().starts_with("--batch 0: a batch holds at least 1 server"), "{error}");
        let error = plan(&fleet(), [], &options(Order::Given, &[], None)).unwrap_err();
        assert!(error.to_string().contains("--order given needs --roles"), "{error}");
        assert_eq!(Order::parse("topological").unwrap_err().to_string(), "--order \"topological\": use graph or given");
        assert_eq!((Order::parse("graph"), Order::parse("given")), (Ok(Order::Graph), Ok(Order::Given)));
    }

    #[test]
    fn edges_to_roles_outside_the_plan_are_ignored_and_an_empty_plan_has_no_group() {
        let plan = graph_plan(&fleet(), &[("haproxy", "dns"), ("dns", "db"), ("ghost", "ghost")], None);
        assert_eq!(plan.groups.iter().map(Group::name).collect::<Vec<_>>(), ["db", "haproxy", "node"]);
        assert!(plan.cycles.is_empty());
        let empty = graph_plan(&[], &[("a", "b")], None);
        assert_eq!((empty.groups.len(), empty.totals), (0, Totals::default()));
    }
}
