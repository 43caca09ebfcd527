//! The gateway's log, to stderr or to a size-rotated file: plain, journald-friendly lines by
//! default (`<level>: message`, no timestamp, since journald stamps them; a timestamp is added on
//! a terminal), or JSON (`{"ts", "level", "msg"}`).
//!
//! Events go through the `tracing` ecosystem once [`init`] or [`init_file`] has run: the
//! [`info!`](crate::info) / [`warn!`](crate::warn) / [`error!`](crate::error) call sites stay as
//! they are, and a line written inside a span (a message's run: `message_id`, `platform`; see
//! worker/run.rs) carries the span's fields, as JSON keys or as ` [k=v …]` after a plain line. The
//! subscriber is tracing-subscriber's registry with [`Lines`] as its only layer: no fmt, env
//! filter or ANSI features. Before `init` (a CLI verb) lines are written directly, the same way.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use gatewarden_lifecycle::term;

/// Rotate the log file past this size; keep this many older generations.
pub const ROTATE_BYTES: u64 = 5 << 20;
pub const KEEP: u32 = 3;

struct FileSink {
    path: PathBuf,
    file: File,
    size: u64,
}

static FILE: OnceLock<Mutex<FileSink>> = OnceLock::new();

/// Sends log lines to `path` (appending, rotated by size) instead of stderr.
pub fn init_file(path: &Path, format: Format) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        // 0700 whatever the umask (an existing folder's mode is left alone).
        gatewarden_lifecycle::platform::create_private_dir(dir)?;
    }
    // Never through a symlink planted in the home's logs folder.
    let file = gatewarden_lifecycle::fsio::open_append(path)?;
    let size = file.metadata()?.len();
    let _ = FILE.set(Mutex::new(FileSink { path: path.to_owned(), file, size }));
    let _ = FORMAT.set((format, false));
    install();
    Ok(())
}

fn rotate(sink: &mut FileSink) {
    let generation = |n: u32| PathBuf::from(format!("{}.{n}", sink.path.display()));
    for n in (1..KEEP).rev() {
        let _ = std::fs::rename(generation(n), generation(n + 1));
    }
    let _ = std::fs::rename(&sink.path, generation(1));
    if let Ok(f) = gatewarden_lifecycle::fsio::open_append(&sink.path) {
        sink.file = f;
        sink.size = 0;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Plain,
    Json,
}

static FORMAT: OnceLock<(Format, bool)> = OnceLock::new();

/// Chooses the format once; later calls are ignored.
pub fn init(format: Format) {
    let _ = FORMAT.set((format, std::io::stderr().is_terminal()));
    install();
}

/// The process's tracing subscriber: the registry (span storage) and [`Lines`].
fn install() {
    use tracing_subscriber::layer::SubscriberExt;
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Lines));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// The least severe level written (`log_level` in config.toml): 0 info, 1 warn, 2 error.
static MIN_LEVEL: AtomicU8 = AtomicU8::new(0);

/// Sets the least severe level written, at start and by a reload (reload.rs).
pub fn set_level(level: gatewarden_config::LogLevel) {
    let min = match level {
        gatewarden_config::LogLevel::Info => Level::Info,
        gatewarden_config::LogLevel::Warn => Level::Warn,
        gatewarden_config::LogLevel::Error => Level::Error,
    };
    MIN_LEVEL.store(min as u8, Ordering::Relaxed);
}

fn enabled(level: Level) -> bool {
    level as u8 >= MIN_LEVEL.load(Ordering::Relaxed)
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// Logs `msg` at `level`: a tracing event once the subscriber is installed (so the current
/// span's fields join it), else the line itself.
pub fn emit(level: Level, msg: std::fmt::Arguments<'_>) {
    if !tracing::dispatcher::has_been_set() {
        return write(level, msg);
    }
    match level {
        Level::Info => tracing::event!(tracing::Level::INFO, "{}", msg),
        Level::Warn => tracing::event!(tracing::Level::WARN, "{}", msg),
        Level::Error => tracing::event!(tracing::Level::ERROR, "{}", msg),
    }
}

pub fn write(level: Level, msg: std::fmt::Arguments<'_>) {
    line(level, &msg.to_string(), &[]);
}

/// Writes one line with the fields of the spans it happened in (outermost first).
fn line(level: Level, msg: &str, fields: &[(&'static str, String)]) {
    if !enabled(level) {
        return;
    }
    #[cfg(test)]
    if tests::captured(level, msg, fields) {
        return;
    }
    let (format, tty) = *FORMAT.get_or_init(|| (Format::Plain, std::io::stderr().is_terminal()));
    let line = render(format, tty || FILE.get().is_some(), level, msg, fields);
    remember(level, line.trim_end());
    if let Some(sink) = FILE.get() {
        if let Ok(mut sink) = sink.lock() {
            if sink.size + line.len() as u64 > ROTATE_BYTES {
                rotate(&mut sink);
            }
            if sink.file.write_all(line.as_bytes()).is_ok() {
                sink.size += line.len() as u64;
            }
        }
        return;
    }
    // One write per line so concurrent lines do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The last lines logged, for the dashboard's live log tail (bounded: [`RECENT`] lines).
pub const RECENT: usize = 200;
static TAIL: Mutex<std::collections::VecDeque<(&'static str, String)>> = Mutex::new(std::collections::VecDeque::new());

fn remember(level: Level, line: &str) {
    let mut t = TAIL.lock().unwrap_or_else(|p| p.into_inner());
    if t.len() >= RECENT {
        t.pop_front();
    }
    t.push_back((level.as_str(), line.to_owned()));
}

/// The recent lines, oldest first, as `(level, line)`.
pub fn recent() -> Vec<(&'static str, String)> {
    TAIL.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
}

/// One line in `format`; `stamped`: a plain line starts with the time.
fn render(format: Format, stamped: bool, level: Level, msg: &str, fields: &[(&'static str, String)]) -> String {
    let plain_fields = || {
        if fields.is_empty() {
            return String::new();
        }
        let kv: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={}", term::escape(v))).collect();
        format!(" [{}]", kv.join(" "))
    };
    match format {
        Format::Json => {
            let mut v =
                serde_json::json!({"ts": gatewarden_lifecycle::timefmt::now(), "level": level.as_str(), "msg": msg});
            for (k, val) in fields {
                // The line's own keys stay the line's.
                if !matches!(*k, "ts" | "level" | "msg") {
                    v[*k] = serde_json::Value::String(val.clone());
                }
            }
            format!("{v}\n")
        }
        // One line per entry whatever the message holds (chat text, an agent's stderr): a line
        // break or an escape sequence in it can neither forge a line nor reach a terminal.
        Format::Plain if stamped => format!(
            "{} {}: {}{}\n",
            gatewarden_lifecycle::timefmt::now(),
            level.as_str(),
            term::escape(msg),
            plain_fields()
        ),
        Format::Plain => format!("{}: {}{}\n", level.as_str(), term::escape(msg), plain_fields()),
    }
}

/// A span's fields, kept in its registry extensions.
struct SpanFields(Vec<(&'static str, String)>);

/// Collects an event's message or a span's fields as text.
struct Collect<'a> {
    message: Option<String>,
    fields: &'a mut Vec<(&'static str, String)>,
}

impl tracing::field::Visit for Collect<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.put(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.put(field.name(), format!("{value:?}"));
    }
}

impl Collect<'_> {
    fn put(&mut self, name: &'static str, value: String) {
        if name == "message" {
            self.message = Some(value);
        } else if let Some(slot) = self.fields.iter_mut().find(|(k, _)| *k == name) {
            slot.1 = value;
        } else {
            self.fields.push((name, value));
        }
    }
}

/// The layer that writes lines: span fields are stored when a span is made or recorded, and
/// an event is written with the fields of every span it is in.
pub struct Lines;

impl<S> tracing_subscriber::Layer<S> for Lines
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Vec::new();
        attrs.record(&mut Collect { message: None, fields: &mut fields });
        span.extensions_mut().insert(SpanFields(fields));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(SpanFields(fields)) = ext.get_mut::<SpanFields>() {
            values.record(&mut Collect { message: None, fields });
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => Level::Error,
            tracing::Level::WARN => Level::Warn,
            _ => Level::Info,
        };
        let mut fields: Vec<(&'static str, String)> = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(SpanFields(f)) = span.extensions().get::<SpanFields>() {
                    for (k, v) in f {
                        match fields.iter_mut().find(|(name, _)| name == k) {
                            Some(slot) => slot.1.clone_from(v),
                            None => fields.push((k, v.clone())),
                        }
                    }
                }
            }
        }
        let mut own = Vec::new();
        let mut c = Collect { message: None, fields: &mut own };
        event.record(&mut c);
        let msg = c.message.take().unwrap_or_default();
        fields.extend(own);
        line(level, &msg, &fields);
    }
}

#[macro_export]
macro_rules! info { ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Info, format_args!($($t)*)) } }
#[macro_export]
macro_rules! warn { ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Warn, format_args!($($t)*)) } }
#[macro_export]
macro_rules! error { ($($t:tt)*) => { $crate::log::emit($crate::log::Level::Error, format_args!($($t)*)) } }

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use tracing_subscriber::layer::SubscriberExt;

    type Captured = (&'static str, String, Vec<(&'static str, String)>);

    thread_local! {
        static CAPTURE: RefCell<Option<Vec<Captured>>> = const { RefCell::new(None) };
    }

    /// Keeps the line for the test running on this thread (true), if it is capturing.
    pub(super) fn captured(level: Level, msg: &str, fields: &[(&'static str, String)]) -> bool {
        CAPTURE.with(|c| match c.borrow_mut().as_mut() {
            Some(v) => {
                v.push((level.as_str(), msg.to_owned(), fields.to_vec()));
                true
            }
            None => false,
        })
    }

    /// The `info!`/`warn!` call sites, inside a message span and a nested one, through the
    /// registry and [`Lines`]: each line has its level, its text and the spans' fields.
    #[test]
    fn lines_carry_the_fields_of_their_spans() {
        CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Lines);
        tracing::subscriber::with_default(subscriber, || {
            crate::info!("outside {}", 1);
            let span = tracing::info_span!("message", message_id = "m1", platform = tracing::field::Empty);
            let _in = span.enter();
            span.record("platform", "irc");
            crate::warn!("inside {}", 2);
            let inner = tracing::info_span!("provider", provider = "p1");
            let _deeper = inner.enter();
            crate::error!("deeper");
        });
        let got = CAPTURE.with(|c| c.borrow_mut().take()).unwrap();
        let f = |k: &'static str, v: &str| (k, v.to_owned());
        assert_eq!(
            got,
            vec![
                ("info", "outside 1".to_owned(), vec![]),
                ("warn", "inside 2".to_owned(), vec![f("message_id", "m1"), f("platform", "irc")]),
                ("error", "deeper".to_owned(), vec![f("message_id", "m1"), f("platform", "irc"), f("provider", "p1")]),
            ]
        );
    }

    /// The JSON line keeps `ts`, `level` and `msg` (which a span field cannot replace) and adds
    /// the fields; a plain line puts them after the text, where `<level>: ` parsing ignores them.
    #[test]
    fn json_and_plain_lines_with_fields() {
        let fields = vec![("message_id", "m1".to_owned()), ("msg", "not the message".to_owned())];
        let j: serde_json::Value =
            serde_json::from_str(&render(Format::Json, false, Level::Warn, "slow", &fields)).unwrap();
        assert_eq!(
            (j["level"].as_str(), j["msg"].as_str(), j["message_id"].as_str()),
            (Some("warn"), Some("slow"), Some("m1"))
        );
        assert!(j["ts"].as_str().is_some());
        assert_eq!(render(Format::Plain, false, Level::Info, "hi", &fields[..1]), "info: hi [message_id=m1]\n");
        assert_eq!(render(Format::Plain, false, Level::Error, "plain", &[]), "error: plain\n");
        // Outside text cannot add a line or reach a terminal as an escape sequence.
        let hostile = "failed: x\ninfo: forged\u{1b}]0;t\u{7}";
        let chat = [("chat", "a\u{1b}[2J".to_owned())];
        assert_eq!(
            render(Format::Plain, false, Level::Warn, hostile, &chat),
            "warn: failed: x\\ninfo: forged\\x1b]0;t\\x07 [chat=a\\x1b[2J]\n"
        );
    }
}
