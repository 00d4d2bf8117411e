//! A delaying TCP relay in front of a unix socket: makes a real Redis slow,
//! by an amount the test can change while connections are open.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

pub struct SlowRelay {
    pub port: u16,
    delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowRelay {
    /// Listens on 127.0.0.1:0 and relays each connection to `socket`.
    pub async fn start(socket: PathBuf) -> SlowRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay binds");
        let port = listener.local_addr().expect("addr").port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let socket = socket.clone();
                let delay = delay.clone();
                tokio::spawn(async move {
                    let Ok(unix) = UnixStream::connect(&socket).await else {
                        return;
                    };
                    let (mut tr, mut tw) = tcp.into_split();
                    let (mut ur, mut uw) = unix.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n) = tr.read(&mut buf).await {
                            if n == 0 || uw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    // Answers are held back: every reply from Redis is late.
                    let down = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n) = ur.read(&mut buf).await {
                            let wait = delay.load(Ordering::Relaxed);
                            if wait > 0 {
                                tokio::time::sleep(Duration::from_millis(wait)).await;
                            }
                            if n == 0 || tw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::join!(up, down);
                });
            }
        });
        SlowRelay { port, delay_ms, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for SlowRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
