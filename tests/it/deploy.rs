//! The shipped dashboards and alert rules query only metrics the engine records.

use std::collections::BTreeSet;
use std::path::Path;

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

fn sources(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn dashboards_and_alerts_use_only_recorded_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut code = String::new();
    sources(&root.join("src"), &mut code);
    // What the engine records: the names passed to the metrics macros.
    let mut recorded = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for mac in ["counter!(", "gauge!(", "histogram!("] {
        for (at, _) in code.match_indices(mac) {
            let args = code[at + mac.len()..].trim_start();
            if let Some(name) = args.strip_prefix('"').and_then(|a| a.split('"').next()) {
                recorded.insert(name.to_owned());
                if mac == "histogram!(" {
                    histograms.insert(name.to_owned());
                }
            }
        }
    }
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
