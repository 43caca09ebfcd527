//! What the HTTP chat platforms' file transfers share (issue 29 §1/§2; Discord and Slack):
//! the origins a file may be downloaded from or uploaded to, and a `multipart/form-data` body
//! of a stored file.
//!
//! A file URL comes from the platform's event, so it is checked before anything is sent to
//! it: only the platform's own file hosts (or, with a configured `api_base`, that base's
//! origin: a fake, a proxy), so a credential that goes with a download (Slack's bot token)
//! never reaches another host, and a download never reaches into the local network.

use std::io::Read;
use std::time::Duration;

use gatewarden_net::multipart::{FilePart, Form};

use crate::skeleton::OutFile;

/// `scheme://host[:port]` of `url` (WHATWG: lowercased, the scheme's default port dropped);
/// `None` for anything but `http` and `https`, or a URL with user info.
pub(crate) fn origin(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    if !matches!(u.scheme(), "http" | "https") || !u.username().is_empty() || u.password().is_some() {
        return None;
    }
    Some(u.origin().ascii_serialization())
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

/// A `multipart/form-data` body of `fields` then `file` in the part named `field`
/// (gatewarden_net::multipart), streamed from the store.
pub(crate) fn multipart(fields: &[(&str, &str)], field: &str, file: &OutFile) -> Result<Form, String> {
    let part = FilePart { field, name: &file.name, kind: &file.kind, path: &file.path, size: file.size };
    gatewarden_net::multipart::body(fields, part)
}

/// `form` POSTed to `url` with its length (some upload endpoints refuse chunked bodies), the
/// `Authorization` header the platform wants, bounded by `timeout`; the answer is the caller's
/// to read.
pub(crate) fn post_form(
    http: &ureq::Agent,
    url: &str,
    authorization: Option<&str>,
    form: Form,
    timeout: Duration,
) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    let mut request = http.post(url);
    if let Some(a) = authorization {
        request = request.header("Authorization", a);
    }
    request
        .header("Content-Type", &form.content_type)
        .header("Content-Length", &form.length.to_string())
        .config()
        .timeout_global(Some(timeout))
        .build()
        .send(ureq::SendBody::from_owned_reader(form.body))
}

/// `GET` of a file at `url` for the skeleton to stream into the store (attachments.rs): bounded
/// by `timeout` in all, with `bearer` where the platform's file host wants its token, and no
/// redirect followed (one could lead the download, and the token with it, off the host the
/// caller checked). Anything but 200 is refused naming only the status.
pub(crate) fn download(
    http: &ureq::Agent,
    url: &str,
    bearer: Option<&str>,
    timeout: Duration,
) -> Result<Box<dyn Read + Send>, String> {
    let mut request = http.get(url);
    if let Some(token) = bearer {
        request = request.header("Authorization", &format!("Bearer {token}"));
    }
    let response = request
        .config()
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .build()
        .call()
        .map_err(|e| gatewarden_net::describe(&e, url))?;
    match response.status().as_u16() {
        200 => Ok(Box::new(response.into_body().into_reader())),
        status => Err(format!("HTTP {status} for the file")),
    }
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
}
