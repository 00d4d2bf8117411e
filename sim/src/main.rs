//! `permit-api-sim`: runs the simulator as a process. Prints the bound address
//! as the first line of stdout (so a parent can use port 0), then serves
//! until SIGINT/SIGTERM.

use clap::Parser;
use permit_api_sim::{Sim, SimConfig};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(version, about = "A deterministic simulator of the permit data upstream")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: String,
    #[arg(long, default_value = "sim-upstream-key")]
    api_key: String,
    /// Omit for an unlimited account.
    #[arg(long)]
    credit_limit: Option<u64>,
    #[arg(long, default_value_t = 120)]
    requests_per_minute: u32,
    /// How "per 60 s" is read: `bucket` (refills evenly: after a burst, a
    /// call every 60/N s) or `strict` (at most N calls in any 60 s).
    #[arg(long, default_value = "bucket")]
    rate_window: permit_api_sim::ratelimit::Window,
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    #[arg(long, default_value_t = 0)]
    latency_jitter_ms: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn tls_config(cert: &PathBuf, key: &PathBuf) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("reading {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("reading {}: {e}", key.display()))?;
    let cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("bad certificate or key: {e}"))?;
    Ok(Arc::new(cfg))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler installs");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Explicitly ring: an already-installed provider is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => match tls_config(c, k) {
            Ok(cfg) => Some(cfg),
            Err(e) => {
                eprintln!("permit-api-sim: {e}");
                return std::process::ExitCode::from(2);
            }
        },
        _ => None,
    };
    let cfg = SimConfig {
        api_key: args.api_key,
        credit_limit: args.credit_limit,
        requests_per_minute: args.requests_per_minute,
        rate_window: args.rate_window,
        latency_ms: args.latency_ms,
        latency_jitter_ms: args.latency_jitter_ms,
        seed: args.seed,
        tls,
        ..SimConfig::default()
    };
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("permit-api-sim: cannot listen on {}: {e}", args.listen);
            return std::process::ExitCode::FAILURE;
        }
    };
    let sim = Sim::start(listener, cfg).await.expect("listener has a local address");
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", sim.addr());
    let _ = out.flush();
    shutdown_signal().await;
    sim.shutdown().await;
    std::process::ExitCode::SUCCESS
}
