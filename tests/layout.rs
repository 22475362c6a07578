//! The shape of the codebase, checked (docs/DESIGN.md, "Code layout"):
//! - no two modules of the engine import each other, and no cycle runs through
//!   several (file granularity: `store::orders::set_based` is one module);
//! - `http`, `telemetry`, `services`, `status`, `drift`, `startup` and `cli` never
//!   import a pipeline actor (only `engine.rs` does, outside `actors/`);
//! - SQL is written only under `store/`, Redis commands only under `redis/`;
//! - every metric of the catalogue is recorded somewhere, and documented;
//! - every configuration key is documented; the README stays short; no journal
//!   labels and no links outside the repository.
//!
//! Pure file reading: no services needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under src/: `store/orders/mod.rs` → `store::orders`.
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root().join("src")).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The code of a file without comments, string contents and its test module.
fn code_of(text: &str) -> String {
    let tests = [
        "#[cfg(test)]\nmod tests",
        "#[cfg(test)]\npub(crate) mod tests",
    ];
    let text = match tests.iter().filter_map(|t| text.find(t)).min() {
        Some(at) => &text[..at],
        None => text,
    };
    let mut out = String::new();
    for line in text.lines() {
        let line = match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every path written in `code` as `a::b::c` (brace groups of `use` expanded one
/// level deep is enough here: the first segments decide the module).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts = (c.is_ascii_alphabetic() || c == '_')
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == '_'));
        if !starts {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == '_') {
                j += 1;
            }
            segs.push(bytes[s..j].iter().collect::<String>());
            if j + 2 < bytes.len()
                && bytes[j] == ':'
                && bytes[j + 1] == ':'
                && (bytes[j + 2].is_ascii_alphabetic() || bytes[j + 2] == '_')
            {
                j += 2;
            } else if j + 2 < bytes.len()
                && bytes[j] == ':'
                && bytes[j + 1] == ':'
                && bytes[j + 2] == '{'
            {
                // `prefix::{a, b::c}`: each item after the prefix.
                let close = bytes[j..].iter().position(|&c| c == '}').map(|p| p + j);
                if let Some(close) = close {
                    let inner: String = bytes[j + 3..close].iter().collect();
                    for item in inner.split(',') {
                        let item = item.trim();
                        if item.is_empty() {
                            continue;
                        }
                        let mut p = segs.clone();
                        p.extend(item.split("::").map(|s| s.trim().to_owned()));
                        out.push(p);
                    }
                    j = close;
                }
                segs.clear();
                break;
            } else {
                break;
            }
        }
        if segs.len() > 1 {
            out.push(segs);
        }
        i = j.max(i + 1);
    }
    out
}

struct Crate {
    /// module path → its file's code
    modules: BTreeMap<Vec<String>, String>,
}

impl Crate {
    fn load() -> Crate {
        let mut files = Vec::new();
        rust_files(&root().join("src"), &mut files);
        let modules = files
            .iter()
            .filter(|f| !f.ends_with("main.rs"))
            .map(|f| (module_of(f), code_of(&std::fs::read_to_string(f).unwrap())))
            .collect();
        Crate { modules }
    }

    /// The longest known module that `path` (absolute) starts with.
    fn resolve(&self, path: &[String]) -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.modules.contains_key(p))
    }

    /// Module → the modules its code refers to (not itself).
    fn edges(&self) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
        let mut edges = BTreeMap::new();
        for (module, code) in &self.modules {
            let mut to = BTreeSet::new();
            for p in paths(code) {
                let absolute: Vec<String> = match p[0].as_str() {
                    "crate" => p[1..].to_vec(),
                    "super" => {
                        let mut base = module.clone();
                        let mut rest = &p[..];
                        while rest.first().is_some_and(|s| s == "super") {
                            base.pop();
                            rest = &rest[1..];
                        }
                        base.extend(rest.iter().cloned());
                        base
                    }
                    "self" => {
                        let mut base = module.clone();
                        base.extend(p[1..].iter().cloned());
                        base
                    }
                    // A child module named by its bare name.
                    first => {
                        let mut child = module.clone();
                        child.push(first.to_owned());
                        if !self.modules.contains_key(&child) {
                            continue;
                        }
                        let mut base = module.clone();
                        base.extend(p.iter().cloned());
                        base
                    }
                };
                if let Some(target) = self.resolve(&absolute) {
                    // A child naming its parent's items is an import too (the
                    // parent declaring the child is not).
                    if &target != module && !target.is_empty() {
                        to.insert(target);
                    }
                }
            }
            edges.insert(module.clone(), to);
        }
        edges
    }
}

fn name(m: &[String]) -> String {
    m.join("::")
}

#[test]
fn no_module_imports_a_module_that_imports_it() {
    let krate = Crate::load();
    assert!(krate.modules.len() > 40, "{} modules", krate.modules.len());
    let edges = krate.edges();
    // The parser sees what it should: a few known imports.
    let sees = |from: &str, to: &str| {
        edges
            .iter()
            .any(|(f, t)| name(f) == from && t.iter().any(|t| name(t) == to))
    };
    assert!(sees("actors::bucket", "store::orders"));
    assert!(sees("store::orders", "store::orders::set_based"));
    let mut pairs = Vec::new();
    for (from, tos) in &edges {
        for to in tos {
            if edges.get(to).is_some_and(|back| back.contains(from)) && from < to {
                pairs.push(format!("{} <-> {}", name(from), name(to)));
            }
        }
    }
    assert!(pairs.is_empty(), "modules importing each other: {pairs:#?}");

    // No longer cycle either (depth-first search over the same graph).
    fn visit(
        m: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        state.insert(m.clone(), 1);
        stack.push(m.clone());
        for to in edges.get(m).into_iter().flatten() {
            match state.get(to) {
                Some(1) => {
                    let at = stack.iter().position(|s| s == to).unwrap_or(0);
                    return Some(stack[at..].iter().map(|s| name(s)).collect());
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(to, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(m.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in edges.keys() {
        if !state.contains_key(m) {
            let cycle = visit(m, &edges, &mut state, &mut Vec::new());
            assert!(cycle.is_none(), "import cycle: {cycle:?}");
        }
    }
}

#[test]
fn readers_of_status_never_import_the_pipeline_actors() {
    let krate = Crate::load();
    let edges = krate.edges();
    let mut bad = Vec::new();
    for (from, tos) in &edges {
        let Some(top) = from.first().map(String::as_str) else {
            continue; // the crate root (lib.rs) declares everything
        };
        if ![
            "http",
            "telemetry",
            "services",
            "status",
            "domain",
            "store",
            "mq",
            "redis",
            "drift",
            "startup",
            "cli",
        ]
        .contains(&top)
        {
            continue;
        }
        for to in tos {
            if to[0] == "actors" {
                bad.push(format!("{} -> {}", name(from), name(to)));
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    // domain is pure: it imports nothing of the engine but itself.
    for (from, tos) in &edges {
        if from.first().is_some_and(|m| m == "domain") {
            for to in tos {
                assert_eq!(to[0], "domain", "{} -> {}", name(from), name(to));
            }
        }
    }
}

/// String literals of a file's code (test module excluded).
fn literals(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(end) = end else { break };
        out.push(after[..end].to_owned());
        rest = &after[end + 1..];
    }
    out
}

#[test]
fn sql_lives_in_store_and_redis_commands_in_redis() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let sql = [
        "SELECT ",
        "INSERT INTO",
        "DELETE FROM",
        "UPDATE ",
        "CREATE TABLE",
        "ALTER ",
        "DROP ",
        "VACUUM",
        "TRUNCATE",
    ];
    let mut found_sql = 0;
    let mut outside = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let in_store = rel.starts_with("src/store/");
        for lit in literals(&code) {
            let upper = lit.trim_start();
            let is_sql = sql.iter().any(|k| {
                upper.starts_with(k)
                    || lit.contains(&format!("\n{k}"))
                    || lit.contains(&format!("\n{}", k.trim()))
            }) && (lit.contains(" FROM ")
                || lit.contains("\nFROM ")
                || lit.contains(" SET ")
                || lit.contains("\nSET ")
                || lit.contains("INTO ")
                || upper.starts_with("SELECT")
                || upper.starts_with("VACUUM"));
            if is_sql {
                if in_store {
                    found_sql += 1;
                } else {
                    outside.push(format!(
                        "{rel}: {}",
                        lit.trim().lines().next().unwrap_or("")
                    ));
                }
            }
        }
        if !rel.starts_with("src/redis/") {
            for call in [
                "redis::cmd(",
                "redis::pipe(",
                "redis::Script::new(",
                "redis::Cmd::",
            ] {
                if code.contains(call) {
                    outside.push(format!("{rel}: Redis command ({call})"));
                }
            }
        }
    }
    assert!(
        found_sql > 40,
        "the SQL scan found only {found_sql} statements in store/"
    );
    assert!(outside.is_empty(), "outside their layer: {outside:#?}");
}

/// The Redis ACL user that `scripts/services up --roles` makes may run every
/// command src/redis sends, itself or from its Lua scripts: a missing one fails
/// only under that user (a `redis rebuild` once did, NOPERM on ZCARD).
#[test]
fn the_redis_acl_user_may_run_every_command_the_code_sends() {
    let roles = std::fs::read_to_string(root().join("scripts/lib/roles.sh")).unwrap();
    let list = roles
        .split("REDIS_ACL_COMMANDS=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("REDIS_ACL_COMMANDS in scripts/lib/roles.sh");
    let allowed: BTreeSet<String> = list
        .split_whitespace()
        .filter_map(|c| c.strip_prefix('+'))
        .map(|c| c.split('|').next().unwrap_or(c).to_lowercase())
        .collect();
    let mut files = Vec::new();
    rust_files(&root().join("src/redis"), &mut files);
    let mut sent = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (open, close) in [("redis.call('", '\''), ("cmd(\"", '"')] {
            for piece in text.split(open).skip(1) {
                if let Some(name) = piece.split(close).next() {
                    sent.insert(name.to_lowercase());
                }
            }
        }
    }
    assert!(sent.len() >= 15, "found only {sent:?}");
    let missing: Vec<&String> = sent.difference(&allowed).collect();
    assert!(
        missing.is_empty(),
        "commands src/redis sends that the ACL user of scripts/lib/roles.sh may not: {missing:?}"
    );
}

#[test]
fn every_cataloged_metric_is_recorded_and_documented() {
    let names = std::fs::read_to_string(root().join("src/telemetry/names.rs")).unwrap();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let code: String = files
        .iter()
        .filter(|f| !f.ends_with("telemetry/names.rs"))
        .map(|f| code_of(&std::fs::read_to_string(f).unwrap()))
        .collect();
    let ops = std::fs::read_to_string(root().join("docs/OPERATIONS.md")).unwrap();
    let mut consts = 0;
    for line in names.lines() {
        let Some(rest) = line.strip_prefix("pub const ") else {
            continue;
        };
        let Some((ident, value)) = rest.split_once(": &str = \"") else {
            continue;
        };
        consts += 1;
        let metric = value.trim_end_matches("\";");
        assert!(
            code.contains(&format!("names::{ident}")),
            "{metric} ({ident}) is in the catalogue but never recorded"
        );
        assert!(
            ops.contains(&format!("`{metric}`")),
            "{metric} is not in docs/OPERATIONS.md"
        );
    }
    assert!(consts > 40, "read {consts} metric constants");
    assert!(
        !code.contains("\"seckill_"),
        "a metric name is spelled out instead of taken from telemetry::names"
    );
}

#[test]
fn every_configuration_key_is_documented() {
    let defaults = std::fs::read_to_string(root().join("config/default.toml")).unwrap();
    let ops = std::fs::read_to_string(root().join("docs/OPERATIONS.md")).unwrap();
    let mut section = String::new();
    let mut keys = Vec::new();
    for line in defaults.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_owned();
        } else if let Some((key, _)) = line.split_once('=') {
            keys.push(format!("{section}.{}", key.trim()));
        }
    }
    assert!(keys.len() > 40, "read {} keys", keys.len());
    let missing: Vec<_> = keys
        .iter()
        .filter(|k| !ops.contains(&format!("`{k}`")))
        .collect();
    assert!(missing.is_empty(), "undocumented keys: {missing:?}");
}

/// Files a newcomer reads, and the code.
fn prose_and_code() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    for dir in [
        "docs", "src", "tests", "scripts", "crates", "bench", "config", "deploy", ".ci",
    ] {
        let mut stack = vec![root().join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    if !p.ends_with("target") {
                        stack.push(p);
                    }
                } else {
                    files.push(p);
                }
            }
        }
    }
    files
}

#[test]
fn docs_are_short_self_contained_and_free_of_journal_labels() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 150,
        "README.md has {} lines",
        readme.lines().count()
    );
    let mut labels = Vec::new();
    let mut outside = Vec::new();
    for file in prose_and_code() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let rel = file
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel == "tests/layout.rs" {
            continue;
        }
        // The word followed by a number, also across a line break (wrapped prose).
        let words: Vec<&str> = text.split_whitespace().collect();
        for w in words.windows(2) {
            let first = w[0]
                .trim_start_matches(|c: char| !c.is_alphanumeric())
                .to_ascii_lowercase();
            if (first == "session" || first == "sessions")
                && w[1].chars().next().is_some_and(|c| c.is_ascii_digit())
            {
                labels.push(format!("{rel}: {} {}", w[0], w[1]));
            }
        }
        if rel.ends_with(".md") && (text.contains("../shared") || text.contains("](../")) {
            outside.push(rel.clone());
        }
    }
    assert!(labels.is_empty(), "journal labels: {labels:#?}");
    assert!(
        outside.is_empty(),
        "links outside the repository: {outside:?}"
    );
}

/// One TLS stack and one crypto provider (docs/DESIGN.md, "Transport security"):
/// rustls on aws-lc-rs, never a second provider or another TLS library beside it.
#[test]
fn one_tls_stack_and_one_crypto_provider() {
    // What is built, on any target, tools and tests included (the lock file also
    // lists optional dependencies no build enables).
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(root())
        .args([
            "tree",
            "--workspace",
            "--all-features",
            "--target",
            "all",
            "--edges",
            "normal,build,dev",
        ])
        .args(["--prefix", "none", "--format", "{p}", "--offline"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}(every target's crates must be in the local registry: `cargo fetch --locked`, which scripts/test runs first)",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).unwrap();
    let packages: BTreeSet<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    for present in ["rustls", "aws-lc-rs"] {
        assert!(packages.contains(present), "{present} is not built");
    }
    let others: Vec<_> = [
        "ring",
        "openssl",
        "openssl-sys",
        "native-tls",
        "boring",
        "aws-lc-fips-sys",
    ]
    .into_iter()
    .filter(|p| packages.contains(p))
    .collect();
    assert!(
        others.is_empty(),
        "a second TLS stack or crypto provider: {others:?}"
    );
}

/// An advisory is ignored only with a reason and a date it expires, and not past it.
/// The features Cargo resolves for each crate of the engine's tree, with `also`
/// built beside it (`cargo tree`, offline).
fn engine_features(also: &[&str]) -> BTreeSet<String> {
    let mut cmd = std::process::Command::new(env!("CARGO"));
    cmd.current_dir(root())
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["-f", "{p} [{f}]", "-p", "seckill-engine"]);
    for p in also {
        cmd.args(["-p", p]);
    }
    let out = cmd.output().expect("cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches(" (*)").to_owned())
        .collect()
}

/// One build, one binary (issue 51): building the bench beside the engine (as the
/// fail-over drill does) must not change the features of any crate the engine is
/// made of, or Cargo builds a second engine and the next `cargo build` or `cargo
/// run` a third. The fault suite's `chaos` feature is the one intended difference
/// (its own target directory).
#[test]
fn building_the_bench_beside_the_engine_changes_no_feature_of_it() {
    let alone = engine_features(&[]);
    let packages = |set: &BTreeSet<String>| -> BTreeSet<String> {
        set.iter()
            .filter_map(|l| l.split(" [").next().map(str::to_owned))
            .collect()
    };
    let engine_packages = packages(&alone);
    assert!(engine_packages.len() > 100, "{engine_packages:?}");
    let beside: BTreeSet<String> = engine_features(&["seckill-bench"])
        .into_iter()
        .filter(|l| {
            l.split(" [")
                .next()
                .is_some_and(|p| engine_packages.contains(p))
        })
        .collect();
    let changed: Vec<_> = beside.symmetric_difference(&alone).collect();
    assert!(
        changed.is_empty(),
        "the bench changes the features of crates the engine uses (declare them in \
         the engine's Cargo.toml too): {changed:#?}"
    );
}

#[test]
fn every_ignored_advisory_has_a_reason_and_has_not_expired() {
    let deny = std::fs::read_to_string(root().join("deny.toml")).unwrap();
    let today = chrono::Utc::now().date_naive();
    let mut ignores = 0;
    for line in deny
        .lines()
        .filter(|l| l.trim_start().starts_with("{ id = "))
    {
        ignores += 1;
        assert!(line.contains("reason = "), "no reason: {line}");
        let expires = line
            .split("Expires ")
            .nth(1)
            .and_then(|rest| rest.get(..10))
            .and_then(|d| chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").ok())
            .unwrap_or_else(|| panic!("no \"Expires YYYY-MM-DD\" in: {line}"));
        assert!(
            expires >= today,
            "an ignored advisory expired on {expires}: look again: {line}"
        );
    }
    assert!(
        !deny.contains("ignore = [") || ignores > 0 || deny.contains("ignore = []"),
        "ignore entries must each be one line `{{ id = ..., reason = ... }}`"
    );
}

/// The arrows allowed between top-level modules: `from` may import each of `to`
/// (docs/DESIGN.md, "Allowed imports", holds the same table). Every other arrow,
/// and every arrow of a module missing here, fails the test: a new arrow is a design
/// decision, made in both places.
const ALLOWED_IMPORTS: &[(&str, &[&str])] = &[
    (
        "actors",
        &[
            "config",
            "cores",
            "domain",
            "mq",
            "services",
            "status",
            "store",
            "telemetry",
        ],
    ),
    (
        "cli",
        &[
            "config",
            "domain",
            "drift",
            "http",
            "mq",
            "rebuild",
            "redis",
            "startup",
            "store",
            "telemetry",
            "tls",
        ],
    ),
    ("config", &["domain", "tls"]),
    ("contracts", &["domain", "mq"]),
    ("cores", &[]),
    ("domain", &[]),
    ("drift", &["redis", "store"]),
    (
        "engine",
        &[
            "actors",
            "config",
            "domain",
            "mq",
            "services",
            "status",
            "store",
            "telemetry",
        ],
    ),
    ("failpoints", &[]),
    (
        "http",
        &[
            "config",
            "cores",
            "domain",
            "mq",
            "rebuild",
            "redis",
            "status",
            "store",
            "telemetry",
        ],
    ),
    ("mq", &["config", "domain", "status", "telemetry", "tls"]),
    ("rebuild", &["redis", "store"]),
    ("redis", &["config", "telemetry", "tls"]),
    (
        "services",
        &[
            "config",
            "domain",
            "drift",
            "mq",
            "redis",
            "status",
            "store",
            "telemetry",
        ],
    ),
    (
        "startup",
        &[
            "config", "cores", "domain", "engine", "http", "status", "store",
        ],
    ),
    ("status", &["domain", "telemetry"]),
    (
        "store",
        &["config", "domain", "failpoints", "telemetry", "tls"],
    ),
    ("telemetry", &["config"]),
    ("tls", &[]),
];

#[test]
fn top_level_modules_import_only_along_the_allowed_arrows() {
    let krate = Crate::load();
    let mut actual: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in krate.edges() {
        let Some(top) = from.first() else { continue };
        for to in tos {
            if to[0] != *top {
                actual.entry(top.clone()).or_default().insert(to[0].clone());
            }
        }
    }
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED_IMPORTS
        .iter()
        .map(|(from, to)| (*from, to.iter().copied().collect()))
        .collect();
    let mut other = Vec::new();
    for (from, tos) in &actual {
        for to in tos {
            if !allowed
                .get(from.as_str())
                .is_some_and(|a| a.contains(to.as_str()))
            {
                other.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        other.is_empty(),
        "arrows not in ALLOWED_IMPORTS: {other:#?}\nactual: {actual:#?}"
    );
}

/// The `ALLOWED_IMPORTS` rows as docs/DESIGN.md's "Allowed imports" table spells
/// them: `| from | to, to |`.
fn design_allowed_imports() -> BTreeMap<String, BTreeSet<String>> {
    let design = std::fs::read_to_string(root().join("docs/DESIGN.md")).unwrap();
    let section = design
        .split("### Allowed imports")
        .nth(1)
        .expect("docs/DESIGN.md has an \"Allowed imports\" section");
    let mut rows = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [from, to] = cells[..] else { continue };
        let from = from.trim_matches('`');
        if from == "module" || from.starts_with("---") {
            continue;
        }
        let to = to
            .split(',')
            .map(|t| t.trim().trim_matches('`').to_owned())
            .filter(|t| !t.is_empty() && t != "nothing")
            .collect();
        rows.insert(from.to_owned(), to);
    }
    rows
}

#[test]
fn the_allowed_imports_table_is_the_one_in_design() {
    let here: BTreeMap<String, BTreeSet<String>> = ALLOWED_IMPORTS
        .iter()
        .map(|(from, to)| {
            (
                (*from).to_owned(),
                to.iter().map(|t| (*t).to_owned()).collect(),
            )
        })
        .collect();
    assert_eq!(
        here,
        design_allowed_imports(),
        "tests/layout.rs and docs/DESIGN.md differ"
    );
    // Every top-level module has its row, and no row names a module that is gone.
    let krate = Crate::load();
    let tops: BTreeSet<String> = krate
        .modules
        .keys()
        .filter_map(|m| m.first().cloned())
        .collect();
    let rows: BTreeSet<String> = here.keys().cloned().collect();
    assert_eq!(tops, rows, "top-level modules against ALLOWED_IMPORTS rows");
}

/// BEGIN, COMMIT, ROLLBACK and savepoints are the store's: a transaction opened
/// elsewhere escapes the store's COMMIT classification (`store/tx.rs`).
#[test]
fn transaction_control_lives_in_store() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let exact = [
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "START TRANSACTION",
        "ABORT",
        "END",
    ];
    let prefixes = [
        "BEGIN ",
        "START TRANSACTION ",
        "SAVEPOINT ",
        "ROLLBACK TO ",
        "RELEASE SAVEPOINT ",
        "COMMIT AND ",
    ];
    let mut outside = Vec::new();
    let mut in_store = 0;
    for file in &files {
        let rel = file
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        for lit in literals(&code) {
            let stmt = lit.trim().trim_end_matches(';');
            if exact.contains(&stmt) || prefixes.iter().any(|p| stmt.starts_with(p)) {
                if rel.starts_with("src/store/") {
                    in_store += 1;
                } else {
                    outside.push(format!("{rel}: {stmt}"));
                }
            }
        }
    }
    assert!(
        in_store > 0,
        "the scan found no transaction control in store/"
    );
    assert!(
        outside.is_empty(),
        "transaction control outside store/: {outside:#?}"
    );
}

/// A newcomer finds every file from DESIGN's map: each module file (by its name) and
/// each migration.
#[test]
fn design_names_every_module_and_migration() {
    let design = std::fs::read_to_string(root().join("docs/DESIGN.md")).unwrap();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut missing = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if ["mod.rs", "lib.rs", "main.rs"].contains(&name.as_str()) {
            let dir = file
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy();
            if name == "mod.rs"
                && !design.contains(&format!("{dir}/`"))
                && !design.contains(&format!("{dir}/mod.rs`"))
            {
                missing.push(format!("{dir}/"));
            }
            continue;
        }
        if !design.contains(&format!("`{name}`")) && !design.contains(&format!("{name}`")) {
            missing.push(
                file.strip_prefix(root())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    for entry in std::fs::read_dir(root().join("migrations")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".sql") && !design.contains(&name) {
            missing.push(format!("migrations/{name}"));
        }
    }
    assert!(missing.is_empty(), "not in docs/DESIGN.md: {missing:#?}");
}

/// Every `§N.N` the code and the docs cite has its row in DESIGN's "Reference
/// sections" table, so a reader without the reference chapter knows what it says.
#[test]
fn every_cited_section_has_a_row_in_design() {
    let design = std::fs::read_to_string(root().join("docs/DESIGN.md")).unwrap();
    let table = design
        .split("## Reference sections")
        .nth(1)
        .expect("docs/DESIGN.md has a \"Reference sections\" table");
    let rows: BTreeSet<String> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| §"))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect();
    let mut cited = BTreeMap::<String, String>::new();
    for file in prose_and_code() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let rel = file
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        for (at, _) in text.match_indices('§') {
            // Another document's section (e.g. "RFC 7518 §3.2") is not the chapter's.
            let before = &text[text[..at]
                .char_indices()
                .rev()
                .nth(12)
                .map_or(0, |(i, _)| i)..at];
            if before.contains("RFC") {
                continue;
            }
            let section: String = text[at + '§'.len_utf8()..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let section = section.trim_end_matches('.').to_owned();
            if !section.is_empty() {
                cited.entry(section).or_insert(rel.clone());
            }
        }
    }
    assert!(cited.len() > 10, "found {} cited sections", cited.len());
    let missing: Vec<_> = cited
        .iter()
        .filter(|(s, _)| !rows.contains(*s))
        .map(|(s, f)| format!("§{s} (e.g. {f})"))
        .collect();
    assert!(missing.is_empty(), "cited without a row: {missing:#?}");
}

/// Every function of `code` (test module excluded) with its length in lines, from
/// its `fn` line to its closing brace.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let Some(at) = trimmed.find("fn ") else {
            continue;
        };
        let head = &trimmed[..at];
        let is_fn = head
            .split_whitespace()
            .all(|w| ["pub", "async", "const", "unsafe"].contains(&w) || w.starts_with("pub("));
        if !is_fn {
            continue;
        }
        let name: String = trimmed[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The body: from the first `{` after the signature to the brace that closes
        // it (a signature ending in `;` has none).
        let (mut depth, mut opened) = (0i32, false);
        for (i, l) in lines.iter().enumerate().skip(start) {
            for c in l.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    ';' if !opened && depth == 0 => break,
                    _ => {}
                }
            }
            if !opened && l.trim_end().ends_with(';') {
                break;
            }
            if opened && depth <= 0 {
                out.push((name.clone(), i - start + 1));
                break;
            }
        }
    }
    out
}

/// A newcomer reads a function whole: none over 120 lines, and no file over 700.
#[test]
fn no_function_over_120_lines_and_no_file_over_700() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let (mut long, mut over_60, mut big) = (Vec::new(), 0, Vec::new());
    let mut seen = 0;
    for file in &files {
        let rel = file
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        if text.lines().count() > 700 {
            big.push(format!("{rel}: {} lines", text.lines().count()));
        }
        for (name, len) in function_lengths(&code_of(&text)) {
            seen += 1;
            over_60 += usize::from(len > 60);
            if len > 120 {
                long.push(format!("{rel}: {name} ({len} lines)"));
            }
        }
    }
    assert!(seen > 500, "the scan found only {seen} functions");
    println!("{seen} functions, {over_60} over 60 lines");
    assert!(long.is_empty(), "functions over 120 lines: {long:#?}");
    assert!(big.is_empty(), "files over 700 lines: {big:#?}");
}
