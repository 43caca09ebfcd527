//! `multipart/form-data` bodies (RFC 7578) around one stored file, for the native uploads that
//! take one (WhatsApp's media endpoint, Mattermost's files endpoint). The file is streamed from
//! the store, never read into memory whole, and the body's length is known up front so it goes
//! out with a `Content-Length` (not chunked: some upload endpoints refuse chunked bodies).

use std::io::{Cursor, Read};

use crate::skeleton::OutFile;

/// A body ready to send.
pub(crate) struct Form {
    /// `multipart/form-data; boundary=…`.
    pub content_type: String,
    pub length: u64,
    pub body: Box<dyn Read + Send>,
}

/// `fields` (name, value) then the file in part `field`, with its name and type.
pub(crate) fn form(fields: &[(&str, &str)], field: &str, file: &OutFile) -> Result<Form, String> {
    let (opened, len) = gatewarden_lifecycle::fsio::open_regular(&file.path)
        .ok()
        .ok_or_else(|| format!("the stored file {} is gone", file.name))?;
    let boundary = format!("gatewarden-{}", crate::sha256_hex(file.path.to_string_lossy().as_bytes()));
    let mut head = String::new();
    for (k, v) in fields {
        head.push_str(&format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n"));
    }
    head.push_str(&format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{}\"\r\nContent-Type: {}\r\n\r\n",
        quoted(&file.name),
        quoted(&file.kind)
    ));
    let tail = format!("\r\n--{boundary}--\r\n");
    let length = head.len() as u64 + len + tail.len() as u64;
    // The file is read up to the length announced: a file that grew cannot overrun it.
    let body = Cursor::new(head.into_bytes()).chain(opened.take(len)).chain(Cursor::new(tail.into_bytes()));
    Ok(Form { content_type: format!("multipart/form-data; boundary={boundary}"), length, body: Box::new(body) })
}

/// `s` safe inside a quoted header parameter: no quote, backslash or line break.
fn quoted(s: &str) -> String {
    let s: String = s.chars().filter(|c| !matches!(c, '"' | '\\') && !c.is_control()).collect();
    if s.is_empty() { "file".into() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_names_its_fields_and_file_and_says_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let f = OutFile { name: "a\"b\r\n.txt".into(), kind: "text/plain".into(), path, size: 3 };
        let mut form = form(&[("channel_id", "c1")], "files", &f).unwrap();
        let mut body = Vec::new();
        form.body.read_to_end(&mut body).unwrap();
        assert_eq!(body.len() as u64, form.length);
        let text = String::from_utf8(body).unwrap();
        let boundary = form.content_type.strip_prefix("multipart/form-data; boundary=").unwrap();
        assert!(text.starts_with(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"channel_id\"\r\n\r\nc1\r\n"
        )));
        assert!(
            text.contains("name=\"files\"; filename=\"ab.txt\"\r\nContent-Type: text/plain\r\n\r\nabc\r\n"),
            "{text}"
        );
        assert!(text.ends_with(&format!("--{boundary}--\r\n")));
    }
}
