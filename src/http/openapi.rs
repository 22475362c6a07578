//! The OpenAPI 3.1 documents of the two listeners, generated from the handlers'
//! `#[utoipa::path]` annotations and their body types: the front stage's
//! (`http::front::FrontApi`) and the admin listener's (`http::admin::AdminApi`, the
//! probes, the live page's data and the operator API). Each listener serves its own
//! at `GET /openapi.json`; the committed copies under docs/contracts/ are checked
//! equal to these by `tests/contracts.rs`.

use actix_web::HttpResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::OpenApi;

/// Adds the security schemes the annotations name: `buyer` (a JWT as a bearer
/// token, `frontstage.auth`), `operator` (`admin.token`) and `metrics`
/// (`admin.metrics_token`, when set).
pub struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |format: Option<&str>, what: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.bearer_format = format.map(str::to_owned);
            http.description = Some(what.to_owned());
            SecurityScheme::Http(http)
        };
        components.add_security_scheme(
            "buyer",
            bearer(
                Some("JWT"),
                "The buyer's JWT (`frontstage.auth`): `sub` is the user id; `exp` required, \
                 `aud`/`iss` checked when configured. Behind a trusted gateway \
                 (`frontstage.auth.mode = \"gateway\"`) the gateway's user header instead.",
            ),
        );
        components.add_security_scheme(
            "operator",
            bearer(
                None,
                "`admin.token`; the operator API answers 404 while it is unset.",
            ),
        );
        components.add_security_scheme(
            "metrics",
            bearer(
                None,
                "`admin.metrics_token`, when set: `/metrics`, `/status` and the live page's figures.",
            ),
        );
    }
}

/// A document as the listener serves it and docs/contracts/ holds it: pretty JSON
/// with a final newline.
pub fn render(document: &OpenApi) -> String {
    let mut text = document.to_pretty_json().unwrap_or_else(|e| {
        // The document is built from static annotations: failing to serialize it
        // is a bug, answered as an error object rather than a panic.
        format!("{{\"error\": \"the OpenAPI document did not serialize: {e}\"}}")
    });
    text.push('\n');
    text
}

/// `GET /openapi.json`: `document`, rendered once per process.
pub fn answer(document: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document)
}
