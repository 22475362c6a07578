//! Role names of a deployment's database (docs/OPERATIONS.md, "Roles"): the prefix
//! of its group roles, `{prefix}_runtime` and `{prefix}_readonly`, by default derived
//! from the database's name so that two databases on one cluster never share one.
//! `store::grants` grants to them; `config` checks `database.role_prefix`.

/// The longest prefix: role names are at most 63 bytes, and `_readonly` follows.
pub const MAX_ROLE_PREFIX_LEN: usize = 40;

/// The default prefix for a database: its name in lower case, every character
/// outside `a-z 0-9 _` as `_`, starting with a letter, at most 40 characters. Two
/// names equal in their first 40 characters share roles: set `database.role_prefix`.
pub fn role_prefix_for(database: &str) -> String {
    let mut prefix: String = database
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    if !prefix.starts_with(|c: char| c.is_ascii_lowercase()) {
        prefix.insert(0, 'd');
    }
    prefix.truncate(MAX_ROLE_PREFIX_LEN);
    prefix
}

/// Whether `prefix` can be a role prefix (what `role_prefix_for` gives, or set by
/// hand): a letter, then letters, digits or `_`, at most 40.
pub fn is_role_prefix(prefix: &str) -> bool {
    prefix.len() <= MAX_ROLE_PREFIX_LEN
        && prefix.starts_with(|c: char| c.is_ascii_lowercase())
        && prefix
            .chars()
            .all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_name_gives_a_role_prefix() {
        assert_eq!(role_prefix_for("seckill"), "seckill");
        assert_eq!(role_prefix_for("Shop-EU.prod"), "shop_eu_prod");
        assert_eq!(role_prefix_for("2026sale"), "d2026sale");
        let long = role_prefix_for(&"x".repeat(63));
        assert_eq!(long.len(), MAX_ROLE_PREFIX_LEN);
        for name in ["seckill", "Shop-EU.prod", "2026sale", "ä", ""] {
            assert!(is_role_prefix(&role_prefix_for(name)), "{name}");
        }
        assert!(!is_role_prefix("Bad"));
        assert!(!is_role_prefix("a\"; DROP"));
    }
}
