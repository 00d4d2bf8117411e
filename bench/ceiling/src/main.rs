//! The ceiling of the hit-path benchmark: the same stack as the gateway
//! (tokio multi-thread runtime, hyper 1 through hyper-util's auto HTTP/1 +
//! HTTP/2 builder, `TCP_NODELAY`) answering one body from memory, with the
//! headers a gateway hit carries, and nothing else. The gateway cannot be
//! faster than this on the same machine; `bench/run.sh` reports the ratio.
//!
//! Usage: `bench-ceiling LISTEN_ADDR BODY_FILE`. Prints the bound address as
//! the first line of stdout (so `127.0.0.1:0` works), serves until killed.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:0".to_string());
    let body_file = args.next().expect("usage: bench-ceiling LISTEN_ADDR BODY_FILE");
    let body = Bytes::from(std::fs::read(&body_file).expect("the body file is readable"));
    let listener = TcpListener::bind(&listen).await.expect("the listen address binds");
    let addr = listener.local_addr().expect("a bound listener has an address");
    println!("{addr}");
    let _ = std::io::stdout().flush();
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_req: Request<hyper::body::Incoming>| {
                let mut resp = Response::new(Full::new(body.clone()));
                let h = resp.headers_mut();
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                h.insert("x-cache", HeaderValue::from_static("HIT"));
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
