//! A TCP relay that can stop forwarding one way: a replication link whose
//! data stops while the replica's ACKs still reach the primary (so
//! `min-replicas-max-lag` does not trip), as a half-broken network path
//! does. Threads and std sockets: usable from blocking harness code.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct StallRelay {
    pub port: u16,
    /// The way from the target (primary) to the client (replica) is held.
    stalled: Arc<AtomicBool>,
}

impl StallRelay {
    /// Listens on 127.0.0.1:0 and relays each connection to `target_port`.
    pub fn start(target_port: u16) -> StallRelay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay binds");
        let port = listener.local_addr().expect("addr").port();
        let stalled = Arc::new(AtomicBool::new(false));
        let gate = stalled.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(target) = TcpStream::connect(("127.0.0.1", target_port)) else {
                    continue;
                };
                let (c2, t2) = (client.try_clone(), target.try_clone());
                let (Ok(c2), Ok(t2)) = (c2, t2) else { continue };
                std::thread::spawn(move || pipe(client, target, None));
                let gate = gate.clone();
                std::thread::spawn(move || pipe(t2, c2, Some(gate)));
            }
        });
        StallRelay { port, stalled }
    }

    /// Stops forwarding from the target to the client (data stays queued).
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::Release);
    }
}

/// Copies `from` into `to`; while `gate` is set, reads nothing (the bytes
/// wait in the kernel's buffers). A poll every 5 ms: this is the relay's
/// own pacing, not a test's synchronisation.
#[expect(
    clippy::disallowed_methods,
    reason = "the relay's own pacing on its own thread, not a test's synchronisation"
)]
fn pipe(mut from: TcpStream, mut to: TcpStream, gate: Option<Arc<AtomicBool>>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while gate.as_ref().is_some_and(|g| g.load(Ordering::Acquire)) {
            std::thread::sleep(Duration::from_millis(5));
        }
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
