//! The live page of a sale on the admin listener (`GET /`) and the JSON it polls
//! (`GET /status`): first what is down and for how long, then readiness and the
//! intake's state, latency, backlog and dead letters, then the live sales, the one
//! selling now first with its buckets and the rest folded, and the operator API's
//! pause and resume (which need the operator token). The page carries the status of
//! the moment as data and its script renders it at once, then polls `/status` once
//! a second; no build step, nothing loaded from elsewhere. What cannot be read now
//! is `null` in the JSON and "unknown" on the page, never shown as empty.

use serde::Serialize;

/// What `/status` answers and the page shows.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The build (`crate::VERSION`): what runs where, during a rolling upgrade.
    pub version: &'static str,
    /// When it was read (ms since the Unix epoch); the page divides sold units by it.
    pub time_ms: i64,
    pub ready: bool,
    pub checks: serde_json::Map<String, serde_json::Value>,
    pub paused: bool,
    /// The intake's state in words: `running`, `paused by an operator`, `stopped:
    /// ...`, `N of M intakes consuming`, or not run by this process.
    pub intake: String,
    /// Whether the intake consumes as it should (the page colours `intake` by it).
    pub intake_ok: bool,
    /// What is unreachable now, most important first: the page's red banner.
    pub outages: Vec<Outage>,
    pub node_id: Option<u16>,
    pub in_flight: usize,
    /// Orders committed by this instance in the last 5 to 10 s, and their latency.
    pub latency: Option<Latency>,
    /// `None`: unknown (PostgreSQL could not be read in time).
    pub backlog: Option<crate::store::ops::Backlog>,
    pub dead_letters: Vec<DeadLetters>,
    /// `None`: unknown (PostgreSQL could not be read in time). The sale that sold
    /// last comes first.
    pub sales: Option<Vec<Sale>>,
    /// Why some part could not be read (the rest is still shown).
    pub errors: Vec<String>,
}

/// A dependency that does not answer (or cannot take orders), since when.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Outage {
    /// `PostgreSQL`, `Redis`, `RabbitMQ`, `front stage links`.
    pub link: &'static str,
    pub reason: String,
    /// When it began (ms since the Unix epoch), when known.
    pub since_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub orders: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeadLetters {
    pub queue: String,
    pub messages: u32,
}

/// One SKU of a live sale.
#[derive(Debug, Clone, Serialize)]
pub struct Sale {
    pub activity_id: i64,
    pub sku_id: i64,
    pub available: i64,
    /// Units taken by orders (all instances: PostgreSQL's figure).
    pub sold: i64,
    /// When a bucket of it last changed (ms since the Unix epoch).
    pub last_change_ms: i64,
    pub buckets: Vec<Bucket>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    pub bucket: i16,
    pub available: i32,
    pub allocated: i32,
}

/// Groups live buckets (in key order) by SKU.
pub fn sales(buckets: Vec<crate::store::health::LiveBucket>) -> Vec<Sale> {
    let mut sales: Vec<Sale> = Vec::new();
    for b in buckets {
        let same = sales
            .last()
            .is_some_and(|s| (s.activity_id, s.sku_id) == (b.activity_id, b.sku_id));
        if !same {
            sales.push(Sale {
                activity_id: b.activity_id,
                sku_id: b.sku_id,
                available: 0,
                sold: 0,
                last_change_ms: 0,
                buckets: Vec::new(),
            });
        }
        if let Some(sale) = sales.last_mut() {
            sale.available += i64::from(b.available);
            sale.sold += i64::from(b.allocated);
            sale.last_change_ms = sale.last_change_ms.max(b.updated_at.timestamp_millis());
            sale.buckets.push(Bucket {
                bucket: b.bucket,
                available: b.available,
                allocated: b.allocated,
            });
        }
    }
    // The sale selling now first: the one whose buckets changed last.
    sales.sort_by_key(|s| (std::cmp::Reverse(s.last_change_ms), s.activity_id, s.sku_id));
    sales
}

/// The page, its script carrying `nonce` (the answer's Content-Security-Policy) and
/// `status` as data, which it renders at once. `status` is `None` when `/status`
/// needs a token the page's reader must give first (`admin.metrics_token`).
pub fn page(status: Option<&Status>, nonce: &str) -> String {
    let initial = match status.and_then(|s| serde_json::to_string(s).ok()) {
        // `</` cannot end the script element early once escaped.
        Some(json) => json.replace("</", "<\\/"),
        None => "null".to_owned(),
    };
    // The nonce first: the data inserted after it cannot turn into one.
    TEMPLATE
        .replace("{{NONCE}}", nonce)
        .replace(
            "{{TOKEN_NEEDED}}",
            if status.is_none() { "true" } else { "false" },
        )
        .replace("{{INITIAL}}", &initial)
}

const TEMPLATE: &str = include_str!("live_page.html");

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(
        activity_id: i64,
        bucket: i16,
        allocated: i32,
        at_s: i64,
    ) -> crate::store::health::LiveBucket {
        crate::store::health::LiveBucket {
            activity_id,
            sku_id: 1,
            bucket,
            available: 4 - allocated,
            allocated,
            updated_at: chrono::DateTime::from_timestamp(at_s, 0).unwrap_or_default(),
        }
    }

    fn status() -> Status {
        Status {
            version: crate::VERSION,
            time_ms: 0,
            ready: true,
            checks: serde_json::Map::new(),
            paused: false,
            intake: "running".into(),
            intake_ok: true,
            outages: vec![],
            node_id: Some(1),
            in_flight: 0,
            latency: None,
            backlog: None,
            dead_letters: vec![],
            sales: Some(sales(vec![bucket(7, 0, 2, 100), bucket(7, 1, 0, 50)])),
            errors: vec!["</script><b>".into()],
        }
    }

    #[test]
    fn the_page_carries_the_status_as_data_that_cannot_close_its_script() {
        let html = page(Some(&status()), "n0nce");
        assert!(html.contains("<script nonce=\"n0nce\">"));
        assert!(!html.contains("{{"), "a placeholder was left: {html}");
        let json_at = html.find("const INITIAL =").expect("initial status");
        assert!(html[json_at..].contains("\"sold\":2"), "{html}");
        // The embedded JSON cannot close the script element.
        assert!(!html[json_at..].contains("</script><b>"), "{html}");
        assert!(html[json_at..].contains("<\\/script><b>"), "{html}");
    }

    #[test]
    fn without_the_token_the_page_carries_no_numbers() {
        let html = page(None, "n0nce");
        assert!(html.contains("const TOKEN_NEEDED = true"), "{html}");
        assert!(html.contains("const INITIAL = null"), "{html}");
    }

    #[test]
    fn the_sale_that_changed_last_comes_first() {
        let live = sales(vec![
            bucket(3, 0, 1, 10),
            bucket(3, 1, 1, 20),
            bucket(5, 0, 4, 30),
            bucket(9, 0, 0, 5),
        ]);
        let order: Vec<i64> = live.iter().map(|s| s.activity_id).collect();
        assert_eq!(order, vec![5, 3, 9]);
        assert_eq!(live[1].sold, 2);
        assert_eq!(live[1].last_change_ms, 20_000);
    }
}
