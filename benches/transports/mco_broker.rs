//! The mcollective side of benches/transports.rs: a STOMP broker on 127.0.0.1 that
//! answers `runonce` as every daemon of the fleet would. Each SEND is decoded as a
//! request, its PSK signature verified (a daemon drops what fails), and a signed
//! reply with status 0 goes to the request's `reply-to`, from the identity the
//! request was directed to. It is not RabbitMQ: it does no routing, queueing or
//! persistence, so the mcollective figure has no broker's share of the work, where
//! Choria's (a real nats-server) has.

use puppet_kicker::mcollective::marshal::{DecodeLimits, Value};
use puppet_kicker::mcollective::message::{Reply, Request, RpcStatus};
use puppet_kicker::mcollective::stomp::{Frame, FrameReader, FrameWriter, Limits, Version};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub const PSK: &str = "bench-psk";

pub struct Broker {
    port: u16,
    answered: Arc<AtomicUsize>,
}

impl Broker {
    pub fn start() -> Broker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let answered = Arc::new(AtomicUsize::new(0));
        let count = answered.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let count = count.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &count);
                });
            }
        });
        Broker { port, answered }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Requests answered so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

fn serve(stream: TcpStream, answered: &AtomicUsize) -> Result<(), Box<dyn std::error::Error>> {
    stream.set_nodelay(true)?;
    let mut reader = FrameReader::new(stream.try_clone()?, Limits::default());
    let mut writer = FrameWriter::new(stream);
    loop {
        let frame = reader.read_frame()?;
        match frame.command.as_str() {
            "CONNECT" | "STOMP" => {
                let offered = frame.get("accept-version").unwrap_or("1.0");
                let version = offered.split(',').filter_map(Version::parse).max().unwrap_or(Version::V1_0);
                writer.write_frame(
                    &Frame::new("CONNECTED").header("version", version.as_str()).header("heart-beat", "0,0"),
                )?;
                reader.set_version(version);
                writer.set_version(version);
            }
            "DISCONNECT" => {
                if let Some(receipt) = frame.get("receipt") {
                    writer.write_frame(&Frame::new("RECEIPT").header("receipt-id", receipt))?;
                }
                return Ok(());
            }
            "SEND" => {
                let (request, hash) = Request::decode(&frame.body, DecodeLimits::default())?;
                if !puppet_kicker::mcollective::psk::verify(&request.body, PSK, &hash) {
                    continue;
                }
                let destination = frame.get("destination").unwrap_or("");
                let Some(target) = frame
                    .get("mc_identity")
                    .map(str::to_string)
                    .or_else(|| destination.split_once("_directed/").map(|(_, n)| n.to_string()))
                else {
                    continue;
                };
                let body = RpcStatus {
                    statuscode: 0,
                    statusmsg: "OK".into(),
                    data: Value::Hash(vec![(Value::sym("summary"), Value::str("Started a Puppet run"))]),
                }
                .encode()?;
                let reply = Reply {
                    senderid: target,
                    requestid: request.requestid.clone(),
                    senderagent: request.agent.clone(),
                    msgtime: puppet_kicker::time::now(),
                    body: body.into(),
                    signature: None,
                }
                .encode(PSK)?;
                let reply_to = frame.get("reply-to").unwrap_or("/queue/none").to_string();
                writer.write_frame(
                    &Frame::new("MESSAGE")
                        .header("subscription", reply_to.as_str())
                        .header("destination", reply_to.as_str())
                        .header("message-id", "m-1")
                        .body(reply),
                )?;
                answered.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}
