//! How a configuration rule reports: `ConfigError`, which names the key and where its
//! value came from (`origin`), and `Check`, the context every section's `validate`
//! is given, so that every rule words its error the same way. Also the row type of
//! the table of numeric bounds (`Bound`), and the check that applies it.

use figment::{Figment, Metadata};
use secrecy::{ExposeSecret, SecretString};

use crate::tls::TlsError;

/// Prefix of environment overrides; `__` separates the path segments.
pub const ENV_PREFIX: &str = "SECKILL__";

/// The origin of a key no source sets.
const MISSING: &str = "no source (missing)";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source could not be read at all (e.g. a missing or unparsable file).
    #[error("configuration: {0}")]
    Load(String),
    #[error("configuration key `{key}` (from {origin}): {reason}")]
    Invalid {
        key: String,
        origin: String,
        reason: String,
    },
}

/// Describes where the value of `key` came from, e.g. "environment variable
/// SECKILL__DATABASE__URL" or "TOML file /etc/seckill.toml".
/// The keys whose values are secrets (`SecretString`s: URLs with passwords, tokens,
/// keys): an error names them and never shows their value.
pub const SECRET_KEYS: &[&str] = &[
    "database.url",
    "database.replica_url",
    "database.owner_url",
    "amqp.url",
    "amqp.urls",
    "amqp.order_signing_secret",
    "redis.url",
    "redis.sentinels",
    "admin.token",
    "admin.metrics_token",
    "frontstage.amqp_url",
    "frontstage.amqp_urls",
    "frontstage.auth.hs256_secret",
    "frontstage.purchase_token.secret",
];

pub fn origin(figment: &Figment, key: &str) -> String {
    match figment.find_metadata(key) {
        Some(meta) => describe(meta, key),
        None => MISSING.to_owned(),
    }
}

fn describe(meta: &Metadata, key: &str) -> String {
    if meta.name.contains("environment") {
        return format!(
            "environment variable {ENV_PREFIX}{}",
            key.replace('.', "__").to_ascii_uppercase()
        );
    }
    match &meta.source {
        Some(source) => format!("{} {source}", meta.name),
        None => meta.name.to_string(),
    }
}

/// What a rule is checked against: the sources, to say where a bad value came from.
pub struct Check<'a> {
    figment: &'a Figment,
}

impl<'a> Check<'a> {
    pub fn new(figment: &'a Figment) -> Self {
        Check { figment }
    }

    /// `key`'s value breaks a rule; `reason` says which, never quoting a secret.
    pub fn invalid(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: key.to_owned(),
            origin: origin(self.figment, key),
            reason: reason.into(),
        }
    }

    /// A key no source sets, found missing after loading (no sources at hand then:
    /// a missing key has none anyway).
    pub fn missing(key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: key.to_owned(),
            origin: MISSING.to_owned(),
            reason: reason.into(),
        }
    }

    /// A TLS file setting that cannot be used (`tls`), under the key it names.
    pub fn tls(&self, e: TlsError) -> ConfigError {
        self.invalid(&e.key, e.reason)
    }

    /// Figment's own error (type mismatch, unknown or missing key), naming the key
    /// and its source the same way.
    pub fn extraction(&self, e: figment::Error) -> ConfigError {
        let key = e.path.join(".");
        if key.is_empty() {
            return ConfigError::Load(e.to_string());
        }
        let origin = match &e.metadata {
            Some(meta) => describe(meta, &key),
            None => origin(self.figment, &key),
        };
        // Figment's message quotes the value ("found unsigned int `4839…`"): never
        // for a key that holds a secret, whatever type the value was read as.
        let reason = match (&e.kind, SECRET_KEYS.contains(&key.as_str())) {
            (_, false) => e.kind.to_string(),
            (figment::error::Kind::InvalidType(_, expected), true) => {
                format!("invalid type, expected {expected} (the value is not shown)")
            }
            (_, true) => "invalid value (the value is not shown)".to_owned(),
        };
        ConfigError::Invalid {
            key,
            origin,
            reason,
        }
    }

    /// A name that becomes part of queue or key names.
    pub fn name(&self, key: &str, value: &str) -> Result<(), ConfigError> {
        let ok = !value.is_empty()
            && value.len() <= 64
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok {
            return Err(self.invalid(
                key,
                "must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.'",
            ));
        }
        Ok(())
    }

    /// A secret, when set, of at least `min` `unit`s: a short one can be guessed.
    pub fn secret_len(
        &self,
        key: &str,
        secret: Option<&SecretString>,
        min: usize,
        unit: &str,
    ) -> Result<(), ConfigError> {
        if secret.is_some_and(|s| s.expose_secret().len() < min) {
            return Err(self.invalid(
                key,
                format!("must be at least {min} {unit} (the value is not shown)"),
            ));
        }
        Ok(())
    }

    /// Applies a table of numeric bounds to `settings`, in order: the first value
    /// out of its bounds is the error.
    pub fn bounds<S>(&self, table: &[Bound<S>], settings: &S) -> Result<(), ConfigError> {
        for bound in table {
            if let Some(reason) = bound.broken_by(settings) {
                return Err(self.invalid(bound.key, reason));
            }
        }
        Ok(())
    }
}

/// One row of a table of numeric bounds: `key`'s value must lie in `min..=max`.
pub struct Bound<S> {
    key: &'static str,
    value: Value<S>,
    min: u64,
    /// Another key whose value is a minimum too (a cap never below its base).
    floor: Option<(&'static str, Reader<S>)>,
    max: u64,
    /// Why, when the numbers alone do not say; shown after them.
    why: &'static str,
}

/// Reads one value of the settings.
type Reader<S> = fn(&S) -> u64;

enum Value<S> {
    Set(Reader<S>),
    /// An optional key: nothing to check while it is unset.
    Optional(fn(&S) -> Option<u64>),
}

/// The bound of a key that has no upper one (its type's range).
const UNBOUNDED: u64 = u64::MAX;

impl<S> Bound<S> {
    pub const fn new(key: &'static str, value: Reader<S>, min: u64, max: u64) -> Self {
        Bound {
            key,
            value: Value::Set(value),
            min,
            floor: None,
            max,
            why: "",
        }
    }

    /// At least `min`, with no upper bound but the type's.
    pub const fn at_least(key: &'static str, value: Reader<S>, min: u64) -> Self {
        Bound::new(key, value, min, UNBOUNDED)
    }

    /// An optional key, checked when set.
    pub const fn optional(
        key: &'static str,
        value: fn(&S) -> Option<u64>,
        min: u64,
        max: u64,
    ) -> Self {
        Bound {
            key,
            value: Value::Optional(value),
            min,
            floor: None,
            max,
            why: "",
        }
    }

    /// Not below `other`'s value either.
    pub const fn not_below(self, other: &'static str, value: Reader<S>) -> Self {
        Bound {
            floor: Some((other, value)),
            ..self
        }
    }

    pub const fn why(self, why: &'static str) -> Self {
        Bound { why, ..self }
    }

    /// Why `settings` break this bound, if they do.
    fn broken_by(&self, settings: &S) -> Option<String> {
        let value = match self.value {
            Value::Set(value) => value(settings),
            Value::Optional(value) => value(settings)?,
        };
        let (min, other) = match self.floor {
            None => (self.min, None),
            Some((key, floor)) => (self.min.max(floor(settings)), Some(key)),
        };
        if (min..=self.max).contains(&value) {
            return None;
        }
        let mut reason = match self.max {
            UNBOUNDED => format!("must be at least {min}"),
            max => format!("must be between {min} and {max}"),
        };
        let why = match other {
            Some(key) => format!("not below {key}"),
            None => self.why.to_owned(),
        };
        if !why.is_empty() {
            reason.push_str(&format!(" ({why})"));
        }
        Some(reason)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.

    /// What `Settings::load` says with `var=value` in the environment (tests): it must
    /// refuse, naming `key` and the variable it came from. The text is returned for what
    /// a test checks besides.
    pub(crate) fn refusal(var: &str, value: &str, key: &str) -> String {
        let mut said = String::new();
        figment::Jail::expect_with(|jail| {
            jail.set_env(var, value);
            said = crate::config::Settings::load(None)
                .expect_err(var)
                .to_string();
            Ok(())
        });
        assert!(said.contains(&format!("`{key}`")), "{said}");
        assert!(said.contains(var), "{said}");
        said
    }

    use super::*;

    struct Pair {
        base: u64,
        cap: u64,
        id: Option<u64>,
    }

    type B = Bound<Pair>;

    const TABLE: &[B] = &[
        B::new("pair.base", |p| p.base, 1, 100).why("a reason"),
        B::new("pair.cap", |p| p.cap, 1, 1_000).not_below("pair.base", |p| p.base),
        B::optional("pair.id", |p| p.id, 0, 7),
    ];

    fn reason(pair: Pair) -> Option<String> {
        let figment = Figment::new();
        match Check::new(&figment).bounds(TABLE, &pair) {
            Ok(()) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    #[test]
    fn a_table_names_the_first_key_out_of_bounds_with_its_bounds_and_reason() {
        let ok = || Pair {
            base: 10,
            cap: 20,
            id: None,
        };
        assert_eq!(reason(ok()), None);
        let e = reason(Pair { base: 0, ..ok() }).unwrap_or_default();
        assert!(e.contains("`pair.base`"), "{e}");
        assert!(e.contains("must be between 1 and 100 (a reason)"), "{e}");
        assert!(e.contains(MISSING), "{e}");
        let e = reason(Pair { cap: 5, ..ok() }).unwrap_or_default();
        assert!(
            e.contains("must be between 10 and 1000 (not below pair.base)"),
            "{e}"
        );
        let e = reason(Pair {
            id: Some(8),
            ..ok()
        })
        .unwrap_or_default();
        assert!(e.contains("`pair.id`"), "{e}");
    }

    #[test]
    fn a_short_secret_is_refused_without_its_value() {
        let figment = Figment::new();
        let secret = SecretString::from("short-secret".to_owned());
        let e = Check::new(&figment)
            .secret_len("x.secret", Some(&secret), 32, "bytes")
            .map_err(|e| e.to_string())
            .unwrap_err();
        assert!(
            e.contains("`x.secret`") && !e.contains("short-secret"),
            "{e}"
        );
    }
}
