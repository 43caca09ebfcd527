//! Chat commands, decided without side effects: the text and its sender in, a
//! [`CommandOutcome`] out. Who may run what is data ([`Admins`], from config.toml), so the one
//! rule is tested here without a gateway; carrying a command out is the worker's
//! (`Work::command`, worker/commands.rs).

use std::collections::BTreeMap;

/// A parsed chat command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Status,
    Restart,
    Stop,
    Help,
    /// Start a fresh conversation in this chat.
    New,
    Update,
    /// Stop this chat's runs in flight.
    Cancel,
    /// Answer the approval the agent asks in this chat (hermes): yes.
    Approve,
    /// …: no.
    Deny,
    /// `/approve CODE`: approve the sender a pairing code was given to (admins). Told from a
    /// hermes approval's `/approve` by its argument's shape (access/pairing.rs `is_code`).
    Pair,
    /// `/revoke USER`: take a sender's approval back (admins).
    Revoke,
}

/// `/help`'s reply.
pub const HELP: &str = "commands: /status, /new (fresh conversation), /cancel (stop the reply being written), /approve or /deny (what the agent asks), /restart (admins), /stop (admins), /update (admins), /approve CODE and /revoke USER (admins: who may talk to me), /help";

impl Command {
    /// What the user typed, for replies.
    pub fn name(self) -> &'static str {
        match self {
            Command::Status => "/status",
            Command::Restart => "/restart",
            Command::Stop => "/stop",
            Command::Help => "/help",
            Command::New => "/new",
            Command::Update => "/update",
            Command::Cancel => "/cancel",
            Command::Approve | Command::Pair => "/approve",
            Command::Deny => "/deny",
            Command::Revoke => "/revoke",
        }
    }

    /// Every command, in menu order: the platforms' command menus list these (a new command
    /// belongs here too, or no menu shows it). [`Command::Pair`] is `/approve` with a code: the
    /// menu's `/approve` entry covers it.
    pub const ALL: [Command; 10] = [
        Command::Status,
        Command::New,
        Command::Cancel,
        Command::Approve,
        Command::Deny,
        Command::Help,
        Command::Restart,
        Command::Stop,
        Command::Update,
        Command::Revoke,
    ];

    /// One line for a platform's command menu.
    pub fn description(self) -> &'static str {
        match self {
            Command::Status => "the gateway's state",
            Command::Restart => "restart the gateway (admins)",
            Command::Stop => "stop the gateway (admins)",
            Command::Help => "the commands",
            Command::New => "start a fresh conversation",
            Command::Update => "install the configured release (admins)",
            Command::Cancel => "stop the reply being written",
            Command::Approve => "allow what the agent asks",
            Command::Deny => "refuse what the agent asks",
            Command::Pair => "approve a pairing code (admins)",
            Command::Revoke => "take a sender's approval back (admins)",
        }
    }

    /// Whether only an admin may run it (see [`Admins::may_run`]).
    pub fn needs_admin(self) -> bool {
        matches!(self, Command::Restart | Command::Stop | Command::Update | Command::Pair | Command::Revoke)
    }
}

/// The word after the command (`/approve XKGH5N7P` → `XKGH5N7P`), if any.
pub fn argument(text: &str) -> Option<&str> {
    text.split_whitespace().nth(1)
}

/// `/restart`, `/restart@botname` and `/restart now` are commands; `/unknown` and text that
/// merely mentions `/restart` are ordinary messages.
pub fn parse_command(text: &str) -> Option<Command> {
    let word = text.split_whitespace().next()?;
    let name = word.strip_prefix('/')?.split('@').next()?;
    Some(match name.to_ascii_lowercase().as_str() {
        "status" => Command::Status,
        "restart" => Command::Restart,
        "stop" => Command::Stop,
        "help" => Command::Help,
        "new" => Command::New,
        "update" => Command::Update,
        "cancel" => Command::Cancel,
        "approve" if argument(text).is_some_and(crate::access::pairing::is_code) => Command::Pair,
        "approve" => Command::Approve,
        "deny" => Command::Deny,
        "revoke" => Command::Revoke,
        _ => return None,
    })
}

/// The chat platforms' command menu (Telegram's `setMyCommands`): every command, the admin
/// ones marked so that only admins' chats show them.
pub fn menu() -> Vec<gatewarden_platforms::MenuCommand> {
    Command::ALL
        .iter()
        .map(|c| gatewarden_platforms::MenuCommand {
            name: c.name().trim_start_matches('/').to_owned(),
            description: c.description().to_owned(),
            admin: c.needs_admin(),
        })
        .collect()
}

/// The channel a chat message came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel<'a> {
    /// The HTTP API (`/v1/messages`): its user ids are only identities with the API token.
    Http,
    /// A chat platform adapter, by name: its user ids are the platform's.
    Platform(&'a str),
}

/// Who sent a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender<'a> {
    pub channel: Channel<'a>,
    pub user_id: &'a str,
}

/// `[[platform]] admins` by adapter name, as config.toml says.
pub fn platform_admins(config: &gatewarden_config::Config) -> BTreeMap<String, Vec<String>> {
    config.platform.iter().map(|p| (p.adapter_name(), p.admins.clone())).collect()
}

/// Who may run the admin commands, as config.toml says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admins {
    /// Top-level `admins`: HTTP identities.
    pub http: Vec<String>,
    /// Whether `api_token` is set: without it a user id in a request body is not an identity,
    /// so nobody is an admin over HTTP (the local owner uses the control socket).
    pub api_token: bool,
    /// `[[platform]] admins`, by adapter name.
    pub platforms: BTreeMap<String, Vec<String>>,
}

impl Admins {
    /// The one rule for who may run which command: `/restart`, `/stop` and `/update` need an
    /// admin of the channel the command came through — a chat platform's `[[platform]] admins`
    /// (its identities are the platform's), or over HTTP a top-level `admins` entry that came
    /// with the API token. Everything else is for everyone.
    pub fn may_run(&self, cmd: Command, from: Sender<'_>) -> bool {
        let listed = |ids: &[String]| ids.iter().any(|a| a == from.user_id);
        !cmd.needs_admin()
            || match from.channel {
                Channel::Platform(p) => self.platforms.get(p).is_some_and(|ids| listed(ids)),
                Channel::Http => self.api_token && listed(&self.http),
            }
    }

    /// Whether `from` is an admin of the channel it came through (the rule of [`Admins::may_run`]).
    pub fn is_admin(&self, from: Sender<'_>) -> bool {
        self.may_run(Command::Stop, from)
    }

    /// Who may answer an approval the agent asked in a chat (`/approve`, `/deny`): the user
    /// whose message started the run (`asker`), or an admin of the channel.
    pub fn may_answer(&self, from: Sender<'_>, asker: &str) -> bool {
        from.user_id == asker || self.is_admin(from)
    }

    /// The reply to a sender who may not run `cmd`.
    fn refusal(&self, cmd: Command, from: Sender<'_>) -> String {
        match from.channel {
            Channel::Platform(_) => {
                format!("{} is for this platform's admins ([[platform]] admins in config.toml)", cmd.name())
            }
            Channel::Http if self.api_token => "commands are for the admins listed in config.toml".into(),
            Channel::Http => "commands need api_token and your user id in admins (config.toml); on this machine use `gatewarden stop`, `gatewarden restart` or `gatewarden send /stop`".into(),
        }
    }
}

/// What a chat message is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandOutcome {
    /// Not a command: an ordinary message for the agent.
    Message,
    /// A command its sender may not run; `reply` says who may.
    Refused { cmd: Command, reply: String },
    /// A command to carry out.
    Run(Command),
}

/// Decides what `text` from `from` is.
pub fn decide(text: &str, from: Sender<'_>, admins: &Admins) -> CommandOutcome {
    match parse_command(text) {
        None => CommandOutcome::Message,
        Some(cmd) if admins.may_run(cmd, from) => CommandOutcome::Run(cmd),
        Some(cmd) => CommandOutcome::Refused { cmd, reply: admins.refusal(cmd, from) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_recognised_only_at_the_start() {
        assert_eq!(parse_command("/restart"), Some(Command::Restart));
        assert_eq!(parse_command("  /RESTART now"), Some(Command::Restart));
        assert_eq!(parse_command("/stop@gatewarden_bot"), Some(Command::Stop));
        assert_eq!(parse_command("/status"), Some(Command::Status));
        assert_eq!(parse_command("/help"), Some(Command::Help));
        assert_eq!(parse_command("/new"), Some(Command::New));
        assert_eq!(parse_command("/update"), Some(Command::Update));
        assert_eq!(parse_command("/cancel"), Some(Command::Cancel));
        assert_eq!(parse_command("/approve@bot"), Some(Command::Approve));
        assert_eq!(parse_command("/deny please"), Some(Command::Deny));
        // A pairing code is told from a hermes approval by its shape.
        assert_eq!(parse_command("/approve XKGH5N7P"), Some(Command::Pair));
        assert_eq!(parse_command("/approve@bot xkgh5n7p"), Some(Command::Pair));
        assert_eq!(parse_command("/approve it"), Some(Command::Approve));
        assert_eq!(parse_command("/approve XKGH0N7P"), Some(Command::Approve), "0 is not in a code");
        assert_eq!(parse_command("/revoke 102"), Some(Command::Revoke));
        assert_eq!(argument("/revoke  102 now"), Some("102"));
        assert_eq!(parse_command("please /restart"), None);
        assert_eq!(parse_command("/unknown"), None);
        assert_eq!(parse_command(""), None);
    }

    /// The menu lists every command once, each a command its parser knows.
    #[test]
    fn the_menu_is_every_command() {
        let m = menu();
        assert_eq!(m.len(), Command::ALL.len());
        for c in &m {
            let parsed = parse_command(&format!("/{}", c.name)).expect("a known command");
            assert_eq!(parsed.needs_admin(), c.admin, "{}", c.name);
        }
        assert!(m.iter().any(|c| c.name == "status" && !c.admin) && m.iter().any(|c| c.name == "restart" && c.admin));
    }

    fn admins(token: bool) -> Admins {
        Admins {
            http: vec!["u-admin".into()],
            api_token: token,
            platforms: BTreeMap::from([("tg".to_owned(), vec!["42".to_owned()])]),
        }
    }

    const fn http(user_id: &str) -> Sender<'_> {
        Sender { channel: Channel::Http, user_id }
    }

    const fn tg(user_id: &str) -> Sender<'_> {
        Sender { channel: Channel::Platform("tg"), user_id }
    }

    #[test]
    fn everyone_may_ask_for_status_help_and_new() {
        let a = admins(false);
        for text in ["/status", "/help", "/new", "/cancel", "/approve", "/deny"] {
            for from in [http("anyone"), tg("7"), Sender { channel: Channel::Platform("nope"), user_id: "" }] {
                assert!(matches!(decide(text, from, &a), CommandOutcome::Run(_)), "{text} from {from:?}");
            }
        }
        assert_eq!(decide("hello /restart", http("anyone"), &a), CommandOutcome::Message);
    }

    /// Pairing decisions in chat are an admin's, like /restart: a stranger cannot approve itself.
    #[test]
    fn pairing_commands_need_an_admin() {
        let a = admins(true);
        assert_eq!(decide("/approve XKGH5N7P", tg("42"), &a), CommandOutcome::Run(Command::Pair));
        assert_eq!(decide("/revoke 7", tg("42"), &a), CommandOutcome::Run(Command::Revoke));
        assert!(matches!(decide("/approve XKGH5N7P", tg("7"), &a), CommandOutcome::Refused { cmd: Command::Pair, .. }));
        assert!(matches!(decide("/revoke 42", tg("7"), &a), CommandOutcome::Refused { cmd: Command::Revoke, .. }));
        assert_eq!(decide("/approve", tg("7"), &a), CommandOutcome::Run(Command::Approve), "a hermes approval");
    }

    /// Over HTTP an admin is a listed id that came with the API token; without a token nobody is.
    #[test]
    fn http_admins_need_the_token() {
        for cmd in ["/restart", "/stop", "/update"] {
            assert!(matches!(decide(cmd, http("u-admin"), &admins(true)), CommandOutcome::Run(_)), "{cmd}");
            let CommandOutcome::Refused { reply, .. } = decide(cmd, http("u-admin"), &admins(false)) else {
                panic!("{cmd} without a token must be refused");
            };
            assert!(reply.contains("api_token"), "{reply}");
            let CommandOutcome::Refused { reply, .. } = decide(cmd, http("someone"), &admins(true)) else {
                panic!("{cmd} from a non-admin must be refused");
            };
            assert_eq!(reply, "commands are for the admins listed in config.toml");
        }
    }

    /// A platform's admins are its own: the HTTP admin list does not count there, nor does
    /// another platform's.
    #[test]
    fn platform_admins_are_per_platform() {
        let a = admins(true);
        assert_eq!(decide("/restart", tg("42"), &a), CommandOutcome::Run(Command::Restart));
        let out = decide("/stop@bot", tg("u-admin"), &a);
        assert_eq!(
            out,
            CommandOutcome::Refused {
                cmd: Command::Stop,
                reply: "/stop is for this platform's admins ([[platform]] admins in config.toml)".into()
            }
        );
        let other = Sender { channel: Channel::Platform("matrix"), user_id: "42" };
        assert!(matches!(decide("/restart", other, &a), CommandOutcome::Refused { .. }));
        assert!(matches!(decide("/restart", http("42"), &a), CommandOutcome::Refused { .. }));
    }

    /// An approval is answered by the user who asked the agent, or by an admin of the same
    /// channel; anyone else in the chat cannot.
    #[test]
    fn approvals_are_answered_by_the_asker_or_an_admin() {
        let a = admins(true);
        assert!(a.may_answer(tg("7"), "7"));
        assert!(a.may_answer(tg("42"), "7"), "a tg admin");
        assert!(!a.may_answer(tg("8"), "7"));
        assert!(!a.may_answer(Sender { channel: Channel::Platform("matrix"), user_id: "42" }, "7"));
        assert!(!a.may_answer(http("u-admin"), "7") || a.api_token);
        assert!(!admins(false).may_answer(http("u-admin"), "7"));
    }
}
