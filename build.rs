// refinery embeds migrations/ at compile time; rebuild when a migration changes.
// The commit goes into `--version` and the admin `/status`: from
// SECKILL_BUILD_COMMIT when set (an image built without the repository's .git),
// else from git, else "unknown".
fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-env-changed=SECKILL_BUILD_COMMIT");
    let commit = std::env::var("SECKILL_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SECKILL_COMMIT={}", commit.trim());
}

/// HEAD's short hash; rebuilt when HEAD moves (a commit, a checkout).
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    // Only files that exist: Cargo reruns a build script whose watched file is
    // missing on every build, and with it rebuilds the engine (a repository
    // without packed-refs did, each `cargo build` and `cargo run`).
    let watch = |file: String| {
        if std::path::Path::new(&file).exists() {
            println!("cargo:rerun-if-changed={file}");
        }
    };
    for path in ["HEAD", "packed-refs"] {
        if let Some(file) = git(&["rev-parse", "--git-path", path]) {
            watch(file);
        }
    }
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(file) = git(&["rev-parse", "--git-path", &reference]) {
            watch(file);
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).filter(|c| !c.is_empty())
}
