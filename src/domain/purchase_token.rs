//! The purchase token (the seckill "hidden path", anti-bot): fetched during the sale
//! from `GET /v1/activities/{a}/skus/{s}/purchase-token`, presented with a
//! reservation in `X-Purchase-Token`. It binds a user, an activity and a SKU until
//! it expires, signed with HMAC-SHA256 under `frontstage.purchase_token.secret`, so
//! any front-stage instance sharing the secret can check it without a lookup. The
//! one builder and parser of its format:
//! `v1.{user_id}.{activity_id}.{sku_id}.{expires_at_ms}.{hmac hex}`.

use super::mac::{mac, tag_hex, verify_hex};

/// What a token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurchaseClaims {
    pub user_id: i64,
    pub activity_id: i64,
    pub sku_id: i64,
    /// Unix time in milliseconds.
    pub expires_at_ms: i64,
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidToken {
    #[error("not a purchase token")]
    Malformed,
    #[error("the signature does not match")]
    Signature,
    #[error("expired")]
    Expired,
    #[error("issued for another user or SKU")]
    Mismatch,
}

const VERSION: &str = "v1";

fn payload(c: &PurchaseClaims) -> String {
    format!(
        "{VERSION}.{}.{}.{}.{}",
        c.user_id, c.activity_id, c.sku_id, c.expires_at_ms
    )
}

/// The token for `claims`.
pub fn issue(secret: &[u8], claims: &PurchaseClaims) -> String {
    let payload = payload(claims);
    let hex = tag_hex(mac(secret, &[payload.as_bytes()]));
    format!("{payload}.{hex}")
}

/// The claims of a genuine, unexpired token for exactly this user and SKU.
pub fn verify(
    secret: &[u8],
    token: &str,
    (user_id, activity_id, sku_id): (i64, i64, i64),
    now_ms: i64,
) -> Result<PurchaseClaims, InvalidToken> {
    let (payload, hex) = token.rsplit_once('.').ok_or(InvalidToken::Malformed)?;
    if !is_canonical_hex(hex) {
        return Err(InvalidToken::Malformed);
    }
    if !verify_hex(mac(secret, &[payload.as_bytes()]), hex) {
        return Err(InvalidToken::Signature);
    }
    let mut parts = payload.split('.');
    if parts.next() != Some(VERSION) {
        return Err(InvalidToken::Malformed);
    }
    let mut number = || -> Result<i64, InvalidToken> {
        parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or(InvalidToken::Malformed)
    };
    let claims = PurchaseClaims {
        user_id: number()?,
        activity_id: number()?,
        sku_id: number()?,
        expires_at_ms: number()?,
    };
    if claims.expires_at_ms <= now_ms {
        return Err(InvalidToken::Expired);
    }
    if (claims.user_id, claims.activity_id, claims.sku_id) != (user_id, activity_id, sku_id) {
        return Err(InvalidToken::Mismatch);
    }
    Ok(claims)
}

/// The tag as `issue` writes it: 64 lowercase hex digits, nothing else. Anything
/// else (`+3` for `03`, upper case) is malformed, not a wrong signature: a token has
/// one encoding, so a token seen once cannot be presented again as another string.
fn is_canonical_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a-purchase-token-secret-of-32-bytes!";

    fn claims() -> PurchaseClaims {
        PurchaseClaims {
            user_id: 42,
            activity_id: 7,
            sku_id: 1,
            expires_at_ms: 2_000,
        }
    }

    #[test]
    fn only_the_canonical_encoding_of_a_tag_is_accepted() {
        // The first expiry whose tag has a byte below 0x10 (about one tag in nine
        // has none), so that `0x` can be written `+x`.
        let (token, zero_pair) = (2_000..)
            .map(|expires_at_ms| {
                let token = issue(
                    SECRET,
                    &PurchaseClaims {
                        expires_at_ms,
                        ..claims()
                    },
                );
                let hex = token.rsplit_once('.').unwrap().1.to_owned();
                (
                    token,
                    (0..hex.len())
                        .step_by(2)
                        .find(|i| hex[*i..].starts_with('0')),
                )
            })
            .find_map(|(token, pair)| pair.map(|p| (token, p)))
            .unwrap();
        let (payload, hex) = token.rsplit_once('.').unwrap();
        let mut plus = hex.to_owned();
        plus.replace_range(zero_pair..zero_pair + 1, "+");
        for other in [plus, hex.to_uppercase()] {
            assert_ne!(other, hex);
            assert_eq!(
                verify(SECRET, &format!("{payload}.{other}"), (42, 7, 1), 0),
                Err(InvalidToken::Malformed),
                "{other}"
            );
        }
    }

    #[test]
    fn a_token_holds_for_its_user_and_sku_until_it_expires() {
        let token = issue(SECRET, &claims());
        assert_eq!(verify(SECRET, &token, (42, 7, 1), 1_999), Ok(claims()));
        assert_eq!(
            verify(SECRET, &token, (42, 7, 1), 2_000),
            Err(InvalidToken::Expired)
        );
        assert_eq!(
            verify(SECRET, &token, (43, 7, 1), 0),
            Err(InvalidToken::Mismatch)
        );
        assert_eq!(
            verify(SECRET, &token, (42, 7, 2), 0),
            Err(InvalidToken::Mismatch)
        );
        assert_eq!(
            verify(
                b"another-secret-of-at-least-32-bytes!",
                &token,
                (42, 7, 1),
                0
            ),
            Err(InvalidToken::Signature)
        );
    }

    #[test]
    fn tampered_or_garbled_tokens_are_refused() {
        let token = issue(SECRET, &claims());
        let tampered = token.replacen("v1.42.", "v1.43.", 1);
        assert_eq!(
            verify(SECRET, &tampered, (43, 7, 1), 0),
            Err(InvalidToken::Signature)
        );
        for bad in ["", "v1", "v1.42.7.1.2000", "v1.42.7.1.2000.zz", "x.y"] {
            assert!(verify(SECRET, bad, (42, 7, 1), 0).is_err(), "{bad}");
        }
    }
}
