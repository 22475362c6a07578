//! TLS for the engine's three links: PostgreSQL, RabbitMQ and Redis. One stack,
//! rustls, with aws-lc-rs as the process's one crypto provider (`install_provider`); the
//! AMQP and Redis clients build their configurations from that process default.
//!
//! Owns the `{database,amqp,redis}.tls` file settings, libpq's `sslmode` (which
//! tokio-postgres parses only as far as `require`: the engine reads the mode itself
//! and strips it from the connection string) and the PostgreSQL connector that
//! honours it (docs/DESIGN.md, "Transport security").

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use serde::Deserialize;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The files of one link's TLS: `<section>.tls.{ca_file,cert_file,key_file}`, all
/// PEM. `ca_file`: the certificate authorities the server's certificate must chain
/// to. `cert_file` and `key_file` (together or not at all): a client certificate
/// for servers that ask for one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// A TLS setting that cannot be used; `key` is the configuration key to fix.
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct TlsError {
    pub key: String,
    pub reason: String,
}

impl TlsError {
    fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        TlsError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// A client certificate chain and its key.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The files as read, for clients that parse PEM themselves.
    pub chain_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl TlsFiles {
    /// Whether any file is set.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Reads and checks every file set, naming `<section>.tls.*` in an error.
    pub fn check(&self, section: &str) -> Result<(), TlsError> {
        if let Some(pem) = self.ca_pem(section)? {
            roots(&pem, &format!("{section}.tls.ca_file"))?;
        }
        self.identity(section)?;
        Ok(())
    }

    /// The CA file as read, if one is set.
    pub fn ca_pem(&self, section: &str) -> Result<Option<Vec<u8>>, TlsError> {
        self.ca_file
            .as_deref()
            .map(|path| read(path, &format!("{section}.tls.ca_file")))
            .transpose()
    }

    /// The client certificate and key, if set (both or neither).
    pub fn identity(&self, section: &str) -> Result<Option<Identity>, TlsError> {
        let (cert, key) = match (&self.cert_file, &self.key_file) {
            (None, None) => return Ok(None),
            (Some(cert), Some(key)) => (cert, key),
            (Some(_), None) => {
                return Err(TlsError::new(
                    format!("{section}.tls.key_file"),
                    "must be set with cert_file (the client certificate's key)",
                ))
            }
            (None, Some(_)) => {
                return Err(TlsError::new(
                    format!("{section}.tls.cert_file"),
                    "must be set with key_file (the client certificate)",
                ))
            }
        };
        let cert_key = format!("{section}.tls.cert_file");
        let key_key = format!("{section}.tls.key_file");
        let chain_pem = read(cert, &cert_key)?;
        let key_pem = read(key, &key_key)?;
        let chain = CertificateDer::pem_slice_iter(&chain_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::new(&cert_key, format!("not PEM certificates: {e}")))?;
        if chain.is_empty() {
            return Err(TlsError::new(cert_key, "holds no PEM certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| TlsError::new(key_key, format!("not a PEM private key: {e}")))?;
        Ok(Some(Identity {
            chain,
            key,
            chain_pem,
            key_pem,
        }))
    }
}

fn read(path: &Path, key: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError::new(key, format!("cannot read {}: {e}", path.display())))
}

fn roots(pem: &[u8], key: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| TlsError::new(key, format!("not PEM certificates: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| TlsError::new(key, format!("not a CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(TlsError::new(key, "holds no PEM certificate"));
    }
    Ok(roots)
}

/// Installs aws-lc-rs as the process's crypto provider, once; every TLS client of the
/// process (ours, lapin's, the redis crate's) then uses it.
pub fn install_provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| {
        // Fails only if a provider is already installed, which is then the one to use.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
    }))
}

/// libpq's `sslmode`, all five of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it, else plaintext (with a warning).
    Prefer,
    /// TLS or no connection; the chain is verified only when a CA file is given.
    Require,
    /// TLS, the chain verified against the CA file; any host name.
    VerifyCa,
    /// TLS, the chain verified and the host name checked against the certificate.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: it knows whether to try TLS and whether to
    /// fall back; the verification is the connector's.
    fn wire(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

/// libpq parameters the engine takes from `database.tls` instead.
const FILE_PARAMETERS: &[(&str, &str)] = &[
    ("sslrootcert", "ca_file"),
    ("sslcert", "cert_file"),
    ("sslkey", "key_file"),
];

/// Takes `sslmode` out of a PostgreSQL connection string (URL or `key=value`
/// form), returning the rest and the mode (libpq's default, `prefer`, when
/// absent). The error is a reason, without the string (it may hold a password).
pub fn split_sslmode(conn: &str, key: &str) -> Result<(String, SslMode), String> {
    let mut mode = None;
    let mut take = |name: &str, value: &str| -> Result<bool, String> {
        if let Some((_, file)) = FILE_PARAMETERS.iter().find(|(p, _)| *p == name) {
            return Err(format!(
                "`{name}` is not read from the URL; set `{}.tls.{file}`",
                key.split('.').next().unwrap_or("database")
            ));
        }
        if name != "sslmode" {
            return Ok(false);
        }
        mode = Some(SslMode::parse(value).ok_or_else(|| {
            format!(
                "sslmode {value:?} is not one of disable, prefer, require, verify-ca, verify-full"
            )
        })?);
        Ok(true)
    };
    let rest = if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        match conn.split_once('?') {
            None => conn.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&') {
                    let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                    if !take(name, value)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for token in words(conn) {
            let (name, value) = token.split_once('=').unwrap_or((token, ""));
            let name = name.trim();
            if name == "sslmode" && value.is_empty() {
                return Err("write sslmode=MODE without spaces around '='".into());
            }
            if !take(name, value.trim_matches('\''))? {
                kept.push(token);
            }
        }
        kept.join(" ")
    };
    Ok((rest, mode.unwrap_or(SslMode::Prefer)))
}

/// The whitespace-separated words of a `key=value` string, quotes kept together.
fn words(conn: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (None, false, false);
    for (i, c) in conn.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '\'' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if let Some(s) = start.take() {
                    out.push(&conn[s..i]);
                }
                continue;
            }
            _ => {}
        }
        start.get_or_insert(i);
    }
    if let Some(s) = start {
        out.push(&conn[s..]);
    }
    out
}

/// How the engine connects to PostgreSQL over TLS, built once per URL at start.
#[derive(Clone)]
pub struct PgTls {
    mode: SslMode,
    connector: MakeRustlsConnect,
    /// The URL's key, for the fallback warning.
    key: &'static str,
    /// Whether the plaintext fallback of `prefer` was already logged (once is
    /// enough: every connection of the pool would say the same).
    warned: Arc<AtomicBool>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls").field("mode", &self.mode).finish()
    }
}

impl PgTls {
    /// The connector for `mode` with `files` (`database.tls`); `key` names the URL.
    pub fn new(mode: SslMode, files: &TlsFiles, key: &'static str) -> Result<PgTls, TlsError> {
        let provider = install_provider();
        let ca = files.ca_pem("database")?;
        let roots = ca
            .as_deref()
            .map(|pem| roots(pem, "database.tls.ca_file"))
            .transpose()?;
        let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots) {
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(TlsError::new(
                    "database.tls.ca_file",
                    format!(
                        "sslmode={} in `{key}` verifies the server against a CA: set database.tls.ca_file",
                        mode.name()
                    ),
                ))
            }
            // libpq: with a root certificate, `prefer` and `require` verify the
            // chain as `verify-ca` does; without one they check nothing.
            (SslMode::Disable | SslMode::Prefer | SslMode::Require, None) => {
                Arc::new(AnyCertificate(Arc::clone(&provider)))
            }
            (SslMode::VerifyFull, Some(roots)) => webpki(roots, &provider)?,
            (_, Some(roots)) => Arc::new(ChainOnly(webpki(roots, &provider)?)),
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new("database.tls", e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match files.identity("database")? {
            Some(id) => builder
                .with_client_auth_cert(id.chain, id.key)
                .map_err(|e| TlsError::new("database.tls.key_file", e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        Ok(PgTls {
            mode,
            connector: MakeRustlsConnect::new(config),
            key,
            warned: Arc::default(),
        })
    }

    /// The mode, as read from the URL.
    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// Sets what tokio-postgres must do of `mode` on `config`.
    pub fn apply(&self, config: &mut tokio_postgres::Config) {
        config.ssl_mode(self.mode.wire());
    }

    /// A connector for one connection, and the flag it raises once the server
    /// agreed to TLS.
    pub fn connector(&self) -> (Tracked, Arc<AtomicBool>) {
        let used = Arc::new(AtomicBool::new(false));
        (
            Tracked {
                inner: self.connector.clone(),
                used: Arc::clone(&used),
            },
            used,
        )
    }

    /// After a connection opened: under `prefer`, says (once) that the server
    /// offered no TLS and the connection is plaintext.
    pub fn opened(&self, encrypted: &AtomicBool) {
        if self.mode == SslMode::Prefer
            && !encrypted.load(Ordering::Acquire)
            && !self.warned.swap(true, Ordering::AcqRel)
        {
            tracing::warn!(
                key = self.key,
                "sslmode=prefer and the server offers no TLS: the connection is plaintext (set sslmode=require or verify-full to refuse it, or sslmode=disable to say so)"
            );
        }
    }
}

fn webpki(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| TlsError::new("database.tls.ca_file", e.to_string()))
}

/// `MakeRustlsConnect` that raises a flag when a handshake starts: tokio-postgres
/// asks for one only after the server accepted TLS.
#[derive(Clone)]
pub struct Tracked {
    inner: MakeRustlsConnect,
    used: Arc<AtomicBool>,
}

impl<S> MakeTlsConnect<S> for Tracked
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = TrackedConnect<<MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect>;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        Ok(TrackedConnect {
            inner: MakeTlsConnect::<S>::make_tls_connect(&mut self.inner, domain)?,
            used: Arc::clone(&self.used),
        })
    }
}

/// One connection's handshake (`Tracked`).
pub struct TrackedConnect<T> {
    inner: T,
    used: Arc<AtomicBool>,
}

impl<S, T: TlsConnect<S>> TlsConnect<S> for TrackedConnect<T> {
    type Stream = T::Stream;
    type Error = T::Error;
    type Future = T::Future;

    fn connect(self, stream: S) -> T::Future {
        self.used.store(true, Ordering::Release);
        self.inner.connect(stream)
    }
}

/// `require` without a CA file: encrypted, with the server's handshake signature
/// checked, but any certificate accepted (libpq's behaviour; say verify-full to
/// be protected from an impostor).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to the CA file; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_is_taken_out_of_a_url() {
        let (rest, mode) = split_sslmode(
            "postgres://u:p@h:5432/db?application_name=x&sslmode=verify-full",
            "database.url",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:p@h:5432/db?application_name=x");
        assert_eq!(mode, SslMode::VerifyFull);
        let (rest, mode) =
            split_sslmode("postgres://h/db?sslmode=verify-ca", "database.url").unwrap();
        assert_eq!(
            (rest.as_str(), mode),
            ("postgres://h/db", SslMode::VerifyCa)
        );
        let (rest, mode) = split_sslmode("postgres://h/db", "database.url").unwrap();
        assert_eq!((rest.as_str(), mode), ("postgres://h/db", SslMode::Prefer));
    }

    #[test]
    fn sslmode_is_taken_out_of_key_value_form() {
        let (rest, mode) = split_sslmode(
            "host=h password='a b' sslmode=require dbname=d",
            "database.url",
        )
        .unwrap();
        assert_eq!(rest, "host=h password='a b' dbname=d");
        assert_eq!(mode, SslMode::Require);
    }

    #[test]
    fn unknown_modes_and_file_parameters_are_refused_without_the_url() {
        let e = split_sslmode("postgres://u:secret@h/db?sslmode=allow-ish", "database.url")
            .unwrap_err();
        assert!(e.contains("allow-ish") && !e.contains("secret"), "{e}");
        let e = split_sslmode("postgres://h/db?sslrootcert=/x", "database.url").unwrap_err();
        assert!(e.contains("database.tls.ca_file"), "{e}");
    }

    #[test]
    fn verify_modes_need_a_ca_file() {
        let e = PgTls::new(SslMode::VerifyFull, &TlsFiles::default(), "database.url").unwrap_err();
        assert_eq!(e.key, "database.tls.ca_file");
        assert!(PgTls::new(SslMode::Require, &TlsFiles::default(), "database.url").is_ok());
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let files = TlsFiles {
            cert_file: Some("/nonexistent".into()),
            ..TlsFiles::default()
        };
        assert_eq!(
            files.identity("redis").err().map(|e| e.key),
            Some("redis.tls.key_file".into())
        );
    }
}
