//! TLS to Redis (`rediss://`, `rediss+cluster://`, `rediss+sentinel://`):
//! the PEM files of `[redis]`, read once, and a start-up probe.
//!
//! redis-rs does the TLS (rustls, through `ClientConfig::builder()`, so with
//! the one crypto provider `main` installs). Without `redis.tls_ca_file` it
//! trusts the public roots of webpki-roots, like the upstream client.
//!
//! Connections are lazy, so a CA that does not match would otherwise show
//! only as failing calls and an open breaker. The probe does one handshake
//! and one PING at start-up and refuses to start when the certificate (or
//! the client certificate) is the problem, naming the setting; a Redis that
//! is merely unreachable keeps the gateway starting, as without TLS.

use redis::{ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Bounds of the start-up probe, per address.
const PROBE_CONNECT: Duration = Duration::from_secs(1);
const PROBE_ANSWER: Duration = Duration::from_secs(3);

/// The PEM bytes of `redis.tls_ca_file` and of the client certificate and
/// key. No `Debug`: the key is a secret.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Reads and checks the files; errors name the setting and the path
    /// (never the contents).
    pub(crate) fn load(
        ca_file: Option<&Path>,
        cert_file: Option<&Path>,
        key_file: Option<&Path>,
    ) -> Result<TlsFiles, String> {
        let ca = match ca_file {
            Some(path) => {
                let pem = read("redis.tls_ca_file", path)?;
                let certs = certificates("redis.tls_ca_file", path, &pem)?;
                let mut roots = rustls::RootCertStore::empty();
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| format!("redis.tls_ca_file: {}: not a CA certificate ({e})", path.display()))?;
                }
                Some(pem)
            }
            None => None,
        };
        let client = match (cert_file, key_file) {
            (Some(cert_path), Some(key_path)) => {
                let cert = read("redis.tls_cert_file", cert_path)?;
                certificates("redis.tls_cert_file", cert_path, &cert)?;
                let key = read("redis.tls_key_file", key_path)?;
                PrivateKeyDer::from_pem_slice(&key)
                    .map_err(|_| format!("redis.tls_key_file: {}: no PEM private key", key_path.display()))?;
                Some((cert, key))
            }
            _ => None,
        };
        Ok(TlsFiles { ca, client })
    }

    /// What redis-rs takes; `None` when nothing is configured (public roots).
    pub(super) fn certificates(&self) -> Option<TlsCertificates> {
        if self.ca.is_none() && self.client.is_none() {
            return None;
        }
        Some(TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        })
    }

    /// The rustls config redis-rs builds from the same files.
    fn client_config(&self) -> Result<rustls::ClientConfig, String> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem).flatten() {
                    roots.add(cert).map_err(|e| format!("redis.tls_ca_file: {e}"))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        match &self.client {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert).flatten().collect();
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| "redis.tls_key_file: no PEM private key")?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("redis.tls_cert_file / redis.tls_key_file: {e}"))
            }
            None => Ok(builder.with_no_client_auth()),
        }
    }

    /// One TLS handshake and PING with each of `addrs` until one answers:
    /// `Err` when the TLS setup is what fails (certificate not trusted,
    /// client certificate refused), naming the setting. `key` is the URL's
    /// setting (`cache.redis_url`, ...). Unreachable addresses pass.
    pub(super) fn probe(&self, key: &str, addrs: &[(String, u16)]) -> Result<(), String> {
        let config = Arc::new(self.client_config()?);
        for (host, port) in addrs {
            match probe_one(&config, host, *port) {
                Probe::Answered => return Ok(()),
                Probe::Unreachable => continue,
                Probe::Refused(why) => return Err(self.explain(key, host, *port, &why)),
            }
        }
        if !addrs.is_empty() {
            tracing::warn!(
                setting = key,
                "redis over TLS: not reachable at start-up; TLS not checked yet"
            );
        }
        Ok(())
    }

    fn explain(&self, key: &str, host: &str, port: u16, why: &rustls::Error) -> String {
        let at = format!("{key}: the TLS handshake with {host}:{port} failed");
        match why {
            rustls::Error::InvalidCertificate(e) => match &self.ca {
                Some(_) => format!("{at}: its certificate is not trusted by redis.tls_ca_file ({e:?})"),
                None => format!("{at}: its certificate is not signed by a public CA; set redis.tls_ca_file ({e:?})"),
            },
            rustls::Error::AlertReceived(alert) => match &self.client {
                Some(_) => format!("{at}: Redis refused the client certificate of redis.tls_cert_file ({alert:?})"),
                None => format!(
                    "{at}: Redis wants a client certificate: set redis.tls_cert_file and redis.tls_key_file ({alert:?})"
                ),
            },
            other => format!("{at}: {other}"),
        }
    }
}

/// The host and port of every address a TLS target starts from (`None`
/// for an address that is not TLS).
pub(super) fn tls_address(url: &str) -> Option<(String, u16)> {
    match url.into_connection_info().ok()?.addr() {
        ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

enum Probe {
    Answered,
    Unreachable,
    Refused(rustls::Error),
}

fn probe_one(config: &Arc<rustls::ClientConfig>, host: &str, port: u16) -> Probe {
    let Some(addr) = (host, port).to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return Probe::Unreachable;
    };
    let Ok(tcp) = TcpStream::connect_timeout(&addr, PROBE_CONNECT) else {
        return Probe::Unreachable;
    };
    let _ = tcp.set_read_timeout(Some(PROBE_ANSWER));
    let _ = tcp.set_write_timeout(Some(PROBE_ANSWER));
    let Ok(name) = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string()) else {
        return Probe::Unreachable;
    };
    let Ok(conn) = rustls::ClientConnection::new(config.clone(), name) else {
        return Probe::Unreachable;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // The PING goes after the handshake: with TLS 1.3 a refused client
    // certificate shows only as an alert on the first read.
    let mut answer = [0u8; 1];
    let io = tls.write_all(b"PING\r\n").and_then(|_| tls.read_exact(&mut answer));
    match io {
        // "+PONG", or "-NOAUTH"/"-WRONGPASS": TLS itself works.
        Ok(()) => Probe::Answered,
        Err(e) => match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
            Some(why) => Probe::Refused(why.clone()),
            None => Probe::Unreachable,
        },
    }
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))
}

fn certificates<'a>(key: &str, path: &Path, pem: &'a [u8]) -> Result<Vec<CertificateDer<'a>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| format!("{key}: {}: not PEM certificates", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{key}: {}: no certificate in it", path.display()));
    }
    Ok(certs)
}
