//! The shipped dashboards and alert rules query only metrics the engine records.

use std::collections::BTreeSet;
use std::path::Path;

use seckill_engine::telemetry::names::{Kind, CATALOGUE};

/// Every `seckill_*` name in a text, with the suffix of a series of one of
/// `histograms` removed.
fn metric_names(text: &str, histograms: &BTreeSet<String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("seckill_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| histograms.contains(*b)))
            .unwrap_or(name);
        names.insert(base.to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn dashboards_and_alerts_use_only_recorded_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // What the engine records: the metric catalogue (tests/layout.rs checks that
    // every entry is recorded somewhere).
    let recorded: BTreeSet<String> = CATALOGUE.iter().map(|m| m.name.to_owned()).collect();
    let histograms: BTreeSet<String> = CATALOGUE
        .iter()
        .filter(|m| m.kind == Kind::Histogram)
        .map(|m| m.name.to_owned())
        .collect();
    assert!(recorded.len() > 30, "found only {recorded:?}");
    for file in [
        "deploy/grafana/dashboards/seckill-engine.json",
        "deploy/prometheus/alerts.yml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        if file.ends_with(".json") {
            serde_json::from_str::<serde_json::Value>(&text).expect("dashboard is JSON");
        }
        let used = metric_names(&text, &histograms);
        let unknown: Vec<_> = used.difference(&recorded).collect();
        assert!(
            unknown.is_empty(),
            "{file} queries unknown metrics {unknown:?}"
        );
    }
}
