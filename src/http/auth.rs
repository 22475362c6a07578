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

use super::client::Proxies;

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::HttpRequest;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use secrecy::ExposeSecret;
use serde::Deserialize;

use crate::config::{AuthMode, AuthSettings};

/// Checks a request's identity as configured.
pub struct Authenticator {
    mode: Mode,
}

enum Mode {
    Jwt {
        key: DecodingKey,
        validation: Box<Validation>,
        /// `frontstage.auth.max_lifetime_secs`.
        max_lifetime_secs: u64,
        verified: Verified,
    },
    Gateway {
        header: HeaderName,
        trusted: Proxies,
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
    /// Required (`validation`); seconds since the Unix epoch.
    exp: u64,
    #[serde(default)]
    iat: Option<u64>,
    #[serde(default)]
    nbf: Option<u64>,
}

/// How many verified tokens are remembered: at about 50 bytes each, under 10 MiB.
const VERIFIED_CAPACITY: usize = 200_000;

/// The tokens this front stage has verified. A buyer sends the same JWT with each
/// request (the purchase token, the reservation, the reads); decoding and checking
/// it took about 5 % of the engine's CPU in the demo sale, and an RS256 or ES256
/// signature costs several times an HS256 one. What holds for a token's whole life
/// is remembered: its signature, algorithm, audience, issuer and lifetime were good
/// and it names this user. `exp` and `nbf` are checked again at every use.
///
/// Keyed by a 128-bit SipHash-2-4 of the whole token under a key drawn at start:
/// without the key nobody can make another token that lands on a remembered one.
/// When full, the expired entries go and, if that frees nothing, all of them: each
/// token is then verified once more.
struct Verified {
    hasher: siphasher::sip128::SipHasher24,
    entries: std::sync::Mutex<std::collections::HashMap<u128, Known>>,
}

/// A verified token: its user, and its `exp` and `nbf` (seconds).
#[derive(Clone, Copy)]
struct Known {
    user: i64,
    exp: u64,
    nbf: Option<u64>,
}

impl Verified {
    fn new() -> Self {
        Self {
            hasher: siphasher::sip128::SipHasher24::new_with_keys(rand::random(), rand::random()),
            entries: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u128, Known>> {
        // Plain map inserts and removals: nothing half-written to recover from.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn key(&self, token: &str) -> u128 {
        siphasher::sip128::Hasher128::finish128(&{
            let mut h = self.hasher;
            std::hash::Hasher::write(&mut h, token.as_bytes());
            h
        })
        .as_u128()
    }

    /// The user of a token verified before, if it is still within `exp` and `nbf`
    /// (with `leeway`); otherwise `None`, and the token is verified in full.
    fn user(&self, key: u128, now: u64, leeway: u64) -> Option<i64> {
        let known = *self.entries().get(&key)?;
        let expired = known.exp < now.saturating_sub(leeway);
        let early = known
            .nbf
            .is_some_and(|nbf| nbf > now.saturating_add(leeway));
        (!expired && !early).then_some(known.user)
    }

    fn remember(&self, key: u128, known: Known, now: u64) {
        let mut entries = self.entries();
        if entries.len() >= VERIFIED_CAPACITY {
            entries.retain(|_, k| k.exp >= now);
            if entries.len() >= VERIFIED_CAPACITY {
                entries.clear();
            }
        }
        entries.insert(key, known);
    }

    /// Drops the tokens that have expired.
    fn forget_expired(&self, now: u64) {
        let mut entries = self.entries();
        entries.retain(|_, k| k.exp >= now);
        entries.shrink_to_fit();
    }
}

/// What jsonwebtoken checks of a token: the signature with `algorithm`, `exp` and
/// `nbf` within `frontstage.auth.leeway_secs`, and `aud`/`iss` when configured (and
/// then required: jsonwebtoken passes a token without a configured claim).
fn validation(settings: &AuthSettings, algorithm: Algorithm) -> Validation {
    let mut validation = Validation::new(algorithm);
    validation.leeway = settings.leeway_secs;
    validation.validate_nbf = true;
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
    validation
}

/// A token good for longer than `max_secs`, from its issue (`exp − iat`) or, without
/// `iat`, from now, is refused: a leaked long-lived token must not work for years.
fn check_lifetime(claims: &Claims, max_secs: u64, now: u64) -> Result<(), AuthError> {
    let lifetime = claims.exp.saturating_sub(claims.iat.unwrap_or(now));
    if lifetime > max_secs {
        return Err(AuthError::Invalid(format!(
            "the token is good for {lifetime} s, longer than frontstage.auth.max_lifetime_secs ({max_secs} s)"
        )));
    }
    Ok(())
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Authenticator {
    /// Builds the checker from settings validated at load (`config::frontstage`
    /// holds the rules: key lengths, one key not two, the gateway's addresses, `none`
    /// only on loopback) and found ready (`Settings::frontstage_ready`). What remains
    /// here is construction: reading the key and naming the header.
    pub fn new(settings: &AuthSettings) -> Result<Self, AuthConfigError> {
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
                    (Some(secret), _) => (
                        DecodingKey::from_secret(secret.expose_secret().as_bytes()),
                        Algorithm::HS256,
                    ),
                    (None, Some(path)) => public_key(path)?,
                    (None, None) => {
                        return Err(AuthConfigError {
                            key: "frontstage.auth.hs256_secret",
                            reason: "frontstage.auth.mode = \"jwt\" needs it or frontstage.auth.public_key_file".into(),
                        })
                    }
                };
                Mode::Jwt {
                    key,
                    validation: Box::new(validation(settings, algorithm)),
                    max_lifetime_secs: settings.max_lifetime_secs,
                    verified: Verified::new(),
                }
            }
            AuthMode::Gateway => Mode::Gateway {
                header: header("frontstage.auth.gateway_header")?,
                trusted: Proxies::new(&settings.trusted_proxies),
            },
            AuthMode::None => Mode::Unchecked {
                header: header("frontstage.auth.gateway_header")?,
            },
        };
        Ok(Self { mode })
    }

    /// The user the request speaks for.
    pub fn user(&self, req: &HttpRequest) -> Result<i64, AuthError> {
        match &self.mode {
            Mode::Jwt {
                key,
                validation,
                max_lifetime_secs,
                verified,
            } => {
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
                let now = now_secs();
                let remembered = verified.key(token);
                if let Some(user) = verified.user(remembered, now, validation.leeway) {
                    return Ok(user);
                }
                let data = jsonwebtoken::decode::<Claims>(token, key, validation)
                    .map_err(|e| AuthError::Invalid(e.to_string()))?;
                check_lifetime(&data.claims, *max_lifetime_secs, now)?;
                let user = parse_user(&data.claims.sub)?;
                let known = Known {
                    user,
                    exp: data.claims.exp,
                    nbf: data.claims.nbf,
                };
                verified.remember(remembered, known, now);
                Ok(user)
            }
            Mode::Gateway { header, trusted } => {
                let peer = req.peer_addr().map(|a| a.ip());
                if !peer.is_some_and(|ip| trusted.trusts(&ip)) {
                    return Err(AuthError::UntrustedProxy);
                }
                header_user(req, header)
            }
            Mode::Unchecked { header } => header_user(req, header),
        }
    }
}

impl Authenticator {
    /// Forgets the verified tokens that have expired (the front stage's periodic
    /// shrink).
    pub fn forget_expired(&self) {
        if let Mode::Jwt { verified, .. } = &self.mode {
            verified.forget_expired(now_secs());
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
        iat: u64,
        exp: u64,
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &Issued {
            sub: user_id.to_string(),
            iat: now.as_secs(),
            exp: (now + ttl).as_secs(),
        },
        &jsonwebtoken::EncodingKey::from_secret(secret.expose_secret().as_bytes()),
    )
}

/// The `WWW-Authenticate` challenge of a 401 for `e` (RFC 6750).
pub fn challenge(e: &AuthError) -> HeaderValue {
    HeaderValue::from_static(match e {
        AuthError::Missing => "Bearer",
        _ => "Bearer error=\"invalid_token\"",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;
    use serde_json::json;
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
            trusted_proxies: vec![crate::config::Cidr::try_from("10.0.0.1".to_owned()).unwrap()],
            leeway_secs: 30,
            max_lifetime_secs: 86_400,
        }
    }

    /// A token with exactly these claims, signed with the test secret.
    fn signed(claims: serde_json::Value) -> String {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    }

    fn bearer(token: &str) -> HttpRequest {
        TestRequest::default()
            .insert_header(("authorization", format!("Bearer {token}")))
            .to_http_request()
    }

    #[test]
    fn a_valid_token_names_its_subject_and_nothing_else_passes() {
        let auth = Authenticator::new(&settings(AuthMode::Jwt)).unwrap();
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
        let auth = Authenticator::new(&with_aud).unwrap();
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
        let auth = Authenticator::new(&settings(AuthMode::Gateway)).unwrap();
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
    fn tokens_are_held_to_their_time_audience_and_lifetime() {
        let now = now_secs();
        let auth = Authenticator::new(&settings(AuthMode::Jwt)).unwrap();
        let user = |claims| auth.user(&bearer(&signed(claims)));
        assert_eq!(user(json!({"sub": "5", "exp": now + 60})).unwrap(), 5);
        // Within the 30 s leeway, and beyond it.
        assert!(user(json!({"sub": "5", "exp": now - 10})).is_ok());
        assert!(matches!(
            user(json!({"sub": "5", "exp": now - 31 - 5})),
            Err(AuthError::Invalid(_))
        ));
        // Not valid until tomorrow.
        assert!(matches!(
            user(json!({"sub": "5", "exp": now + 3 * 86_400, "nbf": now + 86_400})),
            Err(AuthError::Invalid(_))
        ));
        // Good for 2 days (from iat, or from now without it): over the 1-day cap;
        // expiring in 2286: over it too.
        for claims in [
            json!({"sub": "5", "iat": now, "exp": now + 2 * 86_400}),
            json!({"sub": "5", "exp": now + 2 * 86_400}),
            json!({"sub": "5", "exp": 9_999_999_999u64}),
        ] {
            let refused = user(claims.clone());
            assert!(
                matches!(&refused, Err(AuthError::Invalid(why)) if why.contains("max_lifetime_secs")),
                "{claims}: {refused:?}"
            );
        }
        // An audience or issuer, once configured, is required and must match.
        let mut strict = settings(AuthMode::Jwt);
        strict.audience = Some("seckill".into());
        strict.issuer = Some("https://login.example.com".into());
        let auth = Authenticator::new(&strict).unwrap();
        let user = |claims| auth.user(&bearer(&signed(claims)));
        let good = json!({"sub": "5", "exp": now + 60, "aud": "seckill", "iss": "https://login.example.com"});
        assert_eq!(user(good.clone()).unwrap(), 5);
        for (claim, value) in [
            ("aud", json!("other")),
            ("iss", json!("https://evil.example")),
        ] {
            let mut bad = good.clone();
            bad[claim] = value;
            assert!(matches!(user(bad), Err(AuthError::Invalid(_))), "{claim}");
            let mut missing = good.clone();
            missing.as_object_mut().unwrap().remove(claim);
            assert!(
                matches!(user(missing), Err(AuthError::Invalid(_))),
                "{claim}"
            );
        }
    }

    /// A verified token is answered from memory, but still held to its `exp` and
    /// `nbf` at every use; a token that differs in any byte is verified anew.
    #[test]
    fn a_remembered_token_is_still_held_to_its_time() {
        let now = now_secs();
        let auth = Authenticator::new(&settings(AuthMode::Jwt)).unwrap();
        let Mode::Jwt { verified, .. } = &auth.mode else {
            unreachable!()
        };
        let token = signed(json!({"sub": "5", "exp": now + 60}));
        assert_eq!(auth.user(&bearer(&token)).unwrap(), 5);
        let key = verified.key(&token);
        assert_eq!(verified.user(key, now, 30), Some(5));
        assert_eq!(verified.entries().len(), 1);
        // Past `exp` beyond the leeway, or before `nbf`: not from memory.
        assert_eq!(verified.user(key, now + 60 + 31, 30), None);
        assert_eq!(verified.user(key, now + 60 + 29, 30), Some(5));
        let early = Known {
            user: 6,
            exp: now + 600,
            nbf: Some(now + 100),
        };
        verified.remember(1, early, now);
        assert_eq!(verified.user(1, now, 30), None);
        assert_eq!(verified.user(1, now + 71, 30), Some(6));
        // Another signature on the same claims: refused, not taken from memory.
        let at = token.len() - 10;
        let was = &token[at..=at];
        let forged = format!(
            "{}{}{}",
            &token[..at],
            if was == "A" { "B" } else { "A" },
            &token[at + 1..]
        );
        assert!(matches!(
            auth.user(&bearer(&forged)),
            Err(AuthError::Invalid(_))
        ));
        // The periodic shrink forgets what expired, and only that.
        let gone = Known {
            user: 7,
            exp: now - 1,
            nbf: None,
        };
        verified.remember(2, gone, now);
        auth.forget_expired();
        assert_eq!(verified.user(2, now - 5, 30), None);
        assert_eq!(verified.user(key, now, 30), Some(5));
    }

    /// Full, the memory drops what expired and, when that frees nothing, everything.
    #[test]
    fn the_memory_of_verified_tokens_is_bounded() {
        let now = now_secs();
        let verified = Verified::new();
        let live = |user| Known {
            user,
            exp: now + 60,
            nbf: None,
        };
        for n in 0..VERIFIED_CAPACITY as u128 {
            verified.remember(n, live(1), now);
        }
        assert_eq!(verified.entries().len(), VERIFIED_CAPACITY);
        verified.remember(u128::MAX, live(2), now);
        assert_eq!(verified.entries().len(), 1);
        assert_eq!(verified.user(u128::MAX, now, 0), Some(2));
    }

    #[test]
    fn user_ids_are_positive_decimals() {
        assert_eq!(parse_user("42").ok(), Some(42));
        for bad in ["0", "-1", "abc", "1.5", ""] {
            assert!(parse_user(bad).is_err(), "{bad}");
        }
    }
}
