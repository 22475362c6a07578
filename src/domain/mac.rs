//! HMAC-SHA256 tags and their one text encoding (64 lowercase hex digits), shared
//! by the purchase token and the `order.create` signature.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A MAC over `parts`, in order, under `secret`.
pub(crate) fn mac(secret: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    for part in parts {
        mac.update(part);
    }
    mac
}

/// The tag of `mac`, as 64 lowercase hex digits.
pub(crate) fn tag_hex(mac: Hmac<Sha256>) -> String {
    use std::fmt::Write;
    let tag = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(tag.len() * 2);
    for b in tag {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// Whether `hex` is exactly the tag of `mac`, in constant time. Only the encoding
/// `tag_hex` writes is accepted (`+3` for `03`, upper case: refused), so a value has
/// one spelling and one seen once cannot come back as another string.
pub(crate) fn verify_hex(mac: Hmac<Sha256>, hex: &str) -> bool {
    decode_hex(hex).is_some_and(|tag| mac.verify_slice(&tag).is_ok())
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_round_trips_and_only_its_canonical_spelling_verifies() {
        let hex = tag_hex(mac(b"k", &[b"a", b"b"]));
        assert_eq!(hex.len(), 64);
        assert!(verify_hex(mac(b"k", &[b"ab"]), &hex));
        assert!(!verify_hex(mac(b"k2", &[b"ab"]), &hex));
        assert!(!verify_hex(mac(b"k", &[b"ab"]), &hex.to_uppercase()));
        assert!(!verify_hex(mac(b"k", &[b"ab"]), &hex[..62]));
    }
}
