//! The accept loop shared by the team and admin listeners: HTTP/1.1 and
//! HTTP/2 (h2c, or ALPN over TLS), limits on connections, header size and
//! header read time, and graceful shutdown with a deadline.
//!
//! Mirrors hyper-util's `server_graceful` example. Takes an already-bound
//! listener so tests start the real server on port 0.

use crate::config::ServerConfig;
use crate::http_util::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// How a listener treats its connections.
#[derive(Clone)]
pub struct Limits {
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub header_read_timeout: Duration,
    pub http2_max_concurrent_streams: u32,
    /// How long in-flight requests may run on after shutdown starts.
    pub shutdown_grace: Duration,
    /// Counts open connections (the team listener's; `None` for admin).
    pub open_connections: Option<prometheus::Gauge>,
}

impl Limits {
    pub fn from_config(cfg: &ServerConfig) -> Limits {
        Limits {
            max_connections: cfg.max_connections,
            max_header_bytes: cfg.max_header_bytes,
            header_read_timeout: Duration::from_secs(cfg.header_read_timeout_secs),
            http2_max_concurrent_streams: cfg.http2_max_concurrent_streams,
            shutdown_grace: Duration::from_secs(cfg.shutdown_grace_secs),
            open_connections: None,
        }
    }
}

/// TLS for the team listener from PEM files, offering h2 and http/1.1.
pub fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<TlsAcceptor, String> {
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
        .timer(TokioTimer::new())
        // Slowloris guard: the whole head must arrive in time.
        .header_read_timeout(limits.header_read_timeout)
        // Room above the limit, so that most oversized heads still reach the
        // handler and get a JSON 431 instead of hyper's bare one.
        .max_buf_size(limits.max_header_bytes.saturating_mul(4).max(65_536))
        .max_headers(128);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Duration::from_secs(30));
    b
}

/// Serves `listener` until `shutdown` resolves, then stops accepting and
/// lets open requests finish within the grace period.
pub async fn serve<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let builder = Arc::new(builder(&limits));
    let graceful = GracefulShutdown::new();
    // A permit per open connection: at the limit we stop accepting, and the
    // kernel's backlog holds newcomers instead of us running out of fds.
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let builder = builder.clone();
        let handler = handler.clone();
        let tls = tls.clone();
        let handshake_timeout = limits.header_read_timeout;
        let open = limits.open_connections.clone();
        tokio::spawn(async move {
            // Counted for the connection's whole life, whichever way it ends.
            let _open = open.map(Open::new);
            let service = service_fn(move |req| {
                let fut = handler(req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let result = match tls {
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    watcher.watch(conn.into_owned()).await
                }
                Some(acceptor) => {
                    let Ok(Ok(stream)) = tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await else {
                        return;
                    };
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    watcher.watch(conn.into_owned()).await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => tracing::debug!("all connections closed"),
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!(grace_secs = limits.shutdown_grace.as_secs(), "shutdown grace ran out; closing open connections");
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
