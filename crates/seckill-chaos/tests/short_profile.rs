//! The fault-injection suite's short profile: private services, the engine as a
//! process, faults, and an account of every message. The full matrix runs with
//! `seckill-chaos --profile full`.

use std::path::PathBuf;

use seckill_chaos::{run, ChaosArgs, Profile};

/// The engine binary of this build: `SECKILL_ENGINE_BIN`, else `seckill-engine` in
/// the target directory this test runs from (`target/<profile>/deps/..`). A workspace
/// build (`cargo test --workspace`) builds it with the `chaos` feature this crate
/// asks for.
fn engine_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("SECKILL_ENGINE_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = profile_dir.join("seckill-engine");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo test --workspace` (it builds the engine binary) or set SECKILL_ENGINE_BIN",
        bin.display()
    );
    bin
}

#[actix_rt::test]
async fn short_profile_keeps_every_promise_under_faults() {
    let args = ChaosArgs {
        profile: Profile::Short,
        scenario: Vec::new(),
        report: None,
        services_dir: None,
        engine: Some(engine_binary()),
        services_script: None,
    };
    let accounts = run(&args).await.expect("the harness ran");
    assert!(accounts.len() >= 4, "{} scenarios ran", accounts.len());
    for a in &accounts {
        eprintln!("{}", a.summary());
    }
    for a in &accounts {
        assert!(a.ok(), "a promise was broken: {}", a.summary());
        assert!(
            a.faults > 0 || a.fault == "None",
            "no fault was injected: {}",
            a.summary()
        );
    }
}
