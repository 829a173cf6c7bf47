//! Native mcollective 2.x client (no Ruby): discovery and RPC against
//! existing mcollectived daemons through RabbitMQ or ActiveMQ, with the
//! operator's own `client.cfg` and the `psk` security provider.
//!
//! Layers, bottom up: [`stomp`] frames, [`marshal`] values (and [`marshal_reader`],
//! the same streams read in place), [`psk`]
//! signatures, [`message`] bodies, [`config`] file, [`connector`]
//! destinations/headers, [`tls`] broker connections, [`client`] I/O. Wire facts:
//! each module's doc, and `tests/fixtures/frames/README.md` for the captured traffic
//! they are byte-exact with (versions, brokers, destinations, body layers).

pub mod client;
pub mod config;
pub mod connector;
pub mod error;
pub mod marshal;
pub mod marshal_reader;
pub mod md5_lanes;
pub mod message;
pub mod psk;
pub mod stomp;
pub mod tls;

pub use client::{Client, ClientStats, RawOutcome, RpcOutcome, RpcReply};
pub use config::{BrokerHost, Config, ConnectorKind, Overrides, ReplyLimits};
pub use error::{Error, Result};
pub use marshal::{Encoding, Value};
pub use message::{FactFilter, Filter};
