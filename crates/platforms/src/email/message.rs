//! One received email, decoded (mail-parser: MIME, quoted-printable and base64, charsets) and
//! judged: whom it is from, which thread it belongs to, and whether it may be answered at all
//! (RFC 3834: never answer automatic mail, so two robots cannot bounce off each other).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mail_parser::{HeaderValue, Message, MessageParser, MessagePart, MimeHeaders};

/// Characters of a message body handed on at most (the rest is cut, marked).
pub const MAX_TEXT_CHARS: usize = 32_000;
/// Message ids kept in `References` at most (the root and the newest ones).
pub const MAX_REFERENCES: usize = 20;
/// Files read from one message at most; the rest are named in one refusal (a mail of 20,000
/// tiny parts must not become 20,000 downloads).
pub const MAX_PARTS: usize = 32;

/// A decoded message that may be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mail {
    /// The sender's address, lower-cased.
    pub from: String,
    /// The thread's root Message-ID (without `<>`): the first of `References`, else
    /// `In-Reply-To`, else the message's own id.
    pub root: String,
    /// The message's own Message-ID (without `<>`), when it has one.
    pub message_id: Option<String>,
    /// `References` then the message's own id: what a reply references (capped).
    pub references: Vec<String>,
    pub subject: String,
    /// The text/plain body (or the text of the HTML part), decoded.
    pub text: String,
    pub sent_at: Option<SystemTime>,
    /// The files it carries ([`parts`]), at most [`MAX_PARTS`].
    pub parts: Vec<Part>,
    /// Files past [`MAX_PARTS`], not read.
    pub more_parts: usize,
}

/// One MIME part a message carries as a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its position among the message's attachments (mail-parser's order): its key in
    /// [`contents`].
    pub pos: u32,
    /// The sender's file name (its last path component, one line), else `part<n>.<subtype>`.
    pub name: String,
    /// The declared MIME type, lower-case (`application/octet-stream` when none or malformed).
    pub declared: String,
    /// Its decoded size in bytes.
    pub size: u64,
}

/// Why a message is not answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Not a parsable message, or no usable sender address.
    Unreadable,
    /// Automatic mail (RFC 3834 `Auto-Submitted`, `Precedence: bulk/list/junk`, a list
    /// message, a bounce from a mailer daemon or a null sender).
    Automatic(String),
    /// Our own address (a copy of a reply, a loop).
    Own,
    /// A sender not in `allowed_senders`.
    NotAllowed(String),
}

fn ids(v: &HeaderValue<'_>) -> Vec<String> {
    let clean = |s: &str| s.trim().trim_start_matches('<').trim_end_matches('>').trim().to_owned();
    match v {
        HeaderValue::Text(t) => vec![clean(t)],
        HeaderValue::TextList(l) => l.iter().map(|t| clean(t)).collect(),
        _ => Vec::new(),
    }
    .into_iter()
    .filter(|s| !s.is_empty() && !s.contains(['\r', '\n', '<', '>', ' ']))
    .collect()
}

/// mail-parser's parse of `raw`. Its 0.11.9 has a `debug_assert!` on a multipart it loses
/// track of (its parsers/message.rs, "Invalid part ID"; found by
/// fuzz/fuzz_targets/email_parts.rs): compiled out of release builds, where parsing goes on; a
/// build with debug assertions (the tests') catches it here and the message is unreadable.
fn parse(raw: &[u8]) -> Option<Message<'_>> {
    std::panic::catch_unwind(|| MessageParser::default().parse(raw)).ok().flatten()
}

/// Whether `from` is allowed by `allowed` (empty: everyone; an entry `@domain` allows the
/// domain; otherwise whole addresses, case-insensitive).
pub fn sender_allowed(allowed: &[String], from: &str) -> bool {
    allowed.is_empty()
        || allowed.iter().any(|a| {
            let a = a.trim().to_ascii_lowercase();
            if a.starts_with('@') { from.ends_with(&a) } else { a == from }
        })
}

/// The robots' local parts (RFC 3834 section 2: never answer these).
fn is_daemon(local: &str) -> bool {
    let l = local.to_ascii_lowercase();
    l == "mailer-daemon"
        || l == "postmaster"
        || l.starts_with("owner-")
        || l.ends_with("-request")
        || l == "noreply"
        || l == "no-reply"
}

/// Decodes `raw` and decides whether it may be answered. `own` is our address (lower-case).
pub fn judge(raw: &[u8], own: &str, allowed: &[String]) -> Result<Mail, Skip> {
    let msg = parse(raw).ok_or(Skip::Unreadable)?;
    let header = |name: &str| msg.header_raw(name).map(|v| v.trim().to_ascii_lowercase());
    // RFC 3834 section 5: anything but `no` is automatic.
    if let Some(v) = header("Auto-Submitted").filter(|v| !v.starts_with("no")) {
        return Err(Skip::Automatic(format!("Auto-Submitted: {v}")));
    }
    if let Some(v) = header("Precedence").filter(|v| ["bulk", "list", "junk"].iter().any(|p| v.starts_with(p))) {
        return Err(Skip::Automatic(format!("Precedence: {v}")));
    }
    if header("List-Id").is_some() {
        return Err(Skip::Automatic("a mailing-list message (List-Id)".into()));
    }
    // The null reverse path of a bounce (`Return-Path: <>`, written by the delivering server).
    if msg.header_raw("Return-Path").is_some_and(|v| v.trim() == "<>") {
        return Err(Skip::Automatic("null sender (Return-Path: <>)".into()));
    }
    let from = msg
        .from()
        .and_then(|a| a.first())
        .and_then(|a| a.address())
        .map(|a| a.trim().to_ascii_lowercase())
        .filter(|a| a.contains('@') && !a.contains(|c: char| c.is_whitespace() || c.is_control()))
        .ok_or(Skip::Unreadable)?;
    let local = from.split('@').next().unwrap_or_default();
    if is_daemon(local) {
        return Err(Skip::Automatic(format!("from {from}")));
    }
    if from == own {
        return Err(Skip::Own);
    }
    if !sender_allowed(allowed, &from) {
        return Err(Skip::NotAllowed(from));
    }
    let message_id = msg.message_id().map(|m| ids(&HeaderValue::Text(m.into()))).and_then(|v| v.into_iter().next());
    let refs = ids(msg.references());
    let in_reply_to = ids(msg.in_reply_to());
    let root = refs.first().or(in_reply_to.first()).or(message_id.as_ref()).cloned().unwrap_or_default();
    let mut references = refs;
    if references.is_empty() {
        references.extend(in_reply_to.into_iter().take(1));
    }
    references.extend(message_id.iter().cloned());
    if references.len() > MAX_REFERENCES {
        // Keep the root and the newest ones (RFC 5322 3.6.4 lets a reply trim the middle).
        let tail = references.split_off(references.len() - (MAX_REFERENCES - 1));
        references.truncate(1);
        references.extend(tail);
    }
    let mut text = msg.body_text(0).map(|t| t.trim().to_owned()).unwrap_or_default();
    if text.chars().count() > MAX_TEXT_CHARS {
        text = text.chars().take(MAX_TEXT_CHARS).collect::<String>() + "\n[… cut]";
    }
    let sent_at = msg
        .date()
        .map(|d| d.to_timestamp())
        .and_then(|t| u64::try_from(t).ok())
        .map(|t| SystemTime::UNIX_EPOCH + Duration::from_secs(t));
    let subject = msg.subject().unwrap_or_default().chars().filter(|c| !c.is_control()).take(200).collect();
    let (parts, more_parts) = parts(&msg);
    Ok(Mail { from, root, message_id, references, subject, text, sent_at, parts, more_parts })
}

/// The files `msg` carries: every MIME part mail-parser does not take as the body text
/// (`Content-Disposition: attachment` or `inline` with a file name, images and other non-text
/// parts, attached messages), with their declared types and decoded sizes; at most
/// [`MAX_PARTS`], and how many more there were. Empty parts are skipped. Total over any input
/// (fuzzed: fuzz/fuzz_targets/email_parts.rs).
pub fn parts(msg: &Message<'_>) -> (Vec<Part>, usize) {
    let files = file_parts(msg);
    let more = files.len().saturating_sub(MAX_PARTS);
    let out = files
        .into_iter()
        .take(MAX_PARTS)
        .map(|(pos, p)| {
            let declared = declared_type(p);
            Part { pos, name: part_name(p, pos, &declared), declared, size: p.len() as u64 }
        })
        .collect();
    (out, more)
}

/// The non-empty attachments of `msg` with their positions ([`Part::pos`]), in order.
fn file_parts<'m>(msg: &'m Message<'_>) -> Vec<(u32, &'m MessagePart<'m>)> {
    msg.attachments()
        .enumerate()
        .filter(|(_, p)| !p.is_empty())
        .map(|(pos, p)| (u32::try_from(pos).unwrap_or(u32::MAX), p))
        .collect()
}

/// The decoded bytes of every file [`parts`] names in the message `raw`, by [`Part::pos`]:
/// one parse for all of them. Empty when it does not parse.
pub fn contents(raw: &[u8]) -> HashMap<u32, Arc<[u8]>> {
    let Some(msg) = parse(raw) else { return HashMap::new() };
    file_parts(&msg).into_iter().take(MAX_PARTS).map(|(pos, p)| (pos, Arc::from(p.contents()))).collect()
}

/// [`parts`] of the message `raw`; `None` when it does not parse.
pub fn parts_of(raw: &[u8]) -> Option<(Vec<Part>, usize)> {
    parse(raw).map(|m| parts(&m))
}

/// A part's declared type, lower-case and plain (`type/subtype`, nothing else). An attached
/// message is text (`message/rfc822` is its headers and body as written).
fn declared_type(p: &MessagePart<'_>) -> String {
    if p.is_message() {
        return "text/plain".into();
    }
    let t = match p.content_type() {
        Some(ct) => match ct.subtype() {
            Some(sub) => format!("{}/{sub}", ct.ctype()),
            None => ct.ctype().to_owned(),
        },
        None if p.is_text() => "text/plain".into(),
        None => String::new(),
    }
    .to_ascii_lowercase();
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-._".contains(&b));
    match t.split_once('/') {
        Some((a, b)) if t.len() <= 100 && plain(a) && plain(b) => {
            if t == "message/rfc822" {
                "text/plain".into()
            } else {
                t
            }
        }
        _ => "application/octet-stream".into(),
    }
}

/// The sender's file name without any path, on one line, or one made from the position and
/// subtype (`part2.png`).
fn part_name(p: &MessagePart<'_>, pos: u32, declared: &str) -> String {
    let given = p
        .attachment_name()
        .map(|n| n.rsplit(['/', '\\']).next().unwrap_or(n))
        .map(|n| n.chars().filter(|c| !c.is_control()).take(120).collect::<String>())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty() && n != "." && n != "..");
    given.unwrap_or_else(|| {
        let ext = if p.is_message() {
            "eml"
        } else {
            declared
                .split('/')
                .nth(1)
                .filter(|e| e.len() <= 8 && e.bytes().all(|b| b.is_ascii_alphanumeric()))
                .unwrap_or("bin")
        };
        format!("part{}.{ext}", u64::from(pos) + 1)
    })
}

/// The subject of a reply: `Re: ` once.
pub fn reply_subject(subject: &str) -> String {
    let s = subject.trim();
    if s.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("re:")) {
        s.to_owned()
    } else if s.is_empty() {
        "Re: your message".to_owned()
    } else {
        format!("Re: {s}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: &str = "bot@example.test";

    fn mail(headers: &str, body: &str) -> Vec<u8> {
        format!("{headers}\r\n\r\n{body}").into_bytes()
    }

    #[test]
    fn quoted_printable_base64_and_charsets_are_decoded() {
        let qp = mail(
            "From: Alice <Alice@Example.test>\r\nTo: bot@example.test\r\nSubject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe?=\r\nMessage-ID: <r1@x>\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=iso-8859-1\r\nContent-Transfer-Encoding: quoted-printable",
            "Gr=FC=DFe aus K=F6ln=\r\n und mehr",
        );
        let m = judge(&qp, OWN, &[]).unwrap();
        assert_eq!((m.from.as_str(), m.subject.as_str()), ("alice@example.test", "Grüße"));
        assert_eq!(m.text, "Grüße aus Köln und mehr");
        assert_eq!((m.root.as_str(), m.message_id.as_deref()), ("r1@x", Some("r1@x")));

        let multipart = mail(
            "From: alice@example.test\r\nMessage-ID: <r2@x>\r\nReferences: <root@x> <mid@x>\r\nIn-Reply-To: <mid@x>\r\nMIME-Version: 1.0\r\nContent-Type: multipart/alternative; boundary=b",
            "--b\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\naMOpbGxvIHfDtnJsZA==\r\n--b\r\nContent-Type: text/html\r\n\r\n<p>html</p>\r\n--b--\r\n",
        );
        let m = judge(&multipart, OWN, &[]).unwrap();
        assert_eq!(m.text, "héllo wörld");
        assert_eq!(m.root, "root@x", "the thread's root is the first reference");
        assert_eq!(m.references, vec!["root@x", "mid@x", "r2@x"]);
    }

    #[test]
    fn automatic_mail_is_never_answered() {
        let base = "From: alice@example.test\r\nMessage-ID: <a@x>";
        for extra in [
            "Auto-Submitted: auto-replied",
            "Precedence: bulk",
            "Precedence: list",
            "List-Id: <l.x>",
            "Return-Path: <>",
        ] {
            let raw = mail(&format!("{extra}\r\n{base}"), "hi");
            assert!(matches!(judge(&raw, OWN, &[]), Err(Skip::Automatic(_))), "{extra}");
        }
        assert!(judge(&mail(&format!("Auto-Submitted: no\r\n{base}"), "hi"), OWN, &[]).is_ok());
        let daemon = mail("From: MAILER-DAEMON@example.test\r\nMessage-ID: <d@x>", "bounce");
        assert!(matches!(judge(&daemon, OWN, &[]), Err(Skip::Automatic(_))));
        assert_eq!(judge(&mail("From: bot@example.test", "x"), OWN, &[]), Err(Skip::Own));
        assert_eq!(judge(b"", OWN, &[]).unwrap_err(), Skip::Unreadable);
    }

    #[test]
    fn allowed_senders_are_addresses_or_domains() {
        let allowed = vec!["Alice@Example.test".to_owned(), "@friends.test".to_owned()];
        assert!(sender_allowed(&allowed, "alice@example.test"));
        assert!(sender_allowed(&allowed, "carol@friends.test"));
        assert!(!sender_allowed(&allowed, "mallory@example.test"));
        assert!(!sender_allowed(&allowed, "x@evilfriends.test"));
        assert!(sender_allowed(&[], "anyone@x"));
        let raw = mail("From: mallory@example.test\r\nMessage-ID: <m@x>", "hi");
        assert_eq!(judge(&raw, OWN, &allowed), Err(Skip::NotAllowed("mallory@example.test".into())));
    }

    #[test]
    fn email_attachments_and_inline_images_are_parts_and_the_text_stays_the_text() {
        let png = "iVBORw0KGgoAAAANSUhEUg==";
        let raw = mail(
            "From: alice@example.test\r\nMessage-ID: <p@x>\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=m",
            &format!(
                "--m\r\nContent-Type: multipart/related; boundary=r\r\n\r\n\
                 --r\r\nContent-Type: text/plain\r\n\r\nsee the photo\r\n\
                 --r\r\nContent-Type: image/png\r\nContent-Disposition: inline; filename=\"../../etc/shot.png\"\r\nContent-Transfer-Encoding: base64\r\n\r\n{png}\r\n\
                 --r--\r\n\
                 --m\r\nContent-Type: text/plain; charset=iso-8859-1; name=\"notes.txt\"\r\nContent-Disposition: attachment\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nK=F6ln\r\n\
                 --m\r\nContent-Type: application/pdf\r\n\r\n%PDF-1.4\r\n\
                 --m\r\nContent-Type: weird type;;\r\nContent-Disposition: attachment\r\nContent-Transfer-Encoding: base64\r\n\r\n!!not base64!!\r\n\
                 --m\r\nContent-Type: message/rfc822\r\n\r\nFrom: x@y\r\nSubject: fwd\r\n\r\nforwarded\r\n\
                 --m--\r\n"
            ),
        );
        let m = judge(&raw, OWN, &[]).unwrap();
        assert_eq!(m.text, "see the photo");
        let got: Vec<(&str, &str)> = m.parts.iter().map(|p| (p.name.as_str(), p.declared.as_str())).collect();
        assert_eq!(
            got,
            [
                ("shot.png", "image/png"),
                ("notes.txt", "text/plain"),
                ("part3.pdf", "application/pdf"),
                ("part4.bin", "application/octet-stream"),
                ("part5.eml", "text/plain"),
            ],
            "{:#?}",
            m.parts
        );
        let all = contents(&raw);
        assert_eq!(all.len(), m.parts.len(), "every file named is decoded, nothing else");
        let decoded = |i: usize| all[&m.parts[i].pos].to_vec();
        assert!(decoded(0).starts_with(b"\x89PNG\r\n\x1a\n"), "{:?}", decoded(0));
        assert_eq!(m.parts[0].size, decoded(0).len() as u64);
        assert_eq!(String::from_utf8(decoded(1)).unwrap().trim(), "Köln", "decoded to UTF-8");
        assert!(String::from_utf8_lossy(&decoded(4)).contains("forwarded"));
        assert!(!all.contains_key(&99));
        assert_eq!(m.more_parts, 0);
    }

    #[test]
    fn email_part_counts_are_bounded() {
        let mut body = String::from("--w\r\nContent-Type: text/plain\r\n\r\nmany files\r\n");
        for i in 0..MAX_PARTS + 5 {
            body.push_str(&format!("--w\r\nContent-Type: image/gif; name=\"{i}.gif\"\r\n\r\nGIF89a\r\n"));
        }
        body.push_str("--w--\r\n");
        let raw =
            mail("From: alice@example.test\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=w", &body);
        let m = judge(&raw, OWN, &[]).unwrap();
        assert_eq!((m.parts.len(), m.more_parts, m.text.as_str()), (MAX_PARTS, 5, "many files"));
    }

    #[test]
    fn a_multipart_mail_parser_loses_track_of_is_no_panic() {
        // fuzz/corpus/email_parts/lost-multipart: mail-parser's debug assertion fires on it.
        let raw = include_bytes!("../../../../fuzz/corpus/email_parts/lost-multipart");
        match judge(raw, OWN, &[]) {
            Ok(m) => assert!(m.parts.len() <= MAX_PARTS),
            Err(e) => assert_eq!(e, Skip::Unreadable),
        }
        assert!(parts_of(raw).is_none_or(|(p, _)| p.len() <= MAX_PARTS));
    }

    #[test]
    fn reply_subjects_get_one_re() {
        assert_eq!(reply_subject("Hello"), "Re: Hello");
        assert_eq!(reply_subject("RE: Hello"), "RE: Hello");
        assert_eq!(reply_subject(""), "Re: your message");
    }
}
