//! `[server]`: what a `serve` process runs (`roles`; `serve --role` overrides it).
//! A fleet runs the stateless front stage and the shard-bound engine as separate
//! processes from one configuration, each scaled on its own (docs/DESIGN.md,
//! "Roles of a process").

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use super::check::{Check, ConfigError};

/// One part of the service a process can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The front stage and the engine.
    All,
    /// The buyers' HTTP front stage and the reconciler of its Redis reservations;
    /// no order intake.
    Front,
    /// The order and payment intakes, the pipeline and the background services
    /// (outbox, sweeper, compensation, retention); no buyer-facing port.
    Engine,
    /// Only what every role has: the admin listener (probes, metrics, the
    /// operator API).
    Admin,
}

impl Role {
    pub const NAMES: &'static str = "all, front, engine, admin";

    pub fn name(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Front => "front",
            Role::Engine => "engine",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(Role::All),
            "front" => Ok(Role::Front),
            "engine" => Ok(Role::Engine),
            "admin" => Ok(Role::Admin),
            other => Err(format!("`{other}` is not a role (one of {})", Role::NAMES)),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// What this process runs; every role keeps the admin listener. A list, or one
    /// name (`SECKILL__SERVER__ROLES=engine`).
    #[serde(deserialize_with = "one_or_many")]
    pub roles: Vec<Role>,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Role>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Role),
        Many(Vec<Role>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(role) => vec![role],
        OneOrMany::Many(roles) => roles,
    })
}

impl ServerSettings {
    pub(super) fn validate(&self, ctx: &Check) -> Result<(), ConfigError> {
        if self.roles.is_empty() {
            return Err(ctx.invalid(
                "server.roles",
                format!("name at least one role ({})", Role::NAMES),
            ));
        }
        Ok(())
    }

    /// Whether the buyers' front stage runs here.
    pub fn front(&self) -> bool {
        self.roles
            .iter()
            .any(|r| matches!(r, Role::All | Role::Front))
    }

    /// Whether the order intakes and background services run here.
    pub fn engine(&self) -> bool {
        self.roles
            .iter()
            .any(|r| matches!(r, Role::All | Role::Engine))
    }

    /// The roles as people read them (`/readyz`, the node lease): `all`, `front`,
    /// `engine`, `front+engine`, `admin`.
    pub fn label(&self) -> String {
        match (self.front(), self.engine()) {
            (true, true) => "all".to_owned(),
            (true, false) => "front".to_owned(),
            (false, true) => "engine".to_owned(),
            (false, false) => "admin".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(roles: &[Role]) -> ServerSettings {
        ServerSettings {
            roles: roles.to_vec(),
        }
    }

    #[test]
    fn roles_name_the_parts_a_process_runs() {
        assert_eq!(of(&[Role::All]).label(), "all");
        assert!(of(&[Role::All]).front() && of(&[Role::All]).engine());
        assert_eq!(of(&[Role::Front]).label(), "front");
        assert!(!of(&[Role::Front]).engine());
        assert_eq!(of(&[Role::Engine]).label(), "engine");
        assert!(!of(&[Role::Engine]).front());
        assert_eq!(of(&[Role::Front, Role::Engine]).label(), "all");
        assert_eq!(of(&[Role::Admin]).label(), "admin");
        assert!(!of(&[Role::Admin]).front() && !of(&[Role::Admin]).engine());
        assert_eq!("front".parse::<Role>(), Ok(Role::Front));
        assert!("frontend"
            .parse::<Role>()
            .unwrap_err()
            .contains("one of all, front, engine, admin"));
    }
}
