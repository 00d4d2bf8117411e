//! The team listener served thread-per-core (`server.runtime = "per_core"`,
//! to scale with cores): N single-threaded tokio runtimes, each on an OS thread of its
//! own with its own socket bound with `SO_REUSEPORT` to the team address,
//! so that the kernel spreads new connections over them, as over nginx's
//! workers. A connection stays on the thread that accepted it: hyper's
//! executor spawns on the current runtime, so the connection's tasks and
//! its requests' fetches run there too, and no work-stealing moves them.
//!
//! What the loops share is what one loop has (`Shared` in `mod.rs`): one
//! registry of connections, so `server.max_connections`, the per-peer caps
//! and the HTTP/2 answer-bytes budget hold whole across the loops, not split
//! N ways. The app itself (caches, ledger, Redis connections, background
//! tasks) and the admin listener stay where they were built: on `main`'s
//! multi-thread runtime, reached from every thread.
//!
//! Shutdown: each loop stops accepting when the one watch says so, then
//! drains (`Shared::drain`); [`PerCore::wait`] returns once every thread
//! has ended, with an error naming any that panicked. Work a request left
//! running that no client may cancel (its upstream call, its settle) runs
//! on the app's runtime, not the loop's (`App::detach`), and the shutdown
//! waits for it there.

use super::{ConnectionMark, Limits, Shared};
use crate::http_util::Body;
use hyper::body::Incoming;
use hyper::{Request, Response};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use tokio::net::{TcpListener, TcpSocket};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// Each socket's accept queue: what `TcpListener::bind` asks (the standard
/// library's value).
const BACKLOG: u32 = 128;

/// A listening socket of `addr` with `SO_REUSEPORT` set before the bind, so
/// that the other loops' sockets may bind the same address. Registers with
/// the current runtime.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // What `TcpListener::bind` sets: a restart binds again at once.
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// The running loops of a per-core team listener.
pub(crate) struct PerCore {
    threads: Vec<JoinHandle<()>>,
}

impl PerCore {
    /// Binds `loops - 1` more sockets to `listener`'s address (which must
    /// have been bound with [`bind_reuseport`]), builds a runtime per loop,
    /// and only once all of that worked starts a thread per loop, serving
    /// until `shutdown` turns true or its sender is dropped.
    pub(crate) fn start<H, F>(
        listener: TcpListener,
        loops: usize,
        tls: Option<TlsAcceptor>,
        limits: Limits,
        handler: H,
        shutdown: watch::Receiver<bool>,
    ) -> Result<PerCore, String>
    where
        H: Fn(Request<Incoming>, ConnectionMark) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<Body>> + Send + 'static,
    {
        let addr = listener.local_addr().map_err(|e| format!("server.listen: {e}"))?;
        // Off `main`'s reactor, onto the first loop's.
        let mut first = Some(listener.into_std().map_err(|e| format!("server.listen: {e}"))?);
        let mut prepared = Vec::with_capacity(loops);
        for i in 0..loops.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_park(crate::memory::trim_when_idle)
                .build()
                .map_err(|e| format!("server.runtime: per-core runtime {i}: {e}"))?;
            let runtime = Unstarted(Some(runtime));
            let socket = {
                let _in = runtime.0.as_ref().map(Runtime::enter);
                match first.take() {
                    Some(first) => TcpListener::from_std(first),
                    None => bind_reuseport(addr),
                }
            }
            .map_err(|e| {
                format!(
                    "server.runtime: per-core socket {i} on {addr}: {e} \
                     (the team listener must be bound with SO_REUSEPORT, as Listeners::bind does)"
                )
            })?;
            prepared.push((runtime, socket));
        }
        let shared = Shared::new(tls, limits);
        let mut threads = Vec::with_capacity(prepared.len());
        for (i, (runtime, socket)) in prepared.into_iter().enumerate() {
            let (shared, handler, shutdown) = (shared.clone(), handler.clone(), shutdown.clone());
            let thread = std::thread::Builder::new()
                // `top -H` shows the loops by listener port.
                .name(format!("core{i}:{}", addr.port()))
                .spawn(move || serve_loop(i, runtime, &shared, socket, handler, shutdown))
                // The loops started so far end with `shutdown`'s sender,
                // which the caller drops on this error.
                .map_err(|e| format!("server.runtime: per-core thread {i}: {e}"))?;
            threads.push(thread);
        }
        Ok(PerCore { threads })
    }

    /// How many loops serve.
    pub(crate) fn loops(&self) -> usize {
        self.threads.len()
    }

    /// Resolves once every loop has drained and its thread ended; an error
    /// names the loops that panicked.
    pub(crate) async fn wait(self) -> Result<(), String> {
        let mut panicked = Vec::new();
        for (i, thread) in self.threads.into_iter().enumerate() {
            // A join blocks: off this runtime's workers.
            match tokio::task::spawn_blocking(move || thread.join()).await {
                Ok(Ok(())) => {}
                Ok(Err(payload)) => panicked.push(format!("loop {i}: {}", panic_text(payload.as_ref()))),
                Err(e) => panicked.push(format!("loop {i}: {e}")),
            }
        }
        match panicked.is_empty() {
            true => Ok(()),
            false => Err(format!("per-core loops panicked: {}", panicked.join("; "))),
        }
    }
}

/// One loop's thread: accept until shutdown, then drain.
fn serve_loop<H, F>(
    i: usize,
    runtime: Unstarted,
    shared: &Shared,
    socket: TcpListener,
    handler: H,
    shutdown: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>, ConnectionMark) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let _watch = PanicWatch(i);
    runtime.run(async {
        // This loop's thread gives back what a burst freed (`memory`).
        let trimmer = tokio::spawn(crate::memory::trim_periodically());
        shared.accept(socket, handler, super::stopped(shutdown)).await;
        shared.drain().await;
        trimmer.abort();
    });
}

/// A loop's runtime until its thread runs it. Dropped unrun (the start
/// failed, on the caller's runtime) it shuts down without blocking: a
/// runtime dropped in an async context panics.
struct Unstarted(Option<Runtime>);

impl Unstarted {
    /// Runs `work` to its end on this thread; the runtime then ends here,
    /// waiting for its blocking tasks (the disk tier's writes).
    fn run(mut self, work: impl Future<Output = ()>) {
        if let Some(runtime) = self.0.take() {
            runtime.block_on(work);
        }
    }
}

impl Drop for Unstarted {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Logs a loop's panic as it happens: its socket is closed and the other
/// loops serve on, until shutdown reports it as an error.
struct PanicWatch(usize);

impl Drop for PanicWatch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(per_core_loop = self.0, "a per-core loop panicked; the others serve on");
        }
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic".into(),
    }
}
