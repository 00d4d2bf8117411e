//! The accept loop: HTTP/1.1 and h2c (or TLS with ALPN h2/http1.1) on one
//! listener via hyper-util's auto builder, with graceful shutdown modelled on
//! hyper-util's `server_graceful` example.
//!
//! Connections live in a `JoinSet` owned by the accept task, so aborting that
//! task (dropping a `Sim`) also ends every connection, including hung ones.

use crate::router;
use crate::state::Shared;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

/// How long a graceful shutdown waits for in-flight requests.
const DRAIN: Duration = Duration::from_secs(5);

pub struct ServerHandle {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl ServerHandle {
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }

    pub fn abort(self) {
        self.task.abort();
    }
}

pub fn spawn(listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>, shared: Arc<Shared>) -> ServerHandle {
    let (stop, stopped) = oneshot::channel();
    let acceptor = tls.map(|cfg| {
        let mut cfg = (*cfg).clone();
        if cfg.alpn_protocols.is_empty() {
            cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        }
        TlsAcceptor::from(Arc::new(cfg))
    });
    let task = tokio::spawn(accept_loop(listener, acceptor, shared, stopped));
    ServerHandle { stop, task }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of file descriptors and the like: back off briefly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                conns.spawn(connection(stream, acceptor.clone(), shared.clone(), graceful.watcher()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN) => {}
    }
}

async fn connection(stream: TcpStream, acceptor: Option<TlsAcceptor>, shared: Arc<Shared>, watcher: Watcher) {
    let svc = service_fn(move |req| router::handle(shared.clone(), req));
    let builder = auto::Builder::new(TokioExecutor::new());
    // Errors here are client disconnects and injected resets: nothing to do.
    match acceptor {
        None => {
            let _ = watcher.watch(builder.serve_connection(TokioIo::new(stream), svc)).await;
        }
        Some(acceptor) => {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let _ = watcher.watch(builder.serve_connection(TokioIo::new(tls), svc)).await;
        }
    }
}
