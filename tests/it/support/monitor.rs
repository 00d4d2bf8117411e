//! Redis MONITOR on a connection of its own: every command Redis runs, as
//! it runs it, scripts' own calls included. Tests act on what a replica
//! just did in Redis, or count what one call made Redis do.

use super::redis::RedisServer;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

pub struct Monitor {
    lines: tokio::io::Lines<BufReader<UnixStream>>,
}

/// One command as MONITOR showed it: its name (upper case) and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub name: String,
    pub args: Vec<String>,
    /// Run by a Lua script (MONITOR's `[0 lua]`).
    pub by_script: bool,
}

impl Monitor {
    pub async fn start(redis: &RedisServer) -> Monitor {
        let mut conn = UnixStream::connect(redis.socket()).await.expect("redis socket");
        conn.write_all(b"MONITOR\r\n").await.expect("MONITOR");
        let mut lines = BufReader::new(conn).lines();
        let ok = lines.next_line().await.expect("MONITOR answer");
        assert_eq!(ok.as_deref(), Some("+OK"));
        Monitor { lines }
    }

    /// The next command Redis runs (waits at most 20 s).
    pub async fn next(&mut self) -> Ran {
        let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("Redis ran no command within 20 s")
            .expect("MONITOR line")
            .expect("MONITOR ended");
        parse(&line).unwrap_or_else(|| panic!("not a MONITOR line: {line}"))
    }

    /// Reads up to the next `name` whose first argument starts with `key`.
    pub async fn until(&mut self, name: &str, key: &str) -> Ran {
        loop {
            let ran = self.next().await;
            if ran.name == name && ran.args.first().is_some_and(|a| a.starts_with(key)) {
                return ran;
            }
        }
    }

    /// Everything Redis ran up to `ECHO marker` (sent after the call under
    /// test returned), the marker excluded.
    pub async fn until_echo(&mut self, marker: &str) -> Vec<Ran> {
        let mut ran = Vec::new();
        loop {
            let r = self.next().await;
            if r.name == "ECHO" && r.args.first().is_some_and(|a| a == marker) {
                return ran;
            }
            ran.push(r);
        }
    }
}

/// `+1700000000.123456 [0 unix:/tmp/x/redis.sock] "GET" "key"`; quoted
/// arguments escape `"` and `\` with a backslash.
fn parse(line: &str) -> Option<Ran> {
    let rest = line.strip_prefix('+')?;
    let client_end = rest.find("] ")?;
    let by_script = rest[..client_end].ends_with(" lua");
    let mut words = Vec::new();
    let mut chars = rest[client_end + 2..].chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => word.extend(chars.next()),
                c => word.push(c),
            }
        }
        words.push(word);
    }
    let (name, args) = words.split_first()?;
    Some(Ran {
        name: name.to_ascii_uppercase(),
        args: args.to_vec(),
        by_script,
    })
}
