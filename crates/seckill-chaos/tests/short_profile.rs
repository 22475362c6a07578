//! The fault-injection suite's short profile: private services, the engine as a
//! process, faults, and an account of every message. The full matrix runs with
//! `seckill-chaos --profile full`.

use seckill_chaos::{run, ChaosArgs, Profile};
use seckill_testkit::process::engine_binary;

#[actix_rt::test]
async fn short_profile_keeps_every_promise_under_faults() {
    let args = ChaosArgs {
        profile: Profile::Short,
        scenario: Vec::new(),
        report: None,
        services_dir: None,
        // A workspace build (`cargo test --workspace`) builds it with the `chaos`
        // feature this crate asks for.
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
