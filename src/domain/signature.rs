//! The signature of an `order.create` message (docs/DESIGN.md, "Signed orders"):
//! when `amqp.order_signing_secret` is set, the front stage signs each body and the
//! engine dead-letters a message whose signature is missing or wrong, so an order
//! reaches PostgreSQL only from a producer that holds the secret, whatever broker
//! permissions allow. The one builder and checker of the format:
//!
//! ```text
//! header  x-seckill-signature: v1=<64 lowercase hex digits>
//! tag     HMAC-SHA256(secret, body bytes exactly as published)
//! ```

use super::mac::{mac, tag_hex, verify_hex};
use super::message::PoisonReason;

/// The AMQP header that carries the signature.
pub const SIGNATURE_HEADER: &str = "x-seckill-signature";

const VERSION_PREFIX: &str = "v1=";

/// The header value for `body`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    format!("{VERSION_PREFIX}{}", tag_hex(mac(secret, &[body])))
}

/// Accepts `body` only with the signature `sign` gives it under `secret`; the
/// reason says which check failed (never the expected value).
pub fn check(secret: &[u8], body: &[u8], header: Option<&str>) -> Result<(), PoisonReason> {
    let Some(value) = header else {
        return Err(PoisonReason::new(
            "unsigned",
            format!("no {SIGNATURE_HEADER} header, and amqp.order_signing_secret is set"),
        ));
    };
    let Some(hex) = value.strip_prefix(VERSION_PREFIX) else {
        return Err(PoisonReason::new(
            "bad_signature",
            format!("{SIGNATURE_HEADER} is not of the form v1=<hex>"),
        ));
    };
    if verify_hex(mac(secret, &[body]), hex) {
        Ok(())
    } else {
        Err(PoisonReason::new(
            "bad_signature",
            format!("{SIGNATURE_HEADER} does not match the body under the signing secret"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"an-order-signing-secret-of-32-bytes";

    #[test]
    fn a_signed_body_passes_and_any_change_is_refused() {
        let body = br#"{"message_id":"x"}"#;
        let signature = sign(SECRET, body);
        assert!(signature.starts_with("v1=") && signature.len() == 67);
        assert_eq!(check(SECRET, body, Some(&signature)), Ok(()));
        let kind = |r: Result<(), PoisonReason>| r.unwrap_err().kind;
        assert_eq!(kind(check(SECRET, body, None)), "unsigned");
        assert_eq!(
            kind(check(SECRET, br#"{"message_id":"y"}"#, Some(&signature))),
            "bad_signature"
        );
        assert_eq!(
            kind(check(b"another-secret", body, Some(&signature))),
            "bad_signature"
        );
        assert_eq!(
            kind(check(SECRET, body, Some(&signature[3..]))),
            "bad_signature"
        );
        assert_eq!(
            kind(check(SECRET, body, Some(&signature.to_uppercase()))),
            "bad_signature"
        );
    }

    /// The format as another producer would write it, from the documented recipe.
    #[test]
    fn the_documented_recipe_gives_the_same_header() {
        use hmac::{Hmac, Mac};
        let mut m = <Hmac<sha2::Sha256> as Mac>::new_from_slice(b"s").unwrap();
        m.update(b"{}");
        let hex: String = m
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(sign(b"s", b"{}"), format!("v1={hex}"));
    }
}
