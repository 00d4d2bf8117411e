//! The accept loop shared by the team and admin listeners, before any
//! request handling: HTTP/1.1 and HTTP/2 (h2c, or ALPN over TLS), limits on
//! connections and header size, the connection deadlines, and graceful
//! shutdown with a deadline.
//!
//! Follows hyper-util's `server_graceful` example, with the registry of
//! `conns/mod.rs` in place of its `GracefulShutdown`: the same drain on
//! shutdown, plus closing one connection (evicted, or past a deadline) on its
//! own. `conn.rs` drives each connection. Takes an already-bound listener so tests
//! start the real server on port 0. `per_core.rs` runs the same accept loop
//! on N single-threaded runtimes against one registry (`Shared`).

mod body;
mod budget;
mod conn;
mod conns;
mod frames;
mod hpack;
mod overload;
mod per_core;

pub(crate) use conns::Actions;
pub use overload::{fit_descriptors, Descriptors, RESERVED_DESCRIPTORS};
pub use per_core::bind_reuseport;

use crate::auth::Tenant;
use crate::config::{Runtime, ServerConfig};
use crate::http_util::Body;
use conn::Timeouts;
use conns::{Conns, Order};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use per_core::PerCore;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// How a listener treats its connections.
#[derive(Clone)]
pub struct Limits {
    pub(crate) max_connections: usize,
    pub(crate) max_connections_per_peer: usize,
    pub(crate) max_header_bytes: usize,
    pub(crate) timeouts: Timeouts,
    pub(crate) http2_max_concurrent_streams: u32,
    /// Answer bytes HTTP/2 streams may hold at once (`body.rs`).
    pub(crate) http2_max_buffered_bytes: usize,
    /// How long in-flight requests may run on after shutdown starts.
    pub(crate) shutdown_grace: Duration,
    /// Counts open connections (the team listener's; `None` for admin).
    pub(crate) open_connections: Option<prometheus::Gauge>,
    /// Counts what the overload manager did on this listener.
    pub(crate) actions: Actions,
}

impl Limits {
    pub fn from_config(cfg: &ServerConfig) -> Limits {
        Limits {
            max_connections: cfg.max_connections,
            max_connections_per_peer: cfg.max_connections_per_peer.min(cfg.max_connections),
            max_header_bytes: cfg.max_header_bytes,
            timeouts: Timeouts {
                header_read: Duration::from_secs(cfg.header_read_timeout_secs),
                idle: Duration::from_secs(cfg.idle_timeout_secs),
                write: Duration::from_secs(cfg.write_timeout_secs),
            },
            http2_max_concurrent_streams: cfg.http2_max_concurrent_streams,
            http2_max_buffered_bytes: cfg.http2_max_buffered_bytes,
            shutdown_grace: Duration::from_secs(cfg.shutdown_grace_secs),
            open_connections: None,
            actions: Actions::default(),
        }
    }

    /// The admin listener's: its own cap (`server.admin_max_connections`),
    /// so probes and scrapes keep places whatever the team listener holds.
    pub fn admin_from_config(cfg: &ServerConfig) -> Limits {
        let team = Limits::from_config(cfg);
        Limits {
            max_connections: cfg.admin_max_connections,
            max_connections_per_peer: cfg.admin_max_connections,
            ..team
        }
    }

    /// Lowers the cap to `max` (descriptors, `overload::fit_descriptors`).
    pub fn clamp(&mut self, max: usize) {
        self.max_connections = self.max_connections.min(max);
        self.max_connections_per_peer = self.max_connections_per_peer.min(self.max_connections);
    }

    pub fn max_connections(&self) -> usize {
        self.max_connections
    }
}

/// An HTTP/2 connection's own buffers, an upper estimate: a 16 KiB frame
/// buffer each way, HPACK tables, TLS records (docs/operations.md).
const CONNECTION_BYTES: u64 = 64 * 1024;
/// One open HTTP/2 stream held back by flow control, its answer aside:
/// h2's stream state, hyper's task for it, the answer head it sent.
/// Measured about 9 KiB held in a debug build (tests/it/siege/zero_window.rs),
/// but the peak also carries the refused streams' 503s and the allocator's
/// slack: with 16 KiB the formula was passed by 0.4 MiB once in CI (ten
/// connections at the defaults, peak +24.6 MiB), so 24 KiB.
pub const STREAM_BYTES: u64 = 24 * 1024;

/// The most memory `connections` HTTP/2 connections can make a listener
/// hold, answers held back by flow control included (the formula of
/// docs/operations.md, "Memory under hostile clients").
pub fn worst_case_bytes(limits: &Limits, connections: usize, max_response_bytes: usize) -> u64 {
    let streams = u64::from(limits.http2_max_concurrent_streams);
    let fixed = connections as u64 * (CONNECTION_BYTES + streams * STREAM_BYTES);
    let answers = (connections as u64)
        .saturating_mul(streams)
        .saturating_mul(max_response_bytes as u64)
        .min(limits.http2_max_buffered_bytes as u64);
    fixed + answers
}

/// Handed to the handler with each request (not through the request's
/// extensions, whose map is an allocation and a hash per request): lets it
/// tell the connection that a valid team token came on it, which makes the
/// team its tenant (`overload.rs`).
#[derive(Clone)]
pub(crate) struct ConnectionMark(Arc<conns::Conn>);

impl ConnectionMark {
    /// A valid token of the team of `tenant` came on this connection
    /// (`Team::tenant`). `false`: this
    /// HTTP/2 stream must be refused before anything is bought for it
    /// (`GatewayError::AnswersBusy`), the listener's answer bytes being
    /// spent and the team holding its share of them.
    #[must_use]
    pub(crate) fn team_seen(&self, tenant: Tenant) -> bool {
        self.0.mark_teamed(tenant);
        self.0.may_answer()
    }
}

/// TLS for the team listener from PEM files, offering h2 and http/1.1.
pub(crate) fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<TlsAcceptor, String> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("server.tls_cert_file: {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("server.tls_key_file: {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("server.tls_cert_file: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        // The slowloris guard and the keep-alive idle limit are the
        // connection driver's (`conn.rs`: the first head from accept, each
        // next one from the last answer's end): hyper's timer (30 s by
        // default) would make, poll and drop a timer per request.
        .header_read_timeout(None)
        // Room above the limit, so that most oversized heads still reach the
        // handler and get a JSON 431 instead of hyper's bare one.
        // hyper's default of 100 headers is kept: it parses into an array on
        // the stack, where any `max_headers` setting allocates and zeroes a
        // vector twice per request (measured: 1.7k instructions of a 46k hit).
        .max_buf_size(limits.max_header_bytes.saturating_mul(4).max(65_536));
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        // Pings find dead peers (a vanished client never sends a FIN); one
        // unanswered within the write timeout closes the connection.
        .keep_alive_interval(HTTP2_PING_INTERVAL)
        .keep_alive_timeout(limits.timeouts.write);
    b
}

/// How often an HTTP/2 connection is pinged.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);

/// Serves `listener` until `shutdown` resolves, then stops accepting and
/// lets open requests finish within the grace period; what is left then is
/// closed.
pub(crate) async fn serve<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(Request<Incoming>, ConnectionMark) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let shared = Shared::new(tls, limits);
    shared.accept(listener, handler, shutdown).await;
    shared.drain().await;
}

/// A listener being served; resolves once it has drained (an error: a
/// per-core loop panicked).
pub(crate) type Serving = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The team listener served as `server.runtime` says, until `shutdown`
/// turns true: by [`serve`] on this runtime, or by per-core loops on threads
/// of their own, started here (so a socket they cannot bind is an error now).
pub(crate) fn serve_team<H, F>(
    cfg: &ServerConfig,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    handler: H,
    shutdown: watch::Receiver<bool>,
) -> Result<Serving, String>
where
    H: Fn(Request<Incoming>, ConnectionMark) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    match cfg.runtime {
        Runtime::MultiThread => Ok(Box::pin(async move {
            serve(listener, tls, limits, handler, stopped(shutdown)).await;
            Ok(())
        })),
        Runtime::PerCore => {
            let per_core = PerCore::start(listener, cfg.per_core_loops(), tls, limits, handler, shutdown)?;
            tracing::info!(loops = per_core.loops(), "team listener served by per-core runtimes");
            Ok(Box::pin(per_core.wait()))
        }
    }
}

/// Resolves once `shutdown` turns true, or its sender is gone.
pub(crate) async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// What every accept loop of one listener shares: one registry, so the
/// caps hold whole however many loops accept (`per_core.rs`).
pub(crate) struct Shared {
    builder: Arc<auto::Builder<TokioExecutor>>,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    conns: Arc<Conns>,
}

impl Shared {
    fn new(tls: Option<TlsAcceptor>, limits: Limits) -> Arc<Shared> {
        let budget = budget::Budget::new(limits.http2_max_buffered_bytes);
        let conns = Conns::new(
            limits.max_connections,
            limits.max_connections_per_peer,
            budget,
            limits.actions.clone(),
        );
        Arc::new(Shared {
            builder: Arc::new(builder(&limits)),
            tls,
            limits,
            conns,
        })
    }

    /// The accept loop: admits each connection into the registry and
    /// spawns its driver on the current runtime, until `shutdown`.
    async fn accept<H, F>(&self, listener: TcpListener, handler: H, shutdown: impl Future<Output = ()>)
    where
        H: Fn(Request<Incoming>, ConnectionMark) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<Body>> + Send + 'static,
    {
        let conns = &self.conns;
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // EMFILE and friends: out of descriptors despite the
                        // clamp (something else took them): make room as at the
                        // cap, and back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        conns.make_room();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            // At the limit this tells the overload manager's pick to go and
            // admits at once, or waits while no connection may go; meanwhile
            // the kernel's backlog holds the next newcomers.
            let slot = tokio::select! {
                slot = conns.admit(peer.ip()) => slot,
                () = &mut shutdown => break,
            };
            let Some(slot) = slot else {
                // The peer is at its own limit with all its connections busy.
                tracing::debug!("per-peer connection limit: refusing a connection");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let open = self.limits.open_connections.clone().map(Open::new);
            let conn = conn::serve(
                stream,
                self.tls.clone(),
                self.builder.clone(),
                handler.clone(),
                slot,
                self.limits.timeouts,
                frames::hpack_per_request(self.limits.max_header_bytes),
            );
            tokio::spawn(async move {
                // Counted for the connection's whole life, whichever way it ends.
                let _open = open;
                conn.await;
            });
        }
    }

    /// Once every loop stopped accepting: drains the open connections
    /// within the grace period, then closes what is left. Each loop of
    /// `per_core.rs` runs it after its own accept loop, so the last order
    /// reaches connections any loop admitted meanwhile, and every runtime
    /// keeps driving its connections until all are closed.
    async fn drain(&self) {
        let conns = &self.conns;
        conns.order_all(Order::Drain);
        let grace = self.limits.shutdown_grace;
        tokio::select! {
            () = conns.all_closed() => tracing::debug!("all connections closed"),
            () = tokio::time::sleep(grace) => {
                tracing::warn!(grace_secs = grace.as_secs(), "shutdown grace ran out; closing open connections");
                conns.order_all(Order::Close);
                conns.all_closed().await;
            }
        }
    }
}

/// One open connection in the gauge, until dropped.
struct Open(prometheus::Gauge);

impl Open {
    fn new(gauge: prometheus::Gauge) -> Open {
        gauge.inc();
        Open(gauge)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_case_at_the_defaults_is_what_operations_md_says() {
        let cfg = crate::config::Config::load(crate::config::Source::Text("[upstream]\napi_key = \"k\"\n"))
            .expect("defaults load");
        let limits = Limits::from_config(&cfg.server);
        let max_response = cfg.upstream.max_response_bytes;
        let at_cap = worst_case_bytes(&limits, cfg.server.max_connections, max_response);
        assert_eq!(at_cap, 10_000 * (64 + 100 * 24) * 1024 + 8 * 1024 * 1024);
        let gib = at_cap as f64 / f64::from(1u32 << 30);
        let one = worst_case_bytes(&limits, 1, max_response) as f64 / f64::from(1u32 << 20);
        let doc = include_str!("../../docs/operations.md");
        assert!(doc.contains(&format!("**{gib:.2} GiB**")), "{gib:.2} GiB");
        assert!(doc.contains(&format!("**{one:.1} MiB**")), "{one:.1} MiB");
    }
}
