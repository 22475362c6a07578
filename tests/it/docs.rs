//! The docs an operator follows run as written (issue 51). Every shell block of
//! README.md and docs/OPERATIONS.md carries, on the line before its fence, what
//! happens to it:
//!
//! - `<!-- doc-test: run -->`: run here, the `run` blocks of both files in order in
//!   one shell, with the tested equivalents below; `run tls` blocks likewise, in a
//!   shell of their own (the TLS profile's own servers);
//! - `<!-- doc-test: ci -->`: the block is CI's own command (`scripts/test`);
//! - `<!-- doc-test: see FILE::TEST -->`: that integration test runs its
//!   equivalent (it must exist);
//! - `<!-- doc-test: by hand YYYY-MM-DD: why -->`: it cannot run in CI (why), and
//!   is run by hand before each release; the date is the last run.
//!
//! A shell block is a fence of `sh`, `bash`, `shell`, `console` or no language.
//!
//! The tested equivalents of a `run` block: `cargo run --release --` is the engine
//! binary this test suite built (the same code, not rebuilt for release), paths
//! under `.services/` are this test's own services directory, `localhost:9090` is
//! this test's admin listener, a `serve` runs in the background until
//! `seckill-engine health` says ready, and the world is private: its own database
//! name, broker namespace, Redis prefix, users and ports.

use std::path::PathBuf;

use crate::common::free_port;

/// One shell block and what its directive says.
#[derive(Debug)]
struct Block {
    file: &'static str,
    line: usize,
    directive: String,
    text: String,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The languages of a shell block's fence.
const SHELLS: [&str; 5] = ["", "sh", "bash", "shell", "console"];

fn blocks(file: &'static str) -> Vec<Block> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        // Fences inside a list item are indented.
        if let Some(lang) = lines[i].trim().strip_prefix("```") {
            let directive = i
                .checked_sub(1)
                .map(|p| lines[p].trim())
                .and_then(|l| l.strip_prefix("<!-- doc-test:"))
                .and_then(|l| l.strip_suffix("-->"))
                .map(|d| d.trim().to_owned())
                .unwrap_or_default();
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && lines[end].trim() != "```" {
                end += 1;
            }
            if SHELLS.contains(&lang.trim()) {
                out.push(Block {
                    file,
                    line: i + 1,
                    directive,
                    text: lines[start..end].join("\n"),
                });
            }
            i = end;
        }
        i += 1;
    }
    out
}

const FILES: [&str; 2] = ["README.md", "docs/OPERATIONS.md"];

/// The `run` directives: each is one shell, run by one test below.
const GROUPS: [&str; 2] = ["run", "run tls"];

/// Every block is accounted for: run here, CI itself, another test's, or by hand
/// with why and when.
#[test]
fn every_shell_block_of_the_docs_says_how_it_is_run() {
    let tests = std::fs::read_dir(repo().join("tests/it"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect::<Vec<_>>();
    let mut problems = Vec::new();
    let mut count = 0;
    for file in FILES {
        for b in blocks(file) {
            count += 1;
            let d = b.directive.as_str();
            let ok = match d.split_whitespace().next() {
                Some("run") => GROUPS.contains(&d),
                Some("ci") => d == "ci",
                Some("see") => {
                    let target = d.trim_start_matches("see").trim();
                    match target.split_once("::") {
                        Some((path, name)) => {
                            let path = repo().join(path);
                            tests.contains(&path)
                                && std::fs::read_to_string(&path)
                                    .is_ok_and(|t| t.contains(&format!("async fn {name}(")))
                        }
                        None => false,
                    }
                }
                Some("by") => {
                    // by hand YYYY-MM-DD: why
                    let rest = d.trim_start_matches("by hand").trim();
                    let (date, why) = rest.split_once(':').unwrap_or(("", ""));
                    chrono::NaiveDate::parse_from_str(date.trim(), "%Y-%m-%d").is_ok()
                        && why.trim().len() > 10
                }
                _ => false,
            };
            if !ok {
                problems.push(format!("{}:{}: {:?}", b.file, b.line, b.directive));
            }
        }
    }
    assert!(count >= 16, "found only {count} shell blocks");
    assert!(
        problems.is_empty(),
        "shell blocks without a valid `<!-- doc-test: ... -->` line before them: {problems:#?}"
    );
}

/// The tested equivalent of a `run` block's text (see the module's docs).
fn equivalent(text: &str) -> String {
    text.lines()
        .map(|line| {
            let line = line
                .replace("cargo run --release --", "\"$SECKILL_ENGINE_BIN\"")
                .replace(".services/", "\"$SECKILL_SERVICES_DIR\"/")
                .replace("localhost:9090", "\"$SECKILL__ADMIN__ADDR\"");
            // OPERATIONS' lists name the binary as installed.
            let line = match line.strip_prefix("seckill-engine ") {
                Some(rest) => format!("\"$SECKILL_ENGINE_BIN\" {rest}"),
                None => line,
            };
            // A `serve` (a comment after it allowed) runs in the background.
            let code = line.split(" #").next().unwrap_or_default().trim_end();
            match code.strip_suffix("\"$SECKILL_ENGINE_BIN\" serve") {
                Some(before) => format!("{before}serve_in_background"),
                None => line,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The blocks of one `run` group, as their tested equivalents, in order.
fn group(directive: &str) -> Vec<Block> {
    FILES
        .into_iter()
        .flat_map(blocks)
        .filter(|b| b.directive == directive)
        .collect()
}

/// Runs `blocks` in one bash shell after `env` (exports), with `serve` in the
/// background and stopped at the end, `cleanup` run on exit too. Returns the shell's
/// output; fails the test when the shell fails.
async fn run_blocks(dir: &std::path::Path, env: &str, cleanup: &str, blocks: &[Block]) -> String {
    let mut script = format!(
        r#"set -euo pipefail
cd "{repo}"
export SECKILL_ENGINE_BIN="{engine}"
export SECKILL_SERVICES_DIR="{dir}"
export SECKILL__HTTP__ADDR=127.0.0.1:{http} SECKILL__ADMIN__ADDR=127.0.0.1:{admin}
export RUST_LOG=warn
{env}
serve_in_background() {{
  # The settings file names the database; a URL in the environment only named it
  # for the services' set-up.
  unset SECKILL__DATABASE__URL
  "$SECKILL_ENGINE_BIN" serve > "$SECKILL_SERVICES_DIR/serve.log" 2>&1 &
  echo $! > "$SECKILL_SERVICES_DIR/serve.pid"
  for _ in $(seq 1 600); do
    "$SECKILL_ENGINE_BIN" health >/dev/null 2>&1 && return 0
    kill -0 "$(cat "$SECKILL_SERVICES_DIR/serve.pid")" 2>/dev/null || break
    sleep 0.1
  done
  cat "$SECKILL_SERVICES_DIR/serve.log" >&2
  return 1
}}
on_exit() {{
  if [[ -s $SECKILL_SERVICES_DIR/serve.pid ]]; then
    kill -TERM "$(cat "$SECKILL_SERVICES_DIR/serve.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
  fi
  {cleanup}
}}
trap on_exit EXIT
"#,
        repo = repo().display(),
        engine = crate::common::process::engine_binary().display(),
        dir = dir.display(),
        http = free_port(),
        admin = free_port(),
    );
    for b in blocks {
        script.push_str(&format!(
            "\n# {}:{}\n{}\n",
            b.file,
            b.line,
            equivalent(&b.text)
        ));
    }
    let path = dir.join("doc.sh");
    std::fs::write(&path, &script).unwrap();
    let out = actix_rt::task::spawn_blocking(move || {
        std::process::Command::new("bash").arg(&path).output()
    })
    .await
    .unwrap()
    .expect("bash");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the docs' blocks failed:\n{script}\n---\n{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("FAIL")), "{text}");
    text
}

/// The `run` blocks, in order, in one shell: README's roles flow on a fresh
/// PostgreSQL cluster (services up with one identity per job, migrate as the owner,
/// serve as the runtime role) and its
/// flash sale by hand (a sale created, its invariants checked), then OPERATIONS'
/// before-a-sale and after-a-sale checklists (validate, a sale created and checked,
/// closed, checked again and maintained) and its runbooks' commands (diagnose,
/// pause and resume, the checks after a broker outage, a Redis rebuild) on the
/// engine the README started.
#[actix_rt::test]
async fn the_readme_the_checklists_and_the_runbooks_run_as_written() {
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    // The names `up --roles` makes from these, removed when dropped.
    let world = crate::roles::Identities {
        dir: std::env::temp_dir().join(format!("seckill-doc-{id}")),
        users: format!("t{id}"),
        db: format!("seckill_doc_{id}"),
    };
    std::fs::create_dir_all(&world.dir).unwrap();
    let runs = group("run");
    assert!(runs.len() >= 8, "{runs:#?}");
    // PostgreSQL on a port nothing answers: `scripts/services up` starts a cluster of
    // the test's own, as on a fresh machine (no role of an earlier run exists).
    let env = format!(
        r#"export SECKILL_ROLES_USER_PREFIX=t{id}
export SECKILL__AMQP__NAMESPACE=d{id} SECKILL__REDIS__KEY_PREFIX=d{id}
export SECKILL__DATABASE__URL="postgres://postgres@127.0.0.1:{port}/{db}?sslmode=disable""#,
        port = free_port(),
        db = world.db,
    );
    let text = run_blocks(
        &world.dir,
        &env,
        "scripts/services down >/dev/null 2>&1 || true",
        &runs,
    )
    .await;
    assert!(text.contains("starting project-local server"), "{text}");
    // The sales: their invariants, one line each, all ok; validate's lines all ok;
    // maintain's tables; the pause seen by readiness; a rebuild that had nothing to
    // change.
    assert!(text.contains("ok   duplicate_orders"), "{text}");
    assert!(text.contains("ok   owner"), "{text}");
    assert!(text.contains("vacuumed and analyzed"), "{text}");
    assert!(text.contains("paused by an operator"), "{text}");
    assert!(text.contains("nothing changed"), "{text}");
    drop(world);
}

/// The TLS profile's block: `up --tls` on ports and a directory of the test's own,
/// migrate, validate, serve, the broker's view of the connections, a sale checked.
#[actix_rt::test]
async fn the_tls_profile_runs_as_written() {
    let dir =
        std::env::temp_dir().join(format!("seckill-doc-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    // The PostgreSQL server runs as `postgres` when the tests run as root.
    let _ = std::process::Command::new("chmod")
        .arg("755")
        .arg(&dir)
        .status();
    let runs = group("run tls");
    assert!(!runs.is_empty());
    let env = format!(
        "export SECKILL_TLS_PORTS=\"{} {} {}\"",
        free_port(),
        free_port(),
        free_port()
    );
    let text = run_blocks(
        &dir,
        &env,
        "scripts/services down >/dev/null 2>&1 || true",
        &runs,
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let said = |what: &str| {
        text.lines()
            .any(|l| l.starts_with("ok") && l.contains(what) && l.contains("TLS"))
    };
    assert!(
        said("postgres tls") && said("rabbitmq tls") && said("redis tls"),
        "{text}"
    );
    assert!(text.contains("sslmode=verify-full"), "{text}");
    assert!(text.contains("tlsv1.3"), "{text}");
    assert!(text.contains("ok   duplicate_orders"), "{text}");
}
