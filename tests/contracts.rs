//! The machine-readable contracts under docs/contracts/ are the ones the code
//! generates: the OpenAPI documents of the two listeners and the AsyncAPI document
//! of the messages with their JSON Schemas. A change to a handler, a body type or a
//! message changes the generated text, and this test fails until the committed
//! copy is regenerated (`SECKILL_BLESS=1 cargo test --test contracts`) and
//! reviewed with the change.
//!
//! Pure generation: no services needed.

use std::path::Path;

fn check(file: &str, generated: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/contracts")
        .join(file);
    if std::env::var_os("SECKILL_BLESS").is_some() {
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/contracts/{file} is not what the code generates (first difference at line {}):\n\
             committed: {:?}\ngenerated: {:?}\n\
             regenerate it with `SECKILL_BLESS=1 cargo test --test contracts` and commit it",
            line + 1,
            committed.lines().nth(line).unwrap_or("<end>"),
            generated.lines().nth(line).unwrap_or("<end>"),
        );
    }
}

#[test]
fn the_front_stage_openapi_document_is_the_generated_one() {
    check(
        "front.openapi.json",
        &seckill_engine::http::front::openapi_document(),
    );
}

#[test]
fn the_admin_openapi_document_is_the_generated_one() {
    check(
        "admin.openapi.json",
        &seckill_engine::http::admin::openapi_document(),
    );
}
