//! `multipart/form-data` bodies (RFC 7578), read whole and synchronously: what the fakes need
//! to take an upload apart. Total on any input: a body that is not a well-formed form is
//! `None`, never a panic.

/// One part: its field name, file name (a file part), content type and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormPart {
    pub name: String,
    pub filename: Option<String>,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// RFC 2046 §5.1.1: a boundary is 1 to 70 characters.
const MAX_BOUNDARY: usize = 70;

/// The boundary a `multipart/…` content type names (quotes removed); `None` without one, or
/// with one that is empty or longer than RFC 2046 allows.
pub fn boundary(content_type: &str) -> Option<&str> {
    let b = content_type.split(';').find_map(|p| p.trim().strip_prefix("boundary="))?.trim_matches('"');
    (!b.is_empty() && b.len() <= MAX_BOUNDARY).then_some(b)
}

/// The parts of a `multipart/form-data` body with the boundary `content_type` names; `None`
/// when it is not one (no boundary, a delimiter or a part's blank line missing, no close).
pub fn parse(content_type: &str, body: &[u8]) -> Option<Vec<FormPart>> {
    let delim = format!("--{}", boundary(content_type)?).into_bytes();
    let find = |hay: &[u8], from: usize| {
        hay.get(from..)?.windows(delim.len()).position(|w| w == delim.as_slice()).map(|i| i + from)
    };
    let mut parts = Vec::new();
    let mut at = find(body, 0)? + delim.len();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Some(parts);
        }
        let start = at + 2; // the CRLF after the delimiter
        let next = find(body, start)?;
        let part = body.get(start..next.checked_sub(2)?)?; // without the CRLF before it
        let split = part.windows(4).position(|w| w == b"\r\n\r\n")?;
        let (head, content) = (part.get(..split)?, part.get(split + 4..)?);
        parts.push(part_of(&String::from_utf8_lossy(head), content));
        at = next + delim.len();
    }
}

/// A part from its header lines and content.
fn part_of(head: &str, content: &[u8]) -> FormPart {
    let mut p = FormPart { name: String::new(), filename: None, content_type: String::new(), bytes: content.to_vec() };
    for line in head.split("\r\n") {
        let Some((key, value)) = line.split_once(':') else { continue };
        let key = key.trim();
        if key.eq_ignore_ascii_case("content-disposition") {
            for attr in value.split(';').map(str::trim) {
                if let Some(v) = attr.strip_prefix("name=") {
                    p.name = v.trim_matches('"').to_owned();
                } else if let Some(v) = attr.strip_prefix("filename=") {
                    p.filename = Some(v.trim_matches('"').to_owned());
                }
            }
        } else if key.eq_ignore_ascii_case("content-type") {
            p.content_type = value.trim().to_owned();
        }
    }
    p
}

/// The first part's bytes that is a file (has a file name), else the first part's.
pub fn first_file(parts: Vec<FormPart>) -> Option<Vec<u8>> {
    let i = parts.iter().position(|p| p.filename.is_some()).unwrap_or(0);
    parts.into_iter().nth(i).map(|p| p.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CT: &str = "multipart/form-data; boundary=\"XyZ\"";
    const BODY: &[u8] = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n42\r\n\
--XyZ\r\ncontent-disposition: form-data; name=\"photo\"; filename=\"a b.png\"\r\nCONTENT-TYPE:  image/png \r\n\r\n\
\x89PNG\r\n--X\r\n\r\n--XyZ--\r\nepilogue";

    #[test]
    fn fields_and_files_with_their_names_types_and_bytes() {
        let parts = parse(CT, BODY).expect("a form");
        assert_eq!(parts.len(), 2);
        assert_eq!(
            (parts[0].name.as_str(), parts[0].filename.as_deref(), parts[0].bytes.as_slice()),
            ("chat_id", None, &b"42"[..])
        );
        assert_eq!(parts[1].name, "photo");
        assert_eq!(parts[1].filename.as_deref(), Some("a b.png"));
        assert_eq!(parts[1].content_type, "image/png");
        // Content that looks like a shorter delimiter or a blank line stays content.
        assert_eq!(parts[1].bytes, b"\x89PNG\r\n--X\r\n".to_vec());
        assert_eq!(first_file(parts), Some(b"\x89PNG\r\n--X\r\n".to_vec()));
    }

    #[test]
    fn not_a_form_is_none() {
        assert_eq!(parse("application/json", BODY), None);
        assert_eq!(parse("multipart/form-data; boundary=", BODY), None);
        assert_eq!(parse(&format!("multipart/form-data; boundary={}", "b".repeat(71)), BODY), None);
        assert_eq!(parse("multipart/form-data; boundary=other", BODY), None);
        // No close delimiter.
        assert_eq!(parse(CT, b"--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\nx"), None);
        assert_eq!(parse(CT, b"--XyZ--").map(|p| p.len()), Some(0));
        assert_eq!(first_file(Vec::new()), None);
    }

    #[test]
    fn hostile_bodies_never_panic() {
        // Every cut of a good body, and bytes from a fixed xorshift: total, with no panic.
        for end in 0..BODY.len() {
            let cut = &BODY[..end];
            let parsed = parse(CT, cut);
            assert!(parsed.is_none() || end > BODY.len() - 12, "cut at {end} parsed: {parsed:?}");
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet = b"-XyZ\r\n:;=\"ab";
        for _ in 0..2000 {
            let body: Vec<u8> = (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    alphabet[(x % alphabet.len() as u64) as usize]
                })
                .collect();
            let _ = parse(CT, &body);
            let _ = parse("multipart/form-data; boundary=-", &body);
        }
    }
}
