//! What the HTTP chat platforms' file transfers share (issue 29 §1/§2; Discord and Slack):
//! the origins a file may be downloaded from or uploaded to, and a `multipart/form-data` body
//! streamed from the store.
//!
//! A file URL comes from the platform's event, so it is checked before anything is sent to
//! it: only the platform's own file hosts (or, with a configured `api_base`, that base's
//! origin: a fake, a proxy), so a credential that goes with a download (Slack's bot token)
//! never reaches another host, and a download never reaches into the local network.

use std::io::Read;

use crate::skeleton::OutFile;

/// `scheme://host[:port]` of `url`, lowercased, with the scheme's default port dropped;
/// `None` for anything but `http` and `https`, or a URL with user info.
pub(crate) fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => "443",
        "http" => "80",
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?.to_ascii_lowercase();
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let authority = match authority.rsplit_once(':') {
        // Not the `:` inside a bracketed IPv6 address.
        Some((host, port)) if !port.contains(']') => {
            if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            if port == default_port { host.to_owned() } else { authority.clone() }
        }
        _ => authority,
    };
    Some(format!("{scheme}://{authority}"))
}

/// The origins files may come from or go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileHosts {
    origins: Vec<String>,
}

impl FileHosts {
    /// The platform's public hosts (`public`) when `api_base` is the platform's default, else
    /// `api_base`'s own origin (the configured host serves the files too: a fake, a proxy).
    pub(crate) fn new(api_base: &str, default_base: &str, public: &[&str]) -> FileHosts {
        let origins = if api_base.trim_end_matches('/') == default_base.trim_end_matches('/') {
            public.iter().filter_map(|p| origin(p)).collect()
        } else {
            origin(api_base).into_iter().collect()
        };
        FileHosts { origins }
    }

    /// `Ok(())` when `url` is on one of the hosts; else why not (naming only the host).
    pub(crate) fn check(&self, url: &str) -> Result<(), String> {
        match origin(url) {
            Some(o) if self.origins.contains(&o) => Ok(()),
            Some(o) => Err(format!("the file is on {o}, not on the platform's file host")),
            None => Err("the file has no usable URL".into()),
        }
    }
}

/// A `multipart/form-data` body (RFC 7578) of `fields` then `file` in the part named `field`,
/// streamed from the store (the file is never read into memory whole): `(content type,
/// body)`. The file must still be the size the store said.
pub(crate) fn multipart(
    fields: &[(&str, String)],
    field: &str,
    file: &OutFile,
) -> Result<(String, Box<dyn Read + Send>), String> {
    let (opened, len) = gatewarden_lifecycle::fsio::open_regular(&file.path)
        .ok()
        .ok_or_else(|| format!("the stored file {} is gone", file.name))?;
    if len != file.size {
        return Err(format!("the stored file {} changed size", file.name));
    }
    let boundary = format!("gatewarden-{}", &crate::sha256_hex(file.path.to_string_lossy().as_bytes())[..32]);
    let mut head = String::new();
    for (k, v) in fields {
        head.push_str(&format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n"));
    }
    let name = header_safe(&file.name);
    head.push_str(&format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{name}\"\r\nContent-Type: {}\r\n\r\n",
        header_safe(&file.kind)
    ));
    let tail = format!("\r\n--{boundary}--\r\n");
    let body =
        std::io::Cursor::new(head.into_bytes()).chain(opened.take(len)).chain(std::io::Cursor::new(tail.into_bytes()));
    Ok((format!("multipart/form-data; boundary={boundary}"), Box::new(body)))
}

/// `s` without what would end a quoted header value or the header line.
pub(crate) fn header_safe(s: &str) -> String {
    let out: String = s.chars().filter(|c| !matches!(c, '"' | '\\') && !c.is_control()).collect();
    if out.trim().is_empty() { "file".into() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_compared_exactly() {
        assert_eq!(origin("https://files.slack.com/files-pri/T-F/x.png").as_deref(), Some("https://files.slack.com"));
        assert_eq!(origin("HTTPS://Files.Slack.com:443/x").as_deref(), Some("https://files.slack.com"));
        assert_eq!(origin("http://127.0.0.1:8080/api/").as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(origin("http://[::1]:9/x").as_deref(), Some("http://[::1]:9"));
        assert_eq!(origin("http://[::1]/x").as_deref(), Some("http://[::1]"));
        assert_eq!(origin("https://u:p@files.slack.com/x"), None, "user info");
        assert_eq!(origin("file:///etc/passwd"), None);
        assert_eq!(origin("https://x:notaport/"), None);
        let slack = FileHosts::new("https://slack.com/api/", "https://slack.com/api/", &["https://files.slack.com"]);
        assert!(slack.check("https://files.slack.com/files-pri/T-F/download/a.png").is_ok());
        assert!(slack.check("https://files.slack.com.evil.example/a.png").is_err());
        assert!(slack.check("http://files.slack.com/a.png").is_err(), "not over plain http");
        assert!(slack.check("https://slack.com/a.png").is_err());
        let fake = FileHosts::new("http://127.0.0.1:7/api/", "https://slack.com/api/", &["https://files.slack.com"]);
        assert!(fake.check("http://127.0.0.1:7/files-pri/x").is_ok());
        assert!(fake.check("http://127.0.0.1:8/files-pri/x").is_err(), "another port");
        assert!(fake.check("https://files.slack.com/x").is_err(), "a configured base replaces the public hosts");
    }

    #[test]
    fn a_multipart_body_streams_the_file_between_its_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"hello").unwrap();
        let f = OutFile { name: "a\"b\r\n.txt".into(), kind: "text/plain".into(), path, size: 5 };
        let (ctype, mut body) = multipart(&[("payload_json", "{}".into())], "files[0]", &f).unwrap();
        let mut s = String::new();
        body.read_to_string(&mut s).unwrap();
        let boundary = ctype.strip_prefix("multipart/form-data; boundary=").unwrap();
        assert!(s.starts_with(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"payload_json\"\r\n\r\n{{}}\r\n"
        )));
        assert!(
            s.contains("name=\"files[0]\"; filename=\"ab.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n"),
            "{s}"
        );
        assert!(s.ends_with(&format!("--{boundary}--\r\n")));
        let changed = OutFile { size: 4, ..f };
        assert!(multipart(&[], "f", &changed).is_err(), "a file that changed is not sent");
    }
}
