//! Who the client of a request is, for the per-address limit: the TCP peer, or,
//! when the peer is one of `frontstage.auth.trusted_proxies`, the rightmost address
//! of `X-Forwarded-For` that is not itself a trusted proxy. Each proxy appends the
//! address it received from, so that address is the one the nearest untrusted hop
//! cannot forge; anything to its left was written by the client and is ignored. An
//! IPv6 client is limited per network (`frontstage.rate_limit.ipv6_prefix_len`).

use std::net::IpAddr;

use actix_web::HttpRequest;

use crate::config::Cidr;

/// The proxies in front of the front stage.
#[derive(Debug, Clone, Default)]
pub struct Proxies(Vec<Cidr>);

impl Proxies {
    pub fn new(trusted: &[Cidr]) -> Self {
        Self(trusted.to_vec())
    }

    pub fn trusts(&self, ip: &IpAddr) -> bool {
        let ip = canonical(*ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client address of `req` (see the module docs).
    pub fn client_of(&self, req: &HttpRequest) -> Option<IpAddr> {
        let peer = req.peer_addr()?.ip();
        let forwarded = req
            .headers()
            .get_all("x-forwarded-for")
            .filter_map(|v| v.to_str().ok());
        Some(self.client(peer, forwarded))
    }

    /// The client behind `peer`, given the `X-Forwarded-For` header values in the
    /// order they came.
    pub fn client<'a>(&self, peer: IpAddr, forwarded_for: impl Iterator<Item = &'a str>) -> IpAddr {
        let mut client = canonical(peer);
        if !self.trusts(&client) {
            return client;
        }
        let hops: Vec<&str> = forwarded_for.flat_map(|v| v.split(',')).collect();
        for hop in hops.iter().rev() {
            // A hop that is not an address ends the walk: nothing to its left can be
            // believed, and the last trusted hop is as far as we know.
            let Some(ip) = parse_hop(hop) else {
                return client;
            };
            client = ip;
            if !self.trusts(&ip) {
                return ip;
            }
        }
        client
    }
}

/// An `X-Forwarded-For` entry: an address, optionally `[v6]` or with a port.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    hop.parse::<std::net::SocketAddr>()
        .ok()
        .map(|s| canonical(s.ip()))
        .or_else(|| {
            hop.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .and_then(|h| h.parse::<IpAddr>().ok())
                .map(canonical)
        })
}

/// An IPv4 client reaching a dual-stack socket is `::ffff:a.b.c.d`: the same client.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The key an address is limited under: an IPv4 address itself, an IPv6 address's
/// network of `v6_prefix_len` bits.
pub fn limit_key(ip: IpAddr, v6_prefix_len: u8) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => {
            let bits = u32::from(v6_prefix_len.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(nets: &[&str]) -> Proxies {
        Proxies::new(
            &nets
                .iter()
                .map(|n| Cidr::try_from((*n).to_owned()).unwrap())
                .collect::<Vec<_>>(),
        )
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let p = proxies(&["10.0.0.0/8"]);
        assert_eq!(
            p.client(ip("203.0.113.9"), ["1.2.3.4"].into_iter()),
            ip("203.0.113.9")
        );
        assert_eq!(
            proxies(&[]).client(ip("10.0.0.1"), ["1.2.3.4"].into_iter()),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_hop_is_the_client() {
        let p = proxies(&["10.0.0.0/8", "192.0.2.7"]);
        // The client wrote 6.6.6.6 itself; 198.51.100.4 is what the edge proxy saw.
        let xff = ["6.6.6.6, 198.51.100.4", "192.0.2.7"];
        assert_eq!(
            p.client(ip("10.1.2.3"), xff.into_iter()),
            ip("198.51.100.4")
        );
        // Ports and brackets as some proxies write them.
        assert_eq!(
            p.client(ip("10.1.2.3"), ["[2001:db8::5]:443"].into_iter()),
            ip("2001:db8::5")
        );
        assert_eq!(
            p.client(ip("10.1.2.3"), ["198.51.100.4:5555"].into_iter()),
            ip("198.51.100.4")
        );
        // Garbage ends the walk at the last trusted hop; no header leaves the peer.
        assert_eq!(
            p.client(ip("10.1.2.3"), ["1.1.1.1, junk, 10.9.9.9"].into_iter()),
            ip("10.9.9.9")
        );
        assert_eq!(p.client(ip("10.1.2.3"), std::iter::empty()), ip("10.1.2.3"));
        // Every hop trusted: the leftmost is as far as we know.
        assert_eq!(
            p.client(ip("10.1.2.3"), ["10.4.4.4, 10.5.5.5"].into_iter()),
            ip("10.4.4.4")
        );
        // A mapped IPv4 peer is trusted like the IPv4 one.
        assert_eq!(
            p.client(ip("::ffff:10.1.2.3"), ["198.51.100.4"].into_iter()),
            ip("198.51.100.4")
        );
    }

    #[test]
    fn ipv6_clients_share_a_key_per_network_and_ipv4_ones_do_not() {
        assert_eq!(
            limit_key(ip("2001:db8:1:2:aaaa::1"), 64),
            limit_key(ip("2001:db8:1:2:bbbb::9"), 64)
        );
        assert_ne!(
            limit_key(ip("2001:db8:1:2::1"), 64),
            limit_key(ip("2001:db8:1:3::1"), 64)
        );
        assert_eq!(limit_key(ip("2001:db8::1"), 128), ip("2001:db8::1"));
        assert_ne!(
            limit_key(ip("198.51.100.1"), 64),
            limit_key(ip("198.51.100.2"), 64)
        );
        assert_eq!(limit_key(ip("::ffff:198.51.100.1"), 64), ip("198.51.100.1"));
    }
}
