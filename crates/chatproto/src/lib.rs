//! gatewarden-chatproto: the wire protocols of the chat platforms the gateway bridges, below the
//! adapter layer (which owns journaling, outboxes, locks and reconnect policy).
//!
//! * [`matrix`]: a blocking Matrix client-server API client (password or token login, `/sync`
//!   long-poll, idempotent sends with transaction ids) over ureq.
//! * [`irc`]: a blocking IRC client over `std::net::TcpStream` (registration, PING/PONG, JOIN,
//!   PRIVMSG with splitting, 433 as a typed conflict, a [`irc::Writer`] for sending from another
//!   thread) and a total line parser.
//!
//! * [`xmpp`]: a blocking XMPP client (STARTTLS, SCRAM, bind, stream management acks, MUC,
//!   the message archive) on quick-xml.
//! * [`ws`]: the WebSocket client (tungstenite over crates/net's rustls) that the Discord,
//!   Slack and Mattermost adapters share.
//!
//! All are blocking by design: an adapter runs each connection on a dedicated thread, as the
//! `openai` backend does with ureq (`crates/agent/src/backend/openai.rs`), and every call is
//! bounded by a timeout, so a thread never hangs on a dead server. Errors carry a
//! [`matrix::ErrorKind`] / [`irc::ErrorKind`] that tells the adapter what to do: retry with
//! backoff (transient), wait (rate limited), park (rejected credentials) or stand by (conflict).
#![warn(missing_docs)]

pub mod irc;
pub mod matrix;
mod wire;
pub mod ws;
pub mod xmpp;
