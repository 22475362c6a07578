//! The live page of a sale on the admin listener (`GET /`) and the JSON it polls
//! (`GET /status`): the live sales with their stock per bucket, orders per second,
//! latency, the outbox and compensation backlog, the dead-letter queues, readiness
//! of each dependency, and the operator API's pause and resume (which need the
//! operator token). The page is rendered here with the numbers of the moment, then
//! a little JavaScript in it polls `/status` once a second and redraws the same
//! markup; no build step, nothing loaded from elsewhere.

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
    pub node_id: Option<u16>,
    pub in_flight: usize,
    /// Orders committed by this instance in the last 5 to 10 s, and their latency.
    pub latency: Option<Latency>,
    pub backlog: Option<crate::store::ops::Backlog>,
    pub dead_letters: Vec<DeadLetters>,
    pub sales: Vec<Sale>,
    /// Why some part could not be read (the rest is still shown).
    pub errors: Vec<String>,
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
                buckets: Vec::new(),
            });
        }
        if let Some(sale) = sales.last_mut() {
            sale.available += i64::from(b.available);
            sale.sold += i64::from(b.allocated);
            sale.buckets.push(Bucket {
                bucket: b.bucket,
                available: b.available,
                allocated: b.allocated,
            });
        }
    }
    sales
}

/// The page. `status` is `None` when `/status` needs a token the page's reader
/// must type in first (`admin.metrics_token`).
/// The page, its script carrying `nonce` (the answer's Content-Security-Policy).
pub fn page(status: Option<&Status>, nonce: &str) -> String {
    let body = match status {
        Some(status) => render(status),
        None => "<p class=\"muted\">Enter the metrics token to see the sale.</p>".to_owned(),
    };
    let initial = match status.and_then(|s| serde_json::to_string(s).ok()) {
        // `</` cannot end the script element early once escaped.
        Some(json) => json.replace("</", "<\\/"),
        None => "null".to_owned(),
    };
    // The nonce first: the data inserted after it cannot turn into one.
    TEMPLATE
        .replace("{{NONCE}}", nonce)
        .replace("{{BODY}}", &body)
        .replace(
            "{{TOKEN_NEEDED}}",
            if status.is_none() { "true" } else { "false" },
        )
        .replace("{{INITIAL}}", &initial)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The server's rendering of `status`; the page's `render` in JavaScript builds
/// the same markup.
fn render(status: &Status) -> String {
    let mut html = String::new();
    html.push_str(&format!(
        "<section id=\"readiness\"><h2>Readiness: <span id=\"ready\" class=\"{}\">{}</span> \
         <span id=\"intake-state\">{}</span></h2><table><tr><th>check</th><th>state</th></tr>",
        if status.ready { "ok" } else { "bad" },
        if status.ready { "ready" } else { "not ready" },
        if status.paused {
            "intake paused"
        } else {
            "intake running"
        },
    ));
    for (name, value) in &status.checks {
        let text = value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
        html.push_str(&format!(
            "<tr><td>{}</td><td class=\"{}\">{}</td></tr>",
            escape(name),
            if text == "ok" { "ok" } else { "bad" },
            escape(&text)
        ));
    }
    html.push_str("</table></section>");

    html.push_str("<section id=\"sales\"><h2>Live sales</h2>");
    if status.sales.is_empty() {
        html.push_str("<p class=\"muted\">No sale is live.</p>");
    }
    for sale in &status.sales {
        let id = format!("{}-{}", sale.activity_id, sale.sku_id);
        html.push_str(&format!(
            "<h3>Activity {} SKU {}: <span id=\"sold-{id}\">{}</span> sold, \
             <span id=\"available-{id}\">{}</span> left, \
             <span id=\"rate-{id}\">–</span> orders/s</h3><table class=\"buckets\">\
             <tr><th>bucket</th><th>available</th><th>sold</th><th></th></tr>",
            sale.activity_id, sale.sku_id, sale.sold, sale.available
        ));
        for b in &sale.buckets {
            let total = i64::from(b.available) + i64::from(b.allocated);
            let left = if total > 0 {
                100 * i64::from(b.available) / total
            } else {
                0
            };
            html.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td>\
                 <td><div class=\"bar\"><div style=\"width:{left}%\"></div></div></td></tr>",
                b.bucket, b.available, b.allocated
            ));
        }
        html.push_str("</table>");
    }
    html.push_str("</section>");

    html.push_str("<section id=\"engine\"><h2>This instance</h2><table>");
    let latency = status.latency.as_ref().map_or_else(
        || "no orders in the last seconds".to_owned(),
        |l| {
            format!(
                "p50 ≤ {} ms, p99 ≤ {} ms over {} orders",
                l.p50_ms, l.p99_ms, l.orders
            )
        },
    );
    html.push_str(&format!(
        "<tr><td>order latency</td><td id=\"latency\">{}</td></tr>\
         <tr><td>in flight</td><td id=\"in-flight\">{}</td></tr>",
        escape(&latency),
        status.in_flight
    ));
    if let Some(b) = &status.backlog {
        html.push_str(&format!(
            "<tr><td>outbox backlog</td><td id=\"outbox\">{} (oldest {:.1} s), {} dead</td></tr>\
             <tr><td>compensation backlog</td><td id=\"compensation\">{} (oldest {:.1} s), {} for review</td></tr>",
            b.outbox_pending,
            b.outbox_oldest_pending_age_seconds,
            b.outbox_dead,
            b.compensation_pending,
            b.compensation_oldest_pending_age_seconds,
            b.compensation_manual_review
        ));
    }
    for d in &status.dead_letters {
        html.push_str(&format!(
            "<tr><td>dead letters: {}</td><td>{}</td></tr>",
            escape(&d.queue),
            d.messages
        ));
    }
    html.push_str("</table>");
    for e in &status.errors {
        html.push_str(&format!("<p class=\"bad\">{}</p>", escape(e)));
    }
    html.push_str("</section>");
    html
}

const TEMPLATE: &str = include_str!("live_page.html");

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> Status {
        Status {
            version: crate::VERSION,
            time_ms: 0,
            ready: true,
            checks: serde_json::Map::new(),
            paused: false,
            node_id: Some(1),
            in_flight: 0,
            latency: None,
            backlog: None,
            dead_letters: vec![],
            sales: sales(vec![
                crate::store::health::LiveBucket {
                    activity_id: 7,
                    sku_id: 1,
                    bucket: 0,
                    available: 3,
                    allocated: 2,
                },
                crate::store::health::LiveBucket {
                    activity_id: 7,
                    sku_id: 1,
                    bucket: 1,
                    available: 5,
                    allocated: 0,
                },
            ]),
            errors: vec!["</script><b>".into()],
        }
    }

    #[test]
    fn the_page_shows_each_sale_and_escapes_what_it_prints() {
        let html = page(Some(&status()), "n0nce");
        assert!(html.contains("<script nonce=\"n0nce\">"));
        assert!(html.contains("<span id=\"sold-7-1\">2</span>"), "{html}");
        assert!(
            html.contains("<span id=\"available-7-1\">8</span>"),
            "{html}"
        );
        assert!(html.contains("&lt;/script&gt;&lt;b&gt;"), "{html}");
        assert!(!html.contains("{{"), "a placeholder was left: {html}");
        // The embedded JSON cannot close the script element.
        let json_at = html.find("const INITIAL =").expect("initial status");
        assert!(!html[json_at..].contains("</script><b>"), "{html}");
    }

    #[test]
    fn without_the_token_the_page_shows_no_numbers() {
        let html = page(None, "n0nce");
        assert!(html.contains("Enter the metrics token"), "{html}");
        assert!(html.contains("const INITIAL = null"), "{html}");
    }
}
