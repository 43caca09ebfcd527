//! `multipart/form-data` bodies (RFC 7578) as the fakes of this crate receive uploads
//! (whatsappfake.rs's media endpoint, mattermostfake.rs's files endpoint); the same reading as
//! crates/telegram-fake's.

/// One part: its field name, file name (a file part), content type and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormPart {
    pub name: String,
    pub filename: Option<String>,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// The parts of a `multipart/form-data` body with the boundary `content_type` names; `None`
/// when it is not one.
pub fn parse(content_type: &str, body: &[u8]) -> Option<Vec<FormPart>> {
    let boundary = content_type.split(';').find_map(|p| p.trim().strip_prefix("boundary="))?.trim_matches('"');
    let delim = format!("--{boundary}").into_bytes();
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
        let head = String::from_utf8_lossy(&part[..split]).into_owned();
        let mut p = FormPart { name: String::new(), filename: None, content_type: String::new(), bytes: part[split + 4..].to_vec() };
        for line in head.split("\r\n") {
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("content-disposition:") {
                for attr in line.split(';').map(str::trim) {
                    if let Some(v) = attr.strip_prefix("name=") {
                        p.name = v.trim_matches('"').to_owned();
                    } else if let Some(v) = attr.strip_prefix("filename=") {
                        p.filename = Some(v.trim_matches('"').to_owned());
                    }
                }
            } else if lower.starts_with("content-type:") {
                p.content_type = line["content-type:".len()..].trim().to_owned();
            }
        }
        parts.push(p);
        at = next + delim.len();
    }
}
