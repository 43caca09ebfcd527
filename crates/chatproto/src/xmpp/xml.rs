//! XMPP's XML, on quick-xml: cutting the stream into top-level elements ([`Framer`]) and reading
//! one element into a small tree ([`Element`]). Both are total: hostile input is an error,
//! never a panic, and every size is bounded (a stanza's bytes, its depth).
//!
//! RFC 6120 §11.1 forbids comments, processing instructions, DTDs and entity references other
//! than the predefined ones; each is refused here, so nothing is ever expanded.

use quick_xml::XmlVersion;
use quick_xml::errors::{Error as XmlError, IllFormedError, SyntaxError};
use quick_xml::events::Event;
use quick_xml::name::ResolveResult;

/// The largest top-level element accepted (prosody's default `c2s_stanza_size_limit` is
/// 256 KiB).
pub const MAX_STANZA_BYTES: usize = 256 * 1024;
/// The deepest nesting accepted inside one stanza (a MAM result is about six deep).
pub const MAX_DEPTH: usize = 32;

/// The client stream's default namespace.
pub const NS_CLIENT: &str = "jabber:client";
/// The `stream:` prefix's namespace.
pub const NS_STREAM: &str = "http://etherx.jabber.org/streams";

/// One element: its local name, its namespace, its attributes (qualified names, unescaped
/// values), its children and its character data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Element {
    /// The local name.
    pub name: String,
    /// The namespace it resolves to (empty: none).
    pub ns: String,
    /// The attributes, qualified names with unescaped values.
    pub attrs: Vec<(String, String)>,
    /// The child elements, in order.
    pub children: Vec<Element>,
    /// The character data, unescaped, concatenated.
    pub text: String,
}

impl Element {
    /// The attribute `name`, if present.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The first child named `name` in namespace `ns`.
    pub fn child(&self, name: &str, ns: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name && c.ns == ns)
    }

    /// Every child named `name` in namespace `ns`.
    pub fn children_named<'a>(&'a self, name: &'a str, ns: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name && c.ns == ns)
    }

    /// Whether this is `name` in namespace `ns`.
    pub fn is(&self, name: &str, ns: &str) -> bool {
        self.name == name && self.ns == ns
    }
}

/// What the XML layer refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("XML: {0}")]
pub struct XmlFault(pub String);

fn fault(what: impl Into<String>) -> XmlFault {
    XmlFault(what.into())
}

/// One top-level item of the server's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `<stream:stream …>`: the stream header, with its attributes.
    Open(Vec<(String, String)>),
    /// A complete top-level element (stanza, features, SASL or SM nonza).
    Element(Element),
    /// `</stream:stream>`: the server closed the stream.
    Close,
}

/// Cuts received bytes into [`Frame`]s. Bytes arrive in arbitrary pieces; an element is
/// returned only once it is complete.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
    /// Inside `<stream:stream>` (after its header).
    opened: bool,
}

impl Framer {
    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// A new stream (after STARTTLS or SASL): the next frame is a header again.
    pub fn restart(&mut self) {
        self.buf.clear();
        self.opened = false;
    }

    /// Bytes received and not yet framed.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, XmlFault> {
        let text = match std::str::from_utf8(&self.buf) {
            Ok(s) => s,
            // A character cut by the read: frame what is whole.
            Err(e) if e.error_len().is_none() => std::str::from_utf8(&self.buf[..e.valid_up_to()]).unwrap_or(""),
            Err(_) => return Err(fault("invalid UTF-8")),
        };
        let (frame, used) = match scan(text, self.opened) {
            Scan::Need => {
                if self.buf.len() > MAX_STANZA_BYTES {
                    return Err(fault(format!("an element of more than {MAX_STANZA_BYTES} bytes")));
                }
                return Ok(None);
            }
            Scan::Skip(used) => (None, used),
            Scan::Open(attrs, used) => {
                self.opened = true;
                (Some(Frame::Open(attrs)), used)
            }
            Scan::Element(used) => (Some(Frame::Element(parse_element(&text[..used])?)), used),
            Scan::Close(used) => (Some(Frame::Close), used),
            Scan::Bad(why) => return Err(fault(why)),
        };
        self.buf.drain(..used);
        match frame {
            Some(f) => Ok(Some(f)),
            // Whitespace between elements (keepalives) consumed: look again.
            None => self.next_frame(),
        }
    }
}

enum Scan {
    Need,
    Skip(usize),
    Open(Vec<(String, String)>, usize),
    Element(usize),
    Close(usize),
    Bad(String),
}

/// Whether a parse error only means the input stopped early.
fn truncated(e: &XmlError) -> bool {
    matches!(
        e,
        XmlError::Syntax(
            SyntaxError::InvalidBangMarkup
                | SyntaxError::UnclosedPI
                | SyntaxError::UnclosedXmlDecl
                | SyntaxError::UnclosedComment
                | SyntaxError::UnclosedDoctype
                | SyntaxError::UnclosedCData
                | SyntaxError::UnclosedTag
                | SyntaxError::UnclosedSingleQuotedAttributeValue
                | SyntaxError::UnclosedDoubleQuotedAttributeValue
        ) | XmlError::IllFormed(IllFormedError::UnclosedReference)
    )
}

fn pos(r: &quick_xml::Reader<&[u8]>) -> usize {
    usize::try_from(r.buffer_position()).unwrap_or(usize::MAX)
}

/// Finds where the first frame of `text` ends (names are checked when the element is read).
fn scan(text: &str, opened: bool) -> Scan {
    let mut r = quick_xml::Reader::from_reader(text.as_bytes());
    r.config_mut().check_end_names = false;
    let mut depth = 0usize;
    loop {
        let ev = match r.read_event() {
            Ok(ev) => ev,
            Err(e) if truncated(&e) => return Scan::Need,
            // The stream's own end tag, whose start was in an earlier scan.
            Err(XmlError::IllFormed(IllFormedError::UnmatchedEndTag(name))) if depth == 0 && opened => {
                return if name == "stream:stream" {
                    Scan::Close(pos(&r))
                } else {
                    Scan::Bad(format!("</{name}> at the top"))
                };
            }
            Err(e) => return Scan::Bad(e.to_string()),
        };
        match ev {
            Event::Eof => return if depth == 0 && pos(&r) > 0 { Scan::Skip(pos(&r)) } else { Scan::Need },
            Event::Decl(_) if !opened && depth == 0 => return Scan::Skip(pos(&r)),
            Event::Decl(_) | Event::PI(_) | Event::DocType(_) | Event::Comment(_) => {
                return Scan::Bad("a comment, processing instruction or DTD (RFC 6120 §11.1)".into());
            }
            Event::Start(e) if !opened => {
                if e.name().as_ref() != "stream:stream" {
                    return Scan::Bad(format!("expected <stream:stream>, got <{}>", e.name().as_ref()));
                }
                let mut attrs = Vec::new();
                for a in e.attributes() {
                    let Ok(a) = a else { return Scan::Bad("a malformed attribute in the stream header".into()) };
                    let Ok(v) = a.normalized_value(XmlVersion::Implicit1_0) else {
                        return Scan::Bad("a malformed attribute value in the stream header".into());
                    };
                    attrs.push((a.key.as_ref().to_owned(), v.into_owned()));
                }
                return Scan::Open(attrs, pos(&r));
            }
            Event::Start(_) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Scan::Bad(format!("elements nested deeper than {MAX_DEPTH}"));
                }
            }
            Event::Empty(_) if depth == 0 => return Scan::Element(pos(&r)),
            Event::Empty(_) => {}
            Event::End(_) if depth == 0 => return Scan::Close(pos(&r)),
            Event::End(_) => {
                depth -= 1;
                if depth == 0 {
                    return Scan::Element(pos(&r));
                }
            }
            Event::Text(t) if depth == 0 => {
                if !t.chars().all(|c| matches!(c, ' ' | '\t' | '\r' | '\n')) {
                    return Scan::Bad("text between stanzas".into());
                }
            }
            Event::GeneralRef(_) | Event::CData(_) if depth == 0 => return Scan::Bad("text between stanzas".into()),
            Event::Text(_) | Event::GeneralRef(_) | Event::CData(_) => {}
        }
    }
}

/// Reads one complete top-level element, in the namespaces of a client stream (`jabber:client`
/// by default, `stream:` bound).
pub fn parse_element(xml: &str) -> Result<Element, XmlFault> {
    if xml.len() > MAX_STANZA_BYTES {
        return Err(fault(format!("an element of more than {MAX_STANZA_BYTES} bytes")));
    }
    let wrapped = format!("<stream:stream xmlns='{NS_CLIENT}' xmlns:stream='{NS_STREAM}'>{xml}</stream:stream>");
    let mut r = quick_xml::NsReader::from_str(&wrapped);
    let mut stack: Vec<Element> = Vec::new();
    let mut done: Option<Element> = None;
    let mut seen_root = false;
    loop {
        let (ns, ev) = r.read_resolved_event().map_err(|e| fault(e.to_string()))?;
        let ns = match ns {
            ResolveResult::Bound(n) => n.0.to_owned(),
            ResolveResult::Unbound => String::new(),
            ResolveResult::Unknown(p) => return Err(fault(format!("unknown namespace prefix {p:?}"))),
        };
        match ev {
            Event::Start(e) | Event::Empty(e) if !seen_root => {
                // The wrapper.
                let _ = e;
                seen_root = true;
            }
            Event::Start(e) | Event::Empty(e) if done.is_some() && stack.is_empty() => {
                return Err(fault(format!("a second element <{}> after the first", e.name().as_ref())));
            }
            ev @ (Event::Start(_) | Event::Empty(_)) => {
                let (empty, e) = match ev {
                    Event::Empty(e) => (true, e),
                    Event::Start(e) => (false, e),
                    _ => continue,
                };
                if stack.len() >= MAX_DEPTH {
                    return Err(fault(format!("elements nested deeper than {MAX_DEPTH}")));
                }
                let name = e.local_name().as_ref().to_owned();
                let mut attrs = Vec::new();
                for a in e.attributes() {
                    let a = a.map_err(|e| fault(e.to_string()))?;
                    let v = a.normalized_value(XmlVersion::Implicit1_0).map_err(|e| fault(e.to_string()))?;
                    attrs.push((a.key.as_ref().to_owned(), v.into_owned()));
                }
                let el = Element { name, ns, attrs, children: Vec::new(), text: String::new() };
                if empty {
                    close(&mut stack, &mut done, el);
                } else {
                    stack.push(el);
                }
            }
            Event::End(_) => match stack.pop() {
                Some(el) => close(&mut stack, &mut done, el),
                // The wrapper's end.
                None => break,
            },
            Event::Text(t) => match stack.last_mut() {
                Some(top) => top.text.push_str(&t.xml10_content()),
                None if t.chars().all(char::is_whitespace) => {}
                None => return Err(fault("text outside the element")),
            },
            Event::CData(t) => match stack.last_mut() {
                Some(top) => top.text.push_str(&t),
                None => return Err(fault("CDATA outside the element")),
            },
            Event::GeneralRef(e) => {
                let Some(top) = stack.last_mut() else { return Err(fault("a reference outside the element")) };
                match e.resolve_char_ref().map_err(|e| fault(e.to_string()))? {
                    Some(c) => top.text.push(c),
                    None => match quick_xml::escape::resolve_predefined_entity(&e) {
                        Some(s) => top.text.push_str(s),
                        None => return Err(fault(format!("an undefined entity &{};", &*e))),
                    },
                }
            }
            Event::Decl(_) | Event::PI(_) | Event::DocType(_) | Event::Comment(_) => {
                return Err(fault("a comment, processing instruction or DTD (RFC 6120 §11.1)"));
            }
            Event::Eof => return Err(fault("the element ended early")),
        }
    }
    done.ok_or_else(|| fault("no element"))
}

fn close(stack: &mut [Element], done: &mut Option<Element>, el: Element) {
    match stack.last_mut() {
        Some(parent) => parent.children.push(el),
        None => *done = Some(el),
    }
}

/// Escapes text or an attribute value, and drops what XML 1.0 cannot carry (controls other
/// than tab, LF and CR; U+FFFE, U+FFFF): a reply is text from an agent, never trusted to be
/// well-formed.
pub fn escape(s: &str) -> String {
    let clean: String = s
        .chars()
        .filter(|&c| matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}'))
        .collect();
    quick_xml::escape::escape(clean.as_str()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(chunks: &[&[u8]]) -> Result<Vec<Frame>, XmlFault> {
        let mut f = Framer::default();
        let mut out = Vec::new();
        for c in chunks {
            f.push(c);
            while let Some(fr) = f.next_frame()? {
                out.push(fr);
            }
        }
        Ok(out)
    }

    const HEADER: &str = "<?xml version='1.0'?><stream:stream xmlns='jabber:client' \
        xmlns:stream='http://etherx.jabber.org/streams' id='s1' from='example.org' version='1.0'>";

    #[test]
    fn a_stream_cut_anywhere_gives_the_same_frames() {
        let doc = format!(
            "{HEADER}<stream:features><starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'><required/></starttls>\
             </stream:features> \n<message from='a@b/c' type='chat'><body>x &amp; y &#x263A; &lt;</body>\
             <stanza-id xmlns='urn:xmpp:sid:0' by='bot@b' id='A1'/></message></stream:stream>"
        );
        let whole = frames(&[doc.as_bytes()]).unwrap();
        assert_eq!(whole.len(), 4, "{whole:?}");
        let Frame::Element(m) = &whole[2] else { panic!("{whole:?}") };
        assert!(m.is("message", NS_CLIENT));
        assert_eq!(m.child("body", NS_CLIENT).unwrap().text, "x & y \u{263A} <");
        assert_eq!(m.child("stanza-id", "urn:xmpp:sid:0").unwrap().attr("id"), Some("A1"));
        let Frame::Element(f) = &whole[1] else { panic!() };
        assert!(f.is("features", NS_STREAM));
        assert_eq!(whole[3], Frame::Close);
        // Every split point, byte by byte (UTF-8 characters cut in half included).
        let bytes = doc.as_bytes();
        for cut in 1..bytes.len() {
            assert_eq!(frames(&[&bytes[..cut], &bytes[cut..]]).unwrap(), whole, "cut at {cut}");
        }
    }

    #[test]
    fn hostile_input_is_refused_not_expanded() {
        let bad: &[&str] = &[
            "<!DOCTYPE x [<!ENTITY a 'aaaa'>]><stream:stream>",
            "<stream:stream xmlns:stream='http://etherx.jabber.org/streams'><!-- c --><message/>",
            "<stream:stream xmlns:stream='http://etherx.jabber.org/streams'><message><body>&lol;</body></message>",
            "<stream:stream xmlns:stream='http://etherx.jabber.org/streams'>junk",
            "<html>",
            "<stream:stream xmlns:stream='http://etherx.jabber.org/streams'><x:y/>",
        ];
        for b in bad {
            assert!(frames(&[b.as_bytes()]).is_err(), "{b}");
        }
        // Too deep, too long.
        let deep = format!("{HEADER}{}", "<a>".repeat(MAX_DEPTH + 2));
        assert!(frames(&[deep.as_bytes()]).is_err());
        let long = format!("{HEADER}<message><body>{}", "x".repeat(MAX_STANZA_BYTES + 10));
        assert!(frames(&[long.as_bytes()]).is_err());
        assert!(frames(&[&[0xff, 0xfe, b'<']]).is_err());
    }

    #[test]
    fn escape_drops_what_xml_cannot_carry() {
        assert_eq!(escape("a<b>&'\"\u{1}\u{0}c\n"), "a&lt;b&gt;&amp;&apos;&quot;c\n");
        let back = parse_element(&format!("<body>{}</body>", escape("x < y & \u{7} '"))).unwrap();
        assert_eq!(back.text, "x < y &  '");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..64), 0..8)) {
            let mut f = Framer::default();
            f.push(HEADER.as_bytes());
            for c in &chunks {
                f.push(c);
                for _ in 0..16 {
                    match f.next_frame() {
                        Ok(Some(_)) => {}
                        _ => break,
                    }
                }
            }
        }

        #[test]
        fn arbitrary_text_never_panics(s in "[<>/a-z:='\" &;#x0-9]{0,80}") {
            let _ = parse_element(&s);
            let mut f = Framer::default();
            f.push(HEADER.as_bytes());
            f.push(s.as_bytes());
            while let Ok(Some(_)) = f.next_frame() {}
        }
    }
}
