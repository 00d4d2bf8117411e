//! The simulator, started in-process on 127.0.0.1:0.

pub use permit_api_sim::{FaultKind, Faults, Samples, Sim, SimConfig};

/// Starts a simulator on a fresh loopback port; it stops when dropped.
pub async fn start_sim(cfg: SimConfig) -> Sim {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds a loopback port");
    Sim::start(listener, cfg).await.expect("simulator starts")
}

/// Faults of one kind, everything else at its default.
pub fn fault(kind: FaultKind) -> Faults {
    Faults {
        kind,
        ..Faults::default()
    }
}
