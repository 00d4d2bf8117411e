//! The `permit-gateway` command: serve, demo, token, check-config.

use clap::{Parser, Subcommand};
use permit_gateway::config::{Checks, Config, Source};
use permit_gateway::{app::App, telemetry, Listeners};
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc: fewer cycles per allocation on the request path and less
/// memory per cached entry than the system allocator (see BENCHMARKS.md),
/// asked through its plain calls where a layout allows (`memory.rs`).
#[global_allocator]
static ALLOCATOR: permit_gateway::memory::Allocator = permit_gateway::memory::Allocator;

#[derive(Parser)]
#[command(
    name = "permit-gateway",
    version = permit_gateway::LONG_VERSION,
    about = "A caching, credit-aware gateway in front of one metered permit-data API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Config file; without it config/gateway.toml if present, else defaults.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Start the bundled simulator and the gateway in front of it, with two demo teams.
    Demo {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        #[arg(long, default_value = "127.0.0.1:9090")]
        admin_listen: String,
    },
    /// Print a new random team token and its token_sha256 line.
    Token,
    /// Validate the configuration and print it with secrets redacted.
    CheckConfig {
        /// Config file; without it config/gateway.toml if present, else defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Do not look for the upstream key (validate a file where the secret is not).
        #[arg(long)]
        no_secrets: bool,
    },
}

fn main() -> ExitCode {
    // One crypto provider, chosen here, before anything builds a TLS config.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Token => token(),
        Command::CheckConfig { config, no_secrets } => check_config(config, no_secrets),
        Command::Serve { config } => runtime().block_on(serve(config)),
        Command::Demo { listen, admin_listen } => runtime().block_on(run_demo(listen, admin_listen)),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(permit_gateway::memory::trim_when_idle)
        .build()
        .expect("tokio runtime starts")
}

fn source(path: &Option<PathBuf>) -> Source<'_> {
    path.as_deref().map_or(Source::Default, Source::File)
}

fn token() -> ExitCode {
    let bytes: [u8; 32] = rand::random();
    let token = format!("pgw_{}", hex::encode(bytes));
    println!("token:        {token}");
    println!("token_sha256 = \"{}\"", permit_gateway::auth::token_sha256_hex(&token));
    eprintln!("Give the token to the team; put only the token_sha256 line in its [[teams]] block.");
    ExitCode::SUCCESS
}

fn check_config(path: Option<PathBuf>, no_secrets: bool) -> ExitCode {
    let checks = if no_secrets {
        Checks::without_secrets()
    } else {
        Checks::default()
    };
    match Config::load_checked(source(&path), checks) {
        Ok(config) => {
            print!("{}", config.redacted_toml());
            eprintln!("config: {}", config.origin());
            for warning in config.warnings() {
                eprintln!("warning: {warning}");
            }
            if no_secrets {
                eprintln!("configuration is valid (the upstream key was not checked: --no-secrets)");
            } else {
                eprintln!("configuration is valid");
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprint!("{errors}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(path: Option<PathBuf>) -> ExitCode {
    let config = match Config::load(source(&path)) {
        Ok(c) => c,
        Err(errors) => {
            eprint!("{errors}");
            return ExitCode::FAILURE;
        }
    };
    let telemetry = match telemetry::init(&config.log, &config.tracing) {
        Ok(t) => t,
        Err((_t, e)) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    // Before anything serves (see `shutdown_signal`); SIGHUP's too, whose
    // default would end the process.
    let shutdown = shutdown_signal();
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let listeners = match Listeners::bind(&config.server).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot bind listeners");
            return ExitCode::FAILURE;
        }
    };
    let reload_from = path.clone().or_else(|| {
        let default = PathBuf::from(permit_gateway::config::DEFAULT_CONFIG_PATH);
        default.is_file().then_some(default)
    });
    let app = match App::new(config, reload_from) {
        Ok(app) => app,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = app.check_ledger_format().await {
        tracing::error!(error = %e, "cannot start");
        return ExitCode::FAILURE;
    }
    app.log_configuration().await;
    tracing::info!(
        listen = %listeners.team.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        admin = %listeners.admin.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        version = permit_gateway::VERSION,
        commit = permit_gateway::COMMIT,
        "permit-gateway serving"
    );
    tokio::spawn(reload_on_sighup(app.clone(), hangup));
    let code = match permit_gateway::run(app, listeners, shutdown).await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "stopped with an error");
            ExitCode::FAILURE
        }
    };
    // The spans of the last requests, before the runtime goes.
    telemetry.shutdown().await;
    code
}

/// Built without the `demo` feature (the image): no simulator to start.
#[cfg(not(feature = "demo"))]
async fn run_demo(_listen: String, _admin_listen: String) -> ExitCode {
    eprintln!(
        "error: this build has no demo: it was built without the `demo` feature \
         (a checkout's `cargo run --release -- demo` has it)"
    );
    ExitCode::FAILURE
}

#[cfg(feature = "demo")]
async fn run_demo(listen: String, admin_listen: String) -> ExitCode {
    use permit_gateway::demo;
    let log = permit_gateway::config::LogConfig {
        format: permit_gateway::config::LogFormat::Human,
        level: tracing::level_filters::LevelFilter::INFO.into(),
        queue_lines: 16 * 1024,
    };
    let no_export = permit_gateway::config::TracingConfig {
        otlp_endpoint: None,
        service_name: "permit-gateway".into(),
        sample_ratio: 1.0,
    };
    let Ok(_telemetry) = telemetry::init(&log, &no_export) else {
        return ExitCode::FAILURE;
    };
    let shutdown = shutdown_signal();
    match demo::start(&listen, &admin_listen).await {
        Ok((sim, running)) => {
            println!("{}", demo::banner(&sim, &running));
            shutdown.await;
            let _ = running.shutdown().await;
            sim.shutdown().await;
            demo::clean_up();
            ExitCode::SUCCESS
        }
        Err(e) => {
            demo::clean_up();
            eprintln!("demo failed to start: {e}");
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM (Kubernetes) or SIGINT (Ctrl-C). The handlers are installed
/// when this is called, not when the future is first polled: a SIGTERM that
/// comes once the listeners serve (the per-core loops answer on threads of
/// their own before the main task polls its shutdown) must drain, not kill.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler installs");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: draining"),
            _ = int.recv() => tracing::info!("SIGINT: draining"),
        }
    }
}

/// SIGHUP re-reads the teams, like `POST /admin/reload`.
async fn reload_on_sighup(app: std::sync::Arc<App>, hangup: Option<tokio::signal::unix::Signal>) {
    let Some(mut hup) = hangup else {
        return;
    };
    while hup.recv().await.is_some() {
        match app.reload() {
            // `reload` itself logs what it applied and what waits for a restart.
            Ok(reloaded) => tracing::info!(teams = reloaded.teams, "SIGHUP: reload done"),
            Err(e) => tracing::error!(problems = %e, "SIGHUP: reload refused, the old teams stay"),
        }
    }
}
