//! Redis Sentinel: `redis+sentinel://[user:password@]host:port,host:port/service`
//! (`rediss+sentinel://` for TLS to the Sentinels and the primary).
//!
//! The Sentinels name the primary (redis-rs's `SentinelClient`, which also
//! checks that the named node says it is a primary); commands then go over
//! one multiplexed connection to it. A connection error, a timeout or a
//! `READONLY` answer (a demoted primary) drops that connection, and the next
//! call asks the Sentinels again: a failover is followed without a restart.
//! Sentinel also closes the clients of a primary it demotes, so a demoted
//! primary that stays up is left as quickly as a dead one.
//!
//! The credentials in the URL are the primary's (ACL `user:password`); the
//! Sentinels' own, if they have any, are `redis.sentinel_username` and
//! `redis.sentinel_password`: Sentinels often run without a password, and
//! an `AUTH` to a Sentinel that has none is an error.

use super::tls::TlsFiles;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline};
use redis::{RedisError, RedisFuture, RedisResult, ServerErrorKind, TlsMode, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SENTINEL_SCHEME: &str = "redis+sentinel://";
const TLS_SENTINEL_SCHEME: &str = "rediss+sentinel://";

/// A parsed Sentinel URL. `Debug` hides the login.
#[derive(PartialEq)]
pub(crate) struct SentinelTarget {
    pub(super) sentinels: Vec<(String, u16)>,
    service: String,
    pub(super) tls: bool,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

impl SentinelTarget {
    /// `None` when `url` is not a Sentinel URL. Errors never echo the URL.
    pub(super) fn parse(url: &str) -> Option<Result<SentinelTarget, String>> {
        let (rest, tls) = match url.strip_prefix(SENTINEL_SCHEME) {
            Some(rest) => (rest, false),
            None => (url.strip_prefix(TLS_SENTINEL_SCHEME)?, true),
        };
        Some(parse_rest(rest, tls))
    }
}

impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelTarget")
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("tls", &self.tls)
            .field("login", &"<redacted>")
            .finish()
    }
}

const SHAPE: &str = "a Sentinel URL is redis+sentinel://[user:password@]host:port,host:port/service[/db]";

fn parse_rest(rest: &str, tls: bool) -> Result<SentinelTarget, String> {
    let (authority, path) = rest.split_once('/').ok_or(SHAPE)?;
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), authority),
    };
    let (service, db) = match path.trim_end_matches('/').split_once('/') {
        Some((service, db)) => (service, db),
        None => (path.trim_end_matches('/'), "0"),
    };
    if service.is_empty() || service.contains(['?', '#']) || db.contains(['?', '#', '/']) {
        return Err(SHAPE.into());
    }
    let scheme = if tls { "rediss" } else { "redis" };
    let mut sentinels = Vec::new();
    let mut login = None;
    for host in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        // redis-rs parses each one: host, port and the decoded login.
        let info = format!("{scheme}://{auth}{host}/{db}")
            .into_connection_info()
            .map_err(|e| format!("a Sentinel is not host:port, or the db not a number ({:?})", e.kind()))?;
        let (ConnectionAddr::Tcp(h, p) | ConnectionAddr::TcpTls { host: h, port: p, .. }) = info.addr() else {
            return Err(SHAPE.into());
        };
        sentinels.push((h.clone(), *p));
        let r = info.redis_settings();
        login = Some((r.username().map(str::to_owned), r.password().map(str::to_owned), r.db()));
    }
    let Some((username, password, db)) = login else {
        return Err("a Sentinel URL needs at least one host:port".into());
    };
    Ok(SentinelTarget {
        sentinels,
        service: service.to_string(),
        tls,
        username,
        password,
        db,
    })
}

/// Connection to whichever node the Sentinels name the primary; cheap to clone.
#[derive(Clone)]
pub(crate) struct SentinelConn(Arc<Shared>);

struct Shared {
    client: tokio::sync::Mutex<SentinelClient>,
    current: arc_swap::ArcSwapOption<MultiplexedConnection>,
    config: AsyncConnectionConfig,
    service: String,
    db: i64,
    /// Why the last look-up found no primary (for `/readyz`); no secrets.
    last_error: Mutex<Option<String>>,
    /// A look-up runs apart from the call that started it, so a short call
    /// timeout cannot cut every look-up short; this bounds it instead.
    resolve_timeout: Duration,
}

impl SentinelConn {
    /// Nothing is contacted here: the first call asks the Sentinels.
    pub(super) fn open(
        target: &SentinelTarget,
        tls: &TlsFiles,
        sentinel_login: (Option<&str>, Option<&str>),
        timeout: Duration,
        connect_timeout: Duration,
    ) -> RedisResult<SentinelConn> {
        let scheme = if target.tls { "rediss" } else { "redis" };
        let addrs = target
            .sentinels
            .iter()
            .map(|(h, p)| Ok(format!("{scheme}://{h}:{p}").into_connection_info()?.addr().clone()))
            .collect::<RedisResult<Vec<_>>>()?;
        let mut b = SentinelClientBuilder::new(addrs, &target.service, SentinelServerType::Master)?
            .set_client_to_redis_db(target.db);
        if let Some(user) = &target.username {
            b = b.set_client_to_redis_username(user);
        }
        if let Some(password) = &target.password {
            b = b.set_client_to_redis_password(password);
        }
        if let Some(user) = sentinel_login.0 {
            b = b.set_client_to_sentinel_username(user);
        }
        if let Some(password) = sentinel_login.1 {
            b = b.set_client_to_sentinel_password(password);
        }
        if target.tls {
            b = b
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(certs) = tls.certificates() {
                b = b
                    .set_client_to_redis_certificates(certs.clone())
                    .set_client_to_sentinel_certificates(certs);
            }
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout));
        Ok(SentinelConn(Arc::new(Shared {
            client: tokio::sync::Mutex::new(b.build()?),
            current: Default::default(),
            config,
            service: target.service.clone(),
            db: target.db,
            last_error: Mutex::new(None),
            resolve_timeout: connect_timeout.max(Duration::from_secs(2)),
        })))
    }

    /// Why the Sentinels named no primary the last time they were asked.
    pub(super) fn last_error(&self) -> Option<String> {
        self.0.last_error.lock().map(|e| e.clone()).unwrap_or(None)
    }

    async fn connection(&self) -> RedisResult<Arc<MultiplexedConnection>> {
        if let Some(conn) = self.0.current.load_full() {
            return Ok(conn);
        }
        let shared = self.0.clone();
        tokio::spawn(async move { shared.resolve().await })
            .await
            .map_err(|_| RedisError::from((ErrorKind::Client, "sentinel look-up stopped")))?
    }

    /// After a failed call: a broken or demoted connection is dropped (only
    /// if it is still the current one), so the next call asks again.
    fn after(&self, used: &Arc<MultiplexedConnection>, e: &RedisError) {
        let moved = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
            || e.is_timeout()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if moved {
            self.0.current.compare_and_swap(used, None);
        }
    }
}

impl Shared {
    async fn resolve(&self) -> RedisResult<Arc<MultiplexedConnection>> {
        let mut client = self.client.lock().await;
        // Another call may have connected while this one waited.
        if let Some(conn) = self.current.load_full() {
            return Ok(conn);
        }
        let found = tokio::time::timeout(self.resolve_timeout, async {
            let primary = client.async_get_client().await?;
            primary.get_multiplexed_async_connection_with_config(&self.config).await
        })
        .await
        .unwrap_or_else(|_| Err(RedisError::from((ErrorKind::Io, "sentinel look-up timed out"))));
        let note = match &found {
            Ok(_) => None,
            Err(e) => Some(format!(
                "no Sentinel named a reachable primary for service {:?} ({:?})",
                self.service,
                e.kind()
            )),
        };
        if let Ok(mut last) = self.last_error.lock() {
            *last = note;
        }
        let conn = Arc::new(found?);
        self.current.store(Some(conn.clone()));
        Ok(conn)
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let used = self.connection().await?;
            let mut conn = (*used).clone();
            let reply = conn.req_packed_command(cmd).await;
            if let Err(e) = &reply {
                self.after(&used, e);
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let used = self.connection().await?;
            let mut conn = (*used).clone();
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &reply {
                self.after(&used, e);
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.0.db
    }
}

#[cfg(test)]
mod tests {
    use super::SentinelTarget;

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_service_and_the_login() {
        let t = SentinelTarget::parse("rediss+sentinel://app:p%40ss@a:26379, b:26380/mymaster/2")
            .expect("a sentinel url")
            .expect("valid");
        assert_eq!(t.sentinels, vec![("a".to_string(), 26379), ("b".to_string(), 26380)]);
        assert_eq!(t.service, "mymaster");
        assert!(t.tls);
        assert_eq!(t.username.as_deref(), Some("app"));
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        assert_eq!(t.db, 2);
        let plain = SentinelTarget::parse("redis+sentinel://h:1/svc")
            .expect("sentinel")
            .expect("valid");
        assert!(!plain.tls && plain.password.is_none() && plain.db == 0);
    }

    #[test]
    fn bad_sentinel_urls_are_refused_without_echoing_them() {
        assert!(SentinelTarget::parse("redis://h:1").is_none());
        for url in [
            "redis+sentinel://:secret@h:1",
            "redis+sentinel://:secret@h:1/",
            "redis+sentinel://:secret@/svc",
            "redis+sentinel://:secret@h:x/svc",
            "redis+sentinel://:secret@h:1/svc/notadb",
            "redis+sentinel://:secret@h:1/svc?x=1",
        ] {
            let e = SentinelTarget::parse(url).expect("sentinel").expect_err(url);
            assert!(!e.contains("secret"), "{e}");
        }
    }
}
