//! `puppet kicker graph`: the role-to-role kick graph seen in reports, from the saved
//! kick state (nothing started or sent: it works offline), with each edge's kick
//! count and the cycles, and as Graphviz DOT with the cycles' edges red and bold.

use crate::error::Result;
use crate::kick::RoleGraph;
use crate::service::Service;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Args {}

/// `{"edges": [{"from", "to", "kicks", "in_cycle"}], "cycles": [[role, ..]],
/// "cycles_left_out": N, "dot": "digraph ..."}`, edges sorted by `from` then `to`.
pub fn run(service: &Service, _args: Args) -> Result<Value> {
    let state = service.kick_state()?;
    Ok(describe(&state.graph))
}

fn describe(graph: &RoleGraph) -> Value {
    let on_cycle = cycle_edges(graph);
    let edges: Vec<Value> = graph
        .counted_edges()
        .map(|(from, to, kicks)| {
            json!({"from": from, "to": to, "kicks": kicks, "in_cycle": on_cycle.contains(&(from, to))})
        })
        .collect();
    json!({
        "edges": edges,
        "cycles": graph.cycles().collect::<Vec<_>>(),
        "cycles_left_out": graph.cycles_left_out(),
        "dot": dot(graph, &on_cycle),
    })
}

/// The edges of the listed cycles.
fn cycle_edges(graph: &RoleGraph) -> BTreeSet<(&str, &str)> {
    graph.cycles().flat_map(|cycle| cycle.windows(2).map(|w| (w[0].as_str(), w[1].as_str()))).collect()
}

/// The graph in DOT: nodes named `r0, r1, ...` in role order and labelled with the
/// role (roles come from facts: any text, escaped), edges in order, labelled with
/// their kick count; the edges of cycles red and bold. The same graph gives the same
/// bytes.
fn dot(graph: &RoleGraph, on_cycle: &BTreeSet<(&str, &str)>) -> String {
    let roles: BTreeSet<&str> = graph.edges().flat_map(|(from, to)| [from, to]).collect();
    let ids: BTreeMap<&str, usize> = roles.iter().enumerate().map(|(n, role)| (*role, n)).collect();
    let id = |role: &str| ids.get(role).copied().unwrap_or(0);
    let mut out = String::from("digraph kicks {\n  rankdir=LR;\n  node [shape=box, fontname=\"sans-serif\"];\n");
    out.push_str("  edge [fontname=\"sans-serif\"];\n");
    if roles.is_empty() {
        out.push_str("  label=\"no kicks between roles seen yet\";\n");
    }
    if graph.cycles_left_out() > 0 {
        let _ = writeln!(out, "  label=\"{} more cycles not listed\";", graph.cycles_left_out());
    }
    for (n, role) in roles.iter().enumerate() {
        let _ = writeln!(out, "  r{n} [label=\"{}\"];", label(role));
    }
    for (from, to, kicks) in graph.counted_edges() {
        let style =
            if on_cycle.contains(&(from, to)) { ", color=red, fontcolor=red, style=bold, penwidth=2" } else { "" };
        let _ = writeln!(out, "  r{} -> r{} [label=\"{kicks}\"{style}];", id(from), id(to));
    }
    out.push_str("}\n");
    out
}

/// `text` as a DOT label: quotes and backslashes escaped, control characters shown
/// as `?` (a label's `\n`, `\l` would otherwise be line breaks).
fn label(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' => "\\\"".to_string(),
            '\\' => "\\\\".to_string(),
            c if c.is_control() => "?".to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> RoleGraph {
        let mut graph = RoleGraph::default();
        for (n, (from, to)) in edges.iter().enumerate() {
            graph.add(from, to, n as i64, 6);
        }
        graph
    }

    #[test]
    fn edges_are_counted_and_cycles_drawn_red_in_a_stable_order() {
        let g = graph(&[("node", "haproxy"), ("haproxy", "node"), ("node", "haproxy"), ("db", "node")]);
        let answer = describe(&g);
        assert_eq!(
            answer["edges"],
            json!([
                {"from": "db", "to": "node", "kicks": 1, "in_cycle": false},
                {"from": "haproxy", "to": "node", "kicks": 1, "in_cycle": true},
                {"from": "node", "to": "haproxy", "kicks": 2, "in_cycle": true},
            ])
        );
        assert_eq!(answer["cycles"], json!([["haproxy", "node", "haproxy"]]));
        let dot = answer["dot"].as_str().unwrap();
        let lines: Vec<&str> = dot.lines().filter(|l| l.contains("->") || l.contains("label=\"")).collect();
        assert_eq!(
            lines,
            [
                "  r0 [label=\"db\"];",
                "  r1 [label=\"haproxy\"];",
                "  r2 [label=\"node\"];",
                "  r0 -> r2 [label=\"1\"];",
                "  r1 -> r2 [label=\"1\", color=red, fontcolor=red, style=bold, penwidth=2];",
                "  r2 -> r1 [label=\"2\", color=red, fontcolor=red, style=bold, penwidth=2];",
            ]
        );
        assert!(dot.starts_with("digraph kicks {\n") && dot.ends_with("}\n"));
        let again = graph(&[("db", "node"), ("node", "haproxy"), ("haproxy", "node"), ("node", "haproxy")]);
        assert_eq!(describe(&again)["dot"], answer["dot"], "the same graph, added in another order");
    }

    #[test]
    fn an_empty_graph_says_so_and_roles_are_escaped() {
        let empty = describe(&RoleGraph::default());
        assert_eq!(empty["edges"], json!([]));
        assert!(empty["dot"].as_str().unwrap().contains("label=\"no kicks between roles seen yet\""));
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c?d");
    }
}
