//! `multipart/form-data` request bodies (RFC 7578) with one file streamed from disk: the file
//! is never read into memory whole. Every upload (the chat platforms' files, the transcription
//! provider) builds its body here.

use std::io::Read;
use std::path::Path;

/// One file part: what the receiver is told and where the bytes are.
#[derive(Debug, Clone, Copy)]
pub struct FilePart<'a> {
    /// The form field the file goes in (`document`, `files[0]`, `file`).
    pub field: &'a str,
    pub name: &'a str,
    /// Its MIME type.
    pub kind: &'a str,
    pub path: &'a Path,
    /// The size the caller knows it to have: a file that changed since is not sent.
    pub size: u64,
}

/// A body ready to send. Its length is known up front, so it can go out with a
/// `Content-Length` (some upload endpoints refuse chunked bodies).
pub struct Form {
    /// `multipart/form-data; boundary=…`.
    pub content_type: String,
    pub length: u64,
    pub body: Box<dyn Read + Send>,
}

/// The body of `fields` then `file`. The file is opened without following links, and must be
/// a regular file of `file.size` bytes; it is read up to that length, so a file that grew
/// cannot overrun the length announced.
pub fn body(fields: &[(&str, &str)], file: FilePart<'_>) -> Result<Form, String> {
    let (opened, len) = gatewarden_lifecycle::fsio::open_regular(file.path)
        .ok()
        .ok_or_else(|| format!("the stored file {} is gone", file.name))?;
    if len != file.size {
        return Err(format!("the stored file {} changed size", file.name));
    }
    let boundary = boundary(file.path);
    let mut head = String::new();
    for (k, v) in fields {
        head.push_str(&format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n"));
    }
    head.push_str(&format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\nContent-Type: {}\r\n\r\n",
        header_safe(file.field),
        header_safe(file.name),
        header_safe(file.kind)
    ));
    let tail = format!("\r\n--{boundary}--\r\n");
    let length = head.len() as u64 + len + tail.len() as u64;
    let body =
        std::io::Cursor::new(head.into_bytes()).chain(opened.take(len)).chain(std::io::Cursor::new(tail.into_bytes()));
    Ok(Form { content_type: format!("multipart/form-data; boundary={boundary}"), length, body: Box::new(body) })
}

/// `s` without what would end a quoted header value or the header line.
pub fn header_safe(s: &str) -> String {
    let out: String = s.chars().filter(|c| !matches!(c, '"' | '\\') && !c.is_control()).collect();
    if out.trim().is_empty() { "file".into() } else { out }
}

/// A boundary no file is likely to hold: 128 bits from the process's random hasher keys.
fn boundary(path: &Path) -> String {
    use std::hash::BuildHasher;
    let word =
        |salt: u8| std::collections::hash_map::RandomState::new().hash_one((path, salt, std::time::SystemTime::now()));
    format!("gatewarden-{:016x}{:016x}", word(1), word(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_streams_between_its_fields_and_a_changed_file_is_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello").unwrap();
        let part = FilePart { field: "files[0]", name: "a\"b\r\n.txt", kind: "text/plain", path: &path, size: 5 };
        let mut form = body(&[("payload_json", "{}")], part).unwrap();
        let mut s = String::new();
        form.body.read_to_string(&mut s).unwrap();
        assert_eq!(s.len() as u64, form.length);
        let boundary = form.content_type.strip_prefix("multipart/form-data; boundary=").unwrap();
        assert!(s.starts_with(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"payload_json\"\r\n\r\n{{}}\r\n"
        )));
        assert!(
            s.contains("name=\"files[0]\"; filename=\"ab.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n"),
            "{s}"
        );
        assert!(s.ends_with(&format!("--{boundary}--\r\n")));
        assert!(super::body(&[], FilePart { size: 4, ..part }).is_err(), "a file that changed is not sent");
        // Closed first: Windows deletes an open file only once its last handle is gone.
        drop(form);
        std::fs::remove_file(&path).unwrap();
        assert!(super::body(&[], part).is_err(), "a file that is gone");
    }
}
