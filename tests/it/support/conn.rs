//! One client's own HTTP/1.1 or HTTP/2 connection, below the pooled client
//! (`super::client`): for tests where the connection is the point (kept
//! alive through an attack, opened fresh at the cap, timed hit by hit).

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::fmt::Display;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A kept-alive connection of one client, HTTP/1.1 or (prior knowledge)
/// HTTP/2.
pub struct KeptAlive(Sender);

enum Sender {
    Http1(http1::SendRequest<Empty<Bytes>>),
    Http2(http2::SendRequest<Empty<Bytes>>),
}

impl KeptAlive {
    pub async fn open(addr: SocketAddr) -> Result<KeptAlive, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (send, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(KeptAlive(Sender::Http1(send)))
    }

    /// An HTTP/2 connection (h2c with prior knowledge).
    pub async fn open_h2(addr: SocketAddr) -> Result<KeptAlive, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(KeptAlive(Sender::Http2(send)))
    }

    /// One GET; the status and the `X-Cache` header, or why it failed.
    pub async fn get(&mut self, target: impl Display, token: &str) -> Result<(StatusCode, String), String> {
        let head = self.head_of(target, token).await?;
        Ok((head.status, header(&head, "x-cache").unwrap_or_default()))
    }

    /// One GET, its body read; the answer's head.
    pub async fn head_of(&mut self, target: impl Display, token: &str) -> Result<http::response::Parts, String> {
        Ok(self.fetch(target, token).await?.0)
    }

    /// One GET; the answer's head and body.
    pub async fn fetch(&mut self, target: impl Display, token: &str) -> Result<(http::response::Parts, Bytes), String> {
        let req = Request::get(target.to_string())
            .header("host", "gateway")
            .header("x-api-key", token)
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = match &mut self.0 {
            Sender::Http1(send) => {
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(req).await
            }
            Sender::Http2(send) => {
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let (head, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((head, body))
    }
}

/// A header of `head` as text, or None.
pub fn header(head: &http::response::Parts, name: &str) -> Option<String> {
    head.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// One GET on a connection of its own.
pub async fn on_new_connection(
    addr: SocketAddr,
    target: impl Display,
    token: &str,
) -> Result<(StatusCode, String), String> {
    KeptAlive::open(addr).await?.get(target, token).await
}

/// An anonymous peer's connection: one token-less head sent (a free 4xx)
/// and its answer read; the socket is the caller's to keep open. The flag:
/// a 4xx came within 2 s. `Err`: it could not connect or send.
pub async fn anonymous_head(addr: SocketAddr) -> Result<(TcpStream, bool), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    // Raw bytes on a socket of its own: below any client.
    s.write_all(b"GET /v2/zz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 2048];
    let answered = match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
        Ok(Ok(n)) => buf[..n].starts_with(b"HTTP/1.1 4"),
        _ => false,
    };
    Ok((s, answered))
}
