//! A throwaway PKI for one test: a CA and a leaf for 127.0.0.1/localhost,
//! written as PEM files in a temp dir (the gateway reads files).

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use std::path::PathBuf;
use std::sync::Arc;

pub struct TestPki {
    dir: tempfile::TempDir,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestPki {
    pub fn new() -> TestPki {
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("leaf params")
            .signed_by(&leaf_key, &issuer)
            .expect("leaf cert");
        let pki = TestPki {
            dir: tempfile::tempdir().expect("tmp"),
            ca_pem: ca_cert.pem(),
            cert_pem: leaf.pem(),
            key_pem: leaf_key.serialize_pem(),
        };
        std::fs::write(pki.ca_path(), &pki.ca_pem).expect("write ca");
        std::fs::write(pki.cert_path(), &pki.cert_pem).expect("write cert");
        std::fs::write(pki.key_path(), &pki.key_pem).expect("write key");
        pki
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    /// A server config presenting the leaf, offering h2 and http/1.1.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("cert pem");
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("key pem");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A client config trusting only this CA.
    pub fn client_config(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert.expect("ca pem")).expect("add ca");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_root_certificates(roots)
            .with_no_client_auth()
    }
}
