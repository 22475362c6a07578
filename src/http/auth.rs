//! Who is asking: the buyer identity of the front stage (docs/DESIGN.md, "Buyer
//! identity"). Never taken from a request body. `frontstage.auth.mode`:
//! - `jwt` (the default): `Authorization: Bearer <JWT>`, HS256 with
//!   `frontstage.auth.hs256_secret` or RS256/ES256 with the public key in
//!   `frontstage.auth.public_key_file`; `exp` required, `aud`/`iss` checked when
//!   configured; the subject (`sub`, a decimal string) is the user id.
//! - `gateway`: an authenticating gateway in front sets the user id in
//!   `frontstage.auth.gateway_header`; trusted only from the addresses in
//!   `frontstage.auth.trusted_proxies`.
//! - `none`: the same header from anyone: local development only, refused unless the
//!   front stage listens on a loopback address.

use std::net::IpAddr;

use actix_web::http::header::{HeaderName, HeaderValue, WWW_AUTHENTICATE};
use actix_web::{HttpRequest, HttpResponse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::json;

use crate::config::{AuthMode, AuthSettings, MIN_HS256_SECRET_BYTES};

/// Checks a request's identity as configured.
pub struct Authenticator {
    mode: Mode,
}

enum Mode {
    Jwt {
        key: DecodingKey,
        validation: Box<Validation>,
    },
    Gateway {
        header: HeaderName,
        trusted: Vec<IpAddr>,
    },
    Unchecked {
        header: HeaderName,
    },
}

/// Why a request has no identity; answered with 401.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token")]
    Missing,
    #[error("invalid token: {0}")]
    Invalid(String),
    #[error("the identity header came from an address that is not a trusted proxy")]
    UntrustedProxy,
}

/// The configuration cannot authenticate anyone; names the key.
#[derive(Debug, thiserror::Error)]
#[error("configuration key `{key}`: {reason}")]
pub struct AuthConfigError {
    pub key: &'static str,
    pub reason: String,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
}

impl Authenticator {
    /// `http_addr`: where the front stage listens (mode `none` needs a loopback one).
    pub fn new(settings: &AuthSettings, http_addr: &str) -> Result<Self, AuthConfigError> {
        let header = |key| {
            HeaderName::from_bytes(settings.gateway_header.as_bytes()).map_err(|e| {
                AuthConfigError {
                    key,
                    reason: format!("not a header name: {e}"),
                }
            })
        };
        let mode = match settings.mode {
            AuthMode::Jwt => {
                let (key, algorithm) = match (&settings.hs256_secret, &settings.public_key_file) {
                    (Some(secret), None) => {
                        let secret = secret.expose_secret().as_bytes();
                        if secret.len() < MIN_HS256_SECRET_BYTES {
                            return Err(AuthConfigError {
                                key: "frontstage.auth.hs256_secret",
                                reason: format!(
                                    "must be at least {MIN_HS256_SECRET_BYTES} bytes (the value is not shown)"
                                ),
                            });
                        }
                        (DecodingKey::from_secret(secret), Algorithm::HS256)
                    }
                    (None, Some(path)) => public_key(path)?,
                    (Some(_), Some(_)) => {
                        return Err(AuthConfigError {
                            key: "frontstage.auth.public_key_file",
                            reason: "set either it or frontstage.auth.hs256_secret, not both"
                                .into(),
                        })
                    }
                    (None, None) => {
                        return Err(AuthConfigError {
                            key: "frontstage.auth.hs256_secret",
                            reason: "frontstage.auth.mode = \"jwt\" needs it (at least 32 bytes, through SECKILL__FRONTSTAGE__AUTH__HS256_SECRET) or frontstage.auth.public_key_file".into(),
                        })
                    }
                };
                let mut validation = Validation::new(algorithm);
                // A configured audience or issuer is checked only if the claim
                // must be present: jsonwebtoken passes a token without it.
                let mut required = vec!["exp", "sub"];
                match &settings.audience {
                    Some(aud) => {
                        validation.set_audience(&[aud]);
                        required.push("aud");
                    }
                    None => validation.validate_aud = false,
                }
                if let Some(iss) = &settings.issuer {
                    validation.set_issuer(&[iss]);
                    required.push("iss");
                }
                validation.set_required_spec_claims(&required);
                Mode::Jwt {
                    key,
                    validation: Box::new(validation),
                }
            }
            AuthMode::Gateway => {
                if settings.trusted_proxies.is_empty() {
                    return Err(AuthConfigError {
                        key: "frontstage.auth.trusted_proxies",
                        reason: "mode \"gateway\" trusts the identity header only from these addresses; list the gateway's".into(),
                    });
                }
                Mode::Gateway {
                    header: header("frontstage.auth.gateway_header")?,
                    trusted: settings.trusted_proxies.clone(),
                }
            }
            AuthMode::None => {
                if !is_loopback_bind(http_addr) {
                    return Err(AuthConfigError {
                        key: "frontstage.auth.mode",
                        reason: format!(
                            "\"none\" trusts any caller's identity header: local development only, and http.addr ({http_addr}) is not a loopback address"
                        ),
                    });
                }
                Mode::Unchecked {
                    header: header("frontstage.auth.gateway_header")?,
                }
            }
        };
        Ok(Self { mode })
    }

    /// The user the request speaks for.
    pub fn user(&self, req: &HttpRequest) -> Result<i64, AuthError> {
        match &self.mode {
            Mode::Jwt { key, validation } => {
                let token = req
                    .headers()
                    .get(actix_web::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| {
                        v.strip_prefix("Bearer ")
                            .or_else(|| v.strip_prefix("bearer "))
                    })
                    .map(str::trim)
                    .ok_or(AuthError::Missing)?;
                let data = jsonwebtoken::decode::<Claims>(token, key, validation)
                    .map_err(|e| AuthError::Invalid(e.to_string()))?;
                parse_user(&data.claims.sub)
            }
            Mode::Gateway { header, trusted } => {
                let peer = req.peer_addr().map(|a| a.ip());
                if !peer.is_some_and(|ip| trusted.contains(&ip)) {
                    return Err(AuthError::UntrustedProxy);
                }
                header_user(req, header)
            }
            Mode::Unchecked { header } => header_user(req, header),
        }
    }
}

fn public_key(path: &std::path::Path) -> Result<(DecodingKey, Algorithm), AuthConfigError> {
    let key = "frontstage.auth.public_key_file";
    let pem = std::fs::read(path).map_err(|e| AuthConfigError {
        key,
        reason: format!("{}: {e}", path.display()),
    })?;
    if let Ok(rsa) = DecodingKey::from_rsa_pem(&pem) {
        return Ok((rsa, Algorithm::RS256));
    }
    if let Ok(ec) = DecodingKey::from_ec_pem(&pem) {
        return Ok((ec, Algorithm::ES256));
    }
    Err(AuthConfigError {
        key,
        reason: format!("{}: not a PEM RSA or EC (P-256) public key", path.display()),
    })
}

fn header_user(req: &HttpRequest, header: &HeaderName) -> Result<i64, AuthError> {
    let value = req
        .headers()
        .get(header)
        .and_then(|v| v.to_str().ok())
        .ok_or(AuthError::Missing)?;
    parse_user(value)
}

/// A user id is a positive decimal integer.
fn parse_user(sub: &str) -> Result<i64, AuthError> {
    match sub.trim().parse::<i64>() {
        Ok(user) if user > 0 => Ok(user),
        _ => Err(AuthError::Invalid(
            "the subject is not a positive decimal user id".into(),
        )),
    }
}

fn is_loopback_bind(addr: &str) -> bool {
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An HS256 token for `user_id`, valid for `ttl`: what the bench, the demo and the
/// tests present. In production the identity provider issues the tokens.
pub fn issue_hs256(
    secret: &secrecy::SecretString,
    user_id: i64,
    ttl: std::time::Duration,
) -> Result<String, jsonwebtoken::errors::Error> {
    #[derive(serde::Serialize)]
    struct Issued {
        sub: String,
        exp: u64,
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &Issued {
            sub: user_id.to_string(),
            exp: (now + ttl).as_secs(),
        },
        &jsonwebtoken::EncodingKey::from_secret(secret.expose_secret().as_bytes()),
    )
}

/// 401 with `WWW-Authenticate: Bearer` (RFC 6750), saying why.
pub fn unauthorized(e: &AuthError) -> HttpResponse {
    let challenge = match e {
        AuthError::Missing => "Bearer",
        _ => "Bearer error=\"invalid_token\"",
    };
    HttpResponse::Unauthorized()
        .insert_header((WWW_AUTHENTICATE, HeaderValue::from_static(challenge)))
        .json(json!({"status": "UNAUTHORIZED", "reason": e.to_string()}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;
    use std::time::Duration;

    const SECRET: &str = "a-unit-test-secret-of-at-least-32-bytes";

    fn settings(mode: AuthMode) -> AuthSettings {
        AuthSettings {
            mode,
            hs256_secret: Some(SECRET.to_owned().into()),
            public_key_file: None,
            audience: None,
            issuer: None,
            gateway_header: "x-user-id".into(),
            trusted_proxies: vec!["10.0.0.1".parse().unwrap()],
        }
    }

    fn bearer(token: &str) -> HttpRequest {
        TestRequest::default()
            .insert_header(("authorization", format!("Bearer {token}")))
            .to_http_request()
    }

    #[test]
    fn a_valid_token_names_its_subject_and_nothing_else_passes() {
        let auth = Authenticator::new(&settings(AuthMode::Jwt), "0.0.0.0:8080").unwrap();
        let secret: secrecy::SecretString = SECRET.to_owned().into();
        let token = issue_hs256(&secret, 42, Duration::from_secs(60)).unwrap();
        assert_eq!(auth.user(&bearer(&token)).unwrap(), 42);
        assert!(matches!(
            auth.user(&TestRequest::default().to_http_request()),
            Err(AuthError::Missing)
        ));
        let other: secrecy::SecretString =
            "another-secret-of-at-least-32-bytes!!".to_owned().into();
        let forged = issue_hs256(&other, 42, Duration::from_secs(60)).unwrap();
        assert!(matches!(
            auth.user(&bearer(&forged)),
            Err(AuthError::Invalid(_))
        ));
        // The identity header means nothing in this mode.
        let header_only = TestRequest::default()
            .insert_header(("x-user-id", "42"))
            .to_http_request();
        assert!(auth.user(&header_only).is_err());
    }

    #[test]
    fn an_audience_when_configured_must_match() {
        let mut with_aud = settings(AuthMode::Jwt);
        with_aud.audience = Some("seckill".into());
        let auth = Authenticator::new(&with_aud, "127.0.0.1:1").unwrap();
        let secret: secrecy::SecretString = SECRET.to_owned().into();
        // issue_hs256 sets no audience.
        let token = issue_hs256(&secret, 7, Duration::from_secs(60)).unwrap();
        assert!(matches!(
            auth.user(&bearer(&token)),
            Err(AuthError::Invalid(_))
        ));
    }

    #[test]
    fn a_gateway_is_trusted_only_from_its_addresses() {
        let auth = Authenticator::new(&settings(AuthMode::Gateway), "0.0.0.0:8080").unwrap();
        let from = |peer: &str| {
            TestRequest::default()
                .peer_addr(peer.parse().unwrap())
                .insert_header(("x-user-id", "9"))
                .to_http_request()
        };
        assert_eq!(auth.user(&from("10.0.0.1:5000")).unwrap(), 9);
        assert!(matches!(
            auth.user(&from("10.0.0.2:5000")),
            Err(AuthError::UntrustedProxy)
        ));
    }

    #[test]
    fn bad_configurations_are_refused_naming_the_key() {
        let key = |s: &AuthSettings, addr: &str| Authenticator::new(s, addr).err().map(|e| e.key);
        let mut short = settings(AuthMode::Jwt);
        short.hs256_secret = Some("short".to_owned().into());
        assert_eq!(
            key(&short, "127.0.0.1:1"),
            Some("frontstage.auth.hs256_secret")
        );
        let mut none = settings(AuthMode::Jwt);
        none.hs256_secret = None;
        assert_eq!(
            key(&none, "127.0.0.1:1"),
            Some("frontstage.auth.hs256_secret")
        );
        let mut both = settings(AuthMode::Jwt);
        both.public_key_file = Some("/nonexistent.pem".into());
        assert_eq!(
            key(&both, "127.0.0.1:1"),
            Some("frontstage.auth.public_key_file")
        );
        let mut missing_key = none.clone();
        missing_key.public_key_file = Some("/nonexistent.pem".into());
        assert_eq!(
            key(&missing_key, "127.0.0.1:1"),
            Some("frontstage.auth.public_key_file")
        );
        let mut no_proxies = settings(AuthMode::Gateway);
        no_proxies.trusted_proxies.clear();
        assert_eq!(
            key(&no_proxies, "127.0.0.1:1"),
            Some("frontstage.auth.trusted_proxies")
        );
        assert_eq!(
            key(&settings(AuthMode::None), "0.0.0.0:8080"),
            Some("frontstage.auth.mode")
        );
        assert!(Authenticator::new(&settings(AuthMode::None), "127.0.0.1:8080").is_ok());
    }

    #[test]
    fn only_loopback_binds_are_loopback() {
        for addr in ["127.0.0.1:8080", "[::1]:80", "localhost:1", "127.0.0.2:9"] {
            assert!(is_loopback_bind(addr), "{addr}");
        }
        for addr in ["0.0.0.0:8080", "[::]:80", "10.0.0.1:1", "example.com:80"] {
            assert!(!is_loopback_bind(addr), "{addr}");
        }
    }

    #[test]
    fn user_ids_are_positive_decimals() {
        assert_eq!(parse_user("42").ok(), Some(42));
        for bad in ["0", "-1", "abc", "1.5", ""] {
            assert!(parse_user(bad).is_err(), "{bad}");
        }
    }
}
