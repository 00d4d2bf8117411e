//! A real TLS-only `redis-server` for one test: no plaintext port
//! (`--port 0`), a TLS port on a free loopback port, certificates from a
//! throw-away CA made here ([`RedisPki`]), optionally demanding a client
//! certificate (`--tls-auth-clients yes`). Killed on drop.
//!
//! The calls block (std sockets, child processes): from an async test run
//! them in `tokio::task::spawn_blocking` or before the gateways start.

use super::free_port;
use super::redis_proc::spawn_redis_server;
use super::wait::eventually_blocking;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use redis::{ClientTlsConfig, TlsCertificates};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as
/// PEM files. Every certificate has its own subject: OpenSSL (the server's
/// side) takes a leaf whose subject is its issuer's for a self-signed one.
pub struct RedisPki {
    dir: tempfile::TempDir,
    pub ca_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

impl RedisPki {
    pub fn new() -> RedisPki {
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca.distinguished_name = name("permit-gateway test Redis CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |cn: &str, sans: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let key = KeyPair::generate().expect("leaf key");
            let mut params = CertificateParams::new(sans).expect("leaf params");
            params.distinguished_name = name(cn);
            params.extended_key_usages = usages;
            let cert = params.signed_by(&key, &issuer).expect("leaf cert");
            (cert.pem(), key.serialize_pem())
        };
        let server = leaf(
            "redis server",
            vec!["127.0.0.1".into(), "localhost".into()],
            // A cluster node is also a client of the others' bus (mutual TLS).
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        );
        let client = leaf("gateway client", Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth]);
        let pki = RedisPki {
            dir: tempfile::tempdir().expect("tmp"),
            ca_pem: ca_cert.pem(),
            client_cert_pem: client.0,
            client_key_pem: client.1,
        };
        for (file, text) in [
            ("ca.pem", &pki.ca_pem),
            ("server.pem", &server.0),
            ("server.key", &server.1),
            ("client.pem", &pki.client_cert_pem),
            ("client.key", &pki.client_key_pem),
        ] {
            std::fs::write(pki.path(file), text).expect("write pem");
        }
        pki
    }

    /// One of ca.pem, server.pem, server.key, client.pem, client.key.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

pub struct TlsRedis {
    pub pki: RedisPki,
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// The login the test's own queries use (after `ACL SETUSER`).
    login: String,
}

impl TlsRedis {
    /// Starts the server; `client_certs`: `--tls-auth-clients yes`.
    pub fn start(client_certs: bool) -> TlsRedis {
        let pki = RedisPki::new();
        let port = free_port();
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut server = TlsRedis {
            pki,
            port,
            dir,
            child: None,
            login: String::new(),
        };
        server.spawn(client_certs);
        server
    }

    /// `rediss://[login@]127.0.0.1:port`.
    pub fn url(&self, login: &str) -> String {
        match login {
            "" => format!("rediss://127.0.0.1:{}", self.port),
            login => format!("rediss://{login}@127.0.0.1:{}", self.port),
        }
    }

    /// What a gateway needs to reach this server: its CA, and the client
    /// certificate when `client_cert`.
    pub fn trust(&self, client_cert: bool) -> Trust {
        Trust {
            ca: Some(self.pki.path("ca.pem")),
            client: client_cert.then(|| (self.pki.path("client.pem"), self.pki.path("client.key"))),
        }
    }

    /// Creates an ACL user with every command and key, turns the passwordless
    /// `default` user off (so only that login works from now on) and uses
    /// it for the test's own queries.
    pub fn acl_user(&mut self, user: &str, password: &str) {
        let mut set = redis::cmd("ACL");
        set.arg("SETUSER").arg(user).arg("on").arg(format!(">{password}"));
        set.arg("~*").arg("&*").arg("+@all");
        let _: String = self.query(&set);
        self.login = format!("{user}:{password}");
        let _: String = self.query(redis::cmd("ACL").arg("SETUSER").arg("default").arg("off"));
    }

    /// One command, over TLS with the client certificate (always accepted).
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        self.try_query(cmd).expect("the TLS redis answers")
    }

    fn try_query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        let certs = TlsCertificates {
            client_tls: Some(ClientTlsConfig {
                client_cert: self.pki.client_cert_pem.clone().into_bytes(),
                client_key: self.pki.client_key_pem.clone().into_bytes(),
            }),
            root_cert: Some(self.pki.ca_pem.clone().into_bytes()),
        };
        let client = redis::Client::build_with_tls(self.url(&self.login), certs).ok()?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2)).ok()?;
        cmd.query(&mut conn).ok()
    }

    /// Keys matching `pattern` (KEYS: a test Redis holds a handful).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.query(redis::cmd("KEYS").arg(pattern))
    }

    fn spawn(&mut self, client_certs: bool) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", "0", "--tls-port"])
            .arg(self.port.to_string())
            .arg("--tls-cert-file")
            .arg(self.pki.path("server.pem"))
            .arg("--tls-key-file")
            .arg(self.pki.path("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(self.pki.path("ca.pem"))
            .args(["--tls-auth-clients", if client_certs { "yes" } else { "no" }])
            .args(["--save", "", "--appendonly", "no"]);
        self.child = Some(spawn_redis_server(&mut cmd, self.dir.path()));
        let what = format!("the TLS redis-server on {} answers PING", self.port);
        eventually_blocking(&what, Duration::from_secs(10), || {
            self.try_query::<String>(&redis::cmd("PING")).is_some()
        });
    }
}

/// A TLS-only Redis Cluster of three primaries (no replicas: the failover
/// is the plaintext cluster's test), TLS on the cluster bus too, created
/// with `redis-cli --tls --cluster create`.
pub struct TlsCluster {
    pub pki: RedisPki,
    nodes: Vec<(u16, tempfile::TempDir, Child)>,
}

impl TlsCluster {
    pub fn start() -> TlsCluster {
        let pki = RedisPki::new();
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let (port, bus) = (free_port(), free_port());
            let dir = tempfile::tempdir().expect("node dir");
            let mut cmd = Command::new("redis-server");
            cmd.args(["--bind", "127.0.0.1", "--port", "0", "--tls-port"])
                .arg(port.to_string())
                .args(["--cluster-enabled", "yes", "--tls-cluster", "yes", "--cluster-port"])
                .arg(bus.to_string())
                .arg("--tls-cert-file")
                .arg(pki.path("server.pem"))
                .arg("--tls-key-file")
                .arg(pki.path("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(pki.path("ca.pem"))
                .args(["--tls-auth-clients", "no", "--save", "", "--appendonly", "no"]);
            let child = spawn_redis_server(&mut cmd, dir.path());
            nodes.push((port, dir, child));
        }
        let cluster = TlsCluster { pki, nodes };
        for (port, _, _) in &cluster.nodes {
            eventually_blocking("a TLS cluster node answers", Duration::from_secs(10), || {
                cluster.cli(*port, &["PING"]).is_some_and(|o| o.contains("PONG"))
            });
        }
        let mut create = vec!["--cluster".to_string(), "create".to_string()];
        create.extend(cluster.nodes.iter().map(|(p, _, _)| format!("127.0.0.1:{p}")));
        create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let args: Vec<&str> = create.iter().map(String::as_str).collect();
        let port = cluster.nodes[0].0;
        cluster.cli(port, &args).expect("redis-cli --cluster create");
        eventually_blocking("the TLS cluster is ok", Duration::from_secs(20), || {
            cluster.nodes.iter().all(|(p, _, _)| {
                cluster
                    .cli(*p, &["CLUSTER", "INFO"])
                    .is_some_and(|o| o.contains("cluster_state:ok"))
            })
        });
        cluster
    }

    /// `rediss+cluster://` with two seeds.
    pub fn url(&self) -> String {
        format!(
            "rediss+cluster://127.0.0.1:{},127.0.0.1:{}",
            self.nodes[0].0, self.nodes[1].0
        )
    }

    /// `redis-cli --tls` against one node: its stdout when it succeeds.
    fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(self.pki.path("ca.pem"))
            .args(["-h", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        for (_, _, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The `[redis]` TLS files of a gateway: the CA it trusts (none: the
/// public roots) and the client certificate and key it presents.
#[derive(Clone, Default)]
pub struct Trust {
    pub ca: Option<PathBuf>,
    pub client: Option<(PathBuf, PathBuf)>,
}

impl Trust {
    /// Trusting the CA in `path` only.
    pub fn ca(path: PathBuf) -> Trust {
        Trust {
            ca: Some(path),
            client: None,
        }
    }

    /// Writes these files into `config`'s `[redis]`.
    pub fn apply(&self, config: &mut permit_gateway::config::Config) {
        config.redis.tls_ca_file = self.ca.clone();
        let (cert, key) = self.client.clone().unzip();
        config.redis.tls_cert_file = cert;
        config.redis.tls_key_file = key;
    }
}
