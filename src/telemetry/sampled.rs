//! Gauges whose label sets come and go with the data: the stock of each bucket of a
//! live sale, Redis drift per live SKU, the health of each table, the lag of each
//! standby. The `metrics` recorder keeps a series at its last value forever once
//! set, so a sale that ended would report its buckets until the process restarts;
//! here whoever samples a metric replaces its whole set of series at once, and a
//! series not in the latest set is gone from `/metrics`. Rendered after the
//! recorder's own text, in the same exposition format. This module owns the set and
//! its rendering; the set of an engine lives in its `status::Live`, so two engines
//! in one process keep their series apart.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use super::names;

/// One series: its labels, in the order given, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

impl Series {
    pub fn new(labels: Vec<(&'static str, String)>, value: f64) -> Self {
        Self { labels, value }
    }
}

/// Every sampled gauge of one engine: catalogue name → its current series.
#[derive(Debug, Default)]
pub struct Sampled {
    series: Mutex<BTreeMap<&'static str, Vec<Series>>>,
}

impl Sampled {
    /// Replaces every series of the gauge `name` (a catalogue name) with `series`.
    pub fn replace(&self, name: &'static str, series: Vec<Series>) {
        // A poisoned lock only means a writer panicked mid-insert: the map is whole.
        let mut all = self
            .series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        all.insert(name, series);
    }

    /// Appends every gauge with at least one series, with its help and type lines.
    pub fn render(&self, out: &mut String) {
        let all = self
            .series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (name, series) in all.iter().filter(|(_, s)| !s.is_empty()) {
            render_gauge(out, name, series);
        }
    }
}

/// One gauge: its help and type lines, then each series.
fn render_gauge(out: &mut String, name: &str, series: &[Series]) {
    let help = names::CATALOGUE
        .iter()
        .find(|m| m.name == name)
        .map_or("", |m| m.help);
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} gauge");
    for s in series {
        out.push_str(name);
        if !s.labels.is_empty() {
            out.push('{');
            for (i, (label, value)) in s.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{label}=\"{}\"", escape_value(value));
            }
            out.push('}');
        }
        let _ = writeln!(out, " {}", s.value);
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_set_drops_the_series_not_in_it() {
        let name = names::BUCKET_SOLD_OUT;
        let bucket = |b: i16, v: f64| {
            Series::new(
                vec![
                    ("activity", "1".into()),
                    ("sku", "2".into()),
                    ("bucket", b.to_string()),
                ],
                v,
            )
        };
        let sampled = Sampled::default();
        sampled.replace(name, vec![bucket(0, 0.0), bucket(1, 1.0)]);
        let mut text = String::new();
        sampled.render(&mut text);
        assert!(
            text.contains("# TYPE seckill_bucket_sold_out gauge"),
            "{text}"
        );
        assert!(
            text.contains("seckill_bucket_sold_out{activity=\"1\",sku=\"2\",bucket=\"1\"} 1"),
            "{text}"
        );
        // The sale ended: its series go with it.
        sampled.replace(name, vec![]);
        let mut text = String::new();
        sampled.render(&mut text);
        assert!(!text.contains("seckill_bucket_sold_out"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
