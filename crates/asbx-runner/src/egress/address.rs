//! Which addresses a sandbox may reach: public unicast ones that are not
//! this host's own, and the internal ranges an operator allows ([`Cidr`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address range, `10.0.0.0/8` or `fd00::/8` (a bare address is `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max)?,
            None => max,
        };
        Some(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }
}

/// Whether `ip` is one of this host's interface addresses.
pub(super) fn is_own_address(ip: IpAddr) -> bool {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        // Can't tell: count it as own, so the check fails closed.
        return true;
    };
    addrs.filter_map(|a| a.address).any(|a| {
        a.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())) == Some(ip)
            || a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())) == Some(ip)
    })
}

/// Whether `ip` is a public unicast address a sandbox may reach.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v6(v6: Ipv6Addr) -> bool {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return is_public_v4(v4); // ::ffff:0:0/96
    }
    let s = v6.segments();
    if s[0] == 0x2002 {
        // 6to4: the embedded v4 decides.
        let o = v6.octets();
        return is_public_v4(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    !(s[..6] == [0; 6] // IPv4-compatible ::/96, with :: and ::1
        || v6.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] <= 1) // NAT64 64:ff9b::/96, 64:ff9b:1::/48
        || (s[0] == 0x100 && s[1..4] == [0; 3]) // discard 100::/64
        || (s[0] == 0x2001 && s[1] == 0) // Teredo 2001::/32
        || (s[0] == 0x2001 && (s[1] & 0xfff0) == 0x10) // ORCHID 2001:10::/28
        || (s[0] == 0x2001 && s[1] == 2 && s[2] == 0) // benchmarking 2001:2::/48
        || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
        || (s[0] & 0xe000) != 0x2000) // outside global unicast 2000::/3
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // CGNAT 100.64/10
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 192 && o[1] == 0 && o[2] == 2) // TEST-NET-1
        || (o[0] == 198 && o[1] == 51 && o[2] == 100) // TEST-NET-2
        || (o[0] == 203 && o[1] == 0 && o[2] == 113) // TEST-NET-3
        || (o[0] == 192 && o[1] == 88 && o[2] == 99) // 6to4 relay anycast
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking 198.18/15
        || o[0] >= 240) // reserved 240/4 and broadcast
}
