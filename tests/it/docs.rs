//! The docs an operator follows run as written (issue 51). Every shell block of
//! README.md and docs/OPERATIONS.md carries, on the line before its fence, what
//! happens to it:
//!
//! - `<!-- doc-test: run -->`: run here, the file's `run` blocks in order in one
//!   shell, with the tested equivalents below;
//! - `<!-- doc-test: ci -->`: the block is CI's own command (`scripts/test`);
//! - `<!-- doc-test: see FILE::TEST -->`: that integration test runs its
//!   equivalent (it must exist);
//! - `<!-- doc-test: by hand YYYY-MM-DD: why -->`: it cannot run in CI (why), and
//!   is run by hand before each release; the date is the last run.
//!
//! The tested equivalents of a `run` block: `cargo run --release --` is the engine
//! binary this test suite built (the same code, not rebuilt for release), paths
//! under `.services/` are this test's own services directory, a `serve` runs in the
//! background until `seckill-engine health` says ready, and the world is private:
//! its own database name, broker namespace, Redis prefix, users and ports.

use std::path::PathBuf;

use secrecy::ExposeSecret;

use crate::common::{base_settings, free_port, with_dbname};

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

fn blocks(file: &'static str) -> Vec<Block> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        // Fences inside a list item are indented.
        if lines[i].trim() == "```sh" {
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
            out.push(Block {
                file,
                line: i + 1,
                directive,
                text: lines[start..end].join("\n"),
            });
            i = end;
        }
        i += 1;
    }
    out
}

const FILES: [&str; 2] = ["README.md", "docs/OPERATIONS.md"];

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
                Some("run") | Some("ci") => true,
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
    assert!(count >= 8, "found only {count} shell blocks");
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
                .replace(".services/", "\"$SECKILL_SERVICES_DIR\"/");
            // OPERATIONS' lists name the binary as installed.
            let line = match line.strip_prefix("seckill-engine ") {
                Some(rest) => format!("\"$SECKILL_ENGINE_BIN\" {rest}"),
                None => line,
            };
            match line.strip_suffix("\"$SECKILL_ENGINE_BIN\" serve") {
                Some(before) => format!("{before}serve_in_background"),
                None => line,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `run` blocks, in order, in one shell: README's roles flow (services up with
/// one identity per job, migrate as the owner, serve as the runtime role) and its
/// flash sale by hand (a sale created, its invariants checked), then OPERATIONS'
/// before-a-sale and after-a-sale checklists (validate, a sale created and checked,
/// closed, checked again and maintained) on the engine the README started.
#[actix_rt::test]
async fn the_readme_and_the_sale_checklists_run_as_written() {
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    // The names `up --roles` makes from these, removed when dropped.
    let world = crate::roles::Identities {
        dir: std::env::temp_dir().join(format!("seckill-doc-{id}")),
        users: format!("t{id}"),
        db: format!("seckill_doc_{id}"),
    };
    std::fs::create_dir_all(&world.dir).unwrap();
    // The README's, then OPERATIONS' checklists on the engine the README started.
    let runs: Vec<Block> = FILES
        .into_iter()
        .flat_map(blocks)
        .filter(|b| b.directive == "run")
        .collect();
    assert!(runs.len() >= 4, "{runs:#?}");
    let admin = format!("127.0.0.1:{}", free_port());
    let prelude = format!(
        r#"set -euo pipefail
cd "{repo}"
export SECKILL_ENGINE_BIN="{engine}"
export SECKILL_SERVICES_DIR="{dir}"
export SECKILL_ROLES_USER_PREFIX=t{id}
export SECKILL__AMQP__NAMESPACE=d{id} SECKILL__REDIS__KEY_PREFIX=d{id}
export SECKILL__DATABASE__URL="{url}"
export SECKILL__HTTP__ADDR=127.0.0.1:{http} SECKILL__ADMIN__ADDR={admin}
export RUST_LOG=warn
serve_in_background() {{
  # The roles' settings file names the database; the URL above only named it for
  # `up --roles`.
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
stop_serve() {{
  if [[ -s $SECKILL_SERVICES_DIR/serve.pid ]]; then
    kill -TERM "$(cat "$SECKILL_SERVICES_DIR/serve.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
  fi
}}
trap stop_serve EXIT
"#,
        repo = repo().display(),
        engine = crate::common::process::engine_binary().display(),
        dir = world.dir.display(),
        url = with_dbname(base_settings().database.url.expose_secret(), &world.db),
        http = free_port(),
    );
    let mut script = prelude;
    for b in &runs {
        script.push_str(&format!(
            "\n# {}:{}\n{}\n",
            b.file,
            b.line,
            equivalent(&b.text)
        ));
    }
    let path = world.dir.join("readme.sh");
    std::fs::write(&path, &script).unwrap();
    let out = actix_rt::task::spawn_blocking({
        let path = path.clone();
        move || std::process::Command::new("bash").arg(&path).output()
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
        "the README's blocks failed:\n{script}\n---\n{text}"
    );
    // The sales: their invariants, one line each, all ok; validate's lines all ok;
    // maintain's tables.
    assert!(text.contains("ok   duplicate_orders"), "{text}");
    assert!(text.contains("ok   owner"), "{text}");
    assert!(text.contains("vacuumed and analyzed"), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("FAIL")), "{text}");
    drop(world);
}
