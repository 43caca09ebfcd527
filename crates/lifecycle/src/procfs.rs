//! Pure parsers for the Linux `/proc` texts the platform facade reads (total: garbage in,
//! `None` or nothing out), kept here so they are unit-tested on every host.

/// The state letter of `/proc/<pid>/stat` (field 3: `R`, `S`, `T` stopped, `t` traced, …).
pub fn stat_state(content: &[u8]) -> Option<char> {
    let close = content.iter().rposition(|&c| c == b')')?;
    let rest = std::str::from_utf8(content.get(close + 1..)?).ok()?;
    rest.split_ascii_whitespace().next()?.chars().next()
}

/// Socket inodes listening on `port` in a `/proc/net/tcp` or `/proc/net/tcp6` text.
pub fn listening_inodes(text: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_ascii_whitespace().collect();
            let local_port = f.get(1)?.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok())?;
            (local_port == port && *f.get(3)? == LISTEN).then(|| f.get(9)?.parse().ok()).flatten()
        })
        .collect()
}

/// The inode of a `socket:[12345]` fd link target.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The systemd unit (`*.service`) a `/proc/self/cgroup` text places us in, and whether it
/// belongs to a user manager (`user@UID.service` in the path).
pub fn cgroup_service(text: &str) -> Option<(String, bool)> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let user = path.split('/').any(|seg| seg.starts_with("user@") && seg.ends_with(".service"));
    let unit = path.split('/').rev().find(|seg| seg.ends_with(".service") && !seg.starts_with("user@"))?;
    Some((unit.to_owned(), user))
}

/// The mappings of `exe` in a `/proc/<pid>/smaps` text whose pages are all clean copies of the
/// file: private, not writable, no anonymous (copied-on-write) page. Dropping such a mapping's
/// pages loses nothing; the kernel maps them again from the page cache when they run. The
/// relocated read-only data (RELRO) holds anonymous pages and is never listed. `(start, len)`.
pub fn clean_file_mappings(smaps: &str, exe: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // The mapping being read: its range, and whether it still qualifies.
    let mut current: Option<(usize, usize, bool)> = None;
    let flush = |c: Option<(usize, usize, bool)>, out: &mut Vec<(usize, usize)>| {
        if let Some((start, end, true)) = c {
            out.push((start, end - start));
        }
    };
    for line in smaps.lines() {
        let mut f = line.split_ascii_whitespace();
        let first = f.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            flush(current.take(), &mut out);
            let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
            let perms = f.next().unwrap_or("");
            // Skip offset, device and inode; the rest is the path (which may hold spaces).
            let path = line.splitn(6, |c: char| c.is_ascii_whitespace()).nth(5).unwrap_or("").trim_start();
            let ok =
                end > start && perms.len() == 4 && perms.as_bytes()[1] == b'-' && perms.ends_with('p') && path == exe;
            current = Some((start, end, ok));
        } else if let Some(c) = current.as_mut() {
            let kib = f.next().and_then(|v| v.parse::<u64>().ok());
            // Not `Private_Dirty`: a file just written (a fresh build) has dirty page-cache pages,
            // which are still the file's.
            if matches!(first, "Anonymous:" | "Swap:") && kib != Some(0) {
                c.2 = false;
            }
        }
    }
    flush(current, &mut out);
    out
}

/// `/proc/<pid>/stat` → `(utime + stime in clock ticks, threads, resident pages)`: fields 14,
/// 15, 20 and 24, counted after the last `)` (the command name may hold spaces and parens).
pub fn stat_usage(content: &[u8]) -> Option<(u64, u64, u64)> {
    let close = content.iter().rposition(|&c| c == b')')?;
    let rest = std::str::from_utf8(content.get(close + 1..)?).ok()?;
    // Index 0 is field 3 (state).
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let num = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some((num(14)?.saturating_add(num(15)?), num(20)?, num(24)?))
}

/// Linux `/proc/<pid>/stat` → (state, starttime field 22). The command name may contain spaces
/// and parentheses, so split after the **last** `)`.
pub fn parse_proc_stat(content: &[u8]) -> Option<(char, u64)> {
    let close = content.iter().rposition(|&c| c == b')')?;
    let rest = std::str::from_utf8(content.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // After ")" come field 3 (state) .. field 22 (starttime): index 0 is field 3.
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// The value of `key` in a NUL-separated environment block (`/proc/<pid>/environ`).
pub fn environ_value<'a>(environ: &'a [u8], key: &str) -> Option<&'a str> {
    environ.split(|&b| b == 0).find_map(|kv| {
        let rest = kv.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
        std::str::from_utf8(rest).ok()
    })
}

/// Linux `/proc/<pid>/stat` → parent pid (field 4).
pub fn parse_proc_stat_ppid(content: &[u8]) -> Option<u32> {
    let close = content.iter().rposition(|&c| c == b')')?;
    let rest = std::str::from_utf8(content.get(close + 1..)?).ok()?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// Parses `/proc/locks` for the holders of the file identified by device and inode.
/// Lines look like `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF`; blocked waiters
/// (`1: -> FLOCK …`) are not holders.
pub fn parse_proc_locks(text: &str, major: u64, minor: u64, inode: u64) -> Vec<u32> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f.get(1) == Some(&"->") {
            continue;
        }
        let mut dev = f[5].split(':');
        let (Some(ma), Some(mi), Some(ino)) = (dev.next(), dev.next(), dev.next()) else { continue };
        let same = u64::from_str_radix(ma, 16).ok() == Some(major)
            && u64::from_str_radix(mi, 16).ok() == Some(minor)
            && ino.parse::<u64>().ok() == Some(inode);
        if same && let Ok(pid) = f[4].parse::<u32>() {
            out.push(pid);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_lookup() {
        let env = b"A=1\0GATEWARDEN_RUN_TAG=ab:cd\0GATEWARDEN_RUN_TAGX=no\0\xff=\0";
        assert_eq!(environ_value(env, "GATEWARDEN_RUN_TAG"), Some("ab:cd"));
        assert_eq!(environ_value(env, "A"), Some("1"));
        assert_eq!(environ_value(env, "B"), None);
        assert_eq!(environ_value(b"", "A"), None);
    }

    #[test]
    fn proc_stat_with_hostile_comm() {
        let mut line = b"4242 (we ird) (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 3921877 19 20".to_vec();
        assert_eq!(parse_proc_stat(&line), Some(('R', 3_921_877)));
        assert_eq!(parse_proc_stat_ppid(&line), Some(1));
        line.truncate(20);
        assert_eq!(parse_proc_stat(&line), None);
        assert_eq!(parse_proc_stat(b"\xff\xfe)"), None);
    }

    proptest::proptest! {
        #[test]
        fn proc_stat_parser_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = parse_proc_stat(&bytes);
        }
    }

    #[test]
    fn proc_locks_parser() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 4343 fd:01:1234567 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 99 00:1a:1234567 0 EOF\n\
                    3: OFDLCK ADVISORY  READ  -1 fd:01:1234567 0 EOF\n\
                    garbage\n";
        assert_eq!(parse_proc_locks(text, 0xfd, 1, 1_234_567), vec![4242]);
        assert_eq!(parse_proc_locks(text, 0, 0x1a, 1_234_567), vec![99]);
        assert!(parse_proc_locks(text, 0xfd, 1, 7).is_empty());
    }

    #[test]
    fn stat_state_reads_the_letter_after_the_command() {
        assert_eq!(stat_state(b"42 (a b) c) T 1 42 42"), Some('T'));
        assert_eq!(stat_state(b"42 (gw) S 1"), Some('S'));
        assert_eq!(stat_state(b"garbage"), None);
        assert_eq!(stat_state(b"42 (x)"), None);
    }

    #[test]
    fn listening_sockets_by_port() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1EC6 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31337 1 0 100 0 0 10 0\n\
   1: 0100007F:1EC6 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 31338 1 0 100 0 0 10 0\n\
   2: garbage\n";
        assert_eq!(listening_inodes(t, 7878), vec![31337]);
        assert!(listening_inodes(t, 80).is_empty());
        assert!(listening_inodes("", 80).is_empty());
    }

    #[test]
    fn socket_links() {
        assert_eq!(socket_inode("socket:[31337]"), Some(31337));
        assert_eq!(socket_inode("/dev/null"), None);
        assert_eq!(socket_inode("socket:[x]"), None);
    }

    #[test]
    fn cgroup_units() {
        let user = "0::/user.slice/user-0.slice/user@0.service/app.slice/gatewarden-1a2b.service\n";
        assert_eq!(cgroup_service(user), Some(("gatewarden-1a2b.service".into(), true)));
        assert_eq!(cgroup_service("0::/system.slice/gw.service\n"), Some(("gw.service".into(), false)));
        assert_eq!(cgroup_service("0::/user.slice/user-0.slice/user@0.service/init.scope\n"), None);
        assert_eq!(cgroup_service("0::/\n"), None);
        assert_eq!(cgroup_service("junk"), None);
    }

    #[test]
    fn clean_mappings_of_the_executable_only() {
        let t = "\
55ec78c84000-55ec78e1b000 r--p 00000000 fe:00 5654265                    /opt/gw bin/gatewarden
Rss:                 816 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
Swap:                  0 kB
55ec78e1b000-55ec79510000 r-xp 00196000 fe:00 5654265                    /opt/gw bin/gatewarden
Anonymous:             0 kB
55ec79510000-55ec7953e000 r--p 0088a000 fe:00 5654265                    /opt/gw bin/gatewarden
Private_Dirty:       184 kB
Anonymous:           184 kB
55ec7953e000-55ec79543000 rw-p 008b7000 fe:00 5654265                    /opt/gw bin/gatewarden
Anonymous:             0 kB
7f0000000000-7f0000001000 r-xp 00000000 fe:00 1                          /usr/lib/libc.so.6
Anonymous:             0 kB
7f0000002000-7f0000003000 r-xp 00000000 fe:00 1                          /opt/gw bin/gatewarden (deleted)
Anonymous:             0 kB
garbage line
";
        assert_eq!(
            clean_file_mappings(t, "/opt/gw bin/gatewarden"),
            vec![(0x55ec78c84000, 0x197000), (0x55ec78e1b000, 0x6f5000)]
        );
        assert_eq!(clean_file_mappings(t, "/opt/gw bin/gatewarden (deleted)"), vec![(0x7f0000002000, 0x1000)]);
        assert!(clean_file_mappings("", "/x").is_empty());
        assert!(clean_file_mappings("zz-yy r-xp 0 0 0 /x\nAnonymous: 0 kB\n", "/x").is_empty());
    }

    #[test]
    fn usage_fields_are_counted_after_the_command_name() {
        let stat = b"4242 (gate way) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 7 0 3921877 10000000 900 18446744073709551615";
        assert_eq!(stat_usage(stat), Some((175, 7, 900)));
        assert_eq!(stat_usage(b"4242 (x) S 1"), None);
        assert_eq!(stat_usage(b"no parens"), None);
    }
}
