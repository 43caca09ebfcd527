//! Real mail servers for the email tests: Dovecot (IMAP with IDLE, LMTP, and its submission
//! service) and OpenSMTPD (the MTA), each from a private config in one temp dir, on free
//! loopback ports, with TLS from a test CA made at test time ([`crate::tls::TestCa`]).
//!
//! The mail path is the real one: a test message is handed to OpenSMTPD by plain SMTP
//! ([`MailServer::send`]), which delivers it into Dovecot by LMTP; the bot reads it by IMAP and
//! answers through Dovecot's submission service (STARTTLS or implicit TLS, AUTH PLAIN), which
//! relays to OpenSMTPD, which delivers into the recipient's maildir, which the test reads from
//! disk ([`MailServer::maildir`]). Users live in a passwd-file with a static uid/gid.
//!
//! OpenSMTPD 6.8 on Debian 12 cannot serve TLS with OpenSSL 3 (its privilege-separated key
//! engine fails every handshake), so submission is Dovecot's; OpenSMTPD listens in plain text
//! on loopback only. Its spool (`/var/spool/smtpd`) and control socket (`/run/smtpd.sock`) are
//! compiled in: each instance runs in its own mount namespace (`unshare -m`) with private
//! tmpfs mounts there, so tests run side by side. Both need root (privilege separation); the
//! tests run as root here. Installed by `scripts/setup-mail`.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::api::free_ports;
use crate::servers::{Proc, tail, wait_ready};
use crate::tls::{TestCa, Validity};

/// The mail domain every test user is in.
pub const DOMAIN: &str = "example.test";
/// The test users (`<name>@example.test`, password `pw-<name>`).
pub const USERS: [&str; 4] = ["bot", "alice", "bob", "carol"];
/// Both servers listen within a second; the bound only guards a broken install.
const READY: Duration = Duration::from_secs(20);
/// The uid/gid mail is stored as (Debian's `nobody`).
const MAIL_UID: u32 = 65534;

/// The address of test user `name`.
pub fn address(name: &str) -> String {
    format!("{name}@{DOMAIN}")
}

/// The password of test user `name`.
pub fn password(name: &str) -> String {
    format!("pw-{name}")
}

fn bin(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin")]).map(|d| d.join(name)).find(|p| p.is_file())
}

/// One decoded message of a test user's maildir.
#[derive(Debug, Clone)]
pub struct Reply {
    pub subject: String,
    /// The id it answers, without `<>`.
    pub in_reply_to: String,
    pub text: String,
}

/// One file a raw message carries as a MIME part (mail-parser's attachments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailFile {
    /// `Content-Disposition`'s `filename` (else `Content-Type`'s `name`).
    pub name: String,
    /// `type/subtype` of its `Content-Type`.
    pub kind: String,
    /// Decoded.
    pub bytes: Vec<u8>,
}

/// The files `raw` carries, and the id it answers (`In-Reply-To`, without `<>`).
pub fn files_of(raw: &[u8]) -> (String, Vec<MailFile>) {
    use mail_parser::MimeHeaders;
    let Some(msg) = mail_parser::MessageParser::default().parse(raw) else { return (String::new(), Vec::new()) };
    let files = msg
        .attachments()
        .map(|a| MailFile {
            name: a.attachment_name().unwrap_or_default().to_owned(),
            kind: a.content_type().map(|c| format!("{}/{}", c.ctype(), c.subtype().unwrap_or_default())).unwrap_or_default(),
            bytes: a.contents().to_vec(),
        })
        .collect();
    (msg.in_reply_to().as_text().unwrap_or_default().to_owned(), files)
}

/// Dovecot and OpenSMTPD for one test.
pub struct MailServer {
    dir: TempDir,
    dovecot: PathBuf,
    smtpd: PathBuf,
    ca: PathBuf,
    ports: Ports,
    dovecot_proc: Option<Proc>,
    smtpd_proc: Option<Proc>,
    /// The test CA's certificate, trusted by [`MailServer::imap_messages`].
    ca_der: tokio_rustls::rustls::pki_types::CertificateDer<'static>,
}

#[derive(Clone, Copy)]
struct Ports {
    imap: u16,
    imaps: u16,
    lmtp: u16,
    submission: u16,
    submissions: u16,
    smtp: u16,
}

impl MailServer {
    /// Writes the configs and starts both servers. `None` (with a `SKIPPED:` line) when they
    /// are not installed or this is not root; a panic under `CI`.
    pub fn start() -> Option<MailServer> {
        MailServer::start_with(true)
    }

    /// [`MailServer::start`] with a Dovecot that does not announce IDLE (RFC 2177), as some
    /// servers do not: clients must poll.
    pub fn start_without_idle() -> Option<MailServer> {
        MailServer::start_with(false)
    }

    fn start_with(idle: bool) -> Option<MailServer> {
        let (Some(dovecot), Some(smtpd)) = (bin("dovecot"), bin("smtpd")) else {
            return crate::unavailable("dovecot and OpenSMTPD", "not installed (run scripts/setup-mail)");
        };
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return crate::unavailable("dovecot and OpenSMTPD", "they need root (privilege separation)");
        }
        let dir = tempfile::Builder::new().prefix("gw-mail-").tempdir().expect("mail temp dir");
        let d = dir.path();
        {
            use std::os::unix::fs::PermissionsExt;
            // Dovecot's mail processes (uid 65534) reach the maildirs through it.
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711)).expect("chmod mail dir");
        }
        let ca = TestCa::new("gatewarden mail test CA");
        let leaf = ca.leaf(&["127.0.0.1", "localhost"], Validity::Now);
        std::fs::write(d.join("cert.pem"), &leaf.cert_pem).expect("cert");
        write_private(&d.join("key.pem"), &leaf.key_pem);
        let ca_path = ca.write_pem(d, "ca.pem");
        for sub in ["run", "state"] {
            std::fs::create_dir(d.join(sub)).expect("dovecot dirs");
        }
        let mail = d.join("mail");
        std::fs::create_dir(&mail).expect("mail dir");
        std::os::unix::fs::chown(&mail, Some(MAIL_UID), Some(MAIL_UID)).expect("chown mail dir");
        let users: String = USERS.iter().map(|u| format!("{}:{{PLAIN}}{}::::::\n", address(u), password(u))).collect();
        // Read by Dovecot's auth process, which runs as the `dovecot` user (test passwords only).
        std::fs::write(d.join("users"), &users).expect("users");
        let [imap, imaps, lmtp, submission, submissions, smtp] = free_ports();
        let ports = Ports {
            imap,
            imaps,
            lmtp,
            submission,
            submissions,
            smtp,
        };
        let mut conf = dovecot_config(d, ports);
        if !idle {
            conf += "imap_capability = IMAP4rev1 SASL-IR LOGIN-REFERRALS ID ENABLE LITERAL+ UIDPLUS\n";
        }
        std::fs::write(d.join("dovecot.conf"), conf).expect("dovecot.conf");
        std::fs::write(d.join("vusers"), format!("@{DOMAIN} nobody\n")).expect("vusers");
        write_private(&d.join("smtpd.conf"), &smtpd_config(d, ports));
        let ca_der = leaf.chain.last().cloned().expect("the leaf's chain ends with the CA");
        let mut s =
            MailServer { dir, dovecot, smtpd, ca: ca_path, ports, dovecot_proc: None, smtpd_proc: None, ca_der };
        let started = Instant::now();
        s.launch_dovecot();
        s.launch_smtpd();
        eprintln!("[testkit] dovecot and smtpd ready in {:.3} s", started.elapsed().as_secs_f64());
        Some(s)
    }

    fn launch_dovecot(&mut self) {
        assert!(self.dovecot_proc.is_none(), "dovecot already running");
        let d = self.dir.path();
        // A pid file left by a killed run would stop the start; it is ours to remove.
        let _ = std::fs::remove_file(d.join("run/master.pid"));
        let mut cmd = Command::new(&self.dovecot);
        cmd.arg("-F").arg("-c").arg(d.join("dovecot.conf"));
        let log = d.join("dovecot.out");
        let mut proc = Proc::spawn(cmd, &log).expect("spawn dovecot");
        let addrs = [self.ports.imap, self.ports.imaps, self.ports.lmtp, self.ports.submission, self.ports.submissions]
            .map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p)));
        wait_ready("dovecot", &mut proc, &log, READY, || {
            addrs.iter().all(|a| TcpStream::connect_timeout(a, Duration::from_secs(1)).is_ok())
        });
        self.dovecot_proc = Some(proc);
    }

    fn launch_smtpd(&mut self) {
        assert!(self.smtpd_proc.is_none(), "smtpd already running");
        let d = self.dir.path();
        let script = format!(
            "mount -t tmpfs -o mode=0755 tmpfs /var/spool && mkdir -m 0711 /var/spool/smtpd && \
             mount -t tmpfs -o mode=0755 tmpfs /run && exec {} -d -f {}",
            self.smtpd.display(),
            d.join("smtpd.conf").display()
        );
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c", &script]);
        let log = d.join("smtpd.out");
        let mut proc = Proc::spawn(cmd, &log).expect("spawn unshare smtpd");
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.smtp));
        wait_ready("smtpd", &mut proc, &log, READY, || TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok());
        self.smtpd_proc = Some(proc);
    }

    /// The test CA (PEM), for `ca_file`.
    pub fn ca_file(&self) -> &Path {
        &self.ca
    }

    /// `imaps://127.0.0.1:<port>` (implicit TLS).
    pub fn imaps_url(&self) -> String {
        format!("imaps://127.0.0.1:{}", self.ports.imaps)
    }

    /// `imap://127.0.0.1:<port>` (STARTTLS).
    pub fn imap_starttls_url(&self) -> String {
        format!("imap://127.0.0.1:{}", self.ports.imap)
    }

    /// `smtp://127.0.0.1:<port>` (submission with STARTTLS).
    pub fn submission_url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.ports.submission)
    }

    /// `smtps://127.0.0.1:<port>` (submission with implicit TLS).
    pub fn submissions_url(&self) -> String {
        format!("smtps://127.0.0.1:{}", self.ports.submissions)
    }

    /// The MTA's plain SMTP address (where test mail is handed in).
    pub fn smtp_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.smtp))
    }

    /// Hands `raw` (a whole message, CRLF lines) to the MTA for `to` (plain SMTP, as another
    /// mail server would). The MTA delivers it into Dovecot shortly after.
    pub fn send_raw(&self, from: &str, to: &str, raw: &str) {
        let stream = TcpStream::connect(self.smtp_addr()).expect("connect to smtpd");
        stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let mut r = BufReader::new(stream.try_clone().expect("clone"));
        let mut w = stream;
        let mut expect = |code: &str| {
            loop {
                let mut line = String::new();
                r.read_line(&mut line).expect("read SMTP reply");
                assert!(line.starts_with(code), "smtpd said {line:?}, expected {code}");
                if line.as_bytes().get(3) != Some(&b'-') {
                    break;
                }
            }
        };
        expect("220");
        for (cmd, code) in [
            ("EHLO test.example".to_owned(), "250"),
            (format!("MAIL FROM:<{from}>"), "250"),
            (format!("RCPT TO:<{to}>"), "250"),
            ("DATA".to_owned(), "354"),
        ] {
            write!(w, "{cmd}\r\n").expect("write SMTP");
            expect(code);
        }
        let body = raw.replace("\r\n", "\n").replace('\n', "\r\n");
        let stuffed: String = body.split("\r\n").map(|l| if l.starts_with('.') { format!(".{l}\r\n") } else { format!("{l}\r\n") }).collect();
        write!(w, "{stuffed}.\r\n").expect("write DATA");
        expect("250");
        write!(w, "QUIT\r\n").expect("QUIT");
    }

    /// Sends a plain text message from test user `from` to `to` with `Message-ID: <id>` and
    /// the extra header lines `headers` (each without CRLF).
    pub fn send(&self, from: &str, to: &str, id: &str, subject: &str, body: &str, headers: &[&str]) {
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        let raw = format!(
            "From: {from}\r\nTo: {to}\r\nSubject: {subject}\r\nMessage-ID: <{id}>\r\nDate: {date}\r\n{extra}MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n",
            date = rfc2822_now(),
        );
        self.send_raw(from, to, &raw);
    }

    /// The messages in test user `name`'s INBOX maildir (new and cur), oldest first by file
    /// name, as text.
    pub fn maildir(&self, name: &str) -> Vec<String> {
        let base = self.dir.path().join("mail").join(address(name));
        let mut files: Vec<PathBuf> = ["new", "cur"]
            .iter()
            .filter_map(|s| std::fs::read_dir(base.join(s)).ok())
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        files.iter().filter_map(|p| std::fs::read(p).ok()).map(|b| String::from_utf8_lossy(&b).into_owned()).collect()
    }

    /// The messages in test user `name`'s INBOX as an IMAP client reads them (implicit TLS
    /// verified against the test CA, `LOGIN`, `SELECT INBOX`, `FETCH 1:* BODY.PEEK[]`), raw,
    /// in mailbox order. A blocking client of its own: the adapter's is not what is tested here.
    pub fn imap_messages(&self, name: &str) -> Vec<Vec<u8>> {
        use tokio_rustls::rustls;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).expect("the test CA");
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("server name");
        let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), server).expect("TLS client");
        let tcp = TcpStream::connect((Ipv4Addr::LOCALHOST, self.ports.imaps)).expect("connect to IMAPS");
        tcp.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let mut r = BufReader::new(rustls::StreamOwned::new(conn, tcp));
        let mut line = String::new();
        r.read_line(&mut line).expect("IMAP greeting");
        let mut messages = Vec::new();
        let commands = [
            format!("a1 LOGIN \"{}\" \"{}\"", address(name), password(name)),
            "a2 SELECT INBOX".to_owned(),
            "a3 FETCH 1:* (BODY.PEEK[])".to_owned(),
            "a4 LOGOUT".to_owned(),
        ];
        for cmd in &commands {
            r.get_mut().write_all(format!("{cmd}\r\n").as_bytes()).expect("write IMAP");
            let tag = cmd.split(' ').next().unwrap_or_default();
            loop {
                let mut buf = Vec::new();
                if r.read_until(b'\n', &mut buf).expect("read IMAP") == 0 {
                    return messages;
                }
                let l = String::from_utf8_lossy(&buf).trim_end().to_owned();
                // `* n FETCH (BODY[] {len}`: the message's bytes follow, then `)`.
                if let Some(len) =
                    l.strip_suffix('}').and_then(|h| h.rsplit_once('{')).and_then(|(_, n)| n.parse::<usize>().ok())
                {
                    let mut body = vec![0; len];
                    std::io::Read::read_exact(&mut r, &mut body).expect("read a message");
                    messages.push(body);
                    continue;
                }
                if l.starts_with(&format!("{tag} ")) {
                    // An empty mailbox answers the FETCH with NO or BAD: no messages.
                    assert!(tag == "a3" || tag == "a4" || l.starts_with(&format!("{tag} OK")), "IMAP said {l:?} to {tag}");
                    break;
                }
            }
        }
        messages
    }

    /// The messages in `name`'s maildir, decoded: (subject, In-Reply-To, text body).
    pub fn replies(&self, name: &str) -> Vec<Reply> {
        self.maildir(name)
            .iter()
            .filter_map(|raw| mail_parser::MessageParser::default().parse(raw.as_bytes()).map(|m| Reply {
                subject: m.subject().unwrap_or_default().to_owned(),
                in_reply_to: m.in_reply_to().as_text().unwrap_or_default().to_owned(),
                text: m.body_text(0).map(|t| t.trim().to_owned()).unwrap_or_default(),
            }))
            .collect()
    }

    /// The text bodies of `name`'s messages.
    pub fn texts(&self, name: &str) -> Vec<String> {
        self.replies(name).into_iter().map(|r| r.text).collect()
    }

    /// INBOX's UIDVALIDITY for `name`, from Dovecot's `dovecot-uidlist` (once it exists).
    pub fn uidvalidity(&self, name: &str) -> Option<u32> {
        let list = std::fs::read_to_string(self.dir.path().join("mail").join(address(name)).join("dovecot-uidlist")).ok()?;
        list.lines().next()?.split(' ').find_map(|w| w.strip_prefix('V')).and_then(|v| v.parse().ok())
    }

    /// Gives `name`'s INBOX a new UIDVALIDITY, as a restored or recreated mailbox has: Dovecot
    /// is stopped, its UID list and indexes are replaced, and it is started again. Every
    /// message keeps its text and gets a new UID.
    pub fn reset_uidvalidity(&mut self, name: &str) -> u32 {
        self.stop_dovecot();
        let dir = self.dir.path().join("mail").join(address(name));
        let old = self.uidvalidity(name).unwrap_or(1);
        let new = old.wrapping_add(1000);
        for e in std::fs::read_dir(&dir).expect("maildir").flatten() {
            if e.file_name().to_string_lossy().starts_with("dovecot.index") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        std::fs::write(dir.join("dovecot-uidlist"), format!("3 V{new} N1\n")).expect("write dovecot-uidlist");
        std::os::unix::fs::chown(dir.join("dovecot-uidlist"), Some(MAIL_UID), Some(MAIL_UID)).expect("chown uidlist");
        self.launch_dovecot();
        new
    }

    /// Kills Dovecot (IMAP, LMTP and submission): every client connection breaks.
    pub fn stop_dovecot(&mut self) {
        if let Some(p) = self.dovecot_proc.take() {
            p.kill();
        }
    }

    /// Starts Dovecot again on the same ports with the same mail.
    pub fn start_dovecot(&mut self) {
        self.launch_dovecot();
    }

    /// Both logs' tails, for failure messages.
    pub fn log_tail(&self) -> String {
        let d = self.dir.path();
        format!(
            "--- dovecot ---\n{}\n--- smtpd ---\n{}",
            tail(&d.join("dovecot.log"), 4000),
            tail(&d.join("smtpd.out"), 4000)
        )
    }
}

impl Drop for MailServer {
    fn drop(&mut self) {
        if let Some(p) = self.smtpd_proc.take() {
            p.kill();
        }
        self.stop_dovecot();
    }
}

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(path).expect("write");
    f.write_all(text.as_bytes()).expect("write");
}

/// Now as an RFC 5322 date (UTC).
fn rfc2822_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const M: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!(
        "{day} {} {year} {:02}:{:02}:{:02} +0000",
        M[(month - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn dovecot_config(d: &Path, p: Ports) -> String {
    let d = d.display();
    format!(
        r#"base_dir = {d}/run
state_dir = {d}/state
instance_name = gw-mail-{imap}
log_path = {d}/dovecot.log
protocols = imap lmtp submission
listen = 127.0.0.1
hostname = localhost
ssl = required
ssl_cert = <{d}/cert.pem
ssl_key = <{d}/key.pem
disable_plaintext_auth = yes
auth_mechanisms = plain login
first_valid_uid = 1
mail_location = maildir:{d}/mail/%u
submission_relay_host = 127.0.0.1
submission_relay_port = {smtp}
submission_relay_trusted = yes
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/users
}}
userdb {{
  driver = static
  args = uid={MAIL_UID} gid={MAIL_UID} home={d}/mail/%u
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {imap}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {imaps}
    ssl = yes
  }}
}}
service submission-login {{
  inet_listener submission {{
    address = 127.0.0.1
    port = {submission}
  }}
  inet_listener submissions {{
    address = 127.0.0.1
    port = {submissions}
    ssl = yes
  }}
}}
service lmtp {{
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {lmtp}
  }}
}}
"#,
        imap = p.imap,
        imaps = p.imaps,
        lmtp = p.lmtp,
        submission = p.submission,
        submissions = p.submissions,
        smtp = p.smtp,
    )
}

fn smtpd_config(d: &Path, p: Ports) -> String {
    let d = d.display();
    format!(
        "table vusers file:{d}/vusers\n\
         smtp max-message-size 64M\n\
         listen on 127.0.0.1 port {smtp} hostname localhost\n\
         action \"dovecot\" lmtp \"127.0.0.1:{lmtp}\" rcpt-to virtual <vusers>\n\
         match from any for domain \"{DOMAIN}\" action \"dovecot\"\n",
        smtp = p.smtp,
        lmtp = p.lmtp,
    )
}
