//! Remote-address patterns of `plain_acl.yml` (`globalWhiteRemoteAddresses`,
//! `whiteRemoteAddress`), read as RocketMQ's RemoteAddressStrategyFactory reads them: empty
//! matches nothing, `*` (or `*.*.*.*`) everything, `a,b,c` and `192.168.1.{1,2,3}` a set,
//! `192.168.1.*`, `192.168.*.*` and `192.168.1.10-20` a range of IPv4 addresses, anything
//! else one address. CIDR blocks (`10.0.0.0/8`, `fd00::/8`) are accepted too (ACL 2.0 reads
//! them). IPv6 addresses match one by one, in sets, or by CIDR.

use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressPattern {
    /// Empty or absent: matches no address.
    Nothing,
    /// `*`: matches every address.
    Any,
    /// One or more exact addresses.
    Set(Vec<IpAddr>),
    /// IPv4 addresses whose first `fixed.len()` bytes are `fixed`, whose next byte lies in
    /// `low..=high`; any later bytes are free.
    Range { fixed: Vec<u8>, low: u8, high: u8 },
    /// `address/prefix`.
    Cidr { network: IpAddr, prefix: u8 },
}

impl AddressPattern {
    pub fn parse(text: &str) -> Result<AddressPattern, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(AddressPattern::Nothing);
        }
        if text == "*" || text == "*.*.*.*" || text == "*:*:*:*:*:*:*:*" {
            return Ok(AddressPattern::Any);
        }
        if let Some((network, prefix)) = text.split_once('/') {
            return parse_cidr(network, prefix).map_err(|why| format!("{text:?}: {why}"));
        }
        if let Some(open) = text.find('{') {
            // `192.168.1.{1,2}`: the listed last parts after a common head.
            let Some(inner) = text[open + 1..].strip_suffix('}') else {
                return Err(format!(
                    "{text:?}: a '{{' list must close with '}}' at the end"
                ));
            };
            let head = &text[..open];
            let addresses = inner
                .split(',')
                .map(|last| parse_ip(&format!("{head}{}", last.trim())))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|why| format!("{text:?}: {why}"))?;
            return Ok(AddressPattern::Set(addresses));
        }
        if text.contains(',') {
            let addresses = text
                .split(',')
                .map(|one| parse_ip(one.trim()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|why| format!("{text:?}: {why}"))?;
            return Ok(AddressPattern::Set(addresses));
        }
        if text.contains('*') || text.contains('-') {
            return parse_range(text).map_err(|why| format!("{text:?}: {why}"));
        }
        Ok(AddressPattern::Set(vec![
            parse_ip(text).map_err(|why| format!("{text:?}: {why}"))?
        ]))
    }

    pub fn matches(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        match self {
            AddressPattern::Nothing => false,
            AddressPattern::Any => true,
            AddressPattern::Set(addresses) => addresses.contains(&address),
            AddressPattern::Range { fixed, low, high } => match address {
                IpAddr::V4(v4) => {
                    let octets = v4.octets();
                    octets.starts_with(fixed) && (*low..=*high).contains(&octets[fixed.len()])
                }
                IpAddr::V6(_) => false,
            },
            AddressPattern::Cidr { network, prefix } => match (network, address) {
                (IpAddr::V4(network), IpAddr::V4(address)) => {
                    prefix_equal(&network.octets(), &address.octets(), *prefix)
                }
                (IpAddr::V6(network), IpAddr::V6(address)) => {
                    prefix_equal(&network.octets(), &address.octets(), *prefix)
                }
                _ => false,
            },
        }
    }
}

/// IPv4-mapped IPv6 peers (`::ffff:10.0.0.1`) match the IPv4 patterns.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn parse_ip(text: &str) -> Result<IpAddr, String> {
    text.parse::<IpAddr>()
        .map(canonical)
        .map_err(|_| format!("{text:?} is not an IP address"))
}

fn parse_cidr(network: &str, prefix: &str) -> Result<AddressPattern, String> {
    let network = parse_ip(network)?;
    let max = if network.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|prefix| *prefix <= max)
        .ok_or_else(|| format!("the prefix length must be 0..={max}"))?;
    Ok(AddressPattern::Cidr { network, prefix })
}

/// `a.b.c.*`, `a.b.*.*`, `a.*.*.*`, `a.b.c.x-y`, `a.b.x-y.*`: literal parts, then one `*` or
/// `x-y` part, then only `*` parts, four parts in all.
fn parse_range(text: &str) -> Result<AddressPattern, String> {
    let parts: Vec<&str> = text.split('.').map(str::trim).collect();
    if parts.len() != 4 {
        return Err("an IPv4 range has four dot-separated parts".into());
    }
    let byte = |part: &str| {
        part.parse::<u8>()
            .map_err(|_| format!("{part:?} is not a number 0-255"))
    };
    let mut fixed = Vec::new();
    let mut rest = parts.iter();
    for part in rest.by_ref() {
        let (low, high) = if *part == "*" {
            (0, 255)
        } else if let Some((low, high)) = part.split_once('-') {
            let (low, high) = (byte(low.trim())?, byte(high.trim())?);
            if low > high {
                return Err(format!("the range {part:?} runs backwards"));
            }
            (low, high)
        } else {
            fixed.push(byte(part)?);
            continue;
        };
        if rest.any(|later| *later != "*") {
            return Err("only '*' may follow a '*' or a range".into());
        }
        return Ok(AddressPattern::Range { fixed, low, high });
    }
    Err("no '*' or range part".into())
}

fn prefix_equal(network: &[u8], address: &[u8], prefix: u8) -> bool {
    let (whole, bits) = (usize::from(prefix / 8), prefix % 8);
    if network[..whole] != address[..whole] {
        return false;
    }
    if bits == 0 {
        return true;
    }
    let mask = 0xFFu8 << (8 - bits);
    network[whole] & mask == address[whole] & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn matches(pattern: &str, address: &str) -> bool {
        AddressPattern::parse(pattern).unwrap().matches(ip(address))
    }

    #[test]
    fn the_forms_rocketmq_reads() {
        assert!(!matches("", "127.0.0.1"));
        assert!(matches("*", "10.1.2.3"));
        assert!(matches("*.*.*.*", "10.1.2.3"));
        assert!(matches("192.168.0.*", "192.168.0.77"));
        assert!(!matches("192.168.0.*", "192.168.1.77"));
        assert!(matches("192.168.*.*", "192.168.9.9"));
        assert!(matches("10.*.*.*", "10.200.0.1"));
        assert!(matches("192.168.1.10-20", "192.168.1.15"));
        assert!(!matches("192.168.1.10-20", "192.168.1.21"));
        assert!(matches("192.168.10-20.*", "192.168.12.200"));
        assert!(matches("192.168.1.{1,2,3}", "192.168.1.2"));
        assert!(!matches("192.168.1.{1,2,3}", "192.168.1.4"));
        assert!(matches("10.0.0.1, 10.0.0.2", "10.0.0.2"));
        assert!(matches("127.0.0.1", "127.0.0.1"));
        assert!(matches("127.0.0.1", "::ffff:127.0.0.1"));
        assert!(matches("::1", "::1"));
    }

    #[test]
    fn cidr_blocks() {
        assert!(matches("10.0.0.0/8", "10.255.1.1"));
        assert!(!matches("10.0.0.0/8", "11.0.0.1"));
        assert!(matches("192.168.4.0/22", "192.168.7.255"));
        assert!(!matches("192.168.4.0/22", "192.168.8.0"));
        assert!(matches("0.0.0.0/0", "1.2.3.4"));
        assert!(matches("fd00::/8", "fd12::1"));
        assert!(!matches("fd00::/8", "10.0.0.1"));
    }

    #[test]
    fn bad_patterns_say_why() {
        for bad in [
            "192.168.1",
            "192.168.*.1",
            "192.168.1.20-10",
            "192.168.1.300",
            "10.0.0.0/33",
            "host.example",
            "192.168.1.{1,2",
        ] {
            let error = AddressPattern::parse(bad).unwrap_err();
            assert!(error.contains(bad), "{bad}: {error}");
        }
    }
}
