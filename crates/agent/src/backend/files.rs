//! What a backend makes of the files a message carries (issue 29 §1): the runtime resolves the
//! journaled message's stored attachments (crates/platforms/src/attachments.rs) into
//! [`AgentFile`]s; each backend presents them its own way.
//!
//! - `openai` ([`user_content`]): images as `image_url` content parts with `data:` URLs (vision
//!   models); text-like files inline as text within [`INLINE_TEXT_BYTES`]; anything else named
//!   `[file: name, type, size]`.
//! - `exec`: `GATEWARDEN_ATTACHMENTS`, a JSON list of `{path, name, type, size}` ([`env_json`]).
//! - `hermes` ([`runs_input`]): images as `image_url` parts of a one-message `/v1/runs` input,
//!   the other files named in the text.
//!
//! Voice and audio, with `[agent.transcription]`, reach every backend as text instead: the
//! runtime replaces each such file by its transcript before the request is built
//! (backend/transcribe.rs).

use std::io::Read;
use std::path::PathBuf;

use base64::Engine;
use serde_json::{Value, json};

/// Largest image sent inline as a data URL (the store's per-file bound is larger; a bigger
/// image is named instead).
pub const INLINE_IMAGE_BYTES: u64 = 20 << 20;
/// Largest part of a text-like file sent inline; the rest is cut with a note.
pub const INLINE_TEXT_BYTES: u64 = 64 << 10;

/// One stored file of the message, for the agent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AgentFile {
    /// The stored file (read-only to the agent by convention; never to be changed).
    pub path: PathBuf,
    pub name: String,
    /// The MIME type its content shows.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
}

impl AgentFile {
    /// `[file: name, type, size]`: how a file the backend cannot pass on is named.
    pub fn named(&self) -> String {
        format!("[file: {}, {}, {} bytes]", self.name, self.kind, self.size)
    }

    pub fn is_image(&self) -> bool {
        matches!(self.kind.as_str(), "image/png" | "image/jpeg" | "image/gif" | "image/webp")
    }

    pub fn is_text(&self) -> bool {
        self.kind.starts_with("text/")
            || matches!(
                self.kind.as_str(),
                "application/json" | "application/xml" | "application/x-yaml" | "application/toml"
            )
    }

    pub fn is_audio(&self) -> bool {
        self.kind.starts_with("audio/")
    }

    /// Up to `cap` bytes of the file, and whether it was longer.
    fn read(&self, cap: u64) -> std::io::Result<(Vec<u8>, bool)> {
        let f = std::fs::File::open(&self.path)?;
        let mut buf = Vec::new();
        f.take(cap + 1).read_to_end(&mut buf)?;
        let more = buf.len() as u64 > cap;
        buf.truncate(usize::try_from(cap).unwrap_or(usize::MAX));
        Ok((buf, more))
    }
}

/// The `GATEWARDEN_ATTACHMENTS` value for the exec backend: `[{"path", "name", "type", "size"}]`.
pub fn env_json(files: &[AgentFile]) -> String {
    serde_json::to_string(files).unwrap_or_else(|_| "[]".into())
}

/// The text with each file named ([`AgentFile::named`]) on a line of its own, for backends that
/// pass no files.
pub fn named_text(text: &str, files: &[AgentFile]) -> String {
    let mut t = text.to_owned();
    for f in files {
        if !t.is_empty() {
            t.push('\n');
        }
        t.push_str(&f.named());
    }
    t
}

/// hermes `/v1/runs`'s `input`: the text with each file named ([`named_text`]) when no image
/// can go inline; else a one-message list whose `content` is that text (the other files named)
/// and the images as `image_url` parts with `data:` URLs. hermes-agent 0.19.0 hands that
/// content to the agent as the user message (gateway/platforms/api_server.py `_handle_runs`:
/// `raw_input[-1]["content"]`), the shape its `/v1/chat/completions` builds for a vision model.
pub fn runs_input(text: &str, files: &[AgentFile]) -> Value {
    if !files.iter().any(|f| f.is_image() && f.size <= INLINE_IMAGE_BYTES) {
        return json!(named_text(text, files));
    }
    let mut named = Vec::new();
    let mut images = Vec::new();
    for f in files {
        match image_part(f) {
            Some(part) => images.push(part),
            None => named.push(f.clone()),
        }
    }
    let mut parts = vec![json!({"type": "text", "text": named_text(text, &named)})];
    parts.extend(images);
    json!([{"role": "user", "content": parts}])
}

/// An image within [`INLINE_IMAGE_BYTES`] as an `image_url` content part with a `data:` URL;
/// `None` for anything else, or an image that cannot be read whole.
fn image_part(f: &AgentFile) -> Option<Value> {
    if !f.is_image() || f.size > INLINE_IMAGE_BYTES {
        return None;
    }
    let (bytes, false) = f.read(INLINE_IMAGE_BYTES).ok()? else { return None };
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    Some(json!({"type": "image_url", "image_url": {"url": format!("data:{};base64,{b64}", f.kind)}}))
}

/// A user message's `content` for an OpenAI-compatible chat completion: the plain string when
/// there are no files, else content parts (`text`, `image_url`).
pub fn user_content(text: &str, files: &[AgentFile]) -> Value {
    if files.is_empty() {
        return json!(text);
    }
    let mut words = text.to_owned();
    let mut images = Vec::new();
    let mut add = |s: &str| {
        if !words.is_empty() {
            words.push('\n');
        }
        words.push_str(s);
    };
    for f in files {
        if f.is_image() && f.size <= INLINE_IMAGE_BYTES {
            match image_part(f) {
                Some(part) => images.push(part),
                None => add(&f.named()),
            }
        } else if f.is_text() {
            match f.read(INLINE_TEXT_BYTES) {
                Ok((bytes, more)) => {
                    let cut =
                        if more { format!(" (first {INLINE_TEXT_BYTES} bytes of {})", f.size) } else { String::new() };
                    add(&format!("[file: {}, {}{cut}]\n{}", f.name, f.kind, String::from_utf8_lossy(&bytes)));
                }
                Err(_) => add(&f.named()),
            }
        } else {
            add(&f.named());
        }
    }
    let mut parts = vec![json!({"type": "text", "text": words})];
    parts.extend(images);
    Value::Array(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_input_passes_images_as_parts_and_names_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let png = file(d.path(), "a.png", "image/png", b"\x89PNG\r\n\x1a\npng");
        let pdf = file(d.path(), "b.pdf", "application/pdf", b"%PDF-1.4");
        assert_eq!(runs_input("hi", &[]), json!("hi"));
        assert_eq!(runs_input("hi", std::slice::from_ref(&pdf)), json!(format!("hi\n{}", pdf.named())));
        let v = runs_input("look", &[png, pdf.clone()]);
        let url = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(b"\x89PNG\r\n\x1a\npng")
        );
        assert_eq!(
            v,
            json!([{"role": "user", "content": [
                {"type": "text", "text": format!("look\n{}", pdf.named())},
                {"type": "image_url", "image_url": {"url": url}},
            ]}])
        );
    }

    fn file(dir: &std::path::Path, name: &str, kind: &str, bytes: &[u8]) -> AgentFile {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        AgentFile { path, name: name.into(), kind: kind.into(), size: bytes.len() as u64 }
    }

    #[test]
    fn images_become_data_urls_text_is_inlined_and_the_rest_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            file(dir.path(), "p.png", "image/png", b"\x89PNG\r\n\x1a\nxx"),
            file(dir.path(), "n.txt", "text/plain", b"hello notes"),
            file(dir.path(), "a.pdf", "application/pdf", b"%PDF-1.4"),
        ];
        assert_eq!(user_content("hi", &[]), json!("hi"));
        let c = user_content("what is this", &files);
        let text = c[0]["text"].as_str().unwrap();
        assert!(text.starts_with("what is this"), "{text}");
        assert!(text.contains("[file: n.txt, text/plain]\nhello notes"), "{text}");
        assert!(text.contains("[file: a.pdf, application/pdf, 8 bytes]"), "{text}");
        assert_eq!(c[1]["type"], "image_url");
        assert!(c[1]["image_url"]["url"].as_str().unwrap().starts_with("data:image/png;base64,iVBORw0KGgp"));
        let env: Value = serde_json::from_str(&env_json(&files[..1])).unwrap();
        assert_eq!(env[0]["type"], "image/png");
        assert_eq!(env[0]["size"], 10);
    }
}
