//! A position in PostgreSQL's write-ahead log, as the HTTP API shows it
//! (`X-Read-LSN`, `X-Min-LSN`): PostgreSQL's own `pg_lsn` text, two hexadecimal
//! halves separated by a slash (`16/B374D848`). The one builder and parser of that
//! header format.

use std::fmt;
use std::str::FromStr;

/// A WAL position; larger is later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lsn(pub u64);

impl Lsn {
    /// From `pg_lsn - '0/0'` (a non-negative bigint).
    pub fn from_offset(offset: i64) -> Lsn {
        Lsn(u64::try_from(offset).unwrap_or(0))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// Why a header is not an LSN.
#[derive(Debug, thiserror::Error)]
#[error("not a WAL position (two hexadecimal numbers separated by '/', e.g. 16/B374D848)")]
pub struct BadLsn;

impl FromStr for Lsn {
    type Err = BadLsn;
    fn from_str(s: &str) -> Result<Lsn, BadLsn> {
        // Exactly PostgreSQL's `%X/%X`: hexadecimal digits only (`from_str_radix`
        // alone would take a sign), as the OpenAPI document's pattern says.
        let (high, low) = s.split_once('/').ok_or(BadLsn)?;
        let half = |h: &str| {
            if h.is_empty() || h.len() > 8 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(BadLsn);
            }
            u32::from_str_radix(h, 16).map_err(|_| BadLsn)
        };
        let (high, low) = (half(high)?, half(low)?);
        Ok(Lsn((u64::from(high) << 32) | u64::from(low)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_writes_and_orders_like_postgres() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, 0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert!("1/0".parse::<Lsn>().unwrap() > "0/FFFFFFFF".parse().unwrap());
        for bad in [
            "",
            "16",
            "x/1",
            "1/2/3",
            "100000000/0",
            "+1/2",
            " 1/2",
            "1/-2",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad}");
        }
    }
}
