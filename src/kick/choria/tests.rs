//! The codec against the published protocol, with the throwaway key pair of
//! tests/fixtures/choria (made by its make-fixtures.sh with openssl).

use super::*;
use crate::kick::{LastRun, Outcome, RunStatus};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ring::digest::{digest, SHA256};
use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};
use serde_json::{json, Value};
use std::path::PathBuf;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/choria").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn credentials() -> Credentials {
    Credentials::from_pem(&fixture("kicker.mcollective.key.pem"), &fixture("kicker.mcollective.cert.pem")).unwrap()
}

fn caller() -> Caller {
    Caller { sender: "puppet.example.com".into(), certname: "kicker.mcollective".into() }
}

const TARGET: &str = "web1.example.com";
const ID: &str = "0123456789abcdef0123456789abcdef";
const NOW: i64 = 1_764_300_000;

fn id() -> RequestId {
    RequestId::parse(ID).unwrap()
}

fn inputs() -> RunOnce {
    RunOnce { force: Some(true), splay: Some(false), splaylimit: Some(30), environment: Some("production".into()) }
}

fn to() -> Destination<'static> {
    Destination { collective: "production", targets: &[TARGET] }
}

fn build(inputs: &RunOnce) -> DirectedRequest {
    directed_request(&credentials(), &caller(), to(), Action::RunOnce(inputs), id(), 60, NOW).unwrap()
}

fn object<'a>(value: &'a Value, what: &str) -> &'a serde_json::Map<String, Value> {
    value.as_object().unwrap_or_else(|| panic!("{what} is not an object: {value}"))
}

fn string<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or_else(|| panic!("{key} is not a string in {value}"))
}

/// The three layers of a built request, each parsed.
struct Layers {
    transport: Value,
    secure: Value,
    request: Value,
    rpc: Value,
}

fn layers(request: &DirectedRequest) -> Layers {
    let transport: Value = serde_json::from_slice(&request.payload).unwrap();
    let secure: Value = serde_json::from_slice(&BASE64.decode(string(&transport, "data")).unwrap()).unwrap();
    let inner: Value = serde_json::from_str(string(&secure, "message")).unwrap();
    let rpc: Value = serde_json::from_slice(&BASE64.decode(string(&inner, "message")).unwrap()).unwrap();
    Layers { transport, secure, request: inner, rpc }
}

#[test]
fn both_key_encodings_puppet_writes_sign_as_openssl_does() {
    let message = fixture("signed.txt");
    let by_openssl = fixture("signed.txt.sig");
    let cert = fixture("kicker.mcollective.cert.pem");
    for key in ["kicker.mcollective.key.pem", "kicker.mcollective.key.pk8.pem"] {
        let credentials = Credentials::from_pem(&fixture(key), &cert).unwrap();
        // PKCS#1 v1.5 is deterministic: the same key signs the same bytes alike.
        assert_eq!(credentials.sign(&message).unwrap(), by_openssl, "{key}");
        assert_eq!(credentials.public_key_der(), fixture("kicker.mcollective.pub.der").as_slice(), "{key}");
    }
}

#[test]
fn unusable_credentials_are_refused_naming_the_file_at_fault() {
    let key = fixture("kicker.mcollective.key.pem");
    let cert = fixture("kicker.mcollective.cert.pem");
    let other = fixture("other.key.pem");
    assert_eq!(Credentials::from_pem(&other, &cert).unwrap_err(), CredentialError::KeyNotCertificates);
    assert_eq!(Credentials::from_pem(b"not a key", &cert).unwrap_err(), CredentialError::KeyNotPem);
    assert_eq!(Credentials::from_pem(&cert, &cert).unwrap_err(), CredentialError::KeyNotPem);
    assert_eq!(Credentials::from_pem(&key, b"").unwrap_err(), CredentialError::CertificateNotPem);
    assert_eq!(Credentials::from_pem(&key, &key).unwrap_err(), CredentialError::CertificateNotPem);
    let two = [cert.clone(), cert.clone()].concat();
    assert_eq!(Credentials::from_pem(&key, &two).unwrap_err(), CredentialError::SeveralCertificates(2));
    let ec = b"-----BEGIN EC PRIVATE KEY-----\nMAA=\n-----END EC PRIVATE KEY-----\n";
    assert_eq!(Credentials::from_pem(ec, &cert).unwrap_err(), CredentialError::KeyNotRsa);
}

#[test]
fn credentials_never_show_the_key() {
    let shown = format!("{:?}", credentials());
    assert!(shown.contains("4096-bit RSA, redacted"), "{shown}");
    let pem = String::from_utf8(fixture("kicker.mcollective.key.pem")).unwrap();
    let body_line = pem.lines().nth(1).unwrap();
    assert!(!shown.contains(body_line), "{shown}");
}

#[test]
fn a_runonce_goes_to_the_target_and_its_reply_to_our_private_subject() {
    let request = build(&inputs());
    assert_eq!(request.subjects, ["production.node.web1.example.com"]);
    // md5sum of `choria=kicker.mcollective`, the caller id: the subject a Choria
    // broker lets this caller subscribe to.
    assert_eq!(request.reply_to, format!("production.reply.97a9a9546c73458e71edba7b43f4c8d1.{ID}"));
    assert_eq!(request.request_id, id());

    let Layers { transport, .. } = layers(&request);
    assert_eq!(string(&transport, "protocol"), "choria:transport:1");
    let headers = &transport["headers"];
    assert_eq!(string(headers, "reply-to"), request.reply_to);
    assert_eq!(string(headers, "mc_sender"), "puppet.example.com");
}

#[test]
fn one_request_for_several_targets_goes_to_each_with_every_target_in_its_filter() {
    let targets = ["web1.example.com", "web2.example.com", "db1.example.com"];
    let to = Destination { collective: "production", targets: &targets };
    let request = directed_request(&credentials(), &caller(), to, Action::RunOnce(&inputs()), id(), 60, NOW).unwrap();
    assert_eq!(
        request.subjects,
        ["production.node.web1.example.com", "production.node.web2.example.com", "production.node.db1.example.com"]
    );
    assert_eq!(request.reply_to, format!("production.reply.97a9a9546c73458e71edba7b43f4c8d1.{ID}"));
    let Layers { request: inner, .. } = layers(&request);
    assert_eq!(inner["envelope"]["filter"]["identity"], json!(targets));

    // Each reply is told by its sender; a sender outside the request is refused.
    let id = id();
    let expected = Expected { request_id: &id, targets: &targets };
    for target in targets {
        let reply =
            ServerReply { senderid: target.into(), mc_sender: Some(target.into()), ..ServerReply::ok(started()) };
        assert_eq!(decode_reply(&reply.bytes(), &expected).unwrap().sender, target);
    }
    let outsider = ServerReply { senderid: "web3.example.com".into(), mc_sender: None, ..ServerReply::ok(started()) };
    assert!(matches!(decode_reply(&outsider.bytes(), &expected), Err(ReplyError::Sender { field: "senderid", .. })));
    // A header naming one target over an envelope naming another: refused.
    let mixed = ServerReply {
        senderid: "web1.example.com".into(),
        mc_sender: Some("web2.example.com".into()),
        ..ServerReply::ok(started())
    };
    assert!(matches!(decode_reply(&mixed.bytes(), &expected), Err(ReplyError::Sender { field: "senderid", .. })));
}

#[test]
fn a_request_names_1_to_64_targets_none_twice() {
    let build = |targets: &[&str]| {
        let to = Destination { collective: "production", targets };
        directed_request(&credentials(), &caller(), to, Action::RunOnce(&inputs()), id(), 60, NOW)
    };
    assert_eq!(build(&[]).unwrap_err(), RequestError::TargetCount { count: 0, limit: MAX_TARGETS });
    let names: Vec<String> = (0..=MAX_TARGETS).map(|i| format!("web{i}.example.com")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert!(build(&names[..MAX_TARGETS]).is_ok());
    assert_eq!(build(&names).unwrap_err(), RequestError::TargetCount { count: 65, limit: MAX_TARGETS });
    let twice = build(&["web1.example.com", "db1.example.com", "web1.example.com"]).unwrap_err();
    assert_eq!(twice, RequestError::TargetTwice("web1.example.com".into()));
    assert_eq!(twice.to_string(), "a Choria request names target \"web1.example.com\" twice");
}

#[test]
fn the_secure_request_is_signed_over_the_request_text_with_the_certificate_attached() {
    let Layers { secure, .. } = layers(&build(&inputs()));
    // secure_request.json's required fields.
    assert_eq!(object(&secure, "secure request").len(), 4, "{secure}");
    assert_eq!(string(&secure, "protocol"), "choria:secure:request:1");
    let cert = String::from_utf8(fixture("kicker.mcollective.cert.pem")).unwrap();
    assert_eq!(string(&secure, "pubcert"), cert);

    // Verified with the public key openssl wrote, not through the codec's key loading.
    let public = fixture("kicker.mcollective.pub.der");
    let signature = BASE64.decode(string(&secure, "signature")).unwrap();
    let message = string(&secure, "message");
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &public).verify(message.as_bytes(), &signature).unwrap();
    let mut altered = message.as_bytes().to_vec();
    altered[10] ^= 1;
    assert!(UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &public).verify(&altered, &signature).is_err());
}

#[test]
fn the_request_has_every_field_the_schema_requires() {
    let Layers { request, .. } = layers(&build(&inputs()));
    // request.json: required protocol, message, envelope; the envelope's and the
    // filter's required fields, with their types and bounds.
    assert_eq!(string(&request, "protocol"), "choria:request:1");
    assert!(!string(&request, "message").is_empty());
    let envelope = &request["envelope"];
    for key in ["requestid", "senderid", "callerid", "collective", "agent", "ttl", "time", "filter"] {
        assert!(envelope.get(key).is_some(), "envelope lacks {key}: {envelope}");
    }
    assert_eq!(string(envelope, "requestid"), ID);
    assert_eq!(string(envelope, "requestid").len(), 32);
    assert_eq!(string(envelope, "senderid"), "puppet.example.com");
    assert_eq!(string(envelope, "callerid"), "choria=kicker.mcollective");
    assert_eq!(string(envelope, "collective"), "production");
    assert_eq!(string(envelope, "agent"), "puppet");
    assert_eq!(envelope["ttl"].as_i64(), Some(60));
    assert_eq!(envelope["time"].as_i64(), Some(NOW));
    let filter = &envelope["filter"];
    for key in ["fact", "cf_class", "identity", "compound"] {
        assert!(filter[key].is_array(), "filter.{key} is not an array: {filter}");
    }
    assert_eq!(filter["agent"], json!(["puppet"]));
    assert_eq!(filter["identity"], json!([TARGET]));
    assert_eq!(filter["fact"], json!([]));
    assert_eq!(filter["compound"], json!([]));
    // go-choria's field order, so the signed text reads as its own would.
    let text = string(&layers(&build(&inputs())).secure, "message").to_string();
    let order = ["\"requestid\"", "\"senderid\"", "\"callerid\"", "\"collective\"", "\"agent\"", "\"ttl\"", "\"time\""];
    let at: Vec<usize> = order.iter().map(|k| text.find(k).unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
}

#[test]
fn the_rpc_body_carries_only_the_inputs_set() {
    let Layers { rpc, .. } = layers(&build(&inputs()));
    assert_eq!(
        rpc,
        json!({"agent": "puppet", "action": "runonce",
               "data": {"environment": "production", "force": true, "splay": false, "splaylimit": 30}})
    );
    let Layers { rpc, .. } = layers(&build(&RunOnce::default()));
    assert_eq!(rpc, json!({"agent": "puppet", "action": "runonce", "data": {}}));
    let only_force = RunOnce { force: Some(true), ..RunOnce::default() };
    assert_eq!(layers(&build(&only_force)).rpc["data"], json!({"force": true}));
}

#[test]
fn the_same_request_is_the_same_bytes() {
    assert_eq!(build(&inputs()), build(&inputs()));
}

#[test]
fn names_that_cannot_be_subjects_are_refused_by_name() {
    let bad = |collective: &str, target: &str| {
        let to = Destination { collective, targets: &[target] };
        directed_request(&credentials(), &caller(), to, Action::RunOnce(&inputs()), id(), 60, NOW).unwrap_err()
    };
    for target in ["", "web 1", "web*", "web.>", "web..example", ".web", "web.", "web\n1"] {
        assert_eq!(bad("production", target), RequestError::BadName { what: "target", value: target.into() });
    }
    for collective in ["", "prod.uction", "prod uction", "*", ">"] {
        assert!(matches!(bad(collective, TARGET), RequestError::BadName { what: "collective", .. }), "{collective:?}");
    }
    let long = "a".repeat(256);
    assert!(matches!(bad("production", &long), RequestError::BadName { what: "target", .. }));

    let sender = Caller { sender: "my host".into(), ..caller() };
    let err = directed_request(&credentials(), &sender, to(), Action::RunOnce(&inputs()), id(), 60, NOW).unwrap_err();
    assert!(matches!(err, RequestError::BadName { what: "sender", .. }), "{err}");
}

#[test]
fn a_short_ttl_and_an_environment_the_agent_rejects_are_refused() {
    let err = directed_request(&credentials(), &caller(), to(), Action::RunOnce(&inputs()), id(), 29, NOW).unwrap_err();
    assert_eq!(err, RequestError::TtlTooShort(29));
    assert!(directed_request(&credentials(), &caller(), to(), Action::RunOnce(&inputs()), id(), MIN_TTL, NOW).is_ok());
    for env in ["", "prod-1", "a b", &"e".repeat(51)] {
        let inputs = RunOnce { environment: Some(env.to_string()), ..inputs() };
        let err =
            directed_request(&credentials(), &caller(), to(), Action::RunOnce(&inputs), id(), 60, NOW).unwrap_err();
        assert!(matches!(err, RequestError::BadEnvironment(_)), "{env:?}: {err}");
    }
}

#[test]
fn request_ids_are_32_lowercase_hex_digits() {
    let a = RequestId::random().unwrap();
    let b = RequestId::random().unwrap();
    assert_ne!(a, b);
    assert_eq!(RequestId::parse(a.as_str()).unwrap(), a);
    for bad in
        ["", "0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef0123456789abcde", "g123456789abcdef0123456789abcdef"]
    {
        assert!(matches!(RequestId::parse(bad), Err(RequestError::BadRequestId(_))), "{bad:?}");
    }
}

// Replies, made here as a Choria server makes them (go-choria NewReply, NewSecureReply,
// NewTransportForSecureReply).

/// The RPC reply, the reply's envelope, and how the layers are then wrapped.
struct ServerReply {
    rpc: Value,
    requestid: String,
    senderid: String,
    mc_sender: Option<String>,
    agent: String,
    base64_message: bool,
    hash_of: Option<String>,
}

impl ServerReply {
    fn ok(rpc: Value) -> ServerReply {
        ServerReply {
            rpc,
            requestid: ID.into(),
            senderid: TARGET.into(),
            mc_sender: Some(TARGET.into()),
            agent: "puppet".into(),
            base64_message: false,
            hash_of: None,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let rpc = self.rpc.to_string();
        let message = if self.base64_message { BASE64.encode(&rpc) } else { rpc };
        let reply = json!({
            "protocol": "choria:reply:1",
            "message": message,
            "envelope": {"requestid": self.requestid, "senderid": self.senderid, "agent": self.agent, "time": NOW + 5},
        })
        .to_string();
        let hashed = self.hash_of.clone().unwrap_or_else(|| reply.clone());
        let hash = BASE64.encode(digest(&SHA256, hashed.as_bytes()));
        let secure = json!({"protocol": "choria:secure:reply:1", "message": reply, "hash": hash}).to_string();
        let mut headers = json!({"seen-by": [["", TARGET, "nats1"]]});
        if let Some(sender) = &self.mc_sender {
            headers["mc_sender"] = json!(sender);
        }
        json!({"protocol": "choria:transport:1", "data": BASE64.encode(secure), "headers": headers})
            .to_string()
            .into_bytes()
    }
}

fn started() -> Value {
    json!({"statuscode": 0, "statusmsg": "OK",
           "data": {"summary": "Signalled the running Puppet Daemon", "initiated_at": NOW + 4}})
}

fn decode(reply: &ServerReply) -> Result<ActionReply, ReplyError> {
    let id = id();
    decode_reply(&reply.bytes(), &Expected { request_id: &id, targets: &[TARGET] })
}

#[test]
fn a_started_run_is_read_with_the_servers_clock() {
    let reply = decode(&ServerReply::ok(started())).unwrap();
    assert_eq!(reply.statuscode, 0);
    assert_eq!(reply.summary(), Some("Signalled the running Puppet Daemon"));
    assert_eq!(reply.initiated_at(), Some(NOW + 4));
    assert_eq!(reply.outcome(), Outcome::StartedAt((NOW + 4) * 1000));

    // Without `initiated_at` (an older agent): the reply's own time, also the server's.
    let older = json!({"statuscode": 0, "statusmsg": "OK",
                       "data": {"summary": "Started a Puppet run using the 'puppet agent --onetime' command"}});
    assert_eq!(decode(&ServerReply::ok(older)).unwrap().outcome(), Outcome::StartedAt((NOW + 5) * 1000));

    // The RPC reply as base64 of its JSON is read the same.
    let encoded = ServerReply { base64_message: true, ..ServerReply::ok(started()) };
    assert_eq!(decode(&encoded).unwrap(), decode(&ServerReply::ok(started())).unwrap());
}

#[test]
fn refusals_map_to_the_planners_outcomes() {
    let failing = |code: i64, msg: &str| {
        let rpc = json!({"statuscode": code, "statusmsg": msg, "data": {"summary": msg}});
        decode(&ServerReply::ok(rpc)).unwrap().outcome()
    };
    let busy = failing(1, "Puppet is currently applying a catalog, cannot run now");
    assert_eq!(busy, Outcome::Busy("Puppet is currently applying a catalog, cannot run now (status 1)".into()));
    match failing(1, "Puppet is disabled: 'maintenance by ops'") {
        Outcome::Disabled(why) => assert!(why.contains("maintenance by ops"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(failing(4, "Input environment does not match validation"), Outcome::Refused(_)));
    assert!(matches!(failing(2, "Unknown action runonce"), Outcome::Refused(_)));
    assert_eq!(failing(5, "boom"), Outcome::Failed("boom (status 5)".into()));
    // The agent's message is kept bounded.
    match failing(5, &"x".repeat(10_000)) {
        Outcome::Failed(why) => assert!(why.len() < 300, "{}", why.len()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_reply_altered_on_the_way_is_refused() {
    let forged = ServerReply { hash_of: Some("something else".into()), ..ServerReply::ok(started()) };
    assert_eq!(decode(&forged).unwrap_err(), ReplyError::HashMismatch);
}

#[test]
fn a_reply_to_another_request_or_from_another_server_is_refused() {
    let other_id = ServerReply { requestid: "f".repeat(32), ..ServerReply::ok(started()) };
    assert_eq!(decode(&other_id).unwrap_err(), ReplyError::RequestId { found: "f".repeat(32) });

    let impostor = ServerReply { senderid: "evil.example.com".into(), ..ServerReply::ok(started()) };
    assert_eq!(
        decode(&impostor).unwrap_err(),
        ReplyError::Sender { field: "senderid", found: "evil.example.com".into() }
    );
    let relayed = ServerReply { mc_sender: Some("evil.example.com".into()), ..ServerReply::ok(started()) };
    assert_eq!(
        decode(&relayed).unwrap_err(),
        ReplyError::Sender { field: "mc_sender", found: "evil.example.com".into() }
    );
    let no_header = ServerReply { mc_sender: None, ..ServerReply::ok(started()) };
    assert!(decode(&no_header).is_ok());

    let agent = ServerReply { agent: "rpcutil".into(), ..ServerReply::ok(started()) };
    assert_eq!(decode(&agent).unwrap_err(), ReplyError::Agent { found: "rpcutil".into() });
}

#[test]
fn garbage_and_oversized_replies_are_refused_before_anything_else() {
    let id = id();
    let expected = Expected { request_id: &id, targets: &[TARGET] };
    assert!(matches!(decode_reply(b"", &expected), Err(ReplyError::Json { layer: "transport", .. })));
    assert!(matches!(decode_reply(b"\xff\x00{", &expected), Err(ReplyError::Json { layer: "transport", .. })));
    let wrong = br#"{"protocol":"choria:transport:2","data":"","headers":{}}"#;
    assert!(matches!(decode_reply(wrong, &expected), Err(ReplyError::Protocol { layer: "transport", .. })));
    let not_base64 = br#"{"protocol":"choria:transport:1","data":"***","headers":{}}"#;
    assert_eq!(decode_reply(not_base64, &expected).unwrap_err(), ReplyError::Base64 { field: "data" });

    // A valid reply padded past the limit: refused for its size alone.
    let mut big = ServerReply::ok(started()).bytes();
    big.resize(MAX_REPLY_BYTES + 1, b' ');
    assert_eq!(
        decode_reply(&big, &expected).unwrap_err(),
        ReplyError::TooLarge { len: MAX_REPLY_BYTES + 1, limit: MAX_REPLY_BYTES }
    );
    let bad_rpc = ServerReply::ok(json!({"statusmsg": "OK"}));
    assert!(matches!(decode(&bad_rpc), Err(ReplyError::Json { layer: "RPC reply", .. })));
}

#[test]
fn errors_name_the_input_at_fault() {
    let e = ReplyError::Sender { field: "senderid", found: "evil".into() };
    assert_eq!(e.to_string(), "Choria reply's senderid \"evil\" is not a target of the request");
    let e = RequestError::BadName { what: "target", value: "web 1".into() };
    assert_eq!(e.to_string(), "Choria target \"web 1\" cannot be used in a NATS subject or a Choria envelope");
    assert_eq!(
        CredentialError::KeyNotCertificates.to_string(),
        "the Choria client certificate is not the client key's (their public keys differ)"
    );
}

#[test]
fn a_rollouts_actions_are_requests_of_the_puppet_agent_with_the_ddls_inputs() {
    let sent = |action: Action<'_>| {
        let request = directed_request(&credentials(), &caller(), to(), action, id(), 60, NOW).unwrap();
        let transport: Value = serde_json::from_slice(&request.payload).unwrap();
        let secure: Value = serde_json::from_slice(&BASE64.decode(string(&transport, "data")).unwrap()).unwrap();
        let request: Value = serde_json::from_str(string(&secure, "message")).unwrap();
        let rpc: Value = serde_json::from_slice(&BASE64.decode(string(&request, "message")).unwrap()).unwrap();
        (string(&rpc, "action").to_string(), rpc["data"].clone())
    };
    let message = "puppet kicker rollout 20261129-0700";
    assert_eq!(sent(Action::Disable { message }), ("disable".into(), json!({"message": message})));
    assert_eq!(sent(Action::Enable), ("enable".into(), json!({})));
    assert_eq!(sent(Action::LastRunSummary), ("last_run_summary".into(), json!({})));

    // `disable`'s message as the DDL validates it: shellsafe, at most 120 characters.
    for bad in ["rollout; rm -rf /", "a `b`", "$HOME", "a\nb", &"x".repeat(121)] {
        let err = directed_request(&credentials(), &caller(), to(), Action::Disable { message: bad }, id(), 60, NOW)
            .unwrap_err();
        assert!(matches!(err, RequestError::BadMessage(_)), "{bad:?}: {err}");
        assert!(err.to_string().starts_with("disable message "), "{err}");
    }
    assert!(directed_request(
        &credentials(),
        &caller(),
        to(),
        Action::Disable { message: &"x".repeat(120) },
        id(),
        60,
        NOW
    )
    .is_ok());
}

#[test]
fn disable_and_enable_replies_say_done_or_the_agents_reason() {
    let done = json!({"statuscode": 0, "statusmsg": "OK",
                      "data": {"status": "Succesfully locked the Puppet agent: puppet kicker rollout 1", "enabled": false}});
    assert_eq!(decode(&ServerReply::ok(done)).unwrap().done(), Ok(()));
    let refused = json!({"statuscode": 1, "statusmsg": "Could not disable Puppet: Already disabled",
                         "data": {"status": "Could not disable Puppet: Already disabled", "enabled": false}});
    assert_eq!(
        decode(&ServerReply::ok(refused)).unwrap().done(),
        Err("Could not disable Puppet: Already disabled (status 1)".into())
    );
    // Without `status`, the RPC reply's own message.
    let bare = json!({"statuscode": 5, "statusmsg": "boom"});
    assert_eq!(decode(&ServerReply::ok(bare)).unwrap().done(), Err("boom (status 5)".into()));
}

#[test]
fn a_last_run_summary_reply_is_read_as_the_last_run() {
    let summary = |failed: i64, changed: i64, failure: i64| {
        json!({"statuscode": 0, "statusmsg": "OK", "data": {
            "lastrun": NOW - 60, "since_lastrun": 60, "failed_resources": failed, "changed_resources": changed,
            "total_resources": 7, "out_of_sync_resources": changed, "config_version": "1700000000",
            "summary": {"version": {"config": "1700000000", "puppet": "7.23.0"},
                        "resources": {"changed": changed, "failed": failed, "total": 7},
                        "time": {"last_run": NOW - 60}, "events": {"failure": failure, "success": changed, "total": changed + failure}}}})
    };
    let read = |rpc: Value| decode(&ServerReply::ok(rpc)).unwrap().last_run().unwrap();
    let at = Some((NOW - 60) * 1000);
    assert_eq!(read(summary(0, 0, 0)), LastRun { at, status: RunStatus::Unchanged });
    assert_eq!(read(summary(0, 2, 0)), LastRun { at, status: RunStatus::Changed });
    assert_eq!(read(summary(1, 2, 0)), LastRun { at, status: RunStatus::Failed });
    assert_eq!(read(summary(0, 2, 1)), LastRun { at, status: RunStatus::Failed });
    // A catalog that failed to compile leaves a summary without resources.
    let no_catalog = json!({"statuscode": 0, "statusmsg": "OK", "data": {
        "lastrun": NOW - 60, "total_resources": 0, "summary": {"time": {"last_run": NOW - 60}, "version": {"puppet": "7.23.0"}}}});
    assert_eq!(read(no_catalog), LastRun { at, status: RunStatus::Failed });
    // No run yet: the agent's empty summary says last_run 0.
    let never = json!({"statuscode": 0, "statusmsg": "OK", "data": {"lastrun": 0, "summary": {}}});
    assert_eq!(read(never).at, None);
    // An agent that failed to answer: its reason, not a run.
    let failed = json!({"statuscode": 5, "statusmsg": "Could not load the summary"});
    assert_eq!(
        decode(&ServerReply::ok(failed)).unwrap().last_run(),
        Err("Could not load the summary (status 5)".into())
    );
}
