//! `health`: asks this host's engine whether it is ready (`GET /readyz` on
//! `admin.addr`), for a container's `HEALTHCHECK`, where no HTTP client is at hand.
//! Exits 0 on 200, 1 otherwise, with one line saying what it saw.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use crate::config::Settings;

/// Each of connect, write and read.
const TIMEOUT: Duration = Duration::from_secs(2);

pub fn run(settings: &Settings) -> anyhow::Result<ExitCode> {
    let addr = local(&settings.admin.addr)?;
    match readyz(addr) {
        Ok(status) if status == "200" => {
            println!("ready ({addr}/readyz answered 200)");
            Ok(ExitCode::SUCCESS)
        }
        Ok(status) => {
            println!("not ready ({addr}/readyz answered {status})");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            println!("not ready ({addr}/readyz: {e})");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `admin.addr` as this host reaches it: a wildcard address (`0.0.0.0`, `[::]`)
/// listens on loopback too.
fn local(addr: &str) -> anyhow::Result<SocketAddr> {
    let mut addr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow::anyhow!("admin.addr {addr} names no address"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(addr)
}

/// The status code `GET /readyz` answers.
fn readyz(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head)?;
    Ok(String::from_utf8_lossy(&head[9..12]).into_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wildcard_admin_address_is_asked_on_loopback() {
        assert_eq!(
            super::local("0.0.0.0:9090").unwrap().to_string(),
            "127.0.0.1:9090"
        );
        assert_eq!(super::local("[::]:9091").unwrap().to_string(), "[::1]:9091");
        assert_eq!(
            super::local("127.0.0.1:9092").unwrap().to_string(),
            "127.0.0.1:9092"
        );
    }
}
