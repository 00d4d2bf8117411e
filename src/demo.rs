//! `permit-gateway demo`: the newcomer's one command. Starts the bundled
//! upstream simulator on a loopback port and the gateway in front of it with
//! the two demo teams of `config/demo.toml`, then prints curl lines to paste.

use crate::config::{Checks, Config, Source, DEMO_ADMIN_TOKEN, DEMO_TOKENS, DEMO_TOML};
use crate::{Listeners, Running};
use permit_api_sim::{Sim, SimConfig};
use tokio::net::TcpListener;

/// Starts simulator and gateway; returns both so the caller decides how long
/// they live (until Ctrl-C for the command, the test's end in tests).
pub async fn start(listen: &str, admin_listen: &str) -> Result<(Sim, Running), String> {
    let sim_key = format!("sim-{:032x}", rand::random::<u128>());
    let sim_listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("simulator: {e}"))?;
    let sim = Sim::start(
        sim_listener,
        SimConfig {
            api_key: sim_key.clone(),
            credit_limit: Some(100_000),
            latency_ms: 80,
            ..SimConfig::default()
        },
    )
    .await
    .map_err(|e| format!("simulator: {e}"))?;
    // Everything the demo writes, its ledger and its disk-tier file, in a
    // folder of its own: a second demo at once, or the next one, shares
    // nothing with it, and `clean_up` removes it whole.
    let dir = demo_dir();
    let text = format!(
        "{DEMO_TOML}\n[upstream]\nbase_url = {:?}\napi_key = {:?}\n\n[quota]\npath = {:?}\n\n[cache]\ndisk_path = {:?}\n",
        sim.base_url(),
        sim_key,
        dir.join("ledger").display().to_string(),
        dir.join("cache.redb").display().to_string(),
    );
    let config = Config::load_checked(Source::Text(&text), Checks::demo()).map_err(|e| e.to_string())?;
    let listeners = Listeners {
        team: bind_or_any(listen).await?,
        admin: bind_or_any(admin_listen).await?,
    };
    let running = Running::spawn(config, listeners)?;
    Ok((sim, running))
}

/// The demo's folder under the temp directory: one per process.
pub fn demo_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("permit-gateway-demo-{}", std::process::id()))
}

/// Removes what the demo wrote (its ledger, its disk-tier file): call once
/// it has stopped, so a demo leaves nothing behind in the temp directory.
pub fn clean_up() {
    let dir = demo_dir();
    if dir.exists() {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            eprintln!("demo: could not remove {}: {e}", dir.display());
        }
    }
}

/// The wanted address, or any free loopback port when it is taken.
async fn bind_or_any(addr: &str) -> Result<TcpListener, String> {
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(l),
        Err(_) => TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string()),
    }
}

/// What the demo prints: where things are and what to paste.
pub fn banner(sim: &Sim, gw: &Running) -> String {
    let base = gw.base_url();
    let admin = gw.admin_url();
    let (team, token) = DEMO_TOKENS[0];
    let (team2, token2) = DEMO_TOKENS[1];
    let s = sim.samples();
    let search = format!(
        "{base}/v2/permits/search?geo_id={}&permit_from={}&permit_to={}&size=5",
        s.state, s.permit_from, s.permit_to
    );
    format!(
        "permit-gateway demo is running.\n\
         \n  gateway (team traffic):  {base}\
         \n  admin (metrics, health): {admin}\
         \n  upstream simulator:      {upstream}\
         \n\nTeams: {team} (token {token}, 5000 credits), {team2} (token {token2}, 500 credits).\
         \n\nTry:\
         \n  curl -s -H 'X-API-Key: {token}' '{search}'\
         \n  curl -s -i -H 'X-API-Key: {token2}' '{search}' | grep -i '^x-'\
         \n  curl -s -H 'Authorization: Bearer {token}' '{base}/v2/usage'\
         \n  curl -s '{admin}/metrics' | grep -E '^gateway_(credits_(spent|saved)_total|team_credit)' | grep -v ' 0$'\
         \n  curl -s -H 'Authorization: Bearer {DEMO_ADMIN_TOKEN}' '{admin}/admin/teams'\
         \n\nPress Ctrl-C to stop.\n",
        upstream = sim.base_url(),
    )
}
