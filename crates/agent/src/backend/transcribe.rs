//! Voice and audio transcription (issue 29 §1): `[agent.transcription]`, an OpenAI-compatible
//! `POST <base_url>/audio/transcriptions`
//! (https://platform.openai.com/docs/api-reference/audio/createTranscription).
//!
//! - **The request.** `multipart/form-data` with `file` (the stored file, streamed from disk
//!   with a `Content-Length`: never the whole file in memory), `model`, `response_format=json`
//!   and `language` when configured ([`form`]); `Authorization: Bearer <key>` when a key is
//!   named. The answer's `text` is the transcript.
//! - **The client is the openai backend's** (backend/openai.rs): crates/net's TLS (the OS trust
//!   store, or the provider's `ca_file` as the only CA) and proxy rules, the same failure
//!   classes (backend/provider.rs [`classify`]): 429, 408, 409, 5xx, a refused connection or
//!   no answer are retried `[agent] retries` times with its backoff (at least `Retry-After`),
//!   401/403/404 and a broken answer move on to the next provider, other 4xx end the attempt
//!   (every provider would refuse the same file). All of it within `timeout_s`. What the agent
//!   is told of a failure is short and names no address, key or provider's words
//!   ([`Untranscribed`]); the operator's log has the whole reason.
//! - **Bounded.** A file over `max_file_mb` is not sent; the transcript the agent gets is cut at
//!   [`MAX_TRANSCRIPT_CHARS`].
//!
//! The runtime calls [`Transcriber::transcribe`] once per stored audio file, caches the
//! transcript next to the file (crates/platforms/src/attachments.rs) so a re-run does not ask
//! again, and passes it on as text to every backend; a failure names the file and the reason
//! instead, and the run goes on.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gatewarden_config::{AgentConfig, SecretId, Secrets};
use gatewarden_net::multipart::FilePart;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::openai::{ApiKey, Upstream, http_agent, refused, send_failure};
use super::provider::{Backoff, Failure, Pause, Verdict, classify};
use super::truncate;

/// The longest transcript passed to the agent, in characters; the rest is cut with a note.
pub const MAX_TRANSCRIPT_CHARS: usize = 16_000;
/// The largest answer read from a provider.
const MAX_RESPONSE_BYTES: u64 = 4 << 20;

/// `[agent.transcription]`'s providers, tried in order, with their bounds.
#[derive(Debug, Clone)]
pub struct Transcriber {
    providers: Vec<Upstream>,
    language: Option<String>,
    max_bytes: u64,
    timeout: Duration,
    retries: u32,
    backoff: Duration,
}

/// One stored audio file to transcribe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audio {
    pub path: PathBuf,
    /// The sender's file name (`voice.ogg`).
    pub name: String,
    /// Its type as the content shows it (`audio/ogg`).
    pub kind: String,
    pub size: u64,
}

impl Transcriber {
    /// `[agent.transcription]` with the keys of `secrets`; `None` when it is not configured.
    pub fn from_config(c: &AgentConfig, secrets: &Secrets) -> Option<Transcriber> {
        let t = c.transcription.as_ref()?;
        let timeout = t.timeout();
        let providers = t
            .providers()
            .into_iter()
            .map(|p| {
                let name = p.display_name();
                let id = match t.provider.is_empty() {
                    true => SecretId::Transcription,
                    false => SecretId::TranscriptionProvider { name: name.clone() },
                };
                let http = gatewarden_net::Outbound::new(p.ca_file.as_deref(), p.proxy.as_deref())
                    .map(|o| http_agent(&o, timeout))
                    .map_err(|e| format!("transcription provider {name}: {e}"));
                Upstream {
                    url: format!("{}/audio/transcriptions", p.base_url.trim().trim_end_matches('/')),
                    model: p.model.clone(),
                    key: ApiKey::from_resolved(secrets.get(&id)),
                    headers: p.headers.into_iter().collect(),
                    http,
                    name,
                }
            })
            .collect();
        Some(Transcriber {
            providers,
            language: t.language.clone(),
            max_bytes: t.max_file_mb.saturating_mul(1 << 20),
            timeout,
            retries: c.retries,
            backoff: Duration::from_millis(c.backoff_ms),
        })
    }

    /// The largest file sent (`max_file_mb`).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The transcript of `audio`, or why there is none. Each request runs on a plain thread
    /// (see backend/openai.rs on why not `spawn_blocking`); a cancel or the timeout returns at
    /// once and leaves it to end at its own bound.
    pub async fn transcribe(&self, audio: &Audio, cancel: &CancellationToken) -> Result<String, Untranscribed> {
        if audio.size > self.max_bytes {
            let short =
                format!("too large to transcribe ({} bytes > max_file_mb {} MB)", audio.size, self.max_bytes >> 20);
            return Err(Untranscribed { detail: short.clone(), short });
        }
        let deadline = Instant::now() + self.timeout;
        let backoff = Backoff { base: self.backoff };
        let mut tried = Tried::default();
        'providers: for p in &self.providers {
            if let ApiKey::Missing(why) = &p.key {
                tried.push(&p.name, "its key is unavailable".into(), why.clone());
                continue;
            }
            let mut retry = 0u32;
            loop {
                let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                    let why = format!("no answer within timeout_s ({} s)", self.timeout.as_secs());
                    tried.push(&p.name, why.clone(), why);
                    break 'providers;
                };
                let failure = match self.attempt(p, audio, left, cancel).await {
                    Some(Ok(text)) => return Ok(text),
                    Some(Err(f)) => f,
                    None => return Err(Untranscribed { short: "cancelled".into(), detail: "cancelled".into() }),
                };
                match classify(&failure) {
                    Verdict::Fatal => {
                        tried.push(&p.name, short(&failure), failure.reason());
                        break 'providers;
                    }
                    Verdict::Next => {
                        tried.push(&p.name, short(&failure), failure.reason());
                        break;
                    }
                    Verdict::Retry { after } => match backoff.pause(retry, self.retries, after, deadline, cancel).await
                    {
                        Pause::Again => retry += 1,
                        Pause::GiveUp => {
                            tried.push(&p.name, short(&failure), failure.reason());
                            break;
                        }
                        Pause::Cancelled => {
                            return Err(Untranscribed { short: "cancelled".into(), detail: "cancelled".into() });
                        }
                    },
                }
            }
        }
        Err(tried.into())
    }

    /// One request within `left`; `None`: cancelled.
    async fn attempt(
        &self,
        p: &Upstream,
        audio: &Audio,
        left: Duration,
        cancel: &CancellationToken,
    ) -> Option<Result<String, Failure>> {
        let key = match &p.key {
            ApiKey::Value(v) => Some(v.clone()),
            ApiKey::None | ApiKey::Missing(_) => None,
        };
        let http = match &p.http {
            Ok(h) => h.clone(),
            Err(e) => return Some(Err(Failure::Connect(e.clone()))),
        };
        let mut fields = vec![("model", p.model.clone()), ("response_format", "json".to_owned())];
        if let Some(l) = &self.language {
            fields.push(("language", l.clone()));
        }
        let (url, headers, audio) = (p.url.clone(), p.headers.clone(), audio.clone());
        let (tx, rx) = oneshot::channel();
        let spawned = std::thread::Builder::new().name("gatewarden-transcribe".into()).spawn(move || {
            let r = post(&http, &url, key.as_ref().map(|k| k.expose()), &headers, &fields, &audio, left);
            let _ = tx.send(r);
        });
        if let Err(e) = spawned {
            return Some(Err(Failure::Protocol(format!("cannot start a worker thread: {e}"))));
        }
        tokio::select! {
            r = rx => Some(r.unwrap_or_else(|_| Err(Failure::Protocol("the worker thread died".into())))),
            () = tokio::time::sleep(left) => Some(Err(Failure::TimedOut)),
            () = cancel.cancelled() => None,
        }
    }
}

/// Why a file was not transcribed: `short` for the agent's input (and so perhaps the chat's
/// eyes: no address, key name or provider's words, as for a failed run's notice), `detail`
/// for the operator's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untranscribed {
    pub short: String,
    pub detail: String,
}

/// Each provider's failure, in order.
#[derive(Default)]
struct Tried {
    short: Vec<String>,
    detail: Vec<String>,
}

impl Tried {
    fn push(&mut self, provider: &str, short: String, detail: String) {
        if !self.short.contains(&short) {
            self.short.push(short);
        }
        self.detail.push(format!("{provider}: {detail}"));
    }
}

impl From<Tried> for Untranscribed {
    fn from(t: Tried) -> Untranscribed {
        if t.short.is_empty() {
            let none = "no transcription provider is configured".to_owned();
            return Untranscribed { short: none.clone(), detail: none };
        }
        Untranscribed { short: format!("the provider failed: {}", t.short.join("; ")), detail: t.detail.join("; ") }
    }
}

/// A failure in a few words of no secret: the status, or what kind of failure.
fn short(f: &Failure) -> String {
    match f {
        Failure::Status { status, .. } => format!("HTTP {status}"),
        Failure::Connect(_) => "unreachable".into(),
        Failure::TimedOut => "no answer in time".into(),
        Failure::Interrupted(_) => "the answer broke off".into(),
        Failure::Protocol(_) => "an unusable answer".into(),
    }
}

/// The name the file is sent under: the provider tells the format by its extension, so a name
/// without a known one gets the type's (`voice` as `audio/ogg` → `voice.ogg`). One line, no
/// quotes (it sits in a `Content-Disposition` header).
pub fn upload_name(name: &str, kind: &str) -> String {
    const KNOWN: &[&str] = &["flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "opus", "wav", "webm"];
    let clean: String =
        name.chars().map(|c| if c.is_control() || matches!(c, '"' | '\\' | '/') { '_' } else { c }).collect();
    let clean = if clean.trim().is_empty() { "audio".to_owned() } else { clean };
    let ext = clean.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    if ext.as_deref().is_some_and(|e| KNOWN.contains(&e)) {
        return clean;
    }
    let by_type = match kind {
        "audio/ogg" | "audio/opus" => "ogg",
        "audio/mpeg" | "audio/mp3" => "mp3",
        "audio/flac" => "flac",
        "audio/wav" | "audio/x-wav" | "audio/wave" => "wav",
        "audio/mp4" | "audio/m4a" | "audio/x-m4a" | "audio/aac" => "m4a",
        "audio/webm" | "video/webm" => "webm",
        "video/mp4" => "mp4",
        _ => return clean,
    };
    format!("{clean}.{by_type}")
}

/// One `POST` of `audio` to `url`, run on a blocking thread.
fn post(
    http: &ureq::Agent,
    url: &str,
    key: Option<&str>,
    headers: &[(String, String)],
    fields: &[(&str, String)],
    audio: &Audio,
    left: Duration,
) -> Result<String, Failure> {
    let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let name = upload_name(&audio.name, &audio.kind);
    let kind = if audio.kind.is_empty() { "application/octet-stream" } else { audio.kind.as_str() };
    let part = FilePart { field: "file", name: &name, kind, path: &audio.path, size: audio.size };
    // The stored file is content-addressed and never changes: exactly its size is sent.
    let form = gatewarden_net::multipart::body(&fields, part).map_err(Failure::Protocol)?;
    let mut request = http
        .post(url)
        .header("Content-Type", form.content_type)
        .header("Content-Length", form.length.to_string())
        .header("Accept", "application/json");
    for (k, v) in headers {
        request = request.header(k.as_str(), v.as_str());
    }
    if let Some(key) = key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    let request = request.config().timeout_global(Some(left)).build();
    let response = request.send(ureq::SendBody::from_owned_reader(form.body)).map_err(|e| send_failure(e, url))?;
    let mut response = refused(response)?;
    let text = response
        .body_mut()
        .with_config()
        .limit(MAX_RESPONSE_BYTES)
        .read_to_string()
        .map_err(|e| Failure::Interrupted(format!("reading the transcription: {e}")))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::Protocol(format!("the transcription is not JSON ({e}): {}", truncate(&text, 200))))?;
    match value.get("text") {
        Some(Value::String(t)) => Ok(t.clone()),
        _ => Err(Failure::Protocol(format!("the transcription has no text: {}", truncate(&text, 200)))),
    }
}

/// `[voice transcript of voice.ogg: …]`: the line the agent gets for a transcribed file, on one
/// line and cut at [`MAX_TRANSCRIPT_CHARS`].
pub fn transcript_line(name: &str, transcript: &str) -> String {
    let one: String = transcript.trim().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let cut = one.chars().count() > MAX_TRANSCRIPT_CHARS;
    let text: String = one.chars().take(MAX_TRANSCRIPT_CHARS).collect();
    let more = if cut { " … (cut)" } else { "" };
    format!("[voice transcript of {}: {text}{more}]", one_line_name(name))
}

/// `[voice not transcribed: voice.ogg: <reason>]`: said beside the file's own line when the
/// transcription failed.
pub fn failure_line(name: &str, why: &str) -> String {
    let why: String = why.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    format!("[voice not transcribed: {}: {}]", one_line_name(name), truncate(&why, 300))
}

fn one_line_name(name: &str) -> String {
    name.chars().map(|c| if c.is_control() || matches!(c, '[' | ']') { '_' } else { c }).collect()
}

/// Whether a stored file of type `kind` is transcribed: audio (`audio/*`; a Telegram voice
/// note is `audio/ogg`).
pub fn is_audio(kind: &str) -> bool {
    kind.starts_with("audio/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn upload_names_keep_a_known_extension_or_get_the_types() {
        assert_eq!(upload_name("voice.ogg", "audio/ogg"), "voice.ogg");
        assert_eq!(upload_name("note", "audio/ogg"), "note.ogg");
        assert_eq!(upload_name("a.bin", "audio/mpeg"), "a.bin.mp3");
        assert_eq!(upload_name("x\"\r\n.wav", "audio/wav"), "x___.wav");
        assert_eq!(upload_name("", "audio/flac"), "audio.flac");
        assert_eq!(upload_name("odd", "audio/x-unknown"), "odd");
    }

    #[test]
    fn lines_are_one_line_and_bounded() {
        assert_eq!(transcript_line("voice.ogg", " call me\nback "), "[voice transcript of voice.ogg: call me back]");
        let long = "z".repeat(MAX_TRANSCRIPT_CHARS + 10);
        let l = transcript_line("v]", &long);
        assert!(l.starts_with("[voice transcript of v_: ") && l.ends_with(" … (cut)]"), "{}", &l[..40]);
        assert_eq!(l.chars().filter(|c| *c == 'z').count(), MAX_TRANSCRIPT_CHARS);
        assert_eq!(failure_line("v.ogg", "HTTP 500\nboom"), "[voice not transcribed: v.ogg: HTTP 500 boom]");
        assert!(is_audio("audio/ogg") && !is_audio("video/mp4"));
    }

    #[test]
    fn a_missing_key_and_an_oversized_file_fail_in_words_without_a_request() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let c = gatewarden_config::Config::from_toml_str(
            Path::new("/h/config.toml"),
            "[agent]\nretries = 0\n[agent.transcription]\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"GW_TEST_UNSET_KEY_7\"\nmax_file_mb = 1\n",
        )
        .unwrap();
        let secrets = Secrets::resolve_with(Path::new("/nonexistent"), &c, &|_| None);
        let t = Transcriber::from_config(&c.agent, &secrets).unwrap();
        assert_eq!(t.providers[0].url, "http://127.0.0.1:9/v1/audio/transcriptions");
        assert_eq!(t.providers[0].model, "whisper-1");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v");
        std::fs::write(&path, b"OggS").unwrap();
        let audio = Audio { path, name: "v.ogg".into(), kind: "audio/ogg".into(), size: 4 };
        let cancel = CancellationToken::new();
        let e = rt.block_on(t.transcribe(&audio, &cancel)).unwrap_err();
        assert!(e.detail.contains("GW_TEST_UNSET_KEY_7"), "{e:?}");
        assert_eq!(e.short, "the provider failed: its key is unavailable", "no variable named to the agent");
        let big = Audio { size: (1 << 20) + 1, ..audio };
        let e = rt.block_on(t.transcribe(&big, &cancel)).unwrap_err();
        assert!(e.short.contains("too large"), "{e:?}");
        assert!(Transcriber::from_config(&gatewarden_config::AgentConfig::default(), &secrets).is_none());
    }
}
