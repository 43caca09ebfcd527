//! What gatewarden's protocol fakes read and write on the wire, written once:
//!
//! * [`form`]: `multipart/form-data` bodies (RFC 7578), as every fake that takes uploads
//!   receives them (crates/telegram-fake, crates/discord-fake, and crates/testkit's Slack,
//!   Mattermost and WhatsApp fakes).
//! * [`http1`]: one blocking HTTP/1.1 request reader (bounded head and body) and response
//!   writer for crates/testkit's hand-written fakes.
//!
//! Standard library only: the fakes' binaries stay lean, and it builds wherever they do.

pub mod form;
pub mod http1;
