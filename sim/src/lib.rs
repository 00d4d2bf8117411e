//! Placeholder until the simulator lands (replaced by the real crate on merge).
#![allow(dead_code)]
use std::net::SocketAddr;
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub api_key: String,
    pub credit_limit: Option<u64>,
    pub requests_per_minute: u32,
    pub latency_ms: u64,
    pub latency_jitter_ms: u64,
    pub seed: u64,
    pub upgrade_url: String,
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}
impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            api_key: "sim-upstream-key".into(),
            credit_limit: None,
            requests_per_minute: 120,
            latency_ms: 0,
            latency_jitter_ms: 0,
            seed: 42,
            upgrade_url: String::new(),
            tls: None,
        }
    }
}
pub struct Samples {
    pub state: String,
    pub permit_from: String,
    pub permit_to: String,
}
pub struct Sim {
    addr: SocketAddr,
}
impl Sim {
    pub async fn start(listener: tokio::net::TcpListener, _cfg: SimConfig) -> std::io::Result<Sim> {
        Ok(Sim {
            addr: listener.local_addr()?,
        })
    }
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn samples(&self) -> Samples {
        Samples {
            state: "CA".into(),
            permit_from: String::new(),
            permit_to: String::new(),
        }
    }
    pub async fn shutdown(self) {}
}
