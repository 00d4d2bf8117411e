//! One client's own HTTP/1.1 connection, below the pooled client
//! (`super::client`): for tests where the connection is the point (kept
//! alive through an attack, opened fresh at the cap, timed hit by hit).

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::fmt::Display;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// A kept-alive HTTP/1.1 connection of one client.
pub struct KeptAlive(http1::SendRequest<Empty<Bytes>>);

impl KeptAlive {
    pub async fn open(addr: SocketAddr) -> Result<KeptAlive, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (send, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(KeptAlive(send))
    }

    /// One GET; the status and the `X-Cache` header, or why it failed.
    pub async fn get(&mut self, target: impl Display, token: &str) -> Result<(StatusCode, String), String> {
        let head = self.head_of(target, token).await?;
        Ok((head.status, header(&head, "x-cache").unwrap_or_default()))
    }

    /// One GET, its body read; the answer's head.
    pub async fn head_of(&mut self, target: impl Display, token: &str) -> Result<http::response::Parts, String> {
        let req = Request::get(target.to_string())
            .header("host", "gateway")
            .header("x-api-key", token)
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        self.0.ready().await.map_err(|e| e.to_string())?;
        let resp = self.0.send_request(req).await.map_err(|e| e.to_string())?;
        let (head, body) = resp.into_parts();
        body.collect().await.map_err(|e| e.to_string())?;
        Ok(head)
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
