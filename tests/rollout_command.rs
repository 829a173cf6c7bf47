//! `puppet kicker rollout plan` through the entry point both bindings call
//! (`api::command`, JSON in and out), on the fixtures' fact cache, with a role graph
//! drawn by real kick reports (dry run: the planner records the edges, nothing is sent).

mod support;

use puppet_kicker::{api, Service};
use serde_json::{json, Value};

fn command(args: Value) -> Result<Value, String> {
    let request = json!({"name": "rollout_plan", "args": args}).to_string();
    api::command(request.as_bytes()).map(|text| serde_json::from_str(&text).unwrap()).map_err(|e| e.to_string())
}

#[test]
fn a_plan_from_the_fact_cache_and_the_graph_reports_drew() {
    let (settings, _root) = support::scratch_master("pk-rollout-command", "kick:\n  dry_run: true\n");
    let service = Service::configure(settings).unwrap();

    // Before any kick: no graph, so the roles come by name.
    let before = command(json!({"environment": "production"})).unwrap();
    let names = |answer: &Value| -> Vec<String> {
        answer["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&before), ["haproxy", "node"]);
    assert_eq!(before["groups"][1]["servers"], json!(["node1.example.com", "node2.example.com", "node3.example.com"]));

    // lb1 (haproxy) kicks node and node1 kicks haproxy: a cycle, one group.
    service.kick_report(&support::role_kick("lb1.example.com", "Notify[kick -> node]", "node")).unwrap();
    service.kick_report(&support::role_kick("node1.example.com", "Notify[kick -> haproxy]", "haproxy")).unwrap();
    let plan = command(json!({"environment": "production", "batch": 3})).unwrap();
    assert_eq!(names(&plan), ["haproxy, node"]);
    assert_eq!(
        plan["groups"][0]["batches"],
        json!([["lb1.example.com", "node1.example.com", "node2.example.com"], ["node3.example.com"]])
    );
    assert_eq!(plan["cycles"][0]["edges"], json!([["haproxy", "node"], ["node", "haproxy"]]));
    assert_eq!(plan["totals"], json!({"servers": 4, "roles": 2, "groups": 1, "batches": 2}));

    // Given order splits the cycle as typed; the graph is not read.
    let given = command(json!({"environment": "production", "roles": ["node", "haproxy"], "order": "given"})).unwrap();
    assert_eq!((names(&given), given["cycles"].clone()), (vec!["node".to_string(), "haproxy".to_string()], json!([])));

    let error = command(json!({"environment": "production", "roles": ["web"]})).unwrap_err();
    assert!(error.contains("no server of environment \"production\" matches --roles web"), "{error}");
    let error = command(json!({"environment": "production", "batch": 0})).unwrap_err();
    assert!(error.contains("puppet kicker rollout plan: --batch 0"), "{error}");
}
