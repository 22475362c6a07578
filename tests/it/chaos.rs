//! The fault-injection suite's short profile (feature `chaos`, which scripts/test
//! enables): private services, the engine as a process, faults, and an account of
//! every message. The full matrix runs with `seckill-engine chaos --profile full`.

use std::path::PathBuf;

use seckill_engine::chaos::{run, ChaosArgs, Profile};

#[actix_rt::test]
async fn short_profile_keeps_every_promise_under_faults() {
    let args = ChaosArgs {
        profile: Profile::Short,
        scenario: Vec::new(),
        report: None,
        services_dir: None,
        engine: Some(PathBuf::from(env!("CARGO_BIN_EXE_seckill-engine"))),
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
